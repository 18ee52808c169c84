//! A base of the journal's own capture, for when the newest snapshot is encrypted and the
//! journal holds no key to read it (the source never needs a private age key, see
//! `docs/JOURNAL.md`, "Encrypted backups"): every kind of the profile listed as a backup lists
//! it, its records encrypted to the recipients of that snapshot (and the journal's own), signed
//! with the journal's key, written as any snapshot is (payload first, manifest last,
//! create-only). The records stay in memory for the journal's state, as a base read back would.

use object_store::buffered::BufWriter;
use tokio::io::AsyncWriteExt;
use tracing::warn;

use crate::domain::capture::{Collector, reasons};
use crate::domain::identity::Profile;
use crate::format::{Manifest, PayloadEncoder, Recipients, Record, SigningKey, SnapshotId};
use crate::k8s::{DEFAULT_PAGE_SIZE, PageRequest, Pager};
use crate::store::SnapshotStore;
use crate::{Error, Result};

/// What a capture takes: the journal's profile, selector, zstd level and signing key.
pub(super) struct Capture<'a> {
    pub profile: &'a Profile,
    pub selector: Option<&'a str>,
    pub zstd_level: i32,
    pub signing_key: Option<&'a SigningKey>,
}

/// Captures the fleet into a new base encrypted to `recipients`, with the `capturedFrom` of
/// `like` (the snapshot it stands in for: the same source cluster). Its manifest and records.
pub(super) async fn capture_base(
    client: &kube::Client,
    store: &SnapshotStore,
    opts: &Capture<'_>,
    like: &Manifest,
    recipients: &Recipients,
) -> Result<(Manifest, Vec<Record>)> {
    let created_at = jiff::Timestamp::now();
    let id = SnapshotId::new(created_at);
    let mut upload = store.payload_writer(&id);
    match capture_into(client, opts, &id, &mut upload, recipients).await {
        Ok((encoder, collector, records)) => {
            let capture = collector.finish(1);
            let (tail, summary) = encoder.finish().map_err(|e| Error::io("finish zstd", e))?;
            let mut manifest = Manifest::new(store.cluster_id(), id, created_at, &opts.profile.name, capture, summary);
            manifest.captured_from = like.captured_from.clone();
            store.finish_snapshot(upload, &tail, &mut manifest, opts.signing_key).await?;
            Ok((manifest, records))
        }
        Err(e) => {
            if let Err(abort) = upload.abort().await {
                warn!(snapshot = %id, error = %abort, "could not abort the payload upload; retention removes it later");
            }
            Err(e)
        }
    }
}

async fn capture_into(
    client: &kube::Client,
    opts: &Capture<'_>,
    id: &SnapshotId,
    upload: &mut BufWriter,
    recipients: &Recipients,
) -> Result<(PayloadEncoder, Collector, Vec<Record>)> {
    let mut encoder =
        PayloadEncoder::with_recipients(opts.zstd_level, Some(recipients)).map_err(|e| Error::io("start zstd", e))?;
    let mut collector = Collector::new();
    let mut records = Vec::new();
    let page = PageRequest { size: DEFAULT_PAGE_SIZE, selector: opts.selector, namespace: None };
    for kind in &opts.profile.kinds {
        collector.begin_kind(kind);
        if kind.is_denied() {
            collector.skip_kind(kind, reasons::SECRET_KIND);
            continue;
        }
        let mut pager = Pager::new(client, kind, &page);
        while let Some(listed) = pager.next().await? {
            for object in pager.objects(&listed) {
                if let Some(record) = collector.add(kind, &object?) {
                    encoder.push(&record).map_err(|e| Error::io(format!("encode {}", record.object_name()), e))?;
                    records.push(record);
                }
            }
            let compressed = encoder.take_output();
            if !compressed.is_empty() {
                upload
                    .write_all(&compressed)
                    .await
                    .map_err(|e| Error::io(format!("upload payload of snapshot {id}"), e))?;
            }
        }
        if !pager.served() {
            collector.skip_kind(kind, reasons::NOT_SERVED);
        }
    }
    Ok((encoder, collector, records))
}
