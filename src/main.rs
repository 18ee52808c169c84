//! `restatus`: the command line. Thin: parse arguments, call the library, print, exit.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use restatus::backup::{self, BackupOptions};
use restatus::format::SnapshotId;
use restatus::identity::Profile;
use restatus::output::{self, OutputFormat};
use restatus::restore::RestoreOptions;
use restatus::retention::{self, RetentionPolicy};
use restatus::schedule::{self, Schedule};
use restatus::store::{DEFAULT_STORAGE, SnapshotStore};
use restatus::telemetry::{self, LogFormat};
use tracing::info;

#[derive(Parser)]
#[command(
    name = "restatus",
    version,
    about = "Keeps the status of Kubernetes objects safe across cluster moves and disasters"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Global {
    /// Where snapshots live: s3://bucket/prefix, file:///path or memory://.
    #[arg(long, env = "RESTATUS_STORAGE", default_value = DEFAULT_STORAGE, global = true)]
    storage: String,
    /// Names the cluster whose snapshots these are; several clusters can share a bucket.
    #[arg(long, env = "RESTATUS_CLUSTER_ID", default_value = "default", global = true)]
    cluster_id: String,
    /// `metal-operator` (built in) or a profile file (YAML or JSON).
    #[arg(long, env = "RESTATUS_PROFILE", default_value = "metal-operator", global = true)]
    profile: String,
    /// Only objects with these labels (a Kubernetes label selector, e.g. `site=fra1`).
    #[arg(long, short = 'l', global = true)]
    selector: Option<String>,
    /// Kubeconfig file; default: KUBECONFIG, ~/.kube/config, or in-cluster.
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context.
    #[arg(long, global = true)]
    context: Option<String>,
    #[arg(long, env = "RESTATUS_LOG_FORMAT", value_enum, default_value = "plain", global = true)]
    log_format: LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Takes one snapshot now. Exits 0 only when its manifest is written.
    Backup(BackupArgs),
    /// Takes snapshots on a cron schedule, in-process, until SIGTERM or Ctrl-C.
    Schedule {
        /// Five-field cron expression in UTC, with Kubernetes CronJob semantics.
        #[arg(long)]
        cron: String,
        #[command(flatten)]
        backup: BackupArgs,
    },
    /// Reapplies status from the newest good snapshot to the objects of the target cluster.
    Restore(RestoreArgs),
    /// Restores status whenever an object of the profile appears or loses its status
    /// (target cluster), with leader election and /metrics, /healthz, /readyz.
    Controller(ControllerArgs),
    /// Tells whether the cluster can be moved now (exit 0), or not and why (exit 1); exit 2
    /// when it could not check. Run against the source cluster.
    Preflight(PreflightArgs),
    /// Lists, shows, verifies and prunes snapshots.
    #[command(subcommand)]
    Snapshots(SnapshotsCommand),
}

#[derive(Args, Clone)]
struct BackupArgs {
    /// Objects per LIST page.
    #[arg(long, default_value_t = 500)]
    page_size: u32,
    /// Captures to take at most while they come out inconsistent; the last is written anyway,
    /// marked inconsistent.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    capture_attempts: u32,
    /// zstd level (1-19).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=19))]
    zstd_level: i32,
    #[command(flatten)]
    retention: RetentionArgs,
}

#[derive(Args)]
struct RestoreArgs {
    /// Restore from this snapshot instead of the newest one that verifies.
    #[arg(long)]
    snapshot: Option<SnapshotId>,
    /// Overwrite live statuses that moved on after the snapshot.
    #[arg(long)]
    force: bool,
    /// Print the plan, with the status fields each restore would write; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Also use snapshots whose capture was inconsistent.
    #[arg(long)]
    allow_inconsistent: bool,
    /// Objects written at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Role {
    /// Restore status on the target of a move (or a rebuilt cluster).
    Target,
    /// Guard the source of a move: block clusterctl until a final consistent snapshot exists.
    Source,
}

#[derive(Args)]
struct ControllerArgs {
    #[arg(long, value_enum, default_value = "target")]
    role: Role,
    /// Source role: guard only the CAPI Clusters of this namespace (the one to move).
    #[arg(long)]
    cluster_namespace: Option<String>,
    /// Source role: how often to look at the Clusters.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    interval: Duration,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    http_addr: std::net::SocketAddr,
    /// Namespace of the leader election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "restatus")]
    lease_namespace: String,
    #[arg(long, default_value = "restatus-controller")]
    lease_name: String,
    /// This instance's identity in the election.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// How often to look for a newer snapshot.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    snapshot_refresh: Duration,
    /// Overwrite live statuses that moved on after the snapshot.
    #[arg(long)]
    force: bool,
    /// Also use snapshots whose capture was inconsistent.
    #[arg(long)]
    allow_inconsistent: bool,
    /// Objects written at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
}

#[derive(Args)]
struct PreflightArgs {
    /// Watch until the cluster is ready, showing what still blocks.
    #[arg(long)]
    wait: bool,
    /// How long --wait waits before giving up (exit 1 with the remaining reasons).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Take a snapshot the moment the cluster is ready (then freshness is not a blocker).
    #[arg(long)]
    snapshot_when_ready: bool,
    /// Check only the CAPI Clusters and Machines of this namespace (the one to move).
    #[arg(long)]
    cluster_namespace: Option<String>,
    #[command(flatten)]
    backup: BackupArgs,
    #[command(flatten)]
    output: OutputArgs,
}

#[derive(Args, Clone, Copy)]
struct RetentionArgs {
    /// After a successful backup, keep only the newest N complete snapshots.
    #[arg(long)]
    keep_last: Option<usize>,
    /// After a successful backup, delete snapshots older than this (e.g. 7d, 12h).
    #[arg(long, value_parser = humantime::parse_duration)]
    max_age: Option<Duration>,
}

impl RetentionArgs {
    fn policy(self) -> RetentionPolicy {
        RetentionPolicy { keep_last: self.keep_last, max_age: self.max_age }
    }
}

#[derive(Subcommand)]
enum SnapshotsCommand {
    /// Lists this cluster's snapshots, newest first.
    List(OutputArgs),
    /// Shows a snapshot's manifest (ID or `latest`).
    Show {
        id: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Verifies a snapshot end to end: manifest, size, sha256, decompression, every record.
    Verify {
        id: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Applies retention now.
    Prune(RetentionArgs),
}

#[derive(Args)]
struct OutputArgs {
    #[arg(short, long, value_enum, default_value = "table")]
    output: OutputFormat,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.global.log_format);
    // preflight: 0 ready, 1 not ready, 2 could not check; everything else: 0 or 1.
    let failure = if matches!(cli.command, Command::Preflight(_)) { 2 } else { 1 };
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(failure)
        }
    }
}

async fn preflight(g: &Global, store: &SnapshotStore, args: PreflightArgs) -> Result<std::process::ExitCode> {
    use restatus::preflight::{self, PreflightOptions, PreflightReport};
    let (client, backup_options) = backup_setup(g, &args.backup).await?;
    let options = PreflightOptions {
        profile: backup_options.profile.clone(),
        selector: g.selector.clone(),
        freshness: !args.snapshot_when_ready,
        cluster_namespace: args.cluster_namespace.clone(),
    };
    let print = |report: &PreflightReport| match args.output.output {
        OutputFormat::Json => println!("{}", serde_json::to_string(report).unwrap_or_default()),
        OutputFormat::Table => print!("{}", output::preflight_text(report)),
    };
    let mut report = if args.wait {
        // Each evaluation prints the count of blocking objects and what changed since the last.
        let mut last: Option<std::collections::BTreeSet<String>> = None;
        preflight::wait(&client, store, &options, args.timeout, Duration::from_millis(500), |r| {
            let now: std::collections::BTreeSet<String> =
                r.blockers.iter().map(|b| format!("{}: {}", b.object, b.reason)).collect();
            if last.as_ref() != Some(&now) {
                let before = last.take().unwrap_or_default();
                let cleared: Vec<&String> = before.difference(&now).collect();
                let new: Vec<&String> = now.difference(&before).collect();
                eprintln!("{} blocking objects", now.len());
                for line in cleared {
                    eprintln!("  cleared: {line}");
                }
                for line in new {
                    eprintln!("  blocks:  {line}");
                }
                last = Some(now);
            }
        })
        .await?
    } else {
        preflight::gather(&client, store, &options).await?
    };
    if report.ready && args.snapshot_when_ready {
        let manifest = backup::run(&client, store, &backup_options).await.context("snapshot when ready failed")?;
        report.snapshot = Some(manifest.snapshot_id.to_string());
        if let Some(c) = manifest.consistency.as_ref().filter(|c| !c.consistent) {
            report.ready = false;
            report.blockers = c
                .reasons
                .iter()
                .map(|r| preflight::Blocker {
                    object: r.object.clone(),
                    reason: format!("snapshot inconsistent: {}", r.reason),
                })
                .collect();
        }
    }
    print(&report);
    Ok(if report.ready { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::from(1) })
}

async fn run(cli: Cli) -> Result<std::process::ExitCode> {
    let g = &cli.global;
    let store = SnapshotStore::open(&g.storage, &g.cluster_id)?;
    let done: Result<()> = match cli.command {
        Command::Preflight(args) => return preflight(g, &store, args).await,
        Command::Backup(args) => {
            let (client, options) = backup_setup(g, &args).await?;
            let manifest =
                backup::run(&client, &store, &options).await.context("backup failed; no snapshot was written")?;
            println!("{}", manifest.snapshot_id);
            prune(&store, args.retention.policy()).await
        }
        Command::Schedule { cron, backup: args } => {
            let schedule: Schedule = cron.parse()?;
            let (client, options) = backup_setup(g, &args).await?;
            let policy = args.retention.policy();
            info!(schedule = schedule.expression(), storage = store.location(), "schedule started");
            let job = || async {
                backup::run(&client, &store, &options).await?;
                retention::apply(&store, policy).await.map(|_| ())
            };
            let runs = schedule::run(&schedule, job, shutdown_signal()).await;
            info!(runs, "schedule stopped");
            Ok(())
        }
        Command::Restore(args) => restore(g, &store, args).await,
        Command::Controller(args) => controller(g, store, args).await,
        Command::Snapshots(command) => snapshots(&store, command).await,
    };
    done.map(|()| std::process::ExitCode::SUCCESS)
}

async fn controller(g: &Global, store: SnapshotStore, args: ControllerArgs) -> Result<()> {
    use restatus::controller::{self, Context, ControllerOptions};
    let profile = Profile::load(&g.profile)?;
    let client = restatus::kubeconfig::client(g.kubeconfig.as_deref(), g.context.as_deref()).await?;
    let options = ControllerOptions {
        profile,
        selector: g.selector.clone(),
        force: args.force,
        allow_inconsistent: args.allow_inconsistent,
        concurrency: args.concurrency.max(1),
        snapshot_refresh: args.snapshot_refresh,
        batch_window: Duration::from_millis(50),
    };
    let role = args.role;
    let handshake = restatus::handshake::Handshake::new(
        client.clone(),
        store.clone(),
        BackupOptions { selector: g.selector.clone(), ..BackupOptions::new(options.profile.clone()) },
        args.interval,
        args.cluster_namespace.clone(),
    );
    let ctx = Context::new(client.clone(), store, options);
    let http = tokio::spawn(controller::serve_http(ctx.clone(), args.http_addr));
    let identity = args.identity.unwrap_or_else(|| format!("restatus-{:08x}", rand::random::<u32>()));
    let mut leadership =
        restatus::leader::Leadership::join(&client, &args.lease_namespace, &args.lease_name, &identity).await?;
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    tokio::select! {
        _ = &mut shutdown => return Ok(()),
        acquired = leadership.acquired() => acquired?,
    }
    ctx.metrics.leader.set(1);
    info!(identity, ?role, "leading: controller running");
    let work = async {
        match role {
            Role::Target => controller::run(ctx.clone(), &mut shutdown).await,
            Role::Source => {
                ctx.mark_ready();
                handshake.run(&mut shutdown).await
            }
        }
    };
    let result = tokio::select! {
        result = work => result.map_err(Into::into),
        _ = leadership.lost() => Err(anyhow::anyhow!("leadership lost; exiting so that a restart rejoins the election")),
    };
    ctx.metrics.leader.set(0);
    http.abort();
    result
}

async fn restore(g: &Global, store: &SnapshotStore, args: RestoreArgs) -> Result<()> {
    let profile = Profile::load(&g.profile)?;
    let client = restatus::kubeconfig::client(g.kubeconfig.as_deref(), g.context.as_deref()).await?;
    let options = RestoreOptions {
        snapshot: args.snapshot,
        force: args.force,
        dry_run: args.dry_run,
        allow_inconsistent: args.allow_inconsistent,
        concurrency: args.concurrency.max(1),
        selector: g.selector.clone(),
        ..RestoreOptions::new(profile)
    };
    if options.force {
        tracing::warn!("--force: live statuses that moved on after the snapshot will be overwritten");
    }
    let report = restatus::restore::run(&client, store, &options).await.context("restore failed")?;
    match args.output.output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        OutputFormat::Table => {
            print!("{}", output::plan_table(&report.plan, options.dry_run));
            print!("{}", output::restore_summary(&report));
        }
    }
    if !report.ok() {
        bail!(
            "restore incomplete: {} objects failed, {} pairing violations; rerun to retry",
            report.failures().count(),
            report.pairing.len()
        );
    }
    Ok(())
}

async fn backup_setup(g: &Global, args: &BackupArgs) -> Result<(kube::Client, BackupOptions)> {
    let profile = Profile::load(&g.profile)?;
    let client = restatus::kubeconfig::client(g.kubeconfig.as_deref(), g.context.as_deref()).await?;
    let options = BackupOptions {
        page_size: args.page_size.max(1),
        selector: g.selector.clone(),
        zstd_level: args.zstd_level,
        ..BackupOptions::new(profile)
    };
    Ok((client, options))
}

async fn prune(store: &SnapshotStore, policy: RetentionPolicy) -> Result<()> {
    if policy.is_set() {
        let deleted =
            retention::apply(store, policy).await.context("retention failed (the new snapshot is written)")?;
        for d in deleted {
            eprintln!("deleted {} ({})", d.id, d.reason);
        }
    }
    Ok(())
}

async fn snapshots(store: &SnapshotStore, command: SnapshotsCommand) -> Result<()> {
    match command {
        SnapshotsCommand::List(out) => {
            let entries = store.list().await?;
            let rows = output::snapshot_rows(store, &entries).await;
            match out.output {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
                OutputFormat::Table => print!("{}", output::snapshot_table(&rows)),
            }
            Ok(())
        }
        SnapshotsCommand::Show { id, output: out } => {
            let id = resolve(store, &id).await?;
            let manifest = store.manifest(&id).await?;
            match out.output {
                OutputFormat::Json => println!("{}", String::from_utf8_lossy(&manifest.to_json())),
                OutputFormat::Table => print!("{}", output::manifest_text(&manifest)),
            }
            Ok(())
        }
        SnapshotsCommand::Verify { id, output: out } => {
            let id = resolve(store, &id).await?;
            let result = store.load(&id, |_| Ok(())).await;
            let (ok, detail) = match &result {
                Ok(m) => (true, format!("{} records, sha256 {}", m.payload.records, m.payload.sha256)),
                Err(e) => (false, e.to_string()),
            };
            match out.output {
                OutputFormat::Json => {
                    println!("{}", serde_json::json!({"snapshot": id.to_string(), "ok": ok, "detail": detail}))
                }
                OutputFormat::Table => {
                    println!("{id}: {} ({detail})", if ok { "OK" } else { "FAILED" })
                }
            }
            result.map(|_| ()).map_err(Into::into)
        }
        SnapshotsCommand::Prune(args) => {
            if !args.policy().is_set() {
                bail!("prune needs --keep-last and/or --max-age");
            }
            prune(store, args.policy()).await
        }
    }
}

/// A snapshot id, or `latest`: the newest snapshot with a manifest.
async fn resolve(store: &SnapshotStore, id: &str) -> Result<SnapshotId> {
    if id != "latest" {
        return Ok(id.parse()?);
    }
    let entries = store.list().await?;
    entries
        .into_iter()
        .rev()
        .find(|e| e.complete)
        .map(|e| e.id)
        .with_context(|| format!("no complete snapshot for cluster {} in {}", store.cluster_id(), store.location()))
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => return ctrl_c.await.unwrap_or(()),
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    ctrl_c.await.unwrap_or(());
}
