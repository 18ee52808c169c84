//! Identity keys: how restatus finds an object again on another cluster without its uid.
//!
//! A [`Profile`] says, per kind, which fields form the key; the first non-empty one wins and
//! becomes the primary key, the others are kept as alternates. The built-in `metal-operator`
//! profile keys Servers by system UUID, BMCs by BMC UUID, MAC or serial, Endpoints by MAC and
//! everything else by namespace/name. Pure code: no I/O beyond reading a profile file's text.

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::domain::object::RawObject;
use crate::format::IdentityKey;

/// The pseudo path of the namespace/name key.
pub const NAMESPACED_NAME: &str = "namespace/name";

/// Kinds that are never captured, whatever a profile says: they hold credentials.
pub const DENIED_KINDS: &[(&str, &str)] = &[("", "Secret"), ("metal.ironcore.dev", "BMCSecret")];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KeyField {
    /// A dotted path (`spec.systemUUID`) or `namespace/name`.
    pub path: String,
    /// Compare case-insensitively (UUIDs, MAC addresses).
    #[serde(default)]
    pub lowercase: bool,
}

impl KeyField {
    pub fn new(path: &str, lowercase: bool) -> Self {
        KeyField { path: path.to_string(), lowercase }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KindProfile {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub kind: String,
    /// Resource name in URLs; defaults to the lower-cased kind plus `s`.
    #[serde(default)]
    pub plural: String,
    #[serde(default)]
    pub namespaced: bool,
    /// Key fields, first non-empty wins. Empty means namespace/name.
    #[serde(default)]
    pub keys: Vec<KeyField>,
    /// When a live status still counts as initial (a controller just started on it), so a
    /// restore may overwrite it. An empty status always counts as initial.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_states: Option<StateSet>,
    /// States in which an object is still settling: a capture that sees one is inconsistent
    /// and a move is not safe yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transitional_states: Option<StateSet>,
    /// Whether `clusterctl move` must carry this kind's objects to the target (the default).
    /// `false` for a kind its controller rebuilds on the target: preflight and the move
    /// handshake then do not ask for it to be in the move.
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub moves: bool,
}

fn yes() -> bool {
    true
}

fn is_yes(value: &bool) -> bool {
    *value
}

/// A status is in one of these states when the string at `path` (inside the status) is one of
/// `values`; an absent field reads as "".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StateSet {
    pub path: String,
    pub values: Vec<String>,
}

impl StateSet {
    fn new(path: &str, values: &[&str]) -> Self {
        StateSet { path: path.into(), values: values.iter().map(|v| v.to_string()).collect() }
    }
}

/// Cluster API's group, and the version restatus reads it in (the one clusterctl v1.13 serves).
pub const CAPI_GROUP: &str = "cluster.x-k8s.io";
const CAPI_VERSION: &str = "v1beta2";

impl KindProfile {
    /// A namespaced Cluster API kind (Cluster, Machine): read by preflight and the handshake,
    /// never captured, so no keys and no states.
    pub fn cluster_api(kind: &str, plural: &str) -> Self {
        KindProfile {
            group: CAPI_GROUP.into(),
            version: CAPI_VERSION.into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced: true,
            keys: vec![],
            initial_states: None,
            transitional_states: None,
            moves: true,
        }
    }

    fn new(kind: &str, plural: &str, namespaced: bool, keys: Vec<KeyField>) -> Self {
        KindProfile {
            group: METAL_GROUP.into(),
            version: "v1alpha1".into(),
            kind: kind.into(),
            plural: plural.into(),
            namespaced,
            keys,
            initial_states: None,
            transitional_states: None,
            moves: true,
        }
    }

    fn with_transitional(mut self, path: &str, values: &[&str]) -> Self {
        self.transitional_states = Some(StateSet::new(path, values));
        self
    }

    fn with_initial(mut self, path: &str, values: &[&str]) -> Self {
        self.initial_states = Some(StateSet::new(path, values));
        self
    }

    /// The state of an object that is still settling (Server `Initial` or `Discovery`).
    pub fn transitional_state(&self, object: &RawObject<'_>) -> Option<String> {
        let states = self.transitional_states.as_ref()?;
        let state = object.string_at(&format!("status.{}", states.path))?;
        states.values.contains(&state).then_some(state)
    }

    /// Whether a live status (JSON) is empty or in one of the kind's initial states.
    pub fn is_initial_status(&self, status: Option<&serde_json::Value>) -> bool {
        let Some(status) = status.filter(|s| !s.is_null() && s.as_object().is_none_or(|o| !o.is_empty())) else {
            return true;
        };
        let Some(initial) = &self.initial_states else { return false };
        let value = initial.path.split('.').try_fold(status, |v, part| v.get(part));
        let text = match value {
            None | Some(serde_json::Value::Null) => "",
            Some(serde_json::Value::String(s)) => s.as_str(),
            Some(_) => return false,
        };
        initial.values.iter().any(|v| v == text)
    }

    /// The same kind at another version of its group.
    pub fn at_version(&self, version: &str) -> KindProfile {
        KindProfile { version: version.into(), ..self.clone() }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// `Kind.group` (`Server.metal.ironcore.dev`), or `Kind` for the core group.
    pub fn qualified_kind(&self) -> String {
        if self.group.is_empty() { self.kind.clone() } else { format!("{}.{}", self.kind, self.group) }
    }

    /// The collection URL across all namespaces.
    pub fn list_path(&self) -> String {
        self.list_path_in(None)
    }

    /// The collection URL in one namespace (namespaced kinds), or across all.
    pub fn list_path_in(&self, namespace: Option<&str>) -> String {
        let base = if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        };
        match namespace.filter(|_| self.namespaced) {
            Some(ns) => format!("{base}/namespaces/{ns}/{}", self.plural),
            None => format!("{base}/{}", self.plural),
        }
    }

    pub fn is_denied(&self) -> bool {
        // Compared without case, by kind and by plural, with `core` as the core group's other
        // name: no spelling of a credential kind reaches its URL.
        let group = if self.group.eq_ignore_ascii_case("core") { "" } else { self.group.as_str() };
        DENIED_KINDS.iter().any(|(denied_group, kind)| {
            group.eq_ignore_ascii_case(denied_group)
                && (self.kind.eq_ignore_ascii_case(kind) || self.plural.eq_ignore_ascii_case(&format!("{kind}s")))
        })
    }

    /// Every non-empty key of the object, in profile order: the first is the primary key.
    pub fn keys_of(&self, object: &RawObject<'_>) -> Vec<IdentityKey> {
        let default = [KeyField::new(NAMESPACED_NAME, false)];
        let fields = if self.keys.is_empty() { &default[..] } else { &self.keys[..] };
        fields
            .iter()
            .filter_map(|field| {
                let value = if field.path == NAMESPACED_NAME {
                    Some(object.namespaced_name()).filter(|n| !n.is_empty())
                } else {
                    object.string_at(&field.path)
                }?;
                let value = if field.lowercase { value.to_lowercase() } else { value };
                Some(IdentityKey { field: field.path.clone(), value })
            })
            .collect()
    }
}

const METAL_GROUP: &str = "metal.ironcore.dev";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Profile {
    pub name: String,
    pub kinds: Vec<KindProfile>,
}

impl Profile {
    /// The built-in profile for metal-operator (`metal.ironcore.dev/v1alpha1`).
    pub fn metal_operator() -> Profile {
        let nn = || vec![KeyField::new(NAMESPACED_NAME, false)];
        Profile {
            name: "metal-operator".into(),
            kinds: vec![
                KindProfile::new(
                    "BMC",
                    "bmcs",
                    false,
                    vec![
                        KeyField::new("spec.bmcUUID", true),
                        KeyField::new("spec.access.macAddress", true),
                        KeyField::new("status.serialNumber", false),
                    ],
                )
                .with_initial("state", &["", "Pending"]),
                // metal-operator sends a Server with empty status to Initial, then Discovery.
                KindProfile::new("Server", "servers", false, vec![KeyField::new("spec.systemUUID", true)])
                    .with_initial("state", &["", "Initial", "Discovery"])
                    .with_transitional("state", &["Initial", "Discovery"]),
                KindProfile::new("ServerClaim", "serverclaims", true, nn()).with_initial("phase", &["", "Unbound"]),
                KindProfile::new("Endpoint", "endpoints", false, vec![KeyField::new("spec.macAddress", true)]),
                KindProfile::new("ServerMaintenance", "servermaintenances", true, nn()),
                // metal-operator's own controller sets `Pending` on a ServerBootConfiguration
                // without status at once, `ignore` or not (seen on the test bed, e2e/operator.rs).
                KindProfile::new("ServerBootConfiguration", "serverbootconfigurations", true, nn())
                    .with_initial("state", &["", "Pending"]),
            ],
        }
    }

    /// `metal-operator` (built in) or a path to a YAML or JSON profile file.
    pub fn load(spec: &str) -> Result<Profile, Error> {
        if spec == "metal-operator" {
            return Ok(Profile::metal_operator());
        }
        let text = std::fs::read_to_string(spec)
            .map_err(|e| Error::Profile { source_name: spec.into(), reason: format!("cannot read: {e}") })?;
        Profile::parse(spec, &text)
    }

    /// Parses profile text (YAML, of which JSON is a subset) and validates it.
    pub fn parse(source_name: &str, text: &str) -> Result<Profile, Error> {
        let err = |reason: String| Error::Profile { source_name: source_name.into(), reason };
        let mut profile: Profile =
            serde_saphyr::from_str(text).map_err(|e| err(format!("not a valid profile: {e}")))?;
        if profile.kinds.is_empty() {
            return Err(err("lists no kinds".into()));
        }
        for kind in &mut profile.kinds {
            if kind.kind.is_empty() || kind.version.is_empty() {
                return Err(err("every kind needs `kind` and `version`".into()));
            }
            if kind.plural.is_empty() {
                kind.plural = format!("{}s", kind.kind.to_lowercase());
            }
            validate_names(kind).map_err(|reason| err(format!("{}: {reason}", kind.kind)))?;
            if let Some(bad) = kind.keys.iter().find(|k| k.path.is_empty() || k.path.split('.').any(str::is_empty)) {
                return Err(err(format!("{}: key path {:?} is not a dotted path", kind.kind, bad.path)));
            }
        }
        Ok(profile)
    }

    pub fn kind(&self, kind: &str) -> Option<&KindProfile> {
        self.kinds.iter().find(|k| k.kind == kind)
    }
}

/// Group, version and plural become parts of a URL path: each must be what the API server
/// accepts (a DNS subdomain; DNS labels), so nothing else can reach a URL.
fn validate_names(kind: &KindProfile) -> Result<(), String> {
    let label = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    };
    if !kind.kind.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(format!("kind {:?} is not alphanumeric", kind.kind));
    }
    if !kind.group.is_empty() && (kind.group.len() > 253 || !kind.group.split('.').all(label)) {
        return Err(format!("group {:?} is not a DNS subdomain", kind.group));
    }
    if !label(&kind.version) {
        return Err(format!("version {:?} is not a DNS label", kind.version));
    }
    if !label(&kind.plural) {
        return Err(format!("plural {:?} is not a lowercase DNS label", kind.plural));
    }
    Ok(())
}
#[cfg(test)]
mod tests {
    use super::*;

    fn keys(kind: &str, json: &str) -> Vec<String> {
        let profile = Profile::metal_operator();
        let obj = RawObject::parse(json).unwrap();
        profile.kind(kind).unwrap().keys_of(&obj).iter().map(|k| k.to_string()).collect()
    }

    #[test]
    fn server_is_keyed_by_lowercased_system_uuid() {
        let k = keys("Server", r#"{"metadata":{"name":"s1"},"spec":{"systemUUID":"38A1-BEEF"}}"#);
        assert_eq!(k, ["spec.systemUUID=38a1-beef"]);
        assert!(keys("Server", r#"{"metadata":{"name":"s1"},"spec":{}}"#).is_empty());
    }

    #[test]
    fn bmc_falls_back_from_uuid_to_mac_to_serial() {
        let full = r#"{"metadata":{"name":"b"},"spec":{"bmcUUID":"U-1","access":{"macAddress":"AA:BB"}},"status":{"serialNumber":"SN1"}}"#;
        assert_eq!(keys("BMC", full), ["spec.bmcUUID=u-1", "spec.access.macAddress=aa:bb", "status.serialNumber=SN1"]);
        let mac =
            r#"{"metadata":{"name":"b"},"spec":{"access":{"macAddress":"AA:BB"}},"status":{"serialNumber":"SN1"}}"#;
        assert_eq!(keys("BMC", mac)[0], "spec.access.macAddress=aa:bb");
        let serial = r#"{"metadata":{"name":"b"},"spec":{"bmcUUID":""},"status":{"serialNumber":"SN1"}}"#;
        assert_eq!(keys("BMC", serial), ["status.serialNumber=SN1"]);
    }

    #[test]
    fn claims_are_keyed_by_namespace_and_name() {
        let k = keys("ServerClaim", r#"{"metadata":{"name":"c1","namespace":"team-a"},"spec":{}}"#);
        assert_eq!(k, ["namespace/name=team-a/c1"]);
    }

    #[test]
    fn endpoint_is_keyed_by_mac() {
        let k = keys("Endpoint", r#"{"metadata":{"name":"e"},"spec":{"macAddress":"AA:BB:CC:00:11:22"}}"#);
        assert_eq!(k, ["spec.macAddress=aa:bb:cc:00:11:22"]);
    }

    #[test]
    fn secrets_are_denied_whatever_the_profile() {
        let profile = Profile::parse(
            "test",
            "name: t\nkinds:\n- {group: metal.ironcore.dev, version: v1alpha1, kind: BMCSecret}\n- {version: v1, kind: Secret, namespaced: true}\n- {group: apps, version: v1, kind: Deployment, namespaced: true}\n",
        )
        .unwrap();
        let denied: Vec<bool> = profile.kinds.iter().map(KindProfile::is_denied).collect();
        assert_eq!(denied, [true, true, false]);
        assert_eq!(profile.kinds[1].list_path(), "/api/v1/secrets");
        assert_eq!(profile.kinds[2].list_path(), "/apis/apps/v1/deployments");
        assert_eq!(profile.kinds[2].list_path_in(Some("x")), "/apis/apps/v1/namespaces/x/deployments");
        assert_eq!(
            profile.kinds[0].list_path_in(Some("x")),
            "/apis/metal.ironcore.dev/v1alpha1/bmcsecrets",
            "cluster-scoped"
        );
    }

    #[test]
    fn user_profile_with_custom_keys() {
        let profile = Profile::parse(
            "p.yaml",
            r#"
name: widgets
kinds:
  - group: example.com
    version: v1
    kind: Widget
    plural: widgets
    keys:
      - {path: spec.serial, lowercase: true}
      - {path: namespace/name}
"#,
        )
        .unwrap();
        let widget = &profile.kinds[0];
        let obj = RawObject::parse(r#"{"metadata":{"name":"w"},"spec":{"serial":"XY"}}"#).unwrap();
        let k: Vec<String> = widget.keys_of(&obj).iter().map(ToString::to_string).collect();
        assert_eq!(k, ["spec.serial=xy", "namespace/name=w"]);
    }

    #[test]
    fn a_kind_moves_unless_the_profile_says_moves_false() {
        let profile = Profile::parse(
            "p.yaml",
            r#"
name: widgets
kinds:
  - {group: example.com, version: v1, kind: Widget, plural: widgets}
  - {group: example.com, version: v1, kind: Gadget, plural: gadgets, moves: false}
"#,
        )
        .unwrap();
        assert!(profile.kind("Widget").unwrap().moves);
        assert!(!profile.kind("Gadget").unwrap().moves);
        assert!(Profile::metal_operator().kinds.iter().all(|k| k.moves), "every built-in kind moves");
    }

    #[test]
    fn initial_statuses_per_kind() {
        let profile = Profile::metal_operator();
        let server = profile.kind("Server").unwrap();
        let json = |s: &str| serde_json::from_str::<serde_json::Value>(s).unwrap();
        assert!(server.is_initial_status(None));
        assert!(server.is_initial_status(Some(&json("{}"))));
        assert!(server.is_initial_status(Some(&json("null"))));
        assert!(server.is_initial_status(Some(&json(r#"{"state":"Initial","powerState":"Off"}"#))));
        assert!(server.is_initial_status(Some(&json(r#"{"state":"Discovery"}"#))));
        assert!(server.is_initial_status(Some(&json(r#"{"powerState":"Off"}"#))), "no state yet");
        assert!(!server.is_initial_status(Some(&json(r#"{"state":"Available"}"#))));
        assert!(!server.is_initial_status(Some(&json(r#"{"state":{"odd":1}}"#))));
        let claim = profile.kind("ServerClaim").unwrap();
        assert!(claim.is_initial_status(Some(&json(r#"{"phase":"Unbound"}"#))));
        assert!(!claim.is_initial_status(Some(&json(r#"{"phase":"Bound"}"#))));
        let endpoint = profile.kind("Endpoint").unwrap();
        assert!(!endpoint.is_initial_status(Some(&json(r#"{"state":""}"#))), "no initial states: only empty counts");
    }

    #[test]
    fn bad_profiles_name_the_file_and_the_problem() {
        let cases = [
            ("name: x\nkinds: []\n", "lists no kinds"),
            ("name: x\nkinds:\n- {version: v1}\n", "not a valid profile"),
            ("name: x\nkinds:\n- {version: v1, kind: A, keys: [{path: 'spec..x'}]}\n", "not a dotted path"),
            ("name: x\nkinds:\n- {version: v1, kind: A, colour: red}\n", "not a valid profile"),
            (": : :", "not a valid profile"),
        ];
        for (text, expected) in cases {
            let err = Profile::parse("bad.yaml", text).unwrap_err().to_string();
            assert!(err.starts_with("profile bad.yaml: "), "{err}");
            assert!(err.contains(expected), "{text:?}: {err}");
        }
        let missing = Profile::load("/nonexistent/profile.yaml").unwrap_err().to_string();
        assert!(missing.contains("/nonexistent/profile.yaml") && missing.contains("cannot read"), "{missing}");
    }

    #[test]
    fn no_spelling_of_a_secret_kind_is_captured() {
        for spelling in [
            "{version: v1, kind: secret, namespaced: true}",
            "{group: core, version: v1, kind: Secret}",
            "{version: v1, kind: Opaque, plural: secrets}",
            "{version: v1, kind: SECRET, plural: secrets}",
            "{group: metal.ironcore.dev, version: v1alpha1, kind: bmcsecret}",
            "{group: METAL.ironcore.dev, version: v1alpha1, kind: Thing, plural: bmcsecrets}",
        ] {
            let text = format!("name: t\nkinds:\n- {spelling}\n");
            match Profile::parse("t", &text) {
                Ok(profile) => assert!(profile.kinds[0].is_denied(), "{spelling} must be denied"),
                Err(e) => assert!(e.to_string().contains("not a"), "{spelling}: {e}"),
            }
        }
    }

    #[test]
    fn names_that_would_reach_a_url_are_validated() {
        for (spelling, problem) in [
            ("{group: 'a/b', version: v1, kind: X}", "group \"a/b\" is not a DNS subdomain"),
            ("{version: '../v1', kind: X}", "version \"../v1\" is not a DNS label"),
            ("{version: v1, kind: X, plural: 'x?watch=1'}", "plural \"x?watch=1\" is not a lowercase DNS label"),
            ("{version: v1, kind: X, plural: Xs}", "plural \"Xs\" is not a lowercase DNS label"),
            ("{version: v1, kind: 'X/y'}", "kind \"X/y\" is not alphanumeric"),
        ] {
            let err = Profile::parse("p.yaml", &format!("name: t\nkinds:\n- {spelling}\n")).unwrap_err().to_string();
            assert!(err.contains("p.yaml") && err.contains(problem), "{spelling}: {err}");
        }
    }
}
