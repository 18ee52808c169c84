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
    fleet::create(&client, &spec, args.concurrency).await?;
    let what = if spec.with_status { "with status" } else { "without status" };
    eprintln!("created {} objects {what} in {:.1?}", spec.total(), started.elapsed());
    Ok(())
}
