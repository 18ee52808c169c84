//! The listing half of the backup pipeline: each kind page by page, the next page requested
//! before this one is encoded, objects judged by the [`Collector`] and records streamed
//! through the encoder into the upload.

use object_store::buffered::BufWriter;
use tokio::io::AsyncWriteExt;
use tracing::warn;

use crate::backup::BackupOptions;
use crate::domain::capture::{Collector, reasons};
use crate::domain::identity::KindProfile;
use crate::format::{PayloadEncoder, SnapshotId};
use crate::k8s::PageRequest;
use crate::k8s::list::{ListPage, fetch_page, parse_item};
use crate::{Error, Result};

pub(crate) async fn capture_into(
    client: &kube::Client,
    id: &SnapshotId,
    upload: &mut BufWriter,
    opts: &BackupOptions,
) -> Result<(PayloadEncoder, Collector)> {
    let mut encoder = PayloadEncoder::new(opts.zstd_level).map_err(|e| Error::io("start zstd", e))?;
    let mut collector = Collector::new();
    opts.progress.start("backup", None);
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
            opts.progress.advance(page.items.len() as u64);
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
    opts.progress.finish();
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
