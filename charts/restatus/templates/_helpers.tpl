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
serviceAccountName: {{ include "restatus.roleName" . }}
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
{{- $signs := and (has $roleName (list "backup" "source")) $.Values.signing.keySecret }}
{{- $trusts := and (eq $roleName "controller") $.Values.signing.trustedKeysConfigMap }}
{{- if or (eq $roleName "controller") $.Values.s3.caBundle.configMap $.Values.extraVolumes $signs $trusts }}
volumes:
  {{- if eq $roleName "controller" }}
  # Snapshot payloads are spilled here while in use (the root filesystem is read-only).
  - name: tmp
    emptyDir: {sizeLimit: 1Gi}
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
{{- $signs := and (has (index . 1) (list "backup" "source")) $.Values.signing.keySecret }}
{{- $trusted := list }}
{{- if eq (index . 1) "controller" }}
{{- $trusted = $.Values.signing.trustedKeys }}
{{- if $.Values.signing.trustedKeysConfigMap }}
{{- $trusted = append $trusted "/etc/restatus/trusted-keys" }}
{{- end }}
{{- end }}
image: {{ include "restatus.image" $ }}
imagePullPolicy: {{ $.Values.image.pullPolicy }}
env:
  - name: RESTATUS_STORAGE
    value: {{ required "storage (s3://bucket/prefix) is required" $.Values.storage | quote }}
  - name: RESTATUS_CLUSTER_ID
    {{- if and (eq (index . 1) "controller") $.Values.controller.restoreFrom }}
    value: {{ $.Values.controller.restoreFrom | quote }}
    {{- else }}
    value: {{ required "clusterId is required" $.Values.clusterId | quote }}
    {{- end }}
  {{- with $.Values.profile }}
  - name: RESTATUS_PROFILE
    value: {{ . | quote }}
  {{- end }}
  - name: RESTATUS_LOG_FORMAT
    value: {{ $.Values.logFormat | quote }}
  {{- with $.Values.s3.endpoint }}
  - name: AWS_ENDPOINT_URL
    value: {{ . | quote }}
  {{- end }}
  {{- with $.Values.s3.region }}
  - name: AWS_REGION
    value: {{ . | quote }}
  {{- end }}
  {{- if $.Values.s3.caBundle.configMap }}
  - name: SSL_CERT_FILE
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
{{- $trustsMount := and (eq (index . 1) "controller") $.Values.signing.trustedKeysConfigMap }}
{{- if or (eq (index . 1) "controller") $.Values.s3.caBundle.configMap $.Values.extraVolumeMounts $signs $trustsMount }}
volumeMounts:
  {{- if eq (index . 1) "controller" }}
  - {name: tmp, mountPath: /tmp}
  {{- end }}
  {{- if $signs }}
  - {name: signing-key, mountPath: /etc/restatus/signing, readOnly: true}
  {{- end }}
  {{- if $trustsMount }}
  - {name: trusted-keys, mountPath: /etc/restatus/trusted-keys, readOnly: true}
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

{{/* restatus.serviceAccount (list $ "controller") */}}
{{- define "restatus.serviceAccount" -}}
{{- $ := index . 0 }}
{{- $role := index $.Values (index . 1) -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "restatus.roleName" . }}
  namespace: {{ $.Release.Namespace }}
  labels:
    {{- include "restatus.roleLabels" . | nindent 4 }}
  {{- with (merge (dict) $role.serviceAccount.annotations $.Values.serviceAccount.annotations) }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* The metal-operator kinds of the built-in profile, as RBAC resources. */}}
{{- define "restatus.profileResources" -}}
[servers, bmcs, serverclaims, endpoints, servermaintenances, serverbootconfigurations]
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
