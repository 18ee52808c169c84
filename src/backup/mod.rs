//! The backup pipeline: capture → encode → store. One snapshot per call.
//!
//! The payload streams to the store page by page; the manifest is written only when the
//! payload upload has completed, with a create-only PUT. Any failure aborts the upload and
//! leaves no manifest, so a half-written backup never looks complete.

pub mod capture;
pub mod cron;
mod options;
pub mod schedule;

pub use options::BackupOptions;

use jiff::Timestamp;
use object_store::buffered::BufWriter;
use tracing::{info, warn};

use crate::format::{Manifest, PayloadEncoder, PayloadSummary, RecordDrop, SigningKey, SnapshotId};
use crate::store::{SnapshotStore, retention};
use crate::{Error, Result};
use capture::capture_into;

/// Takes one snapshot of everything the profile names and returns its manifest.
///
/// Kinds are listed one after another, so a capture can straddle a change (a claim binding
/// between the LIST of Servers and the LIST of ServerClaims). An inconsistent capture is
/// discarded and taken again, up to `capture_attempts` times; the last one is written marked
/// inconsistent, with its reasons.
pub async fn run(client: &kube::Client, store: &SnapshotStore, opts: &BackupOptions) -> Result<Manifest> {
    let mut attempt = 1;
    loop {
        let created_at = Timestamp::now();
        let id = SnapshotId::new(created_at);
        let mut upload = store.payload_writer(&id);
        let (encoder, collector) = match capture_into(client, &id, &mut upload, opts).await {
            Ok(captured) => captured,
            Err(e) => {
                if let Err(abort) = upload.abort().await {
                    warn!(snapshot = %id, error = %abort, "could not abort the payload upload; retention removes it later");
                }
                return Err(e);
            }
        };
        let capture = collector.finish(attempt);
        if !capture.consistency.consistent && attempt < opts.capture_attempts {
            info!(attempt, reasons = %capture.consistency.summary(), "capture is inconsistent; capturing again");
            let _ = upload.abort().await;
            tokio::time::sleep(opts.retry_delay).await;
            attempt += 1;
            continue;
        }
        let baseline = drop_baseline(store, opts).await;
        let manifest = finish(client, store, upload, encoder, opts.signing_key.as_deref(), |summary| {
            let records = summary.records;
            let mut m = Manifest::new(store.cluster_id(), id.clone(), created_at, &opts.profile.name, capture, summary);
            m.record_drop = baseline.and_then(|b| RecordDrop::judge(&b, records, opts.max_record_drop));
            m
        });
        let manifest = manifest.await?;
        if let Some(drop) = &manifest.record_drop {
            warn!(snapshot = %id, records = manifest.payload.records, previous = %drop.previous,
                previous_records = drop.previous_records, threshold_percent = drop.threshold_percent,
                "snapshot written, marked: its records fell by more than the threshold against the snapshot \
                 before; retention keeps that one until a person deletes it (`snapshots delete ID --force`)");
        }
        if manifest.is_consistent() {
            info!(snapshot = %id, records = manifest.payload.records, bytes = manifest.payload.size,
                signed_by = manifest.signed_by.as_ref().map(|k| k.as_str()),
                encrypted_to = ?manifest.encryption.as_ref().map(|e| &e.recipients), "snapshot written");
        } else {
            warn!(snapshot = %id, attempts = attempt, reasons = manifest.consistency.as_ref().map_or(0, |c| c.reasons.len()),
                "snapshot written, marked inconsistent: restore skips it unless --allow-inconsistent");
        }
        return Ok(manifest);
    }
}

/// The snapshot a capture's record count is compared with ([`retention::drop_baseline`]),
/// or none: a bucket that cannot be read here leaves the check out, with a warning (the
/// backup itself matters more; writing it will say what is wrong with the bucket).
async fn drop_baseline(store: &SnapshotStore, opts: &BackupOptions) -> Option<Manifest> {
    if opts.max_record_drop >= 100 {
        return None;
    }
    match retention::drop_baseline(store, opts.trusted.as_deref()).await {
        Ok(baseline) => baseline,
        Err(e) => {
            warn!(error = %e, "cannot read the snapshot before to compare record counts; the drop check is left out");
            None
        }
    }
}

/// Completes the payload upload, then writes the manifest `manifest` makes of its summary,
/// with the identity of the cluster the objects came from; signed (signature first) with
/// `signing_key` ([`SnapshotStore::finish_snapshot`]).
async fn finish(
    client: &kube::Client,
    store: &SnapshotStore,
    upload: BufWriter,
    encoder: PayloadEncoder,
    signing_key: Option<&SigningKey>,
    manifest: impl FnOnce(PayloadSummary) -> Manifest,
) -> Result<Manifest> {
    let (tail, summary) = encoder.finish().map_err(|e| Error::io("finish zstd", e))?;
    let mut manifest = manifest(summary);
    manifest.captured_from = crate::k8s::cluster_uid(client).await;
    store.finish_snapshot(upload, &tail, &mut manifest, signing_key).await?;
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::identity::Profile;
    use crate::fixtures::api::{self, answer, list_with_an_expired_token};

    #[tokio::test]
    async fn a_capture_that_outlives_a_continue_token_captures_each_object_once_in_one_attempt() {
        let (client, handle) = api::client();
        let server = tokio::spawn(async move {
            let mut api = handle;
            list_with_an_expired_token(&mut api, Some(serde_json::json!({"state": "Available"}))).await;
            // The manifest records which cluster the objects came from.
            let kube_system = r#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"kube-system","uid":"cluster-uid-1"}}"#;
            let (_, path, _) = answer(&mut api, http::StatusCode::OK, kube_system.into()).await;
            assert_eq!(path, "/api/v1/namespaces/kube-system");
        });
        let metal = Profile::metal_operator();
        let profile = Profile { kinds: vec![metal.kind("Server").unwrap().clone()], ..metal };
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let opts = BackupOptions { page_size: 2, ..BackupOptions::new(profile) };
        let manifest = run(&client, &store, &opts).await.unwrap();
        server.await.unwrap();
        assert_eq!(manifest.payload.records, 3, "a, b and c, each once");
        assert_eq!(manifest.consistency.as_ref().map(|c| c.attempts), Some(1), "no second capture");
        assert_eq!(manifest.captured_from.as_deref(), Some("cluster-uid-1"));
        let mut names = vec![];
        store
            .load(&manifest.snapshot_id, |r| {
                names.push(r.name);
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(names, ["a", "b", "c"]);
    }

    /// The API server of a capture that straddles a claim binding `attempts` times: Server s1
    /// is listed `Available` (before the operator made it Reserved), then claim c1 is listed
    /// Bound to it. When `settles`, the capture after those lists s1 `Reserved`.
    async fn straddled(api: &mut api::Handle, attempts: usize, settles: bool) {
        let server = |state: &str| {
            let mut s1 = api::server("s1", Some(&serde_json::json!({"state": state})));
            s1["spec"]["serverClaimRef"] = serde_json::json!({"namespace": "a", "name": "c1"});
            serde_json::json!({"kind": "ServerList", "metadata": {"continue": ""}, "items": [s1]}).to_string()
        };
        let claims = serde_json::json!({"kind": "ServerClaimList", "metadata": {"continue": ""}, "items": [{
            "apiVersion": "metal.ironcore.dev/v1alpha1", "kind": "ServerClaim",
            "metadata": {"name": "c1", "namespace": "a", "uid": "uid-c1", "resourceVersion": "1"},
            "spec": {"serverRef": {"name": "s1"}}, "status": {"phase": "Bound"}}]})
        .to_string();
        let states = std::iter::repeat_n("Available", attempts).chain(settles.then_some("Reserved"));
        for state in states {
            let (_, path, _) = answer(api, http::StatusCode::OK, server(state)).await;
            assert!(path.ends_with("/servers"), "{path}");
            let (_, path, _) = answer(api, http::StatusCode::OK, claims.clone()).await;
            assert!(path.ends_with("/serverclaims"), "{path}");
        }
        let kube_system = r#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":{"name":"kube-system","uid":"cluster-uid-1"}}"#;
        answer(api, http::StatusCode::OK, kube_system.into()).await;
    }

    fn servers_and_claims(attempts: u32) -> BackupOptions {
        let metal = Profile::metal_operator();
        let kinds = vec![metal.kind("Server").unwrap().clone(), metal.kind("ServerClaim").unwrap().clone()];
        let profile = Profile { kinds, ..metal };
        BackupOptions {
            capture_attempts: attempts,
            retry_delay: std::time::Duration::from_millis(1),
            ..BackupOptions::new(profile)
        }
    }

    /// F14: a capture that straddles a binding is not written; it is taken again, and the
    /// snapshot written is the consistent second capture, which says it took two.
    #[tokio::test]
    async fn a_capture_that_straddles_a_binding_is_taken_again_and_the_retake_is_written() {
        let (client, handle) = api::client();
        let server = tokio::spawn(async move {
            let mut api = handle;
            straddled(&mut api, 1, true).await;
        });
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let manifest = run(&client, &store, &servers_and_claims(3)).await.unwrap();
        server.await.unwrap();
        let consistency = manifest.consistency.clone().expect("a consistency verdict");
        assert!(consistency.consistent, "{consistency:?}");
        assert_eq!(consistency.attempts, 2, "the straddled capture was taken again, once");
        let mut states = vec![];
        store
            .load(&manifest.snapshot_id, |r| {
                let status: serde_json::Value = serde_json::from_str(r.status.get()).unwrap();
                states.push((r.name.clone(), Some(status["state"].clone())));
                Ok(())
            })
            .await
            .unwrap();
        assert!(states.contains(&("s1".into(), Some(serde_json::json!("Reserved")))), "the retake's s1: {states:?}");
        assert_eq!(store.list().await.unwrap().iter().filter(|e| e.complete).count(), 1, "one snapshot written");
    }

    /// F14 when the binding never settles within the attempts: the last capture is written,
    /// marked inconsistent with the reason naming the claim and its Server, and the attempts.
    #[tokio::test]
    async fn a_capture_that_straddles_a_binding_every_time_is_written_marked_inconsistent() {
        let (client, handle) = api::client();
        let server = tokio::spawn(async move {
            let mut api = handle;
            straddled(&mut api, 2, false).await;
        });
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let manifest = run(&client, &store, &servers_and_claims(2)).await.unwrap();
        server.await.unwrap();
        assert!(!manifest.is_consistent(), "marked inconsistent: restore skips it unless allowed");
        let consistency = manifest.consistency.clone().expect("a consistency verdict");
        assert_eq!(consistency.attempts, 2);
        let reasons: Vec<String> = consistency.reasons.iter().map(|r| format!("{}: {}", r.object, r.reason)).collect();
        assert_eq!(reasons, ["ServerClaim a/c1: Bound to Server s1, which is \"Available\", not Reserved"]);
        assert_eq!(store.list().await.unwrap().iter().filter(|e| e.complete).count(), 1, "one snapshot written");
    }
}
