//! `restatus-fleet`: creates a sample metal-operator fleet with realistic status on a cluster
//! (demo, end-to-end tests, benchmarks).

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use restatus::fleet::{self, FleetSpec};

#[derive(Parser)]
#[command(about = "Creates a sample metal-operator fleet with realistic status")]
struct Args {
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Name prefix and label value of the fleet.
    #[arg(long, default_value = "demo")]
    name: String,
    #[arg(long, default_value_t = 40)]
    servers: usize,
    #[arg(long, default_value_t = 40)]
    bmcs: usize,
    #[arg(long, default_value_t = 20)]
    claims: usize,
    /// Create the objects without status, as `clusterctl move` leaves them.
    #[arg(long)]
    no_status: bool,
    /// Create the objects with restatus's `ignore`, as a move after the source-role
    /// handshake leaves them.
    #[arg(long)]
    quiesced: bool,
    /// Namespace of the claims (repeatable; claims are spread round-robin). Default: team-a, team-b.
    #[arg(long = "namespace")]
    namespaces: Vec<String>,
    /// Extra label KEY=VALUE on every object (repeatable), e.g. clusterctl's move label.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// BENCH ONLY, never for a real cluster: write the Servers straight into this etcd (its
    /// client URL, e.g. http://127.0.0.1:2379; the cluster of --kubeconfig must be the one
    /// that uses it) through its v3 HTTP/JSON gateway, as the API server would store them,
    /// bypassing validation, admission and the API server (hundreds of times faster). BMCs
    /// and claims still go through the API. Servers that exist already are left as they are.
    #[arg(long, value_name = "URL")]
    etcd: Option<String>,
    /// With --etcd: the API server's --etcd-prefix.
    #[arg(long, default_value = "/registry", requires = "etcd")]
    etcd_prefix: String,
    /// With --etcd: no managedFields on the Servers (the API path always writes them).
    #[arg(long, requires = "etcd")]
    no_managed_fields: bool,
}

fn parse_label(s: &str) -> std::result::Result<(String, String), String> {
    let (key, value) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected KEY=VALUE"))?;
    Ok((key.to_string(), value.to_string()))
}

#[tokio::main]
async fn main() -> Result<()> {
    restatus::telemetry::init(restatus::telemetry::LogFormat::Plain);
    let args = Args::parse();
    let client = restatus::k8s::client(args.kubeconfig.as_deref(), None).await?;
    let mut spec = FleetSpec {
        with_status: !args.no_status,
        quiesced: args.quiesced,
        labels: args.labels,
        ..FleetSpec::new(&args.name, args.servers, args.bmcs, args.claims)
    };
    if !args.namespaces.is_empty() {
        spec.namespaces = args.namespaces;
    }
    let started = std::time::Instant::now();
    let via_etcd = args.etcd.is_some();
    if let Some(url) = args.etcd {
        let etcd = fleet::etcd::EtcdTarget {
            url,
            prefix: args.etcd_prefix,
            managed_fields: !args.no_managed_fields,
            one_per_revision: false,
        };
        let loaded = fleet::etcd::load_servers(&etcd, &spec, args.concurrency).await?;
        eprintln!(
            "wrote {} Servers ({:.1} MiB) into etcd {} in {:.1?} ({} were there already)",
            loaded.written,
            loaded.bytes as f64 / 1048576.0,
            etcd.url,
            started.elapsed(),
            loaded.existing
        );
        let took = fleet::etcd::wait_listed(&client, &spec, std::time::Duration::from_secs(3600)).await?;
        eprintln!("the API server lists them after {took:.1?}");
    }
    // The rest of the fleet through the API.
    let total = if via_etcd { spec.total() - spec.servers } else { spec.total() };
    if total > 0 {
        let started = std::time::Instant::now();
        fleet::create_kinds(&client, &spec, args.concurrency, !via_etcd).await?;
        let what = if spec.with_status { "with status" } else { "without status" };
        eprintln!("created {total} objects {what} in {:.1?}", started.elapsed());
    }
    Ok(())
}
