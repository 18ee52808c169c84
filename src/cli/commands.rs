//! Each command as library calls: connect, run, print. Errors carry anyhow context for people.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::CommandFactory;
use restatus::backup::schedule::{self, Schedule, ScheduleMetrics};
use restatus::backup::{self, BackupOptions};
use restatus::controller::{self, ControllerOptions, Election, Role as ControllerRole};
use restatus::domain::compare::Comparer;
use restatus::domain::identity::Profile;
use restatus::format::{DecryptionKeys, Recipients, SigningKey, TrustedKeys};
use restatus::journal::metrics::JournalMetrics;
use restatus::journal::{self, JournalOptions};
use restatus::k8s;
use restatus::k8s::leader::{Fence, LeaseTiming};
use restatus::moving::handshake::Handshake;
use restatus::moving::preflight::{self, PreflightOptions, PreflightReport};
use restatus::progress::ProgressHook;
use restatus::restore::{self, RestoreOptions, RestoreReport};
use restatus::store::{self, RetentionPolicy, SnapshotStore};
use tracing::{info, warn};

use super::output::{self, OutputFormat};
use super::progress;
use super::{
    BackupArgs, Cli, Command, ControllerArgs, EncryptionArgs, Global, JournalArgs, KeysCommand, OutputArgs, PointArgs,
    PreflightArgs, RestoreArgs, RestoreFormat, Role, SigningArgs, SnapshotsCommand,
};

/// Runs one command; the exit code for commands that have more than success and failure.
/// Completion and key generation need no key and no storage; every other command reads the
/// keys it is given and opens the storage first (a reading command never creates it).
pub async fn run(global: Global, command: Command) -> Result<ExitCode> {
    let reads_only = reads_only(&command);
    let open = || Opened::open(&global, reads_only);
    match command {
        Command::Completion { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "restatus", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Keys(KeysCommand::Generate { name, age: true }) => {
            generate_age_keys(&name).map(|()| ExitCode::SUCCESS)
        }
        Command::Keys(KeysCommand::Generate { name, age: false }) => generate_keys(&name).map(|()| ExitCode::SUCCESS),
        Command::Preflight(args) => {
            let Opened { store, trusted } = open()?;
            preflight(&global, &store, args, trusted.as_deref()).await
        }
        Command::Backup { backup: args, output: out } => backup(&global, &open()?, args, out.output).await,
        Command::Schedule { cron, metrics_addr, backup: args } => {
            schedule(&global, &open()?, &cron, metrics_addr, args).await.map(|()| ExitCode::SUCCESS)
        }
        Command::Restore(args) => {
            let Opened { store, trusted } = open()?;
            restore(&global, &store, args, trusted).await
        }
        Command::Journal(args) => journal(&global, &open()?, args).await.map(|()| ExitCode::SUCCESS),
        Command::Controller(args) => {
            let Opened { store, trusted } = open()?;
            controller(&global, store, args, trusted).await.map(|()| ExitCode::SUCCESS)
        }
        Command::Snapshots(command) => {
            let Opened { store, trusted } = open()?;
            snapshots(&store, command, trusted.as_deref()).await.map(|()| ExitCode::SUCCESS)
        }
    }
}

/// A command that only reads the storage: it never creates a local storage directory (a wrong
/// path is an error).
fn reads_only(command: &Command) -> bool {
    match command {
        Command::Snapshots(_) | Command::Preflight(_) => true,
        Command::Restore(args) => args.dry_run,
        _ => false,
    }
}

/// The storage a command works on, and the keys it trusts.
struct Opened {
    store: SnapshotStore,
    trusted: Option<Arc<TrustedKeys>>,
}

impl Opened {
    /// Reads the trusted and the decryption keys (a bad key file fails the start, naming the
    /// file), then opens the storage with the decryption keys.
    fn open(global: &Global, reads_only: bool) -> Result<Opened> {
        let trusted = TrustedKeys::load(&global.trusted_keys)?.map(Arc::new);
        if let Some(trusted) = &trusted {
            let ids: Vec<&str> = trusted.ids().map(|k| k.as_str()).collect();
            info!(keys = %ids.join(","), "only snapshots signed by these keys are used");
        }
        let decryption = DecryptionKeys::load(&global.decryption_keys)?.map(Arc::new);
        if let Some(keys) = &decryption {
            let files: Vec<String> = global.decryption_keys.iter().map(|p| p.display().to_string()).collect();
            info!(files = %files.join(","), recipients = %keys.recipients().join(","), "encrypted snapshots are decrypted");
        }
        let open = if reads_only { SnapshotStore::open_existing_with } else { SnapshotStore::open_with };
        let store = open(&global.storage, &global.cluster_id, &global.s3_options())?
            .with_max_payload(global.max_snapshot_size)
            .with_decryption_keys(decryption);
        Ok(Opened { store, trusted })
    }
}

/// `backup`: one snapshot, then retention; its id at once for a table, a document after.
async fn backup(g: &Global, opened: &Opened, args: BackupArgs, format: OutputFormat) -> Result<ExitCode> {
    let Opened { store, trusted } = opened;
    let (client, mut options) = backup_setup(g, &args, trusted.as_deref()).await?;
    options.progress = ProgressHook::new(Arc::from(progress::for_stderr(g.progress_interval)));
    let manifest = backup::run(&client, store, &options).await.context("backup failed; no snapshot was written")?;
    let url = store.snapshot_url(&manifest.snapshot_id);
    info!(snapshot = %manifest.snapshot_id, url = %url, "backup written to {url}");
    let code = backup_exit_code(&manifest);
    // A table prints the id at once (scripts read it), a document once retention ran.
    if format == OutputFormat::Table {
        println!("{}", manifest.snapshot_id);
    }
    let keys = options.trusted.as_deref().cloned();
    let (retention, failed) = match prune(store, args.retention.policy(), keys.as_ref(), format).await {
        Ok(retention) => (retention, None),
        Err(e) => (None, Some(e)),
    };
    if format != OutputFormat::Table {
        let report = output::BackupReport::of(&manifest, url, code, retention);
        output::emit(format, &report, String::new)?;
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(ExitCode::from(code)),
    }
}

/// `schedule`: backups (and retention) on a cron schedule until a signal, `/metrics` served.
async fn schedule(
    g: &Global,
    opened: &Opened,
    cron: &str,
    metrics_addr: Option<std::net::SocketAddr>,
    args: BackupArgs,
) -> Result<()> {
    let Opened { store, trusted } = opened;
    let schedule: Schedule = cron.parse()?;
    let metrics = Arc::new(ScheduleMetrics::new(store.cluster_id()));
    // Bound before anything else: a taken port fails the start, not a scrape later.
    let server = match metrics_addr {
        Some(addr) => {
            let listener = restatus::metrics::bind(addr).await.with_context(|| format!("--metrics-addr {addr}"))?;
            let m = metrics.clone();
            // Running is ready: a backup that fails is counted, not a reason to restart.
            let ready = || (true, "ready\n".to_string());
            Some(tokio::spawn(restatus::metrics::serve(listener, move || m.render(), ready)))
        }
        None => None,
    };
    let (client, options) = backup_setup(g, &args, trusted.as_deref()).await?;
    let policy = args.retention.policy();
    let keys = options.trusted.as_deref().cloned();
    let refused = store::Refused::default();
    info!(schedule = schedule.expression(), storage = store.location(), "schedule started");
    if let Err(e) = metrics.newest.refresh(store, keys.as_ref(), &refused).await {
        warn!(error = %e, "cannot read the newest snapshot for the metrics");
    }
    let job = || async {
        let started = std::time::Instant::now();
        let result = backup::run(&client, store, &options).await;
        // The bucket's view first: a scrape that counts this backup sees its snapshot.
        if let Err(e) = metrics.newest.refresh(store, keys.as_ref(), &refused).await {
            warn!(error = %e, "cannot read the newest snapshot for the metrics");
        }
        metrics.backup_finished(result.as_ref().ok(), started.elapsed());
        result?;
        store::retention::apply(store, policy, keys.as_ref()).await.map(|_| ())
    };
    let runs = schedule::run(&schedule, job, shutdown_signal()).await;
    info!(runs, "schedule stopped");
    if let Some(server) = server {
        server.abort();
    }
    Ok(())
}

/// `journal`: segments every interval until a signal, `/metrics` and the probes served.
async fn journal(g: &Global, opened: &Opened, args: JournalArgs) -> Result<()> {
    let Opened { store, trusted } = opened;
    let metrics = Arc::new(JournalMetrics::new(store.cluster_id()));
    // Bound before anything else: a taken port fails the start, not a probe later.
    let server = match args.metrics_addr {
        Some(addr) => {
            let listener = restatus::metrics::bind(addr).await.with_context(|| format!("--metrics-addr {addr}"))?;
            let (m, r) = (metrics.clone(), metrics.clone());
            let ready = move || match r.readiness() {
                Ok(()) => (true, "ready\n".to_string()),
                Err(why) => (false, format!("not ready: {why}\n")),
            };
            Some(tokio::spawn(restatus::metrics::serve(listener, move || m.render(), ready)))
        }
        None => None,
    };
    let signing = signing_key(&args.signing)?;
    let recipients = recipients(&args.encryption)?;
    let (profile, client) = k8s::connect(&g.profile, g.kubeconfig.as_deref(), g.context.as_deref()).await?;
    let options = JournalOptions {
        selector: g.selector.clone(),
        interval: args.journal_interval,
        base_refresh: args.base_refresh,
        base_wait: args.base_wait,
        zstd_level: args.zstd_level,
        max_segments: args.max_segments,
        trusted: trusted.clone(),
        signing_key: signing,
        recipients,
        metrics: Some(metrics),
        ..JournalOptions::new(profile)
    };
    info!(interval = ?options.interval, storage = store.location(), "journal started");
    let result = journal::run(&client, store, &options, shutdown_signal()).await;
    if let Some(server) = server {
        server.abort();
    }
    result.context("journal failed")?;
    Ok(())
}

/// Exit code of `backup` when a capture stayed inconsistent after its retries: the snapshot is
/// written (marked inconsistent) but a CronJob must fail so that its alerts fire.
pub const EXIT_INCONSISTENT: u8 = 3;

/// `backup`'s exit code once a snapshot is written and marked as a drop in records
/// (`--max-record-drop`): retention keeps the snapshot before it, a person decides.
pub const EXIT_RECORD_DROP: u8 = 4;

/// `backup`'s exit code once a snapshot is written: [`EXIT_RECORD_DROP`] when it is marked as a
/// drop in records, else 0 consistent, [`EXIT_INCONSISTENT`] otherwise.
fn backup_exit_code(manifest: &restatus::format::Manifest) -> u8 {
    match (manifest.record_drop.is_some(), manifest.is_consistent()) {
        (true, _) => EXIT_RECORD_DROP,
        (false, true) => 0,
        (false, false) => EXIT_INCONSISTENT,
    }
}

/// The options of a backup; `trusted`: the `--trusted-key`s, with the signing key's public
/// half what the run judges the snapshots before by (retention, the drop in records).
async fn backup_setup(
    g: &Global,
    args: &BackupArgs,
    trusted: Option<&TrustedKeys>,
) -> Result<(kube::Client, BackupOptions)> {
    // The keys first: a bad key fails the start before any cluster is asked.
    let (signing_key, recipients) = (signing_key(&args.signing)?, recipients(&args.encryption)?);
    let (profile, client) = k8s::connect(&g.profile, g.kubeconfig.as_deref(), g.context.as_deref()).await?;
    let trusted = run_keys(trusted, signing_key.as_deref()).map(Arc::new);
    let options = BackupOptions {
        page_size: args.page_size.max(1),
        selector: g.selector.clone(),
        zstd_level: args.zstd_level,
        capture_attempts: args.capture_attempts,
        signing_key,
        recipients,
        max_record_drop: args.max_record_drop,
        trusted,
        ..BackupOptions::new(profile)
    };
    Ok((client, options))
}

/// The `--signing-key`, read (its file named in errors and logs, never its content).
fn signing_key(args: &SigningArgs) -> Result<Option<Arc<SigningKey>>> {
    let Some(path) = &args.signing_key else { return Ok(None) };
    let key = SigningKey::load(path)?;
    info!(file = %path.display(), key = %key.id(), "snapshots are signed");
    Ok(Some(Arc::new(key)))
}

/// The `--encrypt-to` recipients, read (public keys: logged).
fn recipients(args: &EncryptionArgs) -> Result<Option<Arc<Recipients>>> {
    let Some(recipients) = Recipients::load(&args.encrypt_to)? else { return Ok(None) };
    info!(recipients = %recipients.to_strings().join(","), "snapshot payloads are encrypted");
    Ok(Some(Arc::new(recipients)))
}

/// Creates `path` with `text`, never overwriting a file.
fn create_new(path: &Path, text: &str, mode: u32) -> Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    let mut file = options.open(path).with_context(|| format!("create {}", path.display()))?;
    std::io::Write::write_all(&mut file, text.as_bytes()).with_context(|| format!("write {}", path.display()))
}

/// `NAME` with `extension` appended.
fn with_extension(name: &Path, extension: &str) -> std::path::PathBuf {
    let mut path = name.as_os_str().to_owned();
    path.push(extension);
    std::path::PathBuf::from(path)
}

/// `restatus keys generate --age NAME`: NAME.agekey (0600) and NAME.recipient, neither
/// overwritten; prints the recipient.
fn generate_age_keys(name: &Path) -> Result<()> {
    let (key, recipient) = DecryptionKeys::generate(jiff::Timestamp::now());
    let (private_path, public_path) = (with_extension(name, ".agekey"), with_extension(name, ".recipient"));
    create_new(&private_path, &key, 0o600)?;
    create_new(&public_path, &format!("{recipient}\n"), 0o644)?;
    eprintln!("private key: {} (for --decryption-key, where restores run)", private_path.display());
    eprintln!("recipient:   {} (for --encrypt-to, where backups run)", public_path.display());
    println!("recipient {recipient}");
    Ok(())
}

/// `restatus keys generate NAME`: NAME.key (0600) and NAME.pub, neither overwritten.
fn generate_keys(name: &Path) -> Result<()> {
    let key = SigningKey::generate();
    let public = key.public_key();
    let (private_path, public_path) = (with_extension(name, ".key"), with_extension(name, ".pub"));
    create_new(&private_path, &key.to_pem()?, 0o600)?;
    create_new(&public_path, &public.to_pem()?, 0o644)?;
    eprintln!("private key: {} (for --signing-key, where backups run)", private_path.display());
    eprintln!("public key:  {} (for --trusted-key, where restores run)", public_path.display());
    println!("key id {}  {}", public.id(), public.to_short());
    Ok(())
}

async fn preflight(
    g: &Global,
    store: &SnapshotStore,
    args: PreflightArgs,
    trusted: Option<&TrustedKeys>,
) -> Result<ExitCode> {
    let (client, backup_options) = backup_setup(g, &args.backup, trusted).await?;
    let options = PreflightOptions {
        profile: backup_options.profile.clone(),
        selector: g.selector.clone(),
        freshness: !args.snapshot_when_ready,
        cluster_namespace: args.cluster_namespace.clone(),
        trusted: backup_options.trusted.clone(),
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
    if args.label_commands {
        report.label_commands.iter().for_each(|c| println!("{c}"));
    } else {
        output::emit(args.output.output, &report, || output::preflight_text(&report))?;
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

async fn controller(
    g: &Global,
    store: SnapshotStore,
    args: ControllerArgs,
    trusted: Option<Arc<TrustedKeys>>,
) -> Result<()> {
    let profile = Profile::load(&g.profile)?;
    // Every write of the controller passes the fence: open only while this instance holds a
    // lease it renewed in time, on a client of the lease's own.
    let fence = Fence::default();
    let write_limit = args.limit.write_limit(args.limit.concurrency);
    let client =
        k8s::client::fenced_client(g.kubeconfig.as_deref(), g.context.as_deref(), &fence, &write_limit).await?;
    let timing = LeaseTiming { duration: args.lease_duration };
    let lease_client = k8s::client::lease_client(g.kubeconfig.as_deref(), g.context.as_deref(), &timing).await?;
    // The keys the run judges its bucket by: the trusted keys, and on the source the public
    // half of the signing key its final snapshots are signed with.
    let mut keys = trusted.clone();
    let role = match args.role {
        Role::Target => ControllerRole::Target,
        Role::Source => {
            let backup = BackupOptions {
                selector: g.selector.clone(),
                signing_key: signing_key(&args.signing)?,
                recipients: recipients(&args.encryption)?,
                ..BackupOptions::new(profile.clone())
            };
            keys = run_keys(trusted.as_deref(), backup.signing_key.as_deref()).map(Arc::new);
            let handshake =
                Handshake::new(client.clone(), store.clone(), backup, args.interval, args.cluster_namespace.clone())
                    .with_trusted_keys(keys.clone());
            ControllerRole::Source(Box::new(handshake))
        }
    };
    let options = ControllerOptions {
        profile,
        selector: g.selector.clone(),
        force: args.force,
        allow_inconsistent: args.allow_inconsistent,
        allow_same_cluster: args.allow_same_cluster,
        trusted_keys: keys,
        demands: demands(g, &args.demands)?,
        // Twice the writes it may let through: an object spends part of its reconcile reading
        // (a claim) and planning, and the writes' slots stay full meanwhile.
        concurrency: 2 * args.limit.objects_in_flight(args.limit.concurrency),
        write_limit: Some(write_limit),
        snapshot_refresh: args.snapshot_refresh,
        snapshot_timeout: args.snapshot_timeout,
        batch_window: Duration::from_millis(50),
        journal: !args.no_journal,
    };
    let election = Election {
        http_addr: args.http_addr,
        lease_namespace: args.lease_namespace,
        lease_name: args.lease_name,
        identity: args.identity.unwrap_or_else(|| format!("restatus-{:08x}", rand::random::<u32>())),
        timing,
        lease_client,
        fence,
    };
    let ctx = controller::Context::new(client, store, options);
    controller::run_elected(ctx, role, &election, shutdown_signal()).await?;
    Ok(())
}

/// What a restore or the controller demands of a snapshot (`--expect-source`,
/// `--require-encryption`), said once in the log. Encryption required without a decryption
/// key is refused: no snapshot could be used.
fn demands(g: &Global, args: &super::DemandArgs) -> Result<restatus::store::Demands> {
    let demands = args.demands();
    if !demands.sources.is_empty() {
        if g.trusted_keys.is_empty() {
            warn!("--expect-source without --trusted-key: capturedFrom is checked, but nobody signed it");
        }
        info!(sources = %demands.sources.join(","), "only snapshots captured from these sources are used");
    }
    if demands.encryption {
        if g.decryption_keys.is_empty() {
            bail!("--require-encryption needs --decryption-key: without it no encrypted snapshot can be read");
        }
        info!("only encrypted snapshots and segments are used (--require-encryption)");
    }
    Ok(demands)
}

async fn restore(
    g: &Global,
    store: &SnapshotStore,
    args: RestoreArgs,
    trusted: Option<Arc<TrustedKeys>>,
) -> Result<ExitCode> {
    let profile = Profile::load(&g.profile)?;
    let write_limit = args.limit.write_limit(restatus::k8s::limit::DEFAULT_MAX);
    let client = k8s::limited_client(g.kubeconfig.as_deref(), g.context.as_deref(), &write_limit).await?;
    let format = args.output.output;
    // `jsonl` and a dry run's table print each object as it comes, and the report holds none.
    let stream = match (format, args.dry_run) {
        (RestoreFormat::Jsonl, _) | (RestoreFormat::Table, true) => Some(Arc::new(output::Stream::stdout())),
        _ => None,
    };
    let options = RestoreOptions {
        snapshot: args.snapshot,
        force: args.force,
        dry_run: args.dry_run,
        allow_inconsistent: args.allow_inconsistent,
        allow_same_cluster: args.allow_same_cluster,
        trusted_keys: trusted,
        demands: demands(g, &args.demands)?,
        journal: !args.no_journal,
        at: args.at,
        concurrency: args.limit.objects_in_flight(restatus::k8s::limit::DEFAULT_MAX),
        write_limit: Some(write_limit),
        selector: g.selector.clone(),
        // The changes are shown by a dry run's table and in JSON.
        explain: args.dry_run || format != RestoreFormat::Table,
        sink: stream.clone().map(|stream| restore_sink(stream, format)),
        progress: ProgressHook::new(Arc::from(progress::for_stderr(g.progress_interval))),
        ..RestoreOptions::new(profile)
    };
    if options.force {
        warn!("--force: live statuses that moved on after the snapshot will be overwritten");
    }
    // A reader gone (a closed pipe) stops the restore as a signal does: nobody reads on.
    let closed = stream.as_ref().map(|s| s.closed());
    let stop = async move {
        match closed {
            Some(closed) => tokio::select! { _ = shutdown_signal() => {}, _ = closed => {} },
            None => shutdown_signal().await,
        }
    };
    let report = restore::run_until(&client, store, &options, stop).await.context("restore failed")?;
    print_restore(&report, stream.as_deref(), format)?;
    restore_outcome(&report, stream.as_ref().and_then(|s| s.error()))?;
    Ok(ExitCode::from(restore_exit_code(&report)))
}

/// `restore`'s exit code once it is done: [`EXIT_BEHIND`] when it restored to a point older
/// than the newest one the bucket shows (`behind` in the report says why), else 0.
pub const EXIT_BEHIND: u8 = 5;

fn restore_exit_code(report: &RestoreReport) -> u8 {
    if report.behind.is_some() { EXIT_BEHIND } else { 0 }
}

/// Each object's line as it is decided or written: a JSON line, or a row of the dry run's table
/// (its header before the first).
fn restore_sink(stream: Arc<output::Stream>, format: RestoreFormat) -> restore::Sink {
    let header = std::sync::Once::new();
    restore::Sink::new(move |line| match format {
        RestoreFormat::Jsonl => stream.write(&output::RestoreLine::Object(&line).text()),
        _ => {
            header.call_once(|| stream.write(&output::plan_table_header()));
            stream.write(&output::plan_table_rows(&line.item));
        }
    })
}

/// The report once the restore ends: a streamed run's summary line (or table footer), or the
/// whole document.
fn print_restore(report: &RestoreReport, stream: Option<&output::Stream>, format: RestoreFormat) -> Result<()> {
    match (stream, format.document()) {
        (Some(stream), _) if format == RestoreFormat::Jsonl => {
            stream.write(&output::RestoreLine::Summary(report.summary()).text())
        }
        (Some(stream), _) => {
            if report.counts.values().sum::<usize>() == 0 {
                stream.write(&output::plan_table_header());
            }
            stream.write(&output::restore_summary(report));
        }
        (None, Some(document)) => output::emit(document, report, || {
            output::plan_table(&report.plan, report.dry_run) + &output::restore_summary(report)
        })?,
        (None, None) => {}
    }
    Ok(())
}

/// How a restore that ran ends: an error when it stopped early (by what: a signal, a closed or
/// failed stdout), could not write its output, or left failures; success otherwise, and for a
/// dry run whose reader has seen enough (`| head`).
fn restore_outcome(report: &RestoreReport, stdout_error: Option<std::io::Error>) -> Result<()> {
    let broken_pipe = |e: &std::io::Error| e.kind() == std::io::ErrorKind::BrokenPipe;
    let why = match &stdout_error {
        Some(e) if broken_pipe(e) && report.dry_run => return Ok(()),
        Some(e) if broken_pipe(e) => "a closed stdout (its reader is gone)".to_string(),
        Some(e) => format!("a failed write to stdout ({e})"),
        None => "a signal".into(),
    };
    if let Some(stopped) = &report.stopped {
        let kinds = match stopped.kinds_not_reached.as_slice() {
            [] => String::new(),
            kinds => format!(", kinds not reached: {}", kinds.join(", ")),
        };
        bail!(
            "restore stopped by {why} after {} writes: the objects it had started are finished and \
             released, {} planned objects not started{kinds}; rerun to finish",
            report.writes,
            stopped.writes_not_started
        );
    }
    if let Some(e) = stdout_error.filter(|e| !broken_pipe(e)) {
        bail!("cannot write to stdout: {e}");
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

/// The keys a run judges its cluster's snapshots by (retention's newest one that verifies,
/// preflight's freshness): the `--trusted-key`s, and the public half of the `--signing-key` this
/// run signs with. `None` when neither is given: signatures are not looked at, as before.
fn run_keys(trusted: Option<&TrustedKeys>, signing: Option<&SigningKey>) -> Option<TrustedKeys> {
    match (trusted, signing) {
        (Some(trusted), Some(signing)) => Some(trusted.and(signing.public_key())),
        (Some(trusted), None) => Some(trusted.clone()),
        (None, Some(signing)) => Some(TrustedKeys::new([signing.public_key()])),
        (None, None) => None,
    }
}

/// Retention after a backup, when a policy is set: what it did, also on stderr for a table.
async fn prune(
    store: &SnapshotStore,
    policy: RetentionPolicy,
    trusted: Option<&TrustedKeys>,
    format: OutputFormat,
) -> Result<Option<output::RetentionReport>> {
    if !policy.is_set() {
        return Ok(None);
    }
    let plan = store::retention::apply(store, policy, trusted)
        .await
        .context("retention failed (the new snapshot is written)")?;
    let report = output::RetentionReport::of(&plan, false);
    if format == OutputFormat::Table {
        eprint!("{}", report.text());
    }
    Ok(Some(report))
}

async fn snapshots(store: &SnapshotStore, command: SnapshotsCommand, trusted: Option<&TrustedKeys>) -> Result<()> {
    match command {
        SnapshotsCommand::List(out) => {
            let rows = store::describe_snapshots(store, &store.list().await?, trusted, jiff::Timestamp::now()).await;
            output::emit(out.output, &rows, || output::snapshot_table(&rows))?;
        }
        SnapshotsCommand::Clusters(out) => {
            let clusters = store.clusters().await?;
            if clusters.is_empty() {
                warn!(storage = store.location(), "no cluster id with snapshots under this prefix");
            }
            output::emit(out.output, &clusters, || output::cluster_table(&clusters))?;
        }
        SnapshotsCommand::Show { id, point, objects: true, kind, filter, output: out } => {
            let (manifest, records, at) = snapshot_at(store, &id, point, trusted, true).await?;
            log_point(&manifest, at.as_ref());
            let mut rows = Vec::new();
            for i in 0..records.len() {
                let row = output::ObjectRow::of(&records.record(i)?);
                if row.matches(kind.as_deref(), filter.as_deref()) {
                    rows.push(row);
                }
            }
            output::emit(out.output, &rows, || output::object_table(&rows))?;
        }
        SnapshotsCommand::Show { id, point, output: out, .. } => {
            let (manifest, _, at) = snapshot_at(store, &id, point, trusted, false).await?;
            let shown = output::ShownSnapshot { manifest: &manifest, journal_point: at.as_ref() };
            output::emit(out.output, &shown, || shown.text())?;
        }
        SnapshotsCommand::Diff { a, b, point, output: out } => {
            let (ma, a_records, a_point) =
                snapshot_at(store, &a, point, trusted, true).await.with_context(|| format!("read snapshot {a}"))?;
            let (mb, b_records, b_point) =
                snapshot_at(store, &b, point, trusted, true).await.with_context(|| format!("read snapshot {b}"))?;
            let label = |m: &restatus::format::Manifest, p: Option<&store::Point>| match p {
                Some(p) => format!("{} +{} segments ({})", m.snapshot_id, p.segments_applied, p.time),
                None => m.snapshot_id.to_string(),
            };
            let mut comparer = Comparer::new(label(&ma, a_point.as_ref()), label(&mb, b_point.as_ref()));
            for i in 0..a_records.len() {
                comparer.add_a(&a_records.record(i)?)?;
            }
            for i in 0..b_records.len() {
                comparer.add_b(&b_records.record(i)?)?;
            }
            let diff = output::PointDiff { diff: comparer.finish(), a_point, b_point };
            output::emit(out.output, &diff, || diff.text())?;
        }
        SnapshotsCommand::Verify { id, output: out } => return verify(store, &id, out, trusted).await,
        SnapshotsCommand::Prune { retention, dry_run, output: out } => {
            if !retention.policy().is_set() {
                bail!("prune needs --keep-last and/or --max-age");
            }
            let plan = match dry_run {
                true => store::retention::plan_for(store, retention.policy(), trusted).await?,
                false => store::retention::apply(store, retention.policy(), trusted).await?,
            };
            let report = output::RetentionReport::of(&plan, dry_run);
            match out.output {
                // As before: the lines on stderr, stdout left empty.
                OutputFormat::Table => eprint!("{}", report.text()),
                format => output::emit(format, &report, String::new)?,
            }
        }
        SnapshotsCommand::Delete { id, force, output: out } => {
            let deleted = store::retention::delete_one(store, &id, trusted, force).await?;
            let report = output::DeleteReport::of(&deleted, store.snapshot_url(&id), force);
            output::emit(out.output, &report, || report.text())?;
        }
    }
    Ok(())
}

/// `snapshots show`/`diff`: `ID`, `latest`, `ID@TIME` or `latest@TIME` (`--at` the time when
/// none is given) at the point of its journal `point` asks for.
async fn snapshot_at(
    store: &SnapshotStore,
    id: &str,
    point: PointArgs,
    trusted: Option<&TrustedKeys>,
    records: bool,
) -> Result<(restatus::format::Manifest, restatus::format::Records, Option<store::Point>)> {
    let (id, at) = match id.split_once('@') {
        Some((id, at)) => {
            let at: jiff::Timestamp = at.parse().with_context(|| format!("{at:?} is not a time (RFC 3339)"))?;
            (id, Some(at))
        }
        None => (id, point.at),
    };
    let id = store::resolve_at(store, id, at, trusted).await?;
    Ok(store::snapshot_at(store, &id, trusted, !point.no_journal, at, records).await?)
}

/// Says on stderr which point of the journal is shown.
fn log_point(manifest: &restatus::format::Manifest, point: Option<&store::Point>) {
    match point {
        Some(p) => {
            info!(consistent = p.consistent, "showing {}", p.describe());
            if let Some(gap) = &p.gap {
                warn!("journal: {gap}");
            }
        }
        None => info!("showing snapshot {} (no journal read)", manifest.snapshot_id),
    }
}

async fn verify(store: &SnapshotStore, id: &str, out: OutputArgs, trusted: Option<&TrustedKeys>) -> Result<()> {
    let id = store::resolve_at(store, id, None, trusted).await?;
    let result = store.load_verified(&id, trusted, |_| Ok(())).await;
    let (ok, detail, signer) = match &result {
        Ok((m, signer)) => {
            let signature = match (signer, &m.signed_by) {
                (Some(key), _) => format!(", signature of trusted key {key}"),
                (None, Some(key)) => format!(", signed by key {key} (not checked: no --trusted-key)"),
                (None, None) => ", unsigned".to_string(),
            };
            let detail = format!("{} records, sha256 {}{signature}", m.payload.records, m.payload.sha256);
            (true, detail, signer.as_ref().map(|k| k.to_string()))
        }
        Err(e) => (false, e.to_string(), None),
    };
    let result_json =
        serde_json::json!({"snapshot": id.to_string(), "ok": ok, "detail": detail, "verifiedSigner": signer});
    output::emit(out.output, &result_json, || format!("{id}: {} ({detail})\n", if ok { "OK" } else { "FAILED" }))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An inconsistent snapshot exits 3, one marked as a drop in records 4, distinct from 0
    /// (complete) and 1/2 (failed, could not check).
    #[test]
    fn an_inconsistent_backup_and_a_drop_in_records_exit_with_their_own_codes() {
        let at = jiff::Timestamp::now();
        let mut manifest = restatus::fixtures::manifest(restatus::format::SnapshotId::new(at), at);
        assert_eq!(backup_exit_code(&manifest), 0);
        manifest.consistency.as_mut().unwrap().consistent = false;
        assert_eq!(backup_exit_code(&manifest), EXIT_INCONSISTENT);
        let previous = restatus::format::SnapshotId::new(at);
        manifest.record_drop =
            Some(restatus::format::RecordDrop { previous, previous_records: 10, threshold_percent: 50 });
        assert_eq!(backup_exit_code(&manifest), EXIT_RECORD_DROP);
        assert!(![0, 1, 2, EXIT_INCONSISTENT].contains(&EXIT_RECORD_DROP));
    }

    fn parse(args: &[&str]) -> (Global, Command) {
        use clap::Parser;
        let cli = Cli::try_parse_from(["restatus"].iter().chain(args)).unwrap();
        (cli.global, cli.command)
    }

    /// Listings, preflight and a dry run only read; backups, restores and the controller write.
    #[test]
    fn reading_commands_are_told_apart_from_writing_ones() {
        for (args, reads) in [
            (&["snapshots", "list"][..], true),
            (&["snapshots", "show", "latest"], true),
            (&["preflight"], true),
            (&["restore", "--dry-run"], true),
            (&["restore"], false),
            (&["backup"], false),
            (&["controller"], false),
            (&["journal"], false),
        ] {
            assert_eq!(reads_only(&parse(args).1), reads, "{args:?}");
        }
    }

    /// Key generation needs neither the keys it is given nor the storage: a missing trusted key
    /// file does not stop it, and no storage directory is made.
    #[tokio::test]
    async fn keys_are_generated_without_reading_keys_or_opening_storage() {
        let tmp = tempfile::tempdir().unwrap();
        let storage = format!("file://{}", tmp.path().join("storage").display());
        let name = tmp.path().join("k").display().to_string();
        let missing = tmp.path().join("missing.pub").display().to_string();
        let (global, command) =
            parse(&["--storage", &storage, "--trusted-key", &missing, "keys", "generate", "--age", &name]);
        assert_eq!(run(global, command).await.unwrap(), ExitCode::SUCCESS);
        assert!(tmp.path().join("k.agekey").is_file() && tmp.path().join("k.recipient").is_file());
        assert!(!tmp.path().join("storage").exists(), "key generation opened the storage");
    }

    /// Every other command reads its keys first (a bad file fails it before the storage is
    /// opened, even for a writer), and a reading one never creates a missing local storage.
    #[tokio::test]
    async fn keys_are_read_before_the_storage_and_a_reader_never_creates_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("storage");
        let storage = format!("file://{}", dir.display());
        let missing = tmp.path().join("missing.pub").display().to_string();
        let (global, command) = parse(&["--storage", &storage, "--trusted-key", &missing, "backup"]);
        let err = format!("{:#}", run(global, command).await.unwrap_err());
        assert!(err.contains("missing.pub"), "{err}");
        assert!(!dir.exists(), "the storage was opened before the keys were read");
        let (global, command) = parse(&["--storage", &storage, "snapshots", "list"]);
        let err = format!("{:#}", run(global, command).await.unwrap_err());
        assert!(err.contains("does not exist"), "{err}");
        assert!(!dir.exists(), "a listing created the storage");
    }
}
