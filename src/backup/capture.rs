//! The listing half of the backup pipeline: each kind page by page through a [`Pager`] (the
//! next page is requested before this one is encoded, so LIST and encoding overlap), objects
//! judged by the [`Collector`] and records streamed through the encoder into the upload.

use object_store::buffered::BufWriter;
use tokio::io::AsyncWriteExt;
use tracing::warn;

use super::BackupOptions;
use crate::domain::capture::{Collector, reasons};
use crate::domain::identity::KindProfile;
use crate::format::{PayloadEncoder, SnapshotId};
use crate::k8s::{Page, Pager};
use crate::{Error, Result};

pub(crate) async fn capture_into(
    client: &kube::Client,
    id: &SnapshotId,
    upload: &mut BufWriter,
    opts: &BackupOptions,
) -> Result<(PayloadEncoder, Collector)> {
    let mut encoder = PayloadEncoder::with_recipients(opts.zstd_level, opts.recipients.as_deref())
        .map_err(|e| Error::io("start zstd", e))?;
    let mut collector = Collector::new();
    opts.progress.start("backup", None);
    for kind in &opts.profile.kinds {
        collector.begin_kind(kind);
        if kind.is_denied() {
            warn!(kind = %kind.qualified_kind(), "profile names a kind that holds credentials; not captured");
            collector.skip_kind(kind, reasons::SECRET_KIND);
            continue;
        }
        let mut pager = Pager::new(client, kind, &opts.page());
        while let Some(page) = pager.next().await? {
            encode_page(kind, &mut pager, &page, &mut collector, &mut encoder)?;
            opts.progress.advance(page.len() as u64);
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
        if !pager.served() {
            warn!(kind = %kind.qualified_kind(), "kind not served by the API server; skipped");
            collector.skip_kind(kind, reasons::NOT_SERVED);
        }
    }
    opts.progress.finish();
    Ok((encoder, collector))
}

fn encode_page(
    kind: &KindProfile,
    pager: &mut Pager,
    page: &Page,
    collector: &mut Collector,
    encoder: &mut PayloadEncoder,
) -> Result<()> {
    for object in pager.objects(page) {
        if let Some(record) = collector.add(kind, &object?) {
            encoder.push(&record).map_err(|e| Error::io(format!("encode {}", record.object_name()), e))?;
        }
    }
    Ok(())
}
