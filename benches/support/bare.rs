//! The bare restore: the writes `restatus restore` makes per object, made the way restatus
//! makes them, with no planning and no Events. It is the baseline of every "restore / bare
//! loop" ratio in BENCHMARKS.md (`benches/restore.rs`, `benches/adaptive.rs`), and its release
//! is the one `benches/writes.rs` prices: one implementation, so the ratios compare with the
//! same loop.

use std::collections::HashMap;

use futures::{StreamExt, stream};
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use restatus::backup::{self, BackupOptions};
use restatus::domain::annotations::{
    OPERATION_ANNOTATION, OPERATION_IGNORE, QUIESCED_BY_ANNOTATION, RESTORED_FROM_ANNOTATION,
};
use restatus::domain::identity::{KindProfile, Profile};
use restatus::fleet::FLEET_LABEL;
use restatus::format::Record;
use restatus::store::{SnapshotStore, choose_snapshot};
use serde_json::{Value, json};

/// The kinds the restore benches restore: Servers and ServerClaims.
pub fn servers_and_claims() -> Profile {
    let all = Profile::metal_operator();
    Profile {
        name: "servers-and-claims".into(),
        kinds: all.kinds.into_iter().filter(|k| k.kind == "Server" || k.kind == "ServerClaim").collect(),
    }
}

/// The snapshot the restores of a bench start from: what `selector` selects on the source,
/// backed up with `profile` into `store`. Its id and its records.
pub async fn backed_up(
    source: &kube::Client,
    store: &SnapshotStore,
    profile: &Profile,
    selector: &str,
) -> (String, Vec<Record>) {
    let options = BackupOptions { selector: Some(selector.into()), ..BackupOptions::new(profile.clone()) };
    let manifest = backup::run(source, store, &options).await.unwrap();
    let loaded = choose_snapshot(store, Some(&manifest.snapshot_id), &Default::default()).await.unwrap();
    let records = (0..loaded.records.len()).map(|i| loaded.records.record(i).unwrap()).collect();
    (manifest.snapshot_id.to_string(), records)
}

/// Panics unless the Servers of the set `set` on the target are still without status: a
/// restore measured on a restored set would write nothing.
pub async fn assert_not_restored(target: &kube::Client, profile: &Profile, set: &str) {
    let unset = restatus::k8s::api_for(target, profile.kind("Server").unwrap(), None)
        .list(&ListParams::default().labels(&format!("{FLEET_LABEL}={set}")).limit(1))
        .await
        .unwrap();
    assert!(
        unset.items.iter().all(|o| o.data.get("status").is_none()),
        "target fleet already restored: run scripts/bench without BENCH_KEEP"
    );
}

/// The field manager of the bare loop's writes, and its restored-from mark.
const BARE: &str = "bare";

/// One pass of the bare restore over `records` (captured from the fleet `fleet`) onto the moved
/// set `set` of the target: the records' objects renamed (`<fleet>-server-00001` becomes
/// `<set>-server-00001`).
pub struct BareLoop<'a> {
    pub profile: &'a Profile,
    pub records: &'a [Record],
    pub fleet: &'a str,
    pub set: &'a str,
    /// The objects written at a time.
    pub concurrency: usize,
    /// The objects arrive bare, and are quiesced first; else they arrived quiesced by the
    /// source-role handshake.
    pub quiesce: bool,
}

impl BareLoop<'_> {
    /// Per kind of the profile, a LIST of the set, then per object, `concurrency` objects at a
    /// time: the quiesce patch (on the listed resourceVersion; unless the objects arrive
    /// quiesced), the replace of the status subresource, and the release as a replace of the
    /// object as that write answered it. Returns the writes made.
    pub async fn run(&self, client: &kube::Client) -> usize {
        let (from, to) = (format!("{}-", self.fleet), format!("{}-", self.set));
        let mut writes = 0;
        for kind in &self.profile.kinds {
            let listed: HashMap<String, String> = restatus::k8s::api_for(client, kind, None)
                .list_metadata(&ListParams::default().labels(&format!("{FLEET_LABEL}={}", self.set)))
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|o| (o.metadata.name.unwrap_or_default(), o.metadata.resource_version.unwrap_or_default()))
                .collect();
            let (listed, from, to) = (&listed, &from, &to);
            let of_kind: Vec<&Record> = self.records.iter().filter(|r| r.kind == kind.kind).collect();
            let done: Vec<usize> = stream::iter(of_kind)
                .map(|record| async move {
                    let name = record.name.replacen(from, to, 1);
                    let api = restatus::k8s::api_for(client, kind, record.namespace.as_deref());
                    let params = PatchParams { field_manager: Some(BARE.into()), ..Default::default() };
                    let post = PostParams { field_manager: Some(BARE.into()), ..Default::default() };
                    let mut version = listed.get(&name).unwrap_or_else(|| panic!("{name} not on the target")).clone();
                    if self.quiesce {
                        let quiesce = json!({"metadata": {"resourceVersion": version, "annotations": {OPERATION_ANNOTATION: OPERATION_IGNORE, QUIESCED_BY_ANNOTATION: BARE}}});
                        let answer = api.patch(&name, &params, &Patch::Merge(&quiesce)).await.unwrap();
                        version = answer.metadata.resource_version.unwrap_or_default();
                    }
                    let status = serde_json::from_str(record.status.get()).unwrap();
                    let object = status_object(kind, &name, record.namespace.as_deref(), Some(version), status);
                    let answer = api.replace_status(&name, &post, &object).await.unwrap();
                    api.replace(&name, &post, &released(answer, BARE)).await.unwrap();
                    if self.quiesce { 3 } else { 2 }
                })
                .buffer_unordered(self.concurrency)
                .collect()
                .await;
            writes += done.iter().sum::<usize>();
        }
        writes
    }
}

/// The body of restatus's status write, a replace of the status subresource: the object
/// `name` of `kind` at resourceVersion `version`, with `status`.
pub fn status_object(
    kind: &KindProfile,
    name: &str,
    namespace: Option<&str>,
    version: Option<String>,
    status: Value,
) -> DynamicObject {
    let mut object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": kind.api_version(), "kind": kind.kind,
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": version},
    }))
    .unwrap();
    object.data = json!({ "status": status });
    object
}

/// The body of restatus's release, a replace of the object as its status write answered it:
/// restatus's ignore taken off, restored from `by`, without its managed fields and status.
pub fn released(mut object: DynamicObject, by: &str) -> DynamicObject {
    object.metadata.managed_fields = None;
    let annotations = object.metadata.annotations.get_or_insert_default();
    annotations.remove(OPERATION_ANNOTATION);
    annotations.remove(QUIESCED_BY_ANNOTATION);
    annotations.insert(RESTORED_FROM_ANNOTATION.into(), by.into());
    if let Some(data) = object.data.as_object_mut() {
        data.remove("status");
    }
    object
}
