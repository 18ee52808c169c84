//! Each command as library calls: connect, run, print. Errors carry anyhow context for people.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use restatus::backup::schedule::{self, Schedule};
use restatus::backup::{self, BackupOptions};
use restatus::controller::{self, ControllerOptions, Election, Role as ControllerRole};
use restatus::k8s;
use restatus::moving::handshake::Handshake;
use restatus::moving::preflight::{self, PreflightOptions, PreflightReport};
use restatus::restore::{self, RestoreOptions};
use restatus::store::{self, RetentionPolicy, SnapshotStore};
use tracing::{info, warn};

use super::output::{self, OutputFormat};
use super::{
    BackupArgs, Command, ControllerArgs, Global, OutputArgs, PreflightArgs, RestoreArgs, Role, SnapshotsCommand,
};

/// Runs one command; the exit code for commands that have more than success and failure.
pub async fn run(global: Global, command: Command) -> Result<ExitCode> {
    let store = SnapshotStore::open(&global.storage, &global.cluster_id)?.with_max_payload(global.max_snapshot_size);
    match command {
        Command::Preflight(args) => return preflight(&global, &store, args).await,
        Command::Backup(args) => {
            let (client, options) = backup_setup(&global, &args).await?;
            let manifest =
                backup::run(&client, &store, &options).await.context("backup failed; no snapshot was written")?;
            println!("{}", manifest.snapshot_id);
            prune(&store, args.retention.policy()).await?;
        }
        Command::Schedule { cron, backup: args } => {
            let schedule: Schedule = cron.parse()?;
            let (client, options) = backup_setup(&global, &args).await?;
            let policy = args.retention.policy();
            info!(schedule = schedule.expression(), storage = store.location(), "schedule started");
            let job = || async {
                backup::run(&client, &store, &options).await?;
                store::retention::apply(&store, policy).await.map(|_| ())
            };
            let runs = schedule::run(&schedule, job, shutdown_signal()).await;
            info!(runs, "schedule stopped");
        }
        Command::Restore(args) => restore(&global, &store, args).await?,
        Command::Controller(args) => controller(&global, store, args).await?,
        Command::Snapshots(command) => snapshots(&store, command).await?,
    }
    Ok(ExitCode::SUCCESS)
}

async fn backup_setup(g: &Global, args: &BackupArgs) -> Result<(kube::Client, BackupOptions)> {
    let (profile, client) = k8s::connect(&g.profile, g.kubeconfig.as_deref(), g.context.as_deref()).await?;
    let options = BackupOptions {
        page_size: args.page_size.max(1),
        selector: g.selector.clone(),
        zstd_level: args.zstd_level,
        capture_attempts: args.capture_attempts,
        ..BackupOptions::new(profile)
    };
    Ok((client, options))
}

async fn preflight(g: &Global, store: &SnapshotStore, args: PreflightArgs) -> Result<ExitCode> {
    let (client, backup_options) = backup_setup(g, &args.backup).await?;
    let options = PreflightOptions {
        profile: backup_options.profile.clone(),
        selector: g.selector.clone(),
        freshness: !args.snapshot_when_ready,
        cluster_namespace: args.cluster_namespace.clone(),
    };
    let mut report = if args.wait {
        let mut progress = Progress::default();
        let settle = Duration::from_millis(500);
        preflight::wait(&client, store, &options, args.timeout, settle, |r| progress.show(r)).await?
    } else {
        preflight::gather(&client, store, &options).await?
    };
    if args.snapshot_when_ready {
        preflight::snapshot_when_ready(&client, store, &backup_options, &mut report)
            .await
            .context("snapshot when ready failed")?;
    }
    match args.output.output {
        OutputFormat::Json => println!("{}", serde_json::to_string(&report)?),
        OutputFormat::Table => print!("{}", output::preflight_text(&report)),
    }
    Ok(if report.ready { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `preflight --wait` on stderr: the count of blocking objects and what changed since the
/// last evaluation.
#[derive(Default)]
struct Progress {
    last: Option<BTreeSet<String>>,
}

impl Progress {
    fn show(&mut self, report: &PreflightReport) {
        let now: BTreeSet<String> = report.blockers.iter().map(|b| format!("{}: {}", b.object, b.reason)).collect();
        if self.last.as_ref() == Some(&now) {
            return;
        }
        let before = self.last.take().unwrap_or_default();
        eprintln!("{} blocking objects", now.len());
        for line in before.difference(&now) {
            eprintln!("  cleared: {line}");
        }
        for line in now.difference(&before) {
            eprintln!("  blocks:  {line}");
        }
        self.last = Some(now);
    }
}

async fn controller(g: &Global, store: SnapshotStore, args: ControllerArgs) -> Result<()> {
    let (profile, client) = k8s::connect(&g.profile, g.kubeconfig.as_deref(), g.context.as_deref()).await?;
    let role = match args.role {
        Role::Target => ControllerRole::Target,
        Role::Source => {
            let backup = BackupOptions { selector: g.selector.clone(), ..BackupOptions::new(profile.clone()) };
            let handshake =
                Handshake::new(client.clone(), store.clone(), backup, args.interval, args.cluster_namespace.clone());
            ControllerRole::Source(Box::new(handshake))
        }
    };
    let options = ControllerOptions {
        profile,
        selector: g.selector.clone(),
        force: args.force,
        allow_inconsistent: args.allow_inconsistent,
        concurrency: args.concurrency.max(1),
        snapshot_refresh: args.snapshot_refresh,
        batch_window: Duration::from_millis(50),
    };
    let election = Election {
        http_addr: args.http_addr,
        lease_namespace: args.lease_namespace,
        lease_name: args.lease_name,
        identity: args.identity.unwrap_or_else(|| format!("restatus-{:08x}", rand::random::<u32>())),
    };
    let ctx = controller::Context::new(client, store, options);
    controller::run_elected(ctx, role, &election, shutdown_signal()).await?;
    Ok(())
}

async fn restore(g: &Global, store: &SnapshotStore, args: RestoreArgs) -> Result<()> {
    let (profile, client) = k8s::connect(&g.profile, g.kubeconfig.as_deref(), g.context.as_deref()).await?;
    let options = RestoreOptions {
        snapshot: args.snapshot,
        force: args.force,
        dry_run: args.dry_run,
        allow_inconsistent: args.allow_inconsistent,
        concurrency: args.concurrency.max(1),
        selector: g.selector.clone(),
        // The changes are shown by a dry run's table and in JSON.
        explain: args.dry_run || matches!(args.output.output, OutputFormat::Json),
        ..RestoreOptions::new(profile)
    };
    if options.force {
        warn!("--force: live statuses that moved on after the snapshot will be overwritten");
    }
    let report = restore::run(&client, store, &options).await.context("restore failed")?;
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

async fn prune(store: &SnapshotStore, policy: RetentionPolicy) -> Result<()> {
    if policy.is_set() {
        let plan =
            store::retention::apply(store, policy).await.context("retention failed (the new snapshot is written)")?;
        print_retention(&plan, "deleted");
    }
    Ok(())
}

fn print_retention(plan: &store::retention::RetentionPlan, deleted: &str) {
    for d in &plan.deletions {
        eprintln!("{deleted} {} ({})", d.id, d.reason);
    }
    for k in &plan.kept {
        eprintln!("kept {} ({})", k.id, k.reason);
    }
}

async fn snapshots(store: &SnapshotStore, command: SnapshotsCommand) -> Result<()> {
    match command {
        SnapshotsCommand::List(out) => {
            let rows = output::snapshot_rows(store, &store.list().await?).await;
            match out.output {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
                OutputFormat::Table => print!("{}", output::snapshot_table(&rows)),
            }
        }
        SnapshotsCommand::Show { id, output: out } => {
            let manifest = store.manifest(&store::resolve(store, &id).await?).await?;
            match out.output {
                OutputFormat::Json => println!("{}", String::from_utf8_lossy(&manifest.to_json())),
                OutputFormat::Table => print!("{}", output::manifest_text(&manifest)),
            }
        }
        SnapshotsCommand::Verify { id, output: out } => return verify(store, &id, out).await,
        SnapshotsCommand::Prune { retention, dry_run } => {
            if !retention.policy().is_set() {
                bail!("prune needs --keep-last and/or --max-age");
            }
            match dry_run {
                true => print_retention(&store::retention::plan_for(store, retention.policy()).await?, "would delete"),
                false => prune(store, retention.policy()).await?,
            }
        }
    }
    Ok(())
}

async fn verify(store: &SnapshotStore, id: &str, out: OutputArgs) -> Result<()> {
    let id = store::resolve(store, id).await?;
    let result = store.load(&id, |_| Ok(())).await;
    let (ok, detail) = match &result {
        Ok(m) => (true, format!("{} records, sha256 {}", m.payload.records, m.payload.sha256)),
        Err(e) => (false, e.to_string()),
    };
    match out.output {
        OutputFormat::Json => {
            println!("{}", serde_json::json!({"snapshot": id.to_string(), "ok": ok, "detail": detail}))
        }
        OutputFormat::Table => println!("{id}: {} ({detail})", if ok { "OK" } else { "FAILED" }),
    }
    result.map(|_| ()).map_err(Into::into)
}

/// Completes on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
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
