//! The command line: what a person types (clap types) and what they read ([`output`]);
//! [`commands`] turns each command into library calls. Binary side only.

pub mod commands;
pub mod output;
pub mod progress;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use restatus::format::SnapshotId;
use restatus::k8s::DEFAULT_PAGE_SIZE;
use restatus::store::DEFAULT_STORAGE;
use restatus::store::RetentionPolicy;
use restatus::telemetry::LogFormat;

use output::OutputFormat;

/// `restatus --version`: the package version and the git commit it was built from (build.rs).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("RESTATUS_GIT_COMMIT"), ")");

#[derive(Parser)]
#[command(
    name = "restatus",
    version = VERSION,
    about = "Keeps the status of Kubernetes objects safe across cluster moves and disasters"
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args)]
pub struct Global {
    /// Where snapshots live: s3://bucket/prefix, file:///path or memory://.
    #[arg(long, env = "RESTATUS_STORAGE", default_value = DEFAULT_STORAGE, global = true)]
    pub storage: String,
    /// Names the cluster whose snapshots these are; several clusters can share a bucket.
    #[arg(long, env = "RESTATUS_CLUSTER_ID", default_value = "default", global = true)]
    pub cluster_id: String,
    /// `metal-operator` (built in) or a profile file (YAML or JSON).
    #[arg(long, env = "RESTATUS_PROFILE", default_value = "metal-operator", global = true)]
    pub profile: String,
    /// Only objects with these labels (a Kubernetes label selector, e.g. `site=fra1`).
    #[arg(long, short = 'l', global = true)]
    pub selector: Option<String>,
    /// Kubeconfig file; default: KUBECONFIG, ~/.kube/config, or in-cluster.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Snapshot payloads larger than this are refused before they are downloaded (bytes, or
    /// with a KiB/MiB/GiB suffix).
    #[arg(long, env = "RESTATUS_MAX_SNAPSHOT_SIZE", default_value = "1GiB", value_parser = parse_size, global = true)]
    pub max_snapshot_size: u64,
    #[arg(long, env = "RESTATUS_LOG_FORMAT", value_enum, default_value = "plain", global = true)]
    pub log_format: LogFormat,
    /// When stderr is not a terminal, how often `restore` and `backup` log their progress (on
    /// a terminal they draw a bar).
    #[arg(long, env = "RESTATUS_PROGRESS_INTERVAL", default_value = "10s", value_parser = positive_duration, global = true)]
    pub progress_interval: Duration,
    /// Use only snapshots signed by one of these public keys (restore, controller, snapshots
    /// list/show/diff/verify): `ed25519:<base64>`, a file of keys (SPKI PEM or `ed25519:`
    /// lines) or a directory of such files. Repeat it, or list several separated by commas,
    /// to rotate keys. Without it signatures are not checked.
    #[arg(
        long = "trusted-key",
        value_name = "KEY_OR_FILE",
        env = "RESTATUS_TRUSTED_KEYS",
        value_delimiter = ',',
        global = true
    )]
    pub trusted_keys: Vec<String>,
}

#[derive(Subcommand)]
pub enum Command {
    /// Takes one snapshot now. Exits 0 only when its manifest is written.
    Backup(BackupArgs),
    /// Takes snapshots on a cron schedule, in-process, until SIGTERM or Ctrl-C.
    Schedule {
        /// Five-field cron expression in UTC, with Kubernetes CronJob semantics.
        #[arg(long)]
        cron: String,
        /// Serve /metrics (the backups' outcome, the bucket's newest snapshot) and /healthz on
        /// this address, e.g. 0.0.0.0:8080.
        #[arg(long, env = "RESTATUS_METRICS_ADDR")]
        metrics_addr: Option<std::net::SocketAddr>,
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
    /// Lists, shows, compares, verifies and prunes snapshots.
    #[command(subcommand)]
    Snapshots(SnapshotsCommand),
    /// Makes signing keys for snapshots.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Prints a shell completion script: `source <(restatus completion bash)`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Args, Clone)]
pub struct BackupArgs {
    /// Objects per LIST page.
    #[arg(long, default_value_t = DEFAULT_PAGE_SIZE)]
    pub page_size: u32,
    /// Captures to take at most while they come out inconsistent; the last is written anyway,
    /// marked inconsistent.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub capture_attempts: u32,
    /// zstd level (1-19).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=19))]
    pub zstd_level: i32,
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub signing: SigningArgs,
}

#[derive(Args, Clone)]
pub struct SigningArgs {
    /// Sign each snapshot's manifest with this Ed25519 private key (PKCS#8 PEM, as
    /// `restatus keys generate` writes it). Without it snapshots are unsigned.
    #[arg(long, value_name = "FILE", env = "RESTATUS_SIGNING_KEY")]
    pub signing_key: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum KeysCommand {
    /// Writes a new Ed25519 key pair: NAME.key (private, PKCS#8 PEM, mode 0600: for
    /// --signing-key, where backups run) and NAME.pub (public, SPKI PEM: for --trusted-key,
    /// where restores run); prints the key id and the public key as `ed25519:<base64>`.
    /// Never overwrites a file.
    Generate { name: PathBuf },
}

#[derive(Args)]
pub struct RestoreArgs {
    /// Restore from this snapshot instead of the newest one that verifies.
    #[arg(long)]
    pub snapshot: Option<SnapshotId>,
    /// Overwrite live statuses that moved on after the snapshot.
    #[arg(long)]
    pub force: bool,
    /// Print the plan, with the status fields each restore would write; write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Also use snapshots whose capture was inconsistent.
    #[arg(long)]
    pub allow_inconsistent: bool,
    /// Also use snapshots captured from the cluster written to (its kube-system uid is in the
    /// manifest): by default they are passed over, so that a cluster never restores its own
    /// snapshots onto itself by accident.
    #[arg(long)]
    pub allow_same_cluster: bool,
    /// Objects written at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Restore status on the target of a move (or a rebuilt cluster).
    Target,
    /// Guard the source of a move: block clusterctl until a final consistent snapshot exists.
    Source,
}

#[derive(Args)]
pub struct ControllerArgs {
    #[arg(long, value_enum, default_value = "target")]
    pub role: Role,
    /// Source role: guard only the CAPI Clusters of this namespace (the one to move).
    #[arg(long)]
    pub cluster_namespace: Option<String>,
    /// Source role: how often to look at the Clusters.
    #[arg(long, default_value = "2s", value_parser = positive_duration)]
    pub interval: Duration,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub http_addr: std::net::SocketAddr,
    /// Namespace of the leader election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "restatus")]
    pub lease_namespace: String,
    #[arg(long, default_value = "restatus-controller")]
    pub lease_name: String,
    /// This instance's identity in the election.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// How long the leader election's Lease lasts (whole seconds, at least 3): a standby takes
    /// over this long after the leader's last renewal; the leader renews every fifth of it and
    /// stops writing when it has not renewed for two thirds of it.
    #[arg(long, default_value = "15s", value_parser = lease_duration)]
    pub lease_duration: Duration,
    /// How often to look for a newer snapshot.
    #[arg(long, default_value = "60s", value_parser = positive_duration)]
    pub snapshot_refresh: Duration,
    /// How long one snapshot refresh may take (listing, manifests, a payload's download): a
    /// store that stops answering fails it, and the snapshot in use is kept.
    #[arg(long, default_value = "2m", value_parser = positive_duration)]
    pub snapshot_timeout: Duration,
    /// Overwrite live statuses that moved on after the snapshot.
    #[arg(long)]
    pub force: bool,
    /// Also use snapshots whose capture was inconsistent.
    #[arg(long)]
    pub allow_inconsistent: bool,
    /// Also use snapshots captured from the cluster written to (its kube-system uid is in the
    /// manifest): by default they are passed over, so that a cluster never restores its own
    /// snapshots onto itself by accident.
    #[arg(long)]
    pub allow_same_cluster: bool,
    /// Objects written at once.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Source role: signs its final snapshots.
    #[command(flatten)]
    pub signing: SigningArgs,
}

#[derive(Args)]
pub struct PreflightArgs {
    /// Watch until the cluster is ready, showing what still blocks.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits before giving up (exit 1 with the remaining reasons).
    #[arg(long, default_value = "10m", value_parser = positive_duration)]
    pub timeout: Duration,
    /// Take a snapshot the moment the cluster is ready (then freshness is not a blocker).
    #[arg(long)]
    pub snapshot_when_ready: bool,
    /// Check only the CAPI Clusters and Machines of this namespace (the one to move).
    #[arg(long)]
    pub cluster_namespace: Option<String>,
    #[command(flatten)]
    pub backup: BackupArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Args, Clone, Copy)]
pub struct RetentionArgs {
    /// After a successful backup, keep only the newest N complete snapshots.
    #[arg(long)]
    pub keep_last: Option<usize>,
    /// After a successful backup, delete snapshots older than this (e.g. 7d, 12h).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub max_age: Option<Duration>,
}

impl RetentionArgs {
    pub fn policy(self) -> RetentionPolicy {
        RetentionPolicy { keep_last: self.keep_last, max_age: self.max_age }
    }
}

#[derive(Subcommand)]
pub enum SnapshotsCommand {
    /// Lists this cluster's snapshots, newest first.
    List(OutputArgs),
    /// Lists the cluster ids under the storage URL's prefix, with each one's newest snapshot.
    Clusters(OutputArgs),
    /// Shows a snapshot's manifest (ID or `latest`), or with --objects its records.
    Show {
        id: String,
        /// List the records (kind, primary key, namespace/name) instead of the manifest.
        #[arg(long)]
        objects: bool,
        /// With --objects: only records of this kind (e.g. Server; case-insensitive).
        #[arg(long, requires = "objects")]
        kind: Option<String>,
        /// With --objects: only records whose kind, key or name contains this text.
        #[arg(long, requires = "objects")]
        filter: Option<String>,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// The objects whose status differs between snapshots A and B (IDs or `latest`), per
    /// top-level status field, and those in only one of them: what restoring A instead of B
    /// would change.
    Diff {
        a: String,
        b: String,
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
    Prune {
        #[command(flatten)]
        retention: RetentionArgs,
        /// Say what would be deleted and what is kept, and why; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Args)]
pub struct OutputArgs {
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

/// A size in bytes: a number, optionally followed by KiB, MiB or GiB.
fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, unit) = s.trim().split_at(s.trim().find(|c: char| !c.is_ascii_digit()).unwrap_or(s.trim().len()));
    let unit = match unit.trim() {
        "" | "B" => 1u64,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        other => return Err(format!("unknown unit {other:?} (use B, KiB, MiB or GiB)")),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size"))?;
    n.checked_mul(unit).filter(|&b| b > 0).ok_or_else(|| format!("{s:?} is not a size greater than zero"))
}

/// A duration greater than zero (`0s` would spin a loop or panic a timer).
/// A Lease's duration: whole seconds, at least 3.
fn lease_duration(s: &str) -> Result<Duration, String> {
    let duration = positive_duration(s)?;
    if duration.subsec_nanos() != 0 || duration < Duration::from_secs(3) {
        return Err(format!("{s}: a lease lasts whole seconds, at least 3s"));
    }
    Ok(duration)
}

fn positive_duration(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("must be greater than zero".into()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_durations_are_refused_before_anything_runs() {
        for flags in [
            &["restatus", "controller", "--snapshot-refresh", "0s"][..],
            &["restatus", "controller", "--snapshot-timeout", "0s"],
            &["restatus", "controller", "--role", "source", "--interval", "0s"],
            &["restatus", "preflight", "--wait", "--timeout", "0s"],
        ] {
            let err = Cli::try_parse_from(flags).err().expect("refused");
            assert!(err.to_string().contains("must be greater than zero"), "{flags:?}: {err}");
        }
        assert!(Cli::try_parse_from(["restatus", "controller", "--snapshot-refresh", "1s"]).is_ok());
    }

    #[test]
    fn a_lease_lasts_whole_seconds_and_at_least_three() {
        for duration in ["0s", "2s", "3500ms", "lots"] {
            assert!(
                Cli::try_parse_from(["restatus", "controller", "--lease-duration", duration]).is_err(),
                "{duration}"
            );
        }
        assert!(Cli::try_parse_from(["restatus", "controller", "--lease-duration", "6s"]).is_ok());
    }

    #[test]
    fn version_names_the_commit_and_the_cli_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        assert!(VERSION.starts_with(env!("CARGO_PKG_VERSION")));
        assert!(VERSION.contains("(commit ") && !VERSION.contains("(commit )"), "{VERSION}");
        let err = Cli::try_parse_from(["restatus", "snapshots", "show", "latest", "--filter", "x"]).err();
        assert!(err.is_some(), "--filter without --objects is refused");
    }

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("512"), Ok(512));
        assert_eq!(parse_size("3MiB"), Ok(3 << 20));
        assert!(parse_size("2GB").unwrap_err().contains("unknown unit"));
        assert!(parse_size("0").is_err() && parse_size("lots").is_err());
    }
}
