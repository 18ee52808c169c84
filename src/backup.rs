//! The backup pipeline: capture → encode → store. One snapshot per call.
//!
//! The payload streams to the store page by page; the manifest is written only when the
//! payload upload has completed, with a create-only PUT. Any failure aborts the upload and
//! leaves no manifest, so a half-written backup never looks complete.

use jiff::Timestamp;
use object_store::buffered::BufWriter;
use tokio::io::AsyncWriteExt;
use tracing::{info, warn};

use crate::capture::{CaptureSummary, Collector, ListPage, PageRequest, fetch_page, parse_item, reasons};
use crate::format::{Manifest, PayloadEncoder, SnapshotId};
use crate::identity::{KindProfile, Profile};
use crate::store::SnapshotStore;
use crate::{Error, Result};

#[derive(Debug, Clone)]
pub struct BackupOptions {
    pub profile: Profile,
    /// Objects per LIST page.
    pub page_size: u32,
    /// Only objects with these labels (a Kubernetes label selector).
    pub selector: Option<String>,
    pub zstd_level: i32,
    /// Captures to take at most while they come out inconsistent.
    pub capture_attempts: u32,
    /// Pause between two captures.
    pub retry_delay: std::time::Duration,
}

impl BackupOptions {
    pub fn page(&self) -> PageRequest<'_> {
        PageRequest { size: self.page_size, selector: self.selector.as_deref(), namespace: None }
    }

    pub fn new(profile: Profile) -> Self {
        BackupOptions {
            profile,
            page_size: 500,
            selector: None,
            zstd_level: 3,
            capture_attempts: 3,
            retry_delay: std::time::Duration::from_secs(2),
        }
    }
}

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
            let first = &capture.consistency.reasons[0];
            info!(attempt, reasons = capture.consistency.reasons.len(), example = %format!("{}: {}", first.object, first.reason),
                "capture is inconsistent; capturing again");
            let _ = upload.abort().await;
            tokio::time::sleep(opts.retry_delay).await;
            attempt += 1;
            continue;
        }
        let manifest = finish(store, &id, created_at, upload, encoder, capture, &opts.profile).await?;
        if manifest.is_consistent() {
            info!(snapshot = %id, records = manifest.payload.records, bytes = manifest.payload.size, "snapshot written");
        } else {
            warn!(snapshot = %id, attempts = attempt, reasons = manifest.consistency.as_ref().map_or(0, |c| c.reasons.len()),
                "snapshot written, marked inconsistent: restore skips it unless --allow-inconsistent");
        }
        return Ok(manifest);
    }
}

async fn capture_into(
    client: &kube::Client,
    id: &SnapshotId,
    upload: &mut BufWriter,
    opts: &BackupOptions,
) -> Result<(PayloadEncoder, Collector)> {
    let mut encoder = PayloadEncoder::new(opts.zstd_level).map_err(|e| Error::io("start zstd", e))?;
    let mut collector = Collector::new();
    for kind in &opts.profile.kinds {
        collector.begin_kind(kind);
        if kind.is_denied() {
            warn!(kind = %kind.qualified_kind(), "profile names a kind that holds credentials; not captured");
            collector.skip_kind(kind, reasons::SECRET_KIND);
            continue;
        }
        // The next page is requested before this one is encoded, so the API server prepares
        // it while restatus compresses: LIST and encoding overlap.
        let mut next = Some(prefetch(client, kind, opts, None));
        while let Some(fetch) = next.take() {
            let Some(body) = fetch.await.map_err(|e| Error::io("LIST task", std::io::Error::other(e)))?? else {
                warn!(kind = %kind.qualified_kind(), "kind not served by the API server; skipped");
                collector.skip_kind(kind, reasons::NOT_SERVED);
                break;
            };
            let page = ListPage::parse(kind, &body)?;
            next = page.next().map(|token| prefetch(client, kind, opts, Some(token.to_string())));
            if let Err(e) = encode_page(kind, &page, &mut collector, &mut encoder) {
                next.inspect(|fetch| fetch.abort());
                return Err(e);
            }
            // Upload what this page compressed to: memory holds about two pages and at most
            // one upload part, whatever the number of objects.
            let compressed = encoder.take_output();
            if !compressed.is_empty() {
                upload
                    .write_all(&compressed)
                    .await
                    .map_err(|e| Error::io(format!("upload payload of snapshot {id}"), e))?;
            }
        }
    }
    Ok((encoder, collector))
}

fn prefetch(
    client: &kube::Client,
    kind: &KindProfile,
    opts: &BackupOptions,
    token: Option<String>,
) -> tokio::task::JoinHandle<Result<Option<String>>> {
    let (client, kind, size, selector) = (client.clone(), kind.clone(), opts.page_size, opts.selector.clone());
    tokio::spawn(async move {
        let page = PageRequest { size, selector: selector.as_deref(), namespace: None };
        fetch_page(&client, &kind, &page, token.as_deref()).await
    })
}

fn encode_page(
    kind: &KindProfile,
    page: &ListPage<'_>,
    collector: &mut Collector,
    encoder: &mut PayloadEncoder,
) -> Result<()> {
    for item in &page.items {
        let object = parse_item(kind, item)?;
        if let Some(record) = collector.add(kind, &object) {
            encoder.push(&record).map_err(|e| Error::io(format!("encode {}", record.object_name()), e))?;
        }
    }
    Ok(())
}

async fn finish(
    store: &SnapshotStore,
    id: &SnapshotId,
    created_at: Timestamp,
    mut upload: BufWriter,
    encoder: PayloadEncoder,
    capture: CaptureSummary,
    profile: &Profile,
) -> Result<Manifest> {
    let (tail, summary) = encoder.finish().map_err(|e| Error::io("finish zstd", e))?;
    let uploaded = async {
        upload.write_all(&tail).await?;
        upload.shutdown().await
    }
    .await;
    if let Err(e) = uploaded {
        // Not aborted: after a failed shutdown object_store has nothing left to abort (a single
        // PUT failed, or completing the multipart upload did). No manifest is written either way.
        return Err(Error::io(format!("upload payload of snapshot {id} to {}", store.location()), e));
    }
    let manifest = Manifest::new(store.cluster_id(), id.clone(), created_at, &profile.name, capture, summary);
    store.put_manifest(&manifest).await?;
    Ok(manifest)
}
