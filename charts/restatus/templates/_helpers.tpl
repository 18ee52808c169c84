{{/* Names: "restatus" for a release named restatus, as the kustomize folders name things. */}}
{{- define "restatus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "restatus.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* restatus.roleName (list $ "controller"): the name of a role's objects, e.g. restatus-controller. */}}
{{- define "restatus.roleName" -}}
{{- printf "%s-%s" (include "restatus.fullname" (index . 0)) (index . 1) }}
{{- end }}

{{- define "restatus.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "restatus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* restatus.selectorLabels (list $ "controller") */}}
{{- define "restatus.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "restatus.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* restatus.roleLabels (list $ "controller"): every label of a role's objects. */}}
{{- define "restatus.roleLabels" -}}
{{ include "restatus.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "restatus.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* restatus.s3Secret (list $ "controller"): the Secret of S3 keys a role gets, or "". */}}
{{- define "restatus.s3Secret" -}}
{{- $ := index . 0 }}
{{- $role := index $.Values (index . 1) }}
{{- if $role.existingSecret }}
{{- $role.existingSecret }}
{{- else if $.Values.s3.existingSecret }}
{{- $.Values.s3.existingSecret }}
{{- else if and $.Values.s3.accessKeyId $.Values.s3.secretAccessKey }}
{{- include "restatus.roleName" (list $ "s3") }}
{{- end }}
{{- end }}

{{/* restatus.podSpecCommon (list $ "controller"): what every role's pod spec shares. */}}
{{- define "restatus.podSpecCommon" -}}
{{- $ := index . 0 }}
{{- $roleName := index . 1 }}
{{- $role := index $.Values $roleName -}}
serviceAccountName: {{ include "restatus.serviceAccountName" . }}
{{- with (default $.Values.priorityClassName $role.priorityClassName) }}
priorityClassName: {{ . }}
{{- end }}
{{- with $.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml $.Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ $.Values.terminationGracePeriodSeconds }}
{{- with (default $.Values.nodeSelector $role.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (default $.Values.tolerations $role.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (default $.Values.affinity $role.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if gt (int (default 1 $role.replicas)) 1 }}
{{- with $role.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- else }}
# Two replicas (leader and standby) on different nodes where the nodes allow it.
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "restatus.selectorLabels" . | nindent 8 }}
{{- end }}
{{- end }}
{{- $signs := and (has $roleName (list "backup" "source" "journal")) $.Values.signing.keySecret }}
{{- /* Every role judges snapshots by the trusted keys: the controller what it restores, the
    journal its base, the backup and the source role what retention and preflight count. */}}
{{- $trusts := $.Values.signing.trustedKeysConfigMap }}
{{- $custom := include "restatus.customProfile" $ | fromJson }}
{{- $encrypts := and (has $roleName (list "backup" "source" "journal")) $.Values.encryption.recipientsConfigMap }}
{{- /* The private age key: the restore controller only, never where backups run (the journal
    reads no encrypted base: it captures its own). */}}
{{- $decrypts := and (eq $roleName "controller") $.Values.encryption.decryptionKeySecret }}
{{- $spills := has $roleName (list "controller" "journal") }}
{{- if or $spills $.Values.s3.caBundle.configMap $.Values.extraVolumes $signs $trusts $custom $encrypts $decrypts }}
volumes:
  {{- if $spills }}
  # Snapshot payloads are spilled here while in use (the root filesystem is read-only).
  - name: tmp
    emptyDir: {sizeLimit: 1Gi}
  {{- end }}
  {{- if $custom }}
  # The custom identity profile (profile.custom).
  - name: profile
    configMap:
      name: {{ include "restatus.roleName" (list $ "profile") }}
  {{- end }}
  {{- if $signs }}
  # The snapshot signing key: only in the pods that write snapshots.
  - name: signing-key
    secret:
      secretName: {{ $.Values.signing.keySecret }}
      items: [{key: {{ $.Values.signing.keySecretKey }}, path: signing.key}]
  {{- end }}
  {{- if $trusts }}
  - name: trusted-keys
    configMap:
      name: {{ $.Values.signing.trustedKeysConfigMap }}
  {{- end }}
  {{- if $encrypts }}
  # The recipients (public keys) payloads are encrypted to: only where snapshots are written.
  - name: encryption-recipients
    configMap:
      name: {{ $.Values.encryption.recipientsConfigMap }}
  {{- end }}
  {{- if $decrypts }}
  # The private key that decrypts payloads: only in the restore controller.
  - name: decryption-key
    secret:
      secretName: {{ $.Values.encryption.decryptionKeySecret }}
      items: [{key: {{ $.Values.encryption.decryptionKeySecretKey }}, path: decryption.agekey}]
  {{- end }}
  {{- if $.Values.s3.caBundle.configMap }}
  - name: s3-ca
    configMap:
      name: {{ $.Values.s3.caBundle.configMap }}
  {{- end }}
  {{- with $.Values.extraVolumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- end }}

{{/* restatus.containerCommon (list $ "controller"): image, environment, mounts, security. */}}
{{- define "restatus.containerCommon" -}}
{{- $ := index . 0 }}
{{- $role := index $.Values (index . 1) -}}
{{- $custom := include "restatus.customProfile" $ | fromJson }}
{{- $signs := and (has (index . 1) (list "backup" "source" "journal")) $.Values.signing.keySecret }}
{{- $trusted := $.Values.signing.trustedKeys }}
{{- if $.Values.signing.trustedKeysConfigMap }}
{{- $trusted = append $trusted "/etc/restatus/trusted-keys" }}
{{- end }}
{{- $recipients := list }}
{{- if has (index . 1) (list "backup" "source" "journal") }}
{{- $recipients = $.Values.encryption.recipients }}
{{- if $.Values.encryption.recipientsConfigMap }}
{{- $recipients = append $recipients "/etc/restatus/encryption-recipients" }}
{{- end }}
{{- end }}
{{- $decrypts := and (eq (index . 1) "controller") $.Values.encryption.decryptionKeySecret }}
{{- $spills := has (index . 1) (list "controller" "journal") }}
image: {{ include "restatus.image" $ }}
imagePullPolicy: {{ $.Values.image.pullPolicy }}
env:
  {{- include "restatus.required" . }}
  - name: RESTATUS_STORAGE
    value: {{ $.Values.storage | quote }}
  - name: RESTATUS_CLUSTER_ID
    {{- if eq (index . 1) "controller" }}
    value: {{ $.Values.controller.restoreFrom | quote }}
    {{- else }}
    value: {{ $.Values.clusterId | quote }}
    {{- end }}
  {{- if $custom }}
  - name: RESTATUS_PROFILE
    value: /etc/restatus/profile/profile.yaml
  {{- end }}
  - name: RESTATUS_LOG_FORMAT
    value: {{ $.Values.logFormat | quote }}
  - name: RUST_LOG
    value: {{ $.Values.logLevel | quote }}
  {{- with $.Values.s3.endpoint }}
  - name: AWS_ENDPOINT_URL
    value: {{ . | quote }}
  {{- end }}
  {{- with $.Values.s3.region }}
  - name: AWS_REGION
    value: {{ . | quote }}
  {{- end }}
  {{- with $.Values.s3.sse.mode }}
  - name: RESTATUS_S3_SSE
    value: {{ . | quote }}
  {{- end }}
  {{- with $.Values.s3.sse.kmsKeyId }}
  - name: RESTATUS_S3_SSE_KMS_KEY_ID
    value: {{ . | quote }}
  {{- end }}
  {{- if not (kindIs "invalid" $.Values.s3.sse.bucketKey) }}
  - name: RESTATUS_S3_SSE_BUCKET_KEY
    value: {{ $.Values.s3.sse.bucketKey | quote }}
  {{- end }}
  {{- if $.Values.s3.caBundle.configMap }}
  - name: RESTATUS_S3_CA_FILE
    value: /etc/restatus/s3-ca/{{ $.Values.s3.caBundle.key }}
  {{- end }}
  {{- if $signs }}
  - name: RESTATUS_SIGNING_KEY
    value: /etc/restatus/signing/signing.key
  {{- end }}
  {{- with $trusted }}
  - name: RESTATUS_TRUSTED_KEYS
    value: {{ join "," . | quote }}
  {{- end }}
  {{- with $recipients }}
  - name: RESTATUS_ENCRYPT_TO
    value: {{ join "," . | quote }}
  {{- end }}
  {{- if $decrypts }}
  - name: RESTATUS_DECRYPTION_KEY
    value: /etc/restatus/decryption/decryption.agekey
  {{- end }}
  {{- if ne (index . 1) "backup" }}
  - name: POD_NAME
    valueFrom: {fieldRef: {fieldPath: metadata.name}}
  - name: POD_NAMESPACE
    valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
  {{- end }}
  {{- with $.Values.extraEnv }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with (include "restatus.s3Secret" .) }}
envFrom:
  - secretRef:
      name: {{ . }}
{{- end }}
{{- $trustsMount := $.Values.signing.trustedKeysConfigMap }}
{{- $recipientsMount := and (has (index . 1) (list "backup" "source" "journal")) $.Values.encryption.recipientsConfigMap }}
{{- if or $spills $.Values.s3.caBundle.configMap $.Values.extraVolumeMounts $signs $trustsMount $custom $recipientsMount $decrypts }}
volumeMounts:
  {{- if $spills }}
  - {name: tmp, mountPath: /tmp}
  {{- end }}
  {{- if $custom }}
  - {name: profile, mountPath: /etc/restatus/profile, readOnly: true}
  {{- end }}
  {{- if $signs }}
  - {name: signing-key, mountPath: /etc/restatus/signing, readOnly: true}
  {{- end }}
  {{- if $trustsMount }}
  - {name: trusted-keys, mountPath: /etc/restatus/trusted-keys, readOnly: true}
  {{- end }}
  {{- if $recipientsMount }}
  - {name: encryption-recipients, mountPath: /etc/restatus/encryption-recipients, readOnly: true}
  {{- end }}
  {{- if $decrypts }}
  - {name: decryption-key, mountPath: /etc/restatus/decryption, readOnly: true}
  {{- end }}
  {{- if $.Values.s3.caBundle.configMap }}
  - name: s3-ca
    mountPath: /etc/restatus/s3-ca
    readOnly: true
  {{- end }}
  {{- with $.Values.extraVolumeMounts }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
resources:
  {{- toYaml $role.resources | nindent 2 }}
securityContext:
  {{- toYaml $.Values.securityContext | nindent 2 }}
{{- end }}

{{/* restatus.serviceAccount (list $ "controller"): the role's ServiceAccount, unless it is not
to be created (its serviceAccount.create, else serviceAccount.create). */}}
{{- define "restatus.serviceAccount" -}}
{{- $ := index . 0 }}
{{- $role := index $.Values (index . 1) -}}
{{- $create := $role.serviceAccount.create }}
{{- if kindIs "invalid" $create }}
{{- $create = $.Values.serviceAccount.create }}
{{- end }}
{{- if $create -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "restatus.serviceAccountName" . }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "restatus.roleLabels" . | nindent 4 }}
  {{- with (merge (dict) $role.serviceAccount.annotations $.Values.serviceAccount.annotations) }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}
{{- end }}

{{/* restatus.serviceAccountName (list $ "controller"): the ServiceAccount a role runs as, which
its RBAC bindings and admission policy name: the role's serviceAccount.name, else
serviceAccount.name when this is the one role enabled, else the role's name. */}}
{{- define "restatus.serviceAccountName" -}}
{{- $ := index . 0 }}
{{- $name := (index $.Values (index . 1)).serviceAccount.name }}
{{- if and (not $name) $.Values.serviceAccount.name }}
{{- $enabled := list }}
{{- range $r := list "backup" "controller" "source" "journal" }}
{{- if (index $.Values $r).enabled }}
{{- $enabled = append $enabled $r }}
{{- end }}
{{- end }}
{{- if gt (len $enabled) 1 }}
{{- fail (printf "serviceAccount.name names one ServiceAccount, but %s are enabled and each runs as its own (least privilege): set %s.serviceAccount.name instead" (join ", " $enabled) (join ".serviceAccount.name, " $enabled)) }}
{{- end }}
{{- $name = $.Values.serviceAccount.name }}
{{- end }}
{{- $name = default (include "restatus.roleName" .) $name }}
{{- if eq $name "default" }}
{{- fail (printf "%s: the ServiceAccount \"default\" is every namespace's, and the admission policies match a ServiceAccount by name in any namespace: name one only restatus uses" (index . 1)) }}
{{- end }}
{{- $name }}
{{- end }}

{{/* The built-in metal-operator profile's kinds (in the order manifests/ lists them). */}}
{{- define "restatus.builtinKinds" -}}
- {group: metal.ironcore.dev, version: v1alpha1, kind: Server, plural: servers, namespaced: false}
- {group: metal.ironcore.dev, version: v1alpha1, kind: BMC, plural: bmcs, namespaced: false}
- {group: metal.ironcore.dev, version: v1alpha1, kind: ServerClaim, plural: serverclaims, namespaced: true}
- {group: metal.ironcore.dev, version: v1alpha1, kind: Endpoint, plural: endpoints, namespaced: false}
- {group: metal.ironcore.dev, version: v1alpha1, kind: ServerMaintenance, plural: servermaintenances, namespaced: true}
- {group: metal.ironcore.dev, version: v1alpha1, kind: ServerBootConfiguration, plural: serverbootconfigurations, namespaced: true}
{{- end }}

{{/* restatus.customProfile: profile.custom as JSON ({} when empty), whether given as YAML
under the key or as a file's text (--set-file). */}}
{{- define "restatus.customProfile" -}}
{{- $p := .Values.profile.custom }}
{{- if kindIs "string" $p }}
{{- $p = fromYaml $p }}
{{- if hasKey $p "Error" }}
{{- fail (printf "profile.custom is not a valid profile (YAML or JSON): %s" (get $p "Error")) }}
{{- end }}
{{- end }}
{{- toJson (default (dict) $p) }}
{{- end }}

{{/* restatus.profileKinds: {"kinds": [{group, plural, namespaced}, ...]}, the kinds of the
profile the roles run with (profile.custom, else the built-in one) that RBAC and the admission
policies cover: the group "core" as "", the plural defaulted as restatus defaults it (the
lower-cased kind and "s"), Secret and BMCSecret left out as restatus leaves them out. */}}
{{- define "restatus.profileKinds" -}}
{{- $custom := include "restatus.customProfile" . | fromJson }}
{{- $kinds := list }}
{{- if $custom }}
{{- $listed := get $custom "kinds" }}
{{- if not (kindIs "slice" $listed) }}
{{- fail "profile.custom lists no kinds: give it name and kinds as a profile file has them (docs/FORMAT.md#identity-profiles)" }}
{{- end }}
{{- if not $listed }}
{{- fail "profile.custom lists no kinds: give it name and kinds as a profile file has them (docs/FORMAT.md#identity-profiles)" }}
{{- end }}
{{- range $listed }}
{{- $kind := toString (get . "kind") }}
{{- if or (not (get . "kind")) (not (get . "version")) }}
{{- fail (printf "profile.custom: every kind needs kind and version (%s)" (toJson .)) }}
{{- end }}
{{- $group := toString (default "" (get . "group")) }}
{{- if eq (lower $group) "core" }}{{ $group = "" }}{{ end }}
{{- $plural := toString (default (printf "%ss" (lower $kind)) (get . "plural")) }}
{{- $denied := false }}
{{- range list (list "" "secret") (list "metal.ironcore.dev" "bmcsecret") }}
{{- if and (eq (lower $group) (index . 0)) (or (eq (lower $kind) (index . 1)) (eq (lower $plural) (printf "%ss" (index . 1)))) }}
{{- $denied = true }}
{{- end }}
{{- end }}
{{- if not $denied }}
{{- $kinds = append $kinds (dict "group" $group "plural" $plural "namespaced" (eq (toString (get . "namespaced")) "true")) }}
{{- end }}
{{- end }}
{{- if not $kinds }}
{{- fail "profile.custom lists only kinds restatus never captures (Secret, BMCSecret)" }}
{{- end }}
{{- else }}
{{- $kinds = include "restatus.builtinKinds" . | fromYamlArray }}
{{- end }}
{{- toJson (dict "kinds" $kinds) }}
{{- end }}

{{/* restatus.profileGroups: {"groups": [{group, plurals: [...]}, ...]}: the profile's kinds by
API group, in the order the groups first appear. */}}
{{- define "restatus.profileGroups" -}}
{{- $groups := list }}
{{- $seen := dict }}
{{- $kinds := (include "restatus.profileKinds" . | fromJson).kinds }}
{{- range $kinds }}
{{- $g := .group }}
{{- if not (hasKey $seen $g) }}
{{- $_ := set $seen $g true }}
{{- $plurals := list }}
{{- range $kinds }}{{ if eq .group $g }}{{ $plurals = append $plurals .plural }}{{ end }}{{ end }}
{{- $groups = append $groups (dict "group" $g "plurals" $plurals) }}
{{- end }}
{{- end }}
{{- toJson (dict "groups" $groups) }}
{{- end }}

{{/* restatus.profileRules (list $ (list "get" "list") ""): RBAC rules granting the verbs on
each of the profile's kinds, one rule per API group; the third item, "status", grants them on
the kinds' status subresources instead. */}}
{{- define "restatus.profileRules" -}}
{{- $ := index . 0 }}
{{- $verbs := index . 1 }}
{{- $sub := index . 2 }}
{{- range (include "restatus.profileGroups" $ | fromJson).groups }}
- apiGroups: [{{ .group | quote }}]
  resources:
    {{- range .plurals }}
    - {{ if $sub }}{{ printf "%s/%s" . $sub }}{{ else }}{{ . }}{{ end }}
    {{- end }}
  verbs: {{ toJson $verbs }}
{{- end }}
{{- end }}

{{/* restatus.profilePolicyRules: the admission policies' resourceRules for the profile's
kinds (every version, updates), one per API group. */}}
{{- define "restatus.profilePolicyRules" -}}
{{- range (include "restatus.profileGroups" . | fromJson).groups }}
- apiGroups: [{{ .group | quote }}]
  apiVersions: ["*"]
  operations: ["UPDATE"]
  resources: {{ toJson .plurals }}
{{- end }}
{{- end }}

{{/* restatus.required (list $ "controller"): fails the render, naming the value to set, when a
value the role needs has no value: no default pretends to be a bucket or a cluster id. */}}
{{- define "restatus.required" -}}
{{- $ := index . 0 }}
{{- $role := index . 1 }}
{{- if not $.Values.storage }}
{{- fail "set storage: the bucket and prefix of the snapshots, s3://bucket/prefix (--set storage=s3://my-bucket/restatus); every cluster that shares snapshots names the same" }}
{{- end }}
{{- if not (hasPrefix "s3://" (toString $.Values.storage)) }}
{{- fail (printf "storage %q is not s3://bucket/prefix" (toString $.Values.storage)) }}
{{- end }}
{{- if eq $role "controller" }}
{{- if not $.Values.controller.restoreFrom }}
{{- fail "set controller.restoreFrom: the id of the cluster whose snapshots the controller restores, the SOURCE cluster's clusterId (--set controller.restoreFrom=mgmt-eu1)" }}
{{- end }}
{{- else if not $.Values.clusterId }}
{{- fail (printf "set clusterId: this cluster's id, the one the %s role's snapshots are taken under (--set clusterId=mgmt-eu1)" $role) }}
{{- end }}
{{- end }}

{{/* restatus.annotationsOnlyValidations (list $ "controller"): the validations both admission
policies share: no change to spec, labels, owner references or finalizers, no annotation but
the allowed ones, and a user's metal-operator operation kept (or moved to operation-was). */}}
{{- define "restatus.annotationsOnlyValidations" -}}
{{- $who := include "restatus.roleName" . -}}
- expression: "!has(object.spec) && !has(oldObject.spec) || has(object.spec) && has(oldObject.spec) && object.spec == oldObject.spec"
  message: {{ $who }} may not change spec
- expression: >-
    (has(object.metadata.labels) ? object.metadata.labels : {}) ==
    (has(oldObject.metadata.labels) ? oldObject.metadata.labels : {})
  message: {{ $who }} may not change labels
- expression: >-
    variables.new.all(k, k in variables.allowed || (k in variables.old && variables.old[k] == variables.new[k])) &&
    variables.old.all(k, k in variables.allowed || k in variables.new)
  message: {{ $who }} may change only restatus's annotations
- expression: >-
    variables.newOp == variables.oldOp ||
    (variables.newOp == 'ignore' && 'restatus.ironcore.dev/quiesced-by' in variables.new &&
     variables.newWas == variables.oldOp) ||
    (variables.oldOp == 'ignore' && 'restatus.ironcore.dev/quiesced-by' in variables.old &&
     !('restatus.ironcore.dev/quiesced-by' in variables.new) && variables.newOp == variables.oldWas)
  message: >-
    {{ $who }} may not remove or change an operation it did not set: it may only set ignore
    together with quiesced-by (keeping the old value in operation-was) and, on release, put
    back exactly the value operation-was kept
- expression: >-
    variables.newWas == variables.oldWas || variables.newWas == '' ||
    (variables.newOp == 'ignore' && 'restatus.ironcore.dev/quiesced-by' in variables.new &&
     variables.newWas == variables.oldOp)
  message: {{ $who }} may set operation-was only to the operation it replaces with its ignore
- expression: >-
    !('restatus.ironcore.dev/quiesced-by' in variables.new) || 'restatus.ironcore.dev/quiesced-by' in variables.old ||
    (variables.oldOp != 'ignore' && variables.newOp == 'ignore')
  message: {{ $who }} may mark as its own only an ignore it sets in the same request
- expression: >-
    (has(object.metadata.ownerReferences) ? object.metadata.ownerReferences : []) ==
    (has(oldObject.metadata.ownerReferences) ? oldObject.metadata.ownerReferences : []) &&
    (has(object.metadata.finalizers) ? object.metadata.finalizers : []) ==
    (has(oldObject.metadata.finalizers) ? oldObject.metadata.finalizers : [])
  message: {{ $who }} may not change owner references or finalizers
{{- end }}

{{/* restatus.alertLabels (list $ "warning"): an alert's severity and prometheusRule.additionalLabels. */}}
{{- define "restatus.alertLabels" -}}
{{- toYaml (merge (dict "severity" (index . 1)) (index . 0).Values.prometheusRule.additionalLabels) }}
{{- end }}

{{/* restatus.pdb (list $ "controller"): a PodDisruptionBudget for a role of more than one replica,
so that a drain never takes the leader and its standby at once. */}}
{{- define "restatus.pdb" -}}
{{- $ := index . 0 }}
{{- $role := index $.Values (index . 1) }}
{{- if and $role.podDisruptionBudget.enabled (gt (int $role.replicas) 1) }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "restatus.roleName" . }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "restatus.roleLabels" . | nindent 4 }}
spec:
  maxUnavailable: {{ $role.podDisruptionBudget.maxUnavailable }}
  {{- with $role.podDisruptionBudget.unhealthyPodEvictionPolicy }}
  unhealthyPodEvictionPolicy: {{ . }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "restatus.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end }}

{{/* restatus.monitoringOn (list $ .Values.metrics.podMonitor): "true" when the object is enabled
and prometheus-operator's API (monitoring.coreos.com/v1) is served, or `force` asks for it anyway
(`helm template` without --api-versions, or the CRDs installed in the same run). */}}
{{- define "restatus.monitoringOn" -}}
{{- $ := index . 0 }}
{{- $v := index . 1 }}
{{- if and $v.enabled (or $v.force ($.Capabilities.APIVersions.Has "monitoring.coreos.com/v1")) }}true{{ end }}
{{- end }}

{{/* restatus.profileAnnotation: the custom profile's digest as a pod annotation, so that a
changed profile rolls the Deployments (restatus reads it at start); nothing for the built-in one. */}}
{{- define "restatus.profileAnnotation" -}}
{{- if (include "restatus.customProfile" . | fromJson) }}
restatus.ironcore.dev/profile-sha256: {{ include "restatus.customProfile" . | sha256sum | quote }}
{{- end }}
{{- end }}

{{/* restatus.podChecksums (list $ "controller"): pod annotations that roll a Deployment when what
its pods read at start changes: the custom profile, and the S3 Secret when the chart makes it
(s3.accessKeyId/secretAccessKey) and the role uses it. A Secret of the user's (existingSecret)
is not the chart's to watch: restart the Deployments after changing it. */}}
{{- define "restatus.podChecksums" -}}
{{- $ := index . 0 }}
{{- include "restatus.profileAnnotation" $ }}
{{- if eq (include "restatus.s3Secret" .) (include "restatus.roleName" (list $ "s3")) }}
restatus.ironcore.dev/s3-secret-sha256: {{ include (print $.Template.BasePath "/secret.yaml") $ | sha256sum | quote }}
{{- end }}
{{- end }}
