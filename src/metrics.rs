//! Metrics shared by the long-running modes (restore controller, `restatus schedule`,
//! `restatus journal`): the bucket's view of the newest snapshot of a cluster id, the
//! OpenMetrics text rendering, and an HTTP server of `/metrics`, `/healthz` and `/readyz`.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::format::{Manifest, TrustedKeys};
use crate::store::SnapshotStore;

/// The content type of `/metrics`: the text encoder writes OpenMetrics 1.0.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabel {
    pub cluster_id: String,
}

/// The newest complete snapshot (manifest written) of a cluster id in the bucket, whatever its
/// verdict: read from the listing and that one manifest, never a payload.
#[derive(Clone, Debug, Default)]
pub struct NewestSnapshotMetrics {
    /// `createdAt`, Unix seconds; 0 while none is known.
    pub timestamp: Family<ClusterLabel, Gauge<f64, AtomicU64>>,
    /// 1 when its consistency verdict is consistent (or unchecked, format 1.0), else 0.
    pub consistent: Family<ClusterLabel, Gauge>,
    pub records: Family<ClusterLabel, Gauge>,
    /// Payload bytes as stored (compressed).
    pub bytes: Family<ClusterLabel, Gauge>,
    /// 1 when it is marked as a drop in records against the snapshot before (`recordDrop`),
    /// else 0. Every capture after the drop stays marked until a person deletes the snapshot
    /// before it, so this stays 1 until someone decides.
    pub record_drop: Family<ClusterLabel, Gauge>,
}

impl NewestSnapshotMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "snapshot_newest_timestamp_seconds",
            "Capture start of the newest complete snapshot in the bucket (Unix seconds, 0 while none)",
            self.timestamp.clone(),
        );
        registry.register(
            "snapshot_newest_consistent",
            "1 when the newest complete snapshot in the bucket is consistent, else 0",
            self.consistent.clone(),
        );
        registry.register(
            "snapshot_newest_records",
            "Records in the newest complete snapshot in the bucket",
            self.records.clone(),
        );
        registry.register(
            "snapshot_newest_bytes",
            "Payload bytes (compressed, as stored) of the newest complete snapshot in the bucket",
            self.bytes.clone(),
        );
        registry.register(
            "snapshot_newest_record_drop",
            "1 when the newest complete snapshot in the bucket is marked as a drop in records (recordDrop), else 0",
            self.record_drop.clone(),
        );
    }

    /// Sets the gauges of `cluster_id` from `manifest`, or to 0 when there is none.
    pub fn observe(&self, cluster_id: &str, manifest: Option<&Manifest>) {
        let label = ClusterLabel { cluster_id: cluster_id.to_string() };
        let (at, consistent, records, bytes, drop) = match manifest {
            Some(m) => (
                m.created_at.as_millisecond() as f64 / 1000.0,
                i64::from(m.is_consistent()),
                i64::try_from(m.payload.records).unwrap_or(i64::MAX),
                i64::try_from(m.payload.size).unwrap_or(i64::MAX),
                i64::from(m.record_drop.is_some()),
            ),
            None => (0.0, 0, 0, 0, 0),
        };
        self.record_drop.get_or_create(&label).set(drop);
        self.timestamp.get_or_create(&label).set(at);
        self.consistent.get_or_create(&label).set(consistent);
        self.records.get_or_create(&label).set(records);
        self.bytes.get_or_create(&label).set(bytes);
    }

    /// Lists the store and reads the newest complete manifest; with `trusted` keys (those the
    /// run has), the newest one of them signed ([`crate::store::newest_verified`]): a forged
    /// manifest, however new its date, never silences the alert on the backups' age nor
    /// decides the consistency gauge. On an error the gauges keep their last values (the
    /// alert on age still fires when the listing keeps failing). A snapshot refused once is
    /// remembered in `refused` and not verified again at the next refresh.
    pub async fn refresh(
        &self,
        store: &SnapshotStore,
        trusted: Option<&TrustedKeys>,
        refused: &crate::store::Refused,
    ) -> crate::Result<Option<Manifest>> {
        let newest = crate::store::newest_verified_remembering(store, None, trusted, refused).await?;
        let manifest = newest.map(|(manifest, _)| manifest);
        self.observe(store.cluster_id(), manifest.as_ref());
        Ok(manifest)
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    commit: String,
    rustc: String,
    format_version: String,
}

/// `restatus_build_info{version,commit,rustc,format_version} 1` (registry prefixed `restatus`):
/// which build serves these metrics. Registered by every role that serves `/metrics`.
pub fn register_build_info(registry: &mut Registry) {
    let info = Family::<BuildLabels, Gauge>::default();
    info.get_or_create(&BuildLabels {
        version: env!("CARGO_PKG_VERSION").into(),
        commit: env!("RESTATUS_GIT_COMMIT").into(),
        rustc: env!("RESTATUS_RUSTC_VERSION").into(),
        format_version: format!("{}.{}", crate::format::FORMAT_MAJOR, crate::format::FORMAT_MINOR),
    })
    .set(1);
    registry.register("build_info", "The build serving these metrics (value 1)", info);
}

/// A registry in the OpenMetrics text format ([`OPENMETRICS_CONTENT_TYPE`]).
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("writing to a String cannot fail");
    out
}

/// Binds the endpoints' address: a port that cannot be bound is an error at start, not a
/// probe that fails later.
pub async fn bind(addr: std::net::SocketAddr) -> crate::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| crate::Error::io(format!("listen on {addr} for /metrics, /healthz, /readyz"), e))
}

/// Serves `/metrics` (what `render` returns at each scrape, as OpenMetrics text), `/healthz`
/// and `/readyz` (200 or 503 as `readiness` says, with the body it gives) on `listener` until
/// the process ends: the endpoints of every long-running mode (`controller`, `journal`,
/// `schedule` with `--metrics-addr`).
pub async fn serve<R, Q>(listener: tokio::net::TcpListener, render: R, readiness: Q) -> crate::Result<()>
where
    R: Fn() -> String + Clone + Send + Sync + 'static,
    Q: Fn() -> (bool, String) + Clone + Send + Sync + 'static,
{
    use axum::http::{StatusCode, header};
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || std::future::ready(([(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)], render()))),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let (ready, body) = readiness();
                std::future::ready((if ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, body))
            }),
        );
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    }
    axum::serve(listener, app).await.map_err(|e| crate::Error::io("HTTP server", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The build-info gauge carries the version, commit, rustc and format version, value 1.
    #[test]
    fn build_info_names_the_build_with_value_one() {
        let mut registry = Registry::with_prefix("restatus");
        register_build_info(&mut registry);
        let text = render(&registry);
        let line = text.lines().find(|l| l.starts_with("restatus_build_info{")).unwrap_or_else(|| panic!("{text}"));
        assert!(line.ends_with(" 1"), "{line}");
        for label in [
            format!("version=\"{}\"", env!("CARGO_PKG_VERSION")),
            format!("commit=\"{}\"", env!("RESTATUS_GIT_COMMIT")),
            format!("format_version=\"{}.{}\"", crate::format::FORMAT_MAJOR, crate::format::FORMAT_MINOR),
        ] {
            assert!(line.contains(&label), "{label} in {line}");
        }
        assert!(line.contains("rustc=\"rustc 1."), "{line}");
    }
    use crate::fixtures;
    use crate::format::{Consistency, SnapshotId};
    use jiff::Timestamp;
    use object_store::ObjectStoreExt;

    fn line<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        text.lines().find(|l| l.starts_with(name))
    }

    #[tokio::test]
    async fn newest_snapshot_metrics_come_from_the_newest_complete_manifest() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let metrics = crate::controller::metrics::Metrics::default();
        assert!(metrics.newest.refresh(&store, None, &Default::default()).await.unwrap().is_none());
        let text = metrics.render();
        assert_eq!(
            line(&text, "restatus_snapshot_newest_records"),
            Some("restatus_snapshot_newest_records{cluster_id=\"c\"} 0")
        );

        let old: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        let new: Timestamp = "2026-11-30T11:00:00Z".parse().unwrap();
        let mut first = fixtures::manifest(SnapshotId::new(old), old);
        first.payload.records = 7;
        store.put_manifest(&first).await.unwrap();
        let mut newest = fixtures::manifest(SnapshotId::new(new), new);
        newest.payload.records = 42;
        newest.payload.size = 1234;
        newest.consistency = Some(Consistency { consistent: false, attempts: 3, reasons: vec![], reason_count: 1 });
        store.put_manifest(&newest).await.unwrap();
        // A newer snapshot without a manifest (being written) does not count.
        let pending = SnapshotId::new("2026-11-30T12:00:00Z".parse().unwrap());
        store.object_store().put(&store.payload_path(&pending), bytes::Bytes::from_static(b"x").into()).await.unwrap();

        let read = metrics.newest.refresh(&store, None, &Default::default()).await.unwrap().unwrap();
        assert_eq!(read.snapshot_id, newest.snapshot_id);
        let text = metrics.render();
        let value = |name: &str| line(&text, name).and_then(|l| l.rsplit(' ').next()).map(str::to_string);
        assert_eq!(value("restatus_snapshot_newest_records").as_deref(), Some("42"));
        assert_eq!(value("restatus_snapshot_newest_bytes").as_deref(), Some("1234"));
        assert_eq!(value("restatus_snapshot_newest_consistent").as_deref(), Some("0"));
        let at: f64 = value("restatus_snapshot_newest_timestamp_seconds").unwrap().parse().unwrap();
        assert_eq!(at, new.as_second() as f64);
        assert!(text.ends_with("# EOF\n"), "OpenMetrics text ends with # EOF: {text}");
    }

    /// F144: with the run's keys, a forged manifest dated 2999 (unsigned, consistent) sets
    /// neither the newest snapshot's time (the alert on the backups' age stays armed) nor its
    /// consistency: the gauges are the newest signed snapshot's. Without keys, the newest as it is.
    #[tokio::test]
    async fn a_forged_manifest_never_sets_the_newest_snapshot_gauges() {
        let store = SnapshotStore::open("memory://", "c").unwrap();
        let metrics = crate::controller::metrics::Metrics::default();
        let key = crate::format::SigningKey::generate();
        let trusted = TrustedKeys::new([key.public_key()]);
        let signed: Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        let mut real = fixtures::manifest(SnapshotId::new(signed), signed);
        real.consistency = Some(Consistency { consistent: false, attempts: 3, reasons: vec![], reason_count: 1 });
        store.put_signed_manifest(&mut real, &key).await.unwrap();
        let forged: Timestamp = "2999-01-01T00:00:00Z".parse().unwrap();
        store.put_manifest(&fixtures::manifest(SnapshotId::new(forged), forged)).await.unwrap();

        let value = |name: &str| {
            let text = metrics.render();
            line(&text, name).and_then(|l| l.rsplit(' ').next()).map(str::to_string).unwrap()
        };
        let read = metrics.newest.refresh(&store, Some(&trusted), &Default::default()).await.unwrap().unwrap();
        assert_eq!(read.snapshot_id, real.snapshot_id);
        let at: f64 = value("restatus_snapshot_newest_timestamp_seconds").parse().unwrap();
        assert_eq!(at, signed.as_second() as f64, "the forged date silences the stale-backup alert");
        assert_eq!(value("restatus_snapshot_newest_consistent"), "0");

        metrics.newest.refresh(&store, None, &Default::default()).await.unwrap();
        let at: f64 = value("restatus_snapshot_newest_timestamp_seconds").parse().unwrap();
        assert_eq!(at, forged.as_second() as f64, "without keys: the newest as it is");
    }
}
