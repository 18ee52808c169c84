//! Snapshot format and store, end to end on the in-memory object store: round trip, and every
//! way a snapshot can be damaged, each with the error a reader must give.

use bytes::Bytes;
use futures::StreamExt;
use jiff::Timestamp;
use object_store::{ObjectStoreExt, PutPayload};
use proptest::prelude::*;
use restatus::Error;
use restatus::fixtures::{NewSnapshot, encode, server, snapshot, ts};
use restatus::format::CaptureSummary;
use restatus::format::{DecryptionKeys, Recipients, SigningKey, TrustedKeys};
use restatus::format::{Manifest, Record, SnapshotId};
use restatus::store::SnapshotStore;
use restatus::store::retention::{self, RetentionPolicy};
use restatus::store::{Accept, choose_newer, choose_snapshot};
use std::sync::Arc;

fn store(cluster: &str) -> SnapshotStore {
    SnapshotStore::open("memory://", cluster).unwrap()
}

fn empty_capture() -> CaptureSummary {
    CaptureSummary::empty()
}

/// A snapshot of `records` taken at `at`, written the way a backup writes one.
fn snapshot_at<'a>(at: &str, records: &'a [Record]) -> NewSnapshot<'a> {
    snapshot(records).at(ts(at)).profile("test")
}

async fn write(store: &SnapshotStore, at: &str, records: &[Record]) -> Manifest {
    snapshot_at(at, records).write(store).await
}

/// Writes a snapshot whose capture `capture` describes.
async fn write_with(store: &SnapshotStore, at: &str, records: &[Record], capture: CaptureSummary) -> Manifest {
    snapshot_at(at, records).capture(capture).write(store).await
}

async fn replace(store: &SnapshotStore, path: &object_store::path::Path, bytes: Vec<u8>) {
    store.object_store().put(path, PutPayload::from(Bytes::from(bytes))).await.unwrap();
}

/// A payload's bytes as stored, read past the store's checks (to damage them).
async fn stored(store: &SnapshotStore, id: &SnapshotId) -> Bytes {
    store.object_store().get(&store.payload_path(id)).await.unwrap().bytes().await.unwrap()
}

async fn load_err(store: &SnapshotStore, id: &SnapshotId) -> String {
    store.load(id, |_| Ok(())).await.unwrap_err().to_string()
}

fn statuses() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        "[a-zA-Z0-9 :./\\-\"\\\\é\n]{0,20}".prop_map(serde_json::Value::from),
    ];
    let tree = leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
            prop::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    });
    tree.prop_map(|v| serde_json::json!({ "state": "Available", "x": v }).to_string())
}

proptest! {
    #[test]
    fn records_round_trip(statuses in prop::collection::vec(statuses(), 0..40), ns in proptest::option::of("[a-z]{1,10}")) {
        let records: Vec<Record> = statuses.iter().enumerate().map(|(i, s)| Record { namespace: ns.clone(), ..server(i, s) }).collect();
        let (payload, summary) = encode(&records);
        let id = SnapshotId::new(Timestamp::now());
        let manifest = Manifest::new("c", id, Timestamp::now(), "test", empty_capture(), summary);
        let mut decoded = Vec::new();
        let n = restatus::format::decode_records(&manifest, payload.clone(), |r| { decoded.push(r); Ok(()) }).unwrap();
        prop_assert_eq!(n as usize, records.len());
        for (a, b) in records.iter().zip(&decoded) {
            prop_assert_eq!(serde_json::to_string(a).unwrap(), serde_json::to_string(b).unwrap());
            prop_assert_eq!(a.status.get(), b.status.get(), "status bytes must be carried verbatim");
        }
    }
}

#[tokio::test]
async fn a_written_snapshot_lists_loads_and_verifies() {
    let store = store("prod-1");
    let records: Vec<_> = (0..100).map(|i| server(i, r#"{"state":"Reserved"}"#)).collect();
    let manifest = write(&store, "2026-11-30T09:00:00Z", &records).await;
    let listed = store.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].complete);
    let mut names = Vec::new();
    let loaded = store
        .load(&manifest.snapshot_id, |r| {
            names.push(r.name);
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(loaded, manifest);
    assert_eq!(names.len(), 100);
    assert_eq!(names[42], "server-42");
}

#[tokio::test]
async fn a_flipped_byte_fails_the_checksum_before_decompressing() {
    let store = store("c");
    let m = write(&store, "2026-11-30T09:00:00Z", &[server(1, r#"{"a":1}"#)]).await;
    let path = store.payload_path(&m.snapshot_id);
    let mut bytes = stored(&store, &m.snapshot_id).await.to_vec();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    replace(&store, &path, bytes).await;
    let err = load_err(&store, &m.snapshot_id).await;
    assert!(err.contains(m.snapshot_id.as_str()) && err.contains("sha256"), "{err}");
}

#[tokio::test]
async fn a_truncated_payload_is_reported_as_truncated() {
    let store = store("c");
    let m = write(&store, "2026-11-30T09:00:00Z", &[server(1, r#"{"a":1}"#), server(2, r#"{"b":2}"#)]).await;
    let bytes = stored(&store, &m.snapshot_id).await;
    replace(&store, &store.payload_path(&m.snapshot_id), bytes[..bytes.len() - 7].to_vec()).await;
    let err = load_err(&store, &m.snapshot_id).await;
    assert!(err.contains(m.snapshot_id.as_str()) && err.contains("truncated"), "{err}");
}

#[tokio::test]
async fn a_payload_without_manifest_does_not_exist_for_readers() {
    let store = store("c");
    let id = SnapshotId::new("2026-11-30T09:00:00Z".parse().unwrap());
    let (payload, _) = encode(&[server(1, "{}")]);
    store.object_store().put(&store.payload_path(&id), payload.into()).await.unwrap();
    let listed = store.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].complete, "a payload alone must not look complete");
    match store.manifest(&id).await {
        Err(Error::SnapshotNotFound(s)) => assert_eq!(s, id.to_string()),
        other => panic!("expected SnapshotNotFound, got {other:?}"),
    }
    assert!(load_err(&store, &id).await.contains("not found (no manifest)"));
}

#[tokio::test]
async fn a_manifest_of_a_future_major_version_is_refused_by_name() {
    let store = store("c");
    let m = write(&store, "2026-11-30T09:00:00Z", &[server(1, "{}")]).await;
    let mut json: serde_json::Value = serde_json::from_slice(&m.to_json()).unwrap();
    json["formatVersion"] = "2.0".into();
    json["somethingNew"] = serde_json::json!({"a": 1});
    replace(&store, &store.manifest_path(&m.snapshot_id), serde_json::to_vec(&json).unwrap()).await;
    let err = load_err(&store, &m.snapshot_id).await;
    assert!(err.contains("format version 2.0 is not supported") && err.contains("reads format 1.x"), "{err}");
    assert!(err.contains(m.snapshot_id.as_str()), "{err}");

    // A newer minor of the same major is read (unknown fields ignored).
    json["formatVersion"] = "1.7".into();
    replace(&store, &store.manifest_path(&m.snapshot_id), serde_json::to_vec(&json).unwrap()).await;
    store.load(&m.snapshot_id, |_| Ok(())).await.expect("minor versions are compatible");
}

#[tokio::test]
async fn a_payload_that_inflates_past_its_declared_size_is_stopped() {
    // A zstd bomb with a consistent checksum: 64 MiB of zeros compresses to a few KiB, while
    // the manifest declares 1 KiB. The reader must stop at the declared size.
    let store = store("c");
    let m = write(&store, "2026-11-30T09:00:00Z", &[server(1, "{}")]).await;
    let bomb = zstd::encode_all(std::io::repeat(b'x').take_bytes(64 << 20), 3).unwrap();
    replace(&store, &store.payload_path(&m.snapshot_id), bomb.clone()).await;
    let mut manifest = m.clone();
    manifest.payload.size = bomb.len() as u64;
    manifest.payload.sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bomb));
    manifest.payload.uncompressed_size = 1024;
    replace(&store, &store.manifest_path(&m.snapshot_id), manifest.to_json()).await;
    let err = load_err(&store, &m.snapshot_id).await;
    assert!(err.contains("more than the 1024 bytes"), "{err}");
}

#[tokio::test]
async fn garbage_that_passes_the_checksum_is_still_rejected() {
    let store = store("c");
    let m = write(&store, "2026-11-30T09:00:00Z", &[server(1, "{}")]).await;
    let garbage = b"definitely not zstd".to_vec();
    replace(&store, &store.payload_path(&m.snapshot_id), garbage.clone()).await;
    let mut manifest = m.clone();
    manifest.payload.size = garbage.len() as u64;
    manifest.payload.sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&garbage));
    replace(&store, &store.manifest_path(&m.snapshot_id), manifest.to_json()).await;
    let err = load_err(&store, &m.snapshot_id).await;
    assert!(err.contains(m.snapshot_id.as_str()) && err.contains("decompress"), "{err}");
}

#[tokio::test]
async fn a_snapshot_of_another_cluster_is_foreign() {
    let store_a = store("cluster-a");
    let m = write(&store_a, "2026-11-30T09:00:00Z", &[server(1, "{}")]).await;
    // Copy the whole snapshot under cluster-b's folder of the same bucket.
    let store_b = SnapshotStore::new(store_a.object_store().clone(), "", "cluster-b", "memory://".into()).unwrap();
    let payload = stored(&store_a, &m.snapshot_id).await;
    replace(&store_b, &store_b.payload_path(&m.snapshot_id), payload.to_vec()).await;
    replace(&store_b, &store_b.manifest_path(&m.snapshot_id), m.to_json()).await;
    let err = load_err(&store_b, &m.snapshot_id).await;
    assert!(err.contains("belongs to cluster \"cluster-a\", not to \"cluster-b\""), "{err}");
}

#[tokio::test]
async fn a_manifest_is_never_overwritten() {
    let store = store("c");
    let m = write(&store, "2026-11-30T09:00:00Z", &[server(1, "{}")]).await;
    let err = store.put_manifest(&m).await.unwrap_err().to_string();
    assert!(err.contains(m.snapshot_id.as_str()), "{err}");
}

#[tokio::test]
async fn clusters_sharing_a_bucket_do_not_see_each_other() {
    let a = store("a");
    let b = SnapshotStore::new(a.object_store().clone(), "", "b", "memory://".into()).unwrap();
    write(&a, "2026-11-30T09:00:00Z", &[server(1, "{}")]).await;
    write(&b, "2026-11-30T09:00:00Z", &[server(1, "{}")]).await;
    write(&b, "2026-11-30T10:00:00Z", &[server(1, "{}")]).await;
    assert_eq!(a.list().await.unwrap().len(), 1);
    assert_eq!(b.list().await.unwrap().len(), 2);
}

#[tokio::test]
async fn retention_deletes_old_snapshots_and_keeps_the_newest() {
    let store = store("c");
    let mut ids = Vec::new();
    for hour in 1..=5 {
        ids.push(write(&store, &format!("2026-11-30T0{hour}:00:00Z"), &[server(1, "{}")]).await.snapshot_id);
    }
    let plan = retention::apply(&store, RetentionPolicy { keep_last: Some(2), max_age: None }, None).await.unwrap();
    assert_eq!(plan.deletions.iter().map(|d| d.id.clone()).collect::<Vec<_>>(), ids[..3].to_vec());
    let left: Vec<_> = store.list().await.unwrap().into_iter().map(|e| e.id).collect();
    assert_eq!(left, ids[3..].to_vec());
    // Everything is far older than a day, yet the newest complete snapshot stays.
    let policy = RetentionPolicy { keep_last: None, max_age: Some(std::time::Duration::from_secs(1)) };
    retention::apply(&store, policy, None).await.unwrap();
    let left: Vec<_> = store.list().await.unwrap().into_iter().map(|e| e.id).collect();
    assert_eq!(left, vec![ids[4].clone()]);
}

#[tokio::test]
async fn retention_keeps_the_last_consistent_snapshot_behind_fifty_inconsistent_ones() {
    let store = store("c");
    let mut consistent = Vec::new();
    for minute in 0..3 {
        consistent.push(write(&store, &format!("2026-11-30T08:{minute:02}:00Z"), &[server(1, "{}")]).await.snapshot_id);
    }
    let mut stuck = empty_capture();
    stuck.consistency.consistent = false;
    stuck.consistency.reason_count = 1;
    stuck.consistency.reasons.push(restatus::format::Inconsistency {
        object: restatus::format::ObjectRef { kind: "Server".into(), namespace: None, name: "s9".into() },
        reason: "in transitional state \"Discovery\"".into(),
    });
    for minute in 0..50 {
        write_with(&store, &format!("2026-11-30T09:{minute:02}:00Z"), &[server(1, "{}")], stuck.clone()).await;
    }
    let plan = retention::apply(&store, RetentionPolicy { keep_last: Some(48), max_age: None }, None).await.unwrap();
    assert_eq!(plan.deletions.len(), 4, "53 snapshots, 48 kept, one more kept for restores");
    assert_eq!(plan.kept.len(), 1);
    assert_eq!(plan.kept[0].id, consistent[2]);
    assert!(plan.kept[0].reason.contains("newest verified consistent"), "{}", plan.kept[0].reason);
    // A restore without --allow-inconsistent still finds it.
    let loaded = restatus::store::choose_snapshot(&store, None, &Default::default()).await.unwrap();
    assert_eq!(loaded.manifest.snapshot_id, consistent[2]);
    assert_eq!(loaded.passed_over.len(), 48);
}

#[tokio::test]
async fn a_payload_above_the_read_limit_fails_before_it_is_downloaded() {
    let store = store("c");
    let m = write(&store, "2026-11-30T09:00:00Z", &[server(1, r#"{"a":1}"#)]).await;
    let limited = store.clone().with_max_payload(m.payload.size - 1);
    let err = limited.load(&m.snapshot_id, |_| Ok(())).await.unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains(m.snapshot_id.as_str()) && text.contains("--max-snapshot-size"), "{text}");
    // A restore does not fall back to an older snapshot silently: the limit is an error.
    assert!(matches!(
        restatus::store::choose_snapshot(&limited, None, &Default::default()).await,
        Err(Error::TooLarge { .. })
    ));
    assert!(store.load(&m.snapshot_id, |_| Ok(())).await.is_ok(), "within the limit it loads");
}

#[tokio::test]
async fn an_oversized_manifest_is_refused_before_it_is_read() {
    let store = store("c");
    let m = write(&store, "2026-11-30T09:00:00Z", &[server(1, "{}")]).await;
    let huge = vec![b' '; (restatus::store::MAX_MANIFEST + 1) as usize];
    replace(&store, &store.manifest_path(&m.snapshot_id), huge).await;
    let err = load_err(&store, &m.snapshot_id).await;
    assert!(err.contains(m.snapshot_id.as_str()) && err.contains("more than a manifest can have"), "{err}");
}

trait TakeBytes: std::io::Read + Sized {
    fn take_bytes(self, n: u64) -> std::io::Take<Self> {
        std::io::Read::take(self, n)
    }
}
impl<R: std::io::Read> TakeBytes for R {}

/// Records whose statuses hardly compress: `n` of them make a payload of about 150 bytes each.
fn noisy_records(n: usize) -> Vec<Record> {
    use sha2::{Digest, Sha256};
    (0..n)
        .map(|i| {
            let noise: Vec<String> = (0..4).map(|j| hex::encode(Sha256::digest(format!("{i}/{j}")))).collect();
            server(i, &serde_json::json!({ "noise": noise }).to_string())
        })
        .collect()
}

#[tokio::test]
async fn a_large_payload_is_read_from_a_temporary_file_and_verified_there() {
    let store = store("c");
    let records = noisy_records(8000);
    let m = write(&store, "2026-11-30T09:00:00Z", &records).await;
    assert!(m.payload.size > restatus::store::SPILL_ABOVE, "payload of {} bytes", m.payload.size);
    let payload = store.verified_payload(&m).await.unwrap();
    assert!(matches!(payload, restatus::format::Payload::Spilled(_)));
    let loaded = restatus::store::choose_snapshot(&store, None, &Default::default()).await.unwrap();
    assert_eq!(loaded.records.len(), 8000);
    assert_eq!(loaded.records.status(4321).unwrap().get(), records[4321].status.get());

    // Nowhere to spill: held in memory, read the same.
    let unspillable = store.clone().with_spill_dir("/nonexistent/restatus-spill");
    assert!(matches!(unspillable.verified_payload(&m).await.unwrap(), restatus::format::Payload::Memory(_)));
    let loaded = restatus::store::choose_snapshot(&unspillable, None, &Default::default()).await.unwrap();
    assert_eq!(loaded.records.status(17).unwrap().get(), records[17].status.get());

    // A byte flipped in the stored payload: the spilled copy fails its sha256, and the
    // snapshot is passed over for the previous good one.
    let older = write(&store, "2026-11-30T08:00:00Z", &records[..10]).await;
    let mut bytes = stored(&store, &m.snapshot_id).await.to_vec();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    replace(&store, &store.payload_path(&m.snapshot_id), bytes).await;
    let loaded = restatus::store::choose_snapshot(&store, None, &Default::default()).await.unwrap();
    assert_eq!(loaded.manifest.snapshot_id, older.snapshot_id);
    assert!(loaded.passed_over[0].reason.contains("sha256"), "{:?}", loaded.passed_over);
}

/// F53 (the store side): a snapshot captured from the cluster a restore writes to is passed over
/// for the previous one, refused when pinned, and used only with `--allow-same-cluster`.
#[tokio::test]
async fn a_snapshot_captured_from_the_cluster_restored_to_is_passed_over() {
    let store = store("c");
    let theirs = write(&store, "2026-11-30T09:00:00Z", &[server(1, r#"{"state":"Reserved"}"#)]).await;
    // The target backs up under the source's id: an empty, consistent snapshot of itself.
    let id = snapshot_at("2026-11-30T10:00:00Z", &[]).captured_from("target-uid").write(&store).await.snapshot_id;

    let on_target = restatus::store::Accept { this_cluster: Some("target-uid".into()), ..Default::default() };
    let loaded = restatus::store::choose_snapshot(&store, None, &on_target).await.unwrap();
    assert_eq!(loaded.manifest.snapshot_id, theirs.snapshot_id, "the source's snapshot, not the target's own");
    assert!(loaded.passed_over[0].reason.contains("captured from this cluster"), "{:?}", loaded.passed_over);
    let pinned = restatus::store::choose_snapshot(&store, Some(&id), &on_target).await;
    assert!(matches!(pinned, Err(Error::SameCluster { .. })), "pinned: {:?}", pinned.err());
    let allowed = restatus::store::Accept { same_cluster: true, ..on_target.clone() };
    assert_eq!(restatus::store::choose_snapshot(&store, None, &allowed).await.unwrap().manifest.snapshot_id, id);
    // Elsewhere (another cluster, or its identity unknown) it is an ordinary snapshot.
    let elsewhere = restatus::store::Accept { this_cluster: Some("source-uid".into()), ..Default::default() };
    assert_eq!(restatus::store::choose_snapshot(&store, None, &elsewhere).await.unwrap().manifest.snapshot_id, id);
    // Its manifest says where it was captured; readers of 1.2 ignore the field.
    let text = String::from_utf8(
        store.object_store().get(&store.manifest_path(&id)).await.unwrap().bytes().await.unwrap().to_vec(),
    )
    .unwrap();
    assert!(text.contains(r#""capturedFrom": "target-uid""#), "{text}");
}

/// Writes a snapshot signed with `key`: payload, signature, then manifest.
async fn write_signed(store: &SnapshotStore, at: &str, records: &[Record], key: &SigningKey) -> Manifest {
    snapshot_at(at, records).signed_with(key).write(store).await
}

fn trusting(keys: &[&SigningKey]) -> Accept {
    let trusted = TrustedKeys::new(keys.iter().map(|k| k.public_key()));
    Accept { trusted: Some(Arc::new(trusted)), ..Default::default() }
}

/// F70, F71: whoever can write the bucket forges a snapshot (payload changed, its size and
/// sha256 recomputed into a manifest dated after the real one): with a trusted key it is passed
/// over, naming it, for the previous signed one; unsigned, with a signature copied from the
/// real snapshot, or signed by the forger's own key. Without keys it is used, as before.
#[tokio::test]
async fn a_forged_newest_snapshot_is_passed_over_for_the_previous_signed_one() {
    let store = store("c");
    let key = SigningKey::generate();
    let good = write_signed(&store, "2026-11-30T09:00:00Z", &[server(1, r#"{"state":"Reserved"}"#)], &key).await;
    let forged = write(&store, "2026-11-30T10:00:00Z", &[server(1, r#"{"state":"Available"}"#)]).await;
    let accept = trusting(&[&key]);

    let loaded = choose_snapshot(&store, None, &accept).await.unwrap();
    assert_eq!(loaded.manifest.snapshot_id, good.snapshot_id, "the signed snapshot, not the forgery");
    assert_eq!(loaded.signer.as_ref(), Some(key.id()));
    let passed = &loaded.passed_over[0];
    assert_eq!(passed.snapshot, forged.snapshot_id.to_string());
    assert!(passed.reason.contains(&format!("snapshot {}: not signed", forged.snapshot_id)), "{}", passed.reason);
    // The controller keeps the snapshot in use: nothing newer that it trusts.
    assert!(choose_newer(&store, &good.snapshot_id, &accept).await.unwrap().is_none());
    // Pinned, the forgery is refused by name.
    let pinned = choose_snapshot(&store, Some(&forged.snapshot_id), &accept).await;
    assert!(matches!(pinned, Err(Error::Unsigned { .. })), "{:?}", pinned.err());
    // Without a trusted key, today's behaviour: the newest complete snapshot is used.
    let untrusting = choose_snapshot(&store, None, &Accept::default()).await.unwrap();
    assert_eq!(untrusting.manifest.snapshot_id, forged.snapshot_id);
    assert_eq!(untrusting.signer, None);

    // The real snapshot's signature copied beside the forgery: another manifest's.
    let signature = store.object_store().get(&store.signature_path(&good.snapshot_id)).await.unwrap();
    let signature = signature.bytes().await.unwrap().to_vec();
    replace(&store, &store.signature_path(&forged.snapshot_id), signature.clone()).await;
    let loaded = choose_snapshot(&store, None, &accept).await.unwrap();
    assert_eq!(loaded.manifest.snapshot_id, good.snapshot_id);
    assert!(loaded.passed_over[0].reason.contains("a signature of another manifest"), "{:?}", loaded.passed_over);
    // ...and the forged manifest claiming the key too: the signature does not cover its bytes.
    let mut claiming = forged.clone();
    claiming.signed_by = Some(key.id().clone());
    replace(&store, &store.manifest_path(&forged.snapshot_id), claiming.to_json()).await;
    let loaded = choose_snapshot(&store, None, &accept).await.unwrap();
    assert_eq!(loaded.manifest.snapshot_id, good.snapshot_id);
    let reason = &loaded.passed_over[0].reason;
    assert!(
        reason.contains(&format!("signature refused: the signature of key {} does not match the manifest", key.id())),
        "{reason}"
    );

    // Signed by the forger's own key: not a trusted one.
    let forger = SigningKey::generate();
    let own = write_signed(&store, "2026-11-30T11:00:00Z", &[server(1, r#"{"state":"Available"}"#)], &forger).await;
    let loaded = choose_snapshot(&store, None, &accept).await.unwrap();
    assert_eq!(loaded.manifest.snapshot_id, good.snapshot_id);
    let reason = &loaded.passed_over[0].reason;
    assert!(
        reason.starts_with(&format!("snapshot {}: signature refused: signed by key {}", own.snapshot_id, forger.id())),
        "{reason}"
    );
    assert_eq!(loaded.passed_over.len(), 2);

    // Only forgeries: no good snapshot, none of them used.
    store.delete(&good.snapshot_id).await.unwrap();
    assert!(matches!(choose_snapshot(&store, None, &accept).await, Err(Error::NoGoodSnapshot { passed_over: 2, .. })));
}

/// F72: keys are rotated by trusting the old and the new key at once; once the old key is no
/// longer trusted, its snapshots are passed over, naming the key.
#[tokio::test]
async fn a_rotated_key_keeps_the_old_snapshots_restorable_while_both_are_trusted() {
    let store = store("c");
    let (old, new) = (SigningKey::generate(), SigningKey::generate());
    let before = write_signed(&store, "2026-11-30T09:00:00Z", &[server(1, "{}")], &old).await;
    let both = trusting(&[&old, &new]);
    let loaded = choose_snapshot(&store, None, &both).await.unwrap();
    assert_eq!((loaded.manifest.snapshot_id, loaded.signer.as_ref()), (before.snapshot_id.clone(), Some(old.id())));
    let after = write_signed(&store, "2026-11-30T10:00:00Z", &[server(1, "{}")], &new).await;
    let loaded = choose_snapshot(&store, None, &both).await.unwrap();
    assert_eq!((loaded.manifest.snapshot_id, loaded.signer.as_ref()), (after.snapshot_id.clone(), Some(new.id())));
    assert!(loaded.passed_over.is_empty());
    store.delete(&after.snapshot_id).await.unwrap();
    let err = choose_snapshot(&store, None, &trusting(&[&new])).await.err().unwrap().to_string();
    assert!(err.contains("no good snapshot"), "{err}");
    let pinned = choose_snapshot(&store, Some(&before.snapshot_id), &trusting(&[&new])).await.err().unwrap();
    assert!(
        pinned.to_string().contains(&format!("signed by key {}, which is not a trusted key", old.id())),
        "{pinned}"
    );
}

/// A signed snapshot: the signature is written before the manifest, its manifest names the key,
/// `load_verified` checks it, and deleting the snapshot removes the signature too.
#[tokio::test]
async fn a_signed_snapshot_verifies_end_to_end_and_is_deleted_whole() {
    let store = store("c");
    let key = SigningKey::generate();
    let signed = write_signed(&store, "2026-11-30T09:00:00Z", &[server(1, "{}"), server(2, "{}")], &key).await;
    assert_eq!(signed.signed_by.as_ref(), Some(key.id()));
    let trusted = TrustedKeys::new([key.public_key()]);
    let (manifest, signer) = store.load_verified(&signed.snapshot_id, Some(&trusted), |_| Ok(())).await.unwrap();
    assert_eq!((manifest.payload.records, signer.as_ref()), (2, Some(key.id())));
    let text = String::from_utf8(manifest.to_json()).unwrap();
    assert!(text.contains(&format!(r#""signedBy": "{}""#, key.id())), "{text}");
    // A signature already there (another writer of the same id) is never replaced.
    let mut again = signed.clone();
    assert!(store.put_signed_manifest(&mut again, &SigningKey::generate()).await.is_err());
    assert!(store.load_verified(&signed.snapshot_id, Some(&trusted), |_| Ok(())).await.is_ok());
    store.delete(&signed.snapshot_id).await.unwrap();
    let left: Vec<_> = store.object_store().list(None).collect::<Vec<_>>().await;
    assert!(left.is_empty(), "{left:?}");
}

/// F75, F166, F167: forged snapshots written after the last signed one (whoever can write the
/// bucket can write many) never make retention delete it: with the keys (a backup's own signing
/// key, or `--trusted-key`) `keep_last` counts only signed snapshots, so the forgeries push
/// nothing out (before: they counted, and only the newest signed one was kept); without keys,
/// retention cannot tell a signed snapshot from a forgery and deletes none that says it is
/// signed (before: `snapshots prune` without keys deleted the last signed one).
#[tokio::test]
async fn forged_snapshots_never_make_retention_delete_the_last_signed_one() {
    let key = SigningKey::generate();
    let trusted = TrustedKeys::new([key.public_key()]);
    let policy = RetentionPolicy { keep_last: Some(2), max_age: None };
    for keys in [Some(&trusted), None] {
        let store = store("c");
        let older = write_signed(&store, "2026-11-30T07:00:00Z", &[server(1, r#"{"state":"Reserved"}"#)], &key).await;
        let signed = write_signed(&store, "2026-11-30T08:00:00Z", &[server(1, r#"{"state":"Reserved"}"#)], &key).await;
        let mut forged = vec![];
        for minute in 0..3 {
            let at = format!("2026-11-30T09:0{minute}:00Z");
            forged.push(write(&store, &at, &[server(1, r#"{"state":"Available"}"#)]).await.snapshot_id);
        }
        let plan = retention::apply(&store, policy, keys).await.unwrap();
        let left: Vec<_> = store.list().await.unwrap().into_iter().map(|e| e.id).collect();
        let context = format!("keys {:?}: {plan:?}", keys.is_some());
        assert!(left.contains(&signed.snapshot_id) && left.contains(&older.snapshot_id), "{context}");
        match keys {
            // Two signed ones kept by keep_last; the forgeries newer than them do not count.
            Some(_) => assert!(plan.deletions.is_empty() && plan.kept.is_empty(), "{context}"),
            // The oldest unsigned one beyond the newest 2 goes; the signed ones stay, said so.
            None => {
                let deleted: Vec<_> = plan.deletions.iter().map(|d| d.id.clone()).collect();
                assert_eq!(deleted, [forged[0].clone()], "{context}");
                assert_eq!(plan.kept.len(), 2, "{context}");
                assert!(plan.kept.iter().all(|k| k.reason.contains("without --trusted-key")), "{context}");
            }
        }
    }
}

/// F92, B63: `snapshots delete` removes one snapshot whole (manifest, signature, payload),
/// saying which objects; refuses, naming the snapshot and why, to delete what a restore would
/// use (the newest complete one; with keys the newest signed one, whatever unsigned ones came
/// after it) or a folder a backup may still be uploading, unless forced; and an id that is not
/// there is an error naming it. Nothing is deleted by a refusal.
#[tokio::test]
async fn deleting_by_hand_removes_one_snapshot_whole_and_keeps_what_a_restore_uses() {
    let store = store("c");
    let key = SigningKey::generate();
    let trusted = TrustedKeys::new([key.public_key()]);
    let old = write_signed(&store, "2026-11-30T07:00:00Z", &[server(1, "{}")], &key).await.snapshot_id;
    let signed = write_signed(&store, "2026-11-30T08:00:00Z", &[server(1, "{}")], &key).await.snapshot_id;
    let unsigned = write(&store, "2026-11-30T09:00:00Z", &[server(1, "{}")]).await.snapshot_id;
    let newest = write(&store, "2026-11-30T10:00:00Z", &[server(1, "{}")]).await.snapshot_id;
    let uploading = SnapshotId::new("2026-11-30T11:00:00Z".parse().unwrap());
    replace(&store, &store.payload_path(&uploading), b"half a payload".to_vec()).await;
    let ids = || async { store.list().await.unwrap().into_iter().map(|e| e.id).collect::<Vec<_>>() };
    let before = ids().await;
    assert_eq!(before.len(), 5);

    let refused = |id: &SnapshotId, keys: Option<&TrustedKeys>| {
        let (store, id, keys) = (store.clone(), id.clone(), keys.cloned());
        async move { retention::delete_one(&store, &id, keys.as_ref(), false).await.unwrap_err().to_string() }
    };
    let err = refused(&newest, None).await;
    assert!(err.starts_with(&format!("snapshot {newest}: not deleted: it is the newest complete")), "{err}");
    assert!(err.contains("--force"), "{err}");
    let err = refused(&signed, Some(&trusted)).await;
    assert!(err.contains("newest snapshot that verifies (signed by a trusted key"), "{err}");
    let err = refused(&uploading, None).await;
    assert!(err.contains("may still be uploading"), "{err}");
    let missing = SnapshotId::new("2026-11-29T00:00:00Z".parse().unwrap());
    let err = refused(&missing, None).await;
    assert!(err.starts_with(&format!("snapshot {missing}: not deleted: no such snapshot in memory:")), "{err}");
    assert!(err.contains(&format!("/c/{missing}/")), "names where it looked: {err}");
    assert_eq!(ids().await, before, "a refusal deletes nothing");

    // With keys the 07:00 one is not the newest signed.
    let deleted = retention::delete_one(&store, &old, Some(&trusted), false).await.unwrap();
    let names: Vec<&str> = deleted.files.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["manifest.json", "manifest.json.sig", "payload.jsonl.zst"]);
    assert!(deleted.complete && deleted.files.iter().all(|(_, size)| *size > 0), "{deleted:?}");
    // Without keys the newest snapshot that says it is signed cannot be checked: refused
    // unless forced (F167; before, deleted).
    let err = refused(&signed, None).await;
    assert!(err.contains("newest snapshot whose manifest says it is signed"), "{err}");
    let deleted = retention::delete_one(&store, &signed, None, true).await.unwrap();
    assert_eq!(deleted.files.len(), 3, "the signature too: {deleted:?}");
    assert!(store.files(&signed).await.unwrap().is_empty());
    // Forced: the newest and the folder still being written.
    for id in [&newest, &uploading] {
        retention::delete_one(&store, id, None, true).await.unwrap();
    }
    assert_eq!(ids().await, vec![unsigned.clone()], "the others are gone, nothing else");
    let left: Vec<_> = store.object_store().list(None).collect::<Vec<_>>().await;
    assert_eq!(left.len(), 2, "the 09:00 snapshot's payload and manifest: {left:?}");
}

/// An age key pair for encrypted payloads: the keys and their recipient.
fn age_pair() -> (Arc<DecryptionKeys>, Recipients) {
    let (text, recipient) = DecryptionKeys::generate(Timestamp::now());
    let keys = DecryptionKeys::parse_all("test.agekey", &text).unwrap();
    (Arc::new(keys), Recipients::load(&[recipient]).unwrap().unwrap())
}

/// Writes a snapshot whose payload is encrypted to `to`, as a backup does.
async fn write_encrypted(store: &SnapshotStore, at: &str, records: &[Record], to: &Recipients) -> Manifest {
    snapshot_at(at, records).encrypted_to(to).write(store).await
}

/// F80, F81: an encrypted snapshot is read with its key; without a key, or with another, it is
/// passed over for the previous snapshot this reader can use, with a warning naming it, and
/// refused by name when pinned. Retention without a key still finds it restorable (its stored
/// bytes verify), so a backup that cannot decrypt never deletes the snapshot a restore needs.
#[tokio::test]
async fn an_encrypted_snapshot_is_read_with_its_key_and_passed_over_without_it() {
    let (key, to) = age_pair();
    let (other, _) = age_pair();
    // One store, read with no key, the key, and another key.
    let base = store("c");
    let older = write(&base, "2026-11-30T08:00:00Z", &[server(1, r#"{"state":"Old"}"#)]).await;
    let status = r#"{"state":"Reserved","serialNumber":"SRV0DDC0FFE"}"#;
    let sealed = write_encrypted(&base, "2026-11-30T09:00:00Z", &[server(1, status), server(2, "{}")], &to).await;
    let id = sealed.snapshot_id.to_string();
    let (with_key, with_other) =
        (base.clone().with_decryption_keys(Some(key)), base.clone().with_decryption_keys(Some(other)));

    let loaded = choose_snapshot(&with_key, None, &Accept::default()).await.unwrap();
    assert_eq!(loaded.manifest.snapshot_id, sealed.snapshot_id);
    assert!(loaded.passed_over.is_empty());
    assert_eq!(loaded.records.status(0).unwrap().get(), status);
    let mut names = vec![];
    with_key
        .load(&sealed.snapshot_id, |r| {
            names.push(r.name);
            Ok(())
        })
        .await
        .unwrap();
    assert_eq!(names, ["server-1", "server-2"]);

    for (reader, expected) in [(&base, "--decryption-key"), (&with_other, "none of the decryption keys")] {
        let loaded = choose_snapshot(reader, None, &Accept::default()).await.unwrap();
        assert_eq!(loaded.manifest.snapshot_id, older.snapshot_id, "the previous snapshot this reader can use");
        assert_eq!(loaded.passed_over.len(), 1);
        let passed = &loaded.passed_over[0];
        assert_eq!(passed.snapshot, id);
        assert!(passed.reason.contains(&id) && passed.reason.contains(expected), "{}", passed.reason);
        let pinned = choose_snapshot(reader, Some(&sealed.snapshot_id), &Accept::default()).await.err().unwrap();
        assert!(matches!(pinned, Error::Encrypted { .. } | Error::Undecryptable { .. }), "{pinned:?}");
        let err = load_err(reader, &sealed.snapshot_id).await;
        assert!(err.contains(&id) && err.contains(expected), "{err}");
    }
    let err = load_err(&base, &sealed.snapshot_id).await;
    assert!(err.contains(&to.to_strings()[0]), "names the recipient: {err}");

    // Retention without a key: the encrypted snapshot verifies as stored and is kept.
    let restorable = retention::newest_restorable(&base, &base.list().await.unwrap(), None).await.unwrap();
    assert_eq!(restorable, Some(sealed.snapshot_id.clone()));
    // Its ciphertext damaged: it no longer counts, without a key as with one.
    let mut bytes = stored(&base, &sealed.snapshot_id).await.to_vec();
    let at = bytes.len() / 2;
    bytes[at] ^= 1;
    replace(&base, &base.payload_path(&sealed.snapshot_id), bytes).await;
    for reader in [&base, &with_key] {
        let restorable = retention::newest_restorable(reader, &reader.list().await.unwrap(), None).await.unwrap();
        assert_eq!(restorable, Some(older.snapshot_id.clone()));
    }
    let err = load_err(&with_key, &sealed.snapshot_id).await;
    assert!(err.contains("payload sha256 is"), "checked before decrypting: {err}");
}
