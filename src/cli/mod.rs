//! The command line: what a person types (clap types) and what they read ([`output`]);
//! [`commands`] turns each command into library calls. Binary side only.

pub mod commands;
pub mod output;
pub mod plugin;
pub mod progress;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use restatus::format::SnapshotId;
use restatus::k8s::DEFAULT_PAGE_SIZE;
use restatus::store::RetentionPolicy;
use restatus::store::{DEFAULT_STORAGE, S3Options, SSE_MODES};
use restatus::telemetry::LogFormat;

use output::OutputFormat;

/// `restatus --version`: the package version and the git commit it was built from (build.rs).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("RESTATUS_GIT_COMMIT"), ")");

#[derive(Parser)]
#[command(
    name = "restatus",
    version = VERSION,
    about = "Keeps the status of Kubernetes objects safe across cluster moves and disasters",
    after_help = "Exit codes: 0 success; 1 failure (the error is printed once on stderr); \
                  2 the command line was not understood (a usage error: with --log-format json \
                  it is printed as one JSON line too), or preflight could not check; 3 backup \
                  wrote a snapshot marked inconsistent (its capture stayed inconsistent after the \
                  retries).\n\n\
                  Output: `-o json` prints one pretty-printed JSON document on stdout, `-o yaml` \
                  one YAML document; logs and errors go to stderr."
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
    /// Decrypt encrypted snapshots with these private keys (restore, controller, snapshots
    /// show/diff/verify, preflight): files of `AGE-SECRET-KEY-1…` lines, as `restatus keys
    /// generate --age` writes them, or directories of such files. Repeat it, or list several
    /// separated by commas, to rotate keys. Without it an encrypted snapshot is passed over,
    /// named.
    #[arg(
        long = "decryption-key",
        value_name = "FILE",
        env = "RESTATUS_DECRYPTION_KEY",
        value_delimiter = ',',
        global = true
    )]
    pub decryption_keys: Vec<PathBuf>,
    /// Server-side encryption of what restatus writes to S3: `AES256` (SSE-S3) or `aws:kms`
    /// (SSE-KMS). Default: the bucket's own setting (or AWS_SERVER_SIDE_ENCRYPTION).
    #[arg(long, env = "RESTATUS_S3_SSE", value_parser = SSE_MODES, global = true)]
    pub s3_sse: Option<String>,
    /// With `--s3-sse aws:kms`: the KMS key (id, ARN or alias); default: the account's S3 key.
    #[arg(long, env = "RESTATUS_S3_SSE_KMS_KEY_ID", value_name = "KEY", global = true)]
    pub s3_sse_kms_key_id: Option<String>,
    /// With `--s3-sse aws:kms`: use (`true`) or refuse (`false`) an S3 Bucket Key.
    #[arg(long, env = "RESTATUS_S3_SSE_BUCKET_KEY", value_name = "BOOL", global = true)]
    pub s3_sse_bucket_key: Option<bool>,
    /// A PEM bundle of CA certificates the S3 endpoint's certificate may chain to, trusted
    /// besides the system's (a private CA).
    #[arg(long, env = "RESTATUS_S3_CA_FILE", value_name = "FILE", global = true)]
    pub s3_ca_file: Option<PathBuf>,
}

impl Global {
    pub fn s3_options(&self) -> S3Options {
        S3Options {
            sse: self.s3_sse.clone(),
            sse_kms_key_id: self.s3_sse_kms_key_id.clone(),
            sse_bucket_key: self.s3_sse_bucket_key,
            ca_file: self.s3_ca_file.clone(),
        }
    }
}

#[derive(Subcommand)]
pub enum Command {
    /// Takes one snapshot now and prints its id (`-o json|yaml`: the snapshot written). Exits 0
    /// when a consistent snapshot is written, 3 when the snapshot written is marked
    /// inconsistent, 1 when none is written.
    Backup {
        #[command(flatten)]
        backup: BackupArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
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
    /// Journals status changes of the source cluster to the bucket every --journal-interval,
    /// as segments chained to the newest snapshot, until SIGTERM or Ctrl-C (then a final
    /// segment of what is pending). A restore reads them: it loses seconds, not a schedule
    /// interval.
    Journal(JournalArgs),
    /// Restores status whenever an object of the profile appears or loses its status
    /// (target cluster), with leader election and /metrics, /healthz, /readyz.
    Controller(ControllerArgs),
    /// Tells whether the cluster can be moved now (exit 0), or not and why (exit 1); exit 2
    /// when it could not check. Run against the source cluster.
    Preflight(PreflightArgs),
    /// Lists, shows, compares, verifies, prunes and deletes snapshots.
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
    /// A capture whose record count fell by more than this many percent against the snapshot
    /// before it (the fleet deleted by accident, a wrong selector) is written marked, the
    /// backup exits 4, and retention keeps the snapshot before the drop until a person deletes
    /// it. 100 turns the check off.
    #[arg(long, env = "RESTATUS_MAX_RECORD_DROP", default_value_t = restatus::format::RecordDrop::DEFAULT_THRESHOLD_PERCENT,
        value_parser = clap::value_parser!(u8).range(0..=100))]
    pub max_record_drop: u8,
    #[command(flatten)]
    pub retention: RetentionArgs,
    #[command(flatten)]
    pub signing: SigningArgs,
    #[command(flatten)]
    pub encryption: EncryptionArgs,
}

#[derive(Args)]
pub struct JournalArgs {
    /// How often a segment is written, when some status changed (nothing is written while
    /// nothing changes).
    #[arg(long, env = "RESTATUS_JOURNAL_INTERVAL", default_value = "5s", value_parser = positive_duration)]
    pub journal_interval: Duration,
    /// How often to look for a newer snapshot to start a new chain on.
    #[arg(long, default_value = "30s", value_parser = positive_duration)]
    pub base_refresh: Duration,
    /// How long to wait for a first snapshot to chain to (then exit 1).
    #[arg(long, default_value = "10m", value_parser = positive_duration)]
    pub base_wait: Duration,
    /// zstd level (1-19).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i32).range(1..=19))]
    pub zstd_level: i32,
    /// Serve /metrics (the journal's lag, segments, bytes, changes, errors, its base and newest
    /// segment), /healthz and /readyz (ready while it journals) on this address, e.g.
    /// 0.0.0.0:8080.
    #[arg(long, env = "RESTATUS_METRICS_ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// When a chain reaches this many segments, fold its base and segments into a new base
    /// snapshot (signed and encrypted as the segments are) and start a new chain on it, so
    /// that a restore never reads more than about this many segments. Default: an hour at
    /// the default 5 s interval.
    #[arg(long, default_value_t = restatus::journal::DEFAULT_MAX_SEGMENTS, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_segments: u64,
    #[command(flatten)]
    pub signing: SigningArgs,
    #[command(flatten)]
    pub encryption: EncryptionArgs,
}

#[derive(Args, Clone)]
pub struct EncryptionArgs {
    /// Encrypt each snapshot's payload to this recipient (an age X25519 public key, `age1…`),
    /// a file of them (one a line) or a directory of such files. Repeat it, or list several
    /// separated by commas: the private key of any one decrypts. Writing needs no secret. The
    /// manifest stays readable (see docs/FORMAT.md). Without it payloads are plain.
    #[arg(long = "encrypt-to", value_name = "RECIPIENT_OR_FILE", env = "RESTATUS_ENCRYPT_TO", value_delimiter = ',')]
    pub encrypt_to: Vec<String>,
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
    /// With --age, an encryption key pair instead: NAME.agekey (private, mode 0600: for
    /// --decryption-key, where restores run) and NAME.recipient (public: for --encrypt-to,
    /// where backups run); prints the recipient. Never overwrites a file.
    Generate {
        name: PathBuf,
        /// An age X25519 key pair for encrypted payloads, not a signing key.
        #[arg(long)]
        age: bool,
    },
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
    #[command(flatten)]
    pub demands: DemandArgs,
    #[command(flatten)]
    pub limit: LimitArgs,
    /// Restore to this point in time (RFC 3339, e.g. 2026-12-03T10:15:00Z): the newest snapshot
    /// captured at or before it, with the journal segments that end at or before it. Default:
    /// the newest complete point of the newest snapshot's journal.
    #[arg(long, value_name = "TIME")]
    pub at: Option<jiff::Timestamp>,
    /// Restore the snapshot alone: do not read its journal.
    #[arg(long, conflicts_with = "at")]
    pub no_journal: bool,
    #[command(flatten)]
    pub output: RestoreOutputArgs,
}

/// A restore's `-o`: the formats of [`OutputArgs`], and `jsonl`, which only a restore can
/// stream (every other command refuses it as a usage error).
#[derive(Args)]
pub struct RestoreOutputArgs {
    /// `table` for people (a dry run's rows as the objects are decided, the summary last);
    /// `json` (one pretty-printed document) or `yaml` (one document) on stdout for programs;
    /// `jsonl`: one JSON line per object as soon as it is decided or written, a summary line
    /// last, so that its memory does not grow with the fleet (docs/RESTORE.md).
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: RestoreFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RestoreFormat {
    Table,
    Json,
    Yaml,
    Jsonl,
}

impl RestoreFormat {
    /// The one-document format, or `None` for `jsonl`.
    pub fn document(self) -> Option<OutputFormat> {
        match self {
            RestoreFormat::Table => Some(OutputFormat::Table),
            RestoreFormat::Json => Some(OutputFormat::Json),
            RestoreFormat::Yaml => Some(OutputFormat::Yaml),
            RestoreFormat::Jsonl => None,
        }
    }
}

/// What a reader demands of a snapshot besides a good signature (restore, controller).
#[derive(Args, Debug, Clone)]
pub struct DemandArgs {
    /// Use only snapshots captured from this source: the uid of its `kube-system` namespace,
    /// as the signed manifest's `capturedFrom` says (`snapshots list` shows it; `kubectl get
    /// namespace kube-system -o jsonpath='{.metadata.uid}'` on the source). A snapshot of
    /// another cluster copied into this prefix (staging into production, under one signing
    /// key) is passed over, as is one that names no source. Repeat it, or list several
    /// separated by commas (a rebuilt source has a new uid). Checked against the signature only
    /// with --trusted-key: without it, anyone who can write the bucket can write the field.
    #[arg(long = "expect-source", value_name = "UID", env = "RESTATUS_EXPECT_SOURCE", value_delimiter = ',')]
    pub expect_source: Vec<String>,
    /// Use only encrypted snapshots and journal segments: a plain one is passed over. This
    /// keeps a reader from taking a plain snapshot whoever can write the bucket puts there,
    /// and from reading on when the writers stopped encrypting; it does not say who wrote a
    /// snapshot (the recipients are public: anyone can encrypt to them): only a signature
    /// (--trusted-key) does. Needs --decryption-key.
    #[arg(long, env = "RESTATUS_REQUIRE_ENCRYPTION")]
    pub require_encryption: bool,
}

impl DemandArgs {
    pub fn demands(&self) -> restatus::store::Demands {
        let sources = self.expect_source.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).map(String::from);
        restatus::store::Demands { sources: sources.collect(), encryption: self.require_encryption }
    }
}

/// The adaptive limit on the writes in flight (see `k8s::limit`).
#[derive(Args, Debug, Clone, Copy)]
pub struct LimitArgs {
    /// Writes in flight at the start: the limit then grows by one per window of writes whose
    /// latency stays flat, and halves when the API server sheds load (429, 503, 504,
    /// Retry-After). Capped by --max-concurrency.
    #[arg(long, default_value_t = restatus::k8s::limit::DEFAULT_START)]
    pub concurrency: usize,
    /// The most writes ever in flight at once (at least 1; 1 writes one at a time). Default:
    /// 64 for `restore`; for `controller` its --concurrency, so that it does not grow: it
    /// shares the API server with the cluster's other clients and with its own Lease, whose
    /// renewal waits behind the writes queued at the API server (a renewal late under 64
    /// writes in flight on a saturated test API server cost the bench's controller its lease).
    #[arg(long)]
    pub max_concurrency: Option<usize>,
}

impl LimitArgs {
    /// --max-concurrency, or `default` when not given.
    fn max(&self, default: usize) -> usize {
        self.max_concurrency.unwrap_or(default).max(1)
    }

    /// The limit, starting at --concurrency, never above --max-concurrency (or `default_max`).
    pub fn write_limit(&self, default_max: usize) -> restatus::k8s::WriteLimit {
        restatus::k8s::WriteLimit::new(self.concurrency, self.max(default_max))
    }

    /// Objects under way at once above the limit: as many as it may let through.
    pub fn objects_in_flight(&self, default_max: usize) -> usize {
        self.max(default_max)
    }
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
    #[command(flatten)]
    pub demands: DemandArgs,
    #[command(flatten)]
    pub limit: LimitArgs,
    /// Restore to the snapshot alone: do not read its journal. By default the controller
    /// restores to the newest complete consistent point of the newest snapshot's journal and
    /// reads the segments written since at every --snapshot-refresh.
    #[arg(long)]
    pub no_journal: bool,
    /// Source role: signs its final snapshots.
    #[command(flatten)]
    pub signing: SigningArgs,
    /// Source role: encrypts its final snapshots.
    #[command(flatten)]
    pub encryption: EncryptionArgs,
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
    /// Print only the `kubectl label` commands that make `clusterctl move` carry every object
    /// of the profile, one a line (restatus never runs them); exit as preflight does.
    #[arg(long)]
    pub label_commands: bool,
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
    /// Shows a snapshot's manifest (ID or `latest`), or with --objects its records, at the
    /// newest complete point of its journal (the point is named: base + N segments, time,
    /// verdict, a gap); `ID@TIME` or --at picks an earlier point, --no-journal the snapshot
    /// alone.
    Show {
        id: String,
        #[command(flatten)]
        point: PointArgs,
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
    /// would change. Each side is at the newest complete point of its snapshot's journal
    /// (named in the output); `ID@TIME` picks the point at or before TIME on that side, --at
    /// on both, --no-journal compares the snapshots alone.
    Diff {
        a: String,
        b: String,
        #[command(flatten)]
        point: PointArgs,
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
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Deletes one snapshot whole (manifest, signature, payload), named by its id (`latest` is
    /// refused). The snapshot a restore would use (the newest complete one; the newest that
    /// verifies, signed by a trusted key when `--trusted-key`s are given) and a folder a backup
    /// may still be uploading are kept unless --force.
    Delete {
        /// The snapshot's id, as `snapshots list` shows it.
        #[arg(value_parser = explicit_id)]
        id: SnapshotId,
        /// Delete it even when a restore would use it, or a backup may still be writing it.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        output: OutputArgs,
    },
}

/// Which point of a snapshot's journal `snapshots show` and `diff` read.
#[derive(Args, Clone, Copy)]
pub struct PointArgs {
    /// The newest point of the journal at or before this time (RFC 3339); `latest` means the
    /// newest snapshot captured at or before it. Default: the newest complete point.
    #[arg(long, value_name = "TIME")]
    pub at: Option<jiff::Timestamp>,
    /// The snapshot alone: do not read its journal.
    #[arg(long, conflicts_with = "at")]
    pub no_journal: bool,
}

#[derive(Args)]
pub struct OutputArgs {
    /// `table` for people; `json` (one pretty-printed document) or `yaml` (one document) on
    /// stdout for programs.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

/// A snapshot id typed out: `latest` is refused, so that a deletion never follows whatever
/// snapshot happens to be the newest.
fn explicit_id(s: &str) -> Result<SnapshotId, String> {
    if s == "latest" {
        return Err("name the snapshot by its id (`snapshots list` shows them); `latest` is not taken here".into());
    }
    s.parse().map_err(|e: restatus::Error| e.to_string())
}

/// What clap did not accept, or `--help`/`--version`: clap prints it and exits (2 for a usage
/// error), except that a usage error with `--log-format json` (or `RESTATUS_LOG_FORMAT=json`)
/// is one JSON log line, so that stderr stays JSON lines.
/// An argument that holds a key (`--signing-key "$(cat k.key)"`: clap takes the PEM, which starts
/// with `-`, for an unexpected argument and quotes it) is never repeated: the message says
/// which flag to give a file's path instead.
pub fn usage_error(e: clap::Error) -> std::process::ExitCode {
    let args: Vec<String> = std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()).collect();
    let keys: Vec<(String, Option<String>)> = (0..args.len())
        .filter(|&i| restatus::format::hides_a_key(&args[i]))
        .map(|i| (args[i].clone(), i.checked_sub(1).map(|p| args[p].clone()).filter(|p| p.starts_with("--"))))
        .collect();
    let json = json_logs_asked(std::env::args_os().skip(1), std::env::var_os("RESTATUS_LOG_FORMAT"));
    if e.use_stderr() && (json || !keys.is_empty()) {
        let text = without_keys(&e.render().to_string(), &keys);
        let text = text.trim_end();
        if json {
            restatus::telemetry::init(LogFormat::Json);
            tracing::error!(error = %text.strip_prefix("error: ").unwrap_or(text), "invalid command line");
        } else {
            eprintln!("{text}");
        }
        return std::process::ExitCode::from(2);
    }
    e.exit()
}

/// clap's message `text`, or, when arguments hold keys (`keys`, with the flag before each, if
/// any), a message that names the flag and none of the command line: clap quotes an argument
/// whole or in part, and no key may be repeated.
fn without_keys(text: &str, keys: &[(String, Option<String>)]) -> String {
    match keys.first() {
        None => text.to_string(),
        Some((_, flag)) => {
            let what = flag.as_ref().map_or("an argument".to_string(), |f| format!("the value of {f}"));
            format!(
                "error: {what} is a key (not repeated here): give the path of a file that holds it (mode 0600, or a \
                 Kubernetes Secret mounted as one)\n\nFor more information, try '--help'."
            )
        }
    }
}

/// Whether the arguments (after the program's name), or else the environment, ask for JSON
/// logs: the last `--log-format json` or `--log-format=json` wins, before a `--`.
fn json_logs_asked(args: impl IntoIterator<Item = std::ffi::OsString>, env: Option<std::ffi::OsString>) -> bool {
    let mut asked = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--") => break,
            Some("--log-format") => asked = args.next(),
            Some(a) => {
                if let Some(value) = a.strip_prefix("--log-format=") {
                    asked = Some(value.into());
                }
            }
            None => {}
        }
    }
    asked.or(env).is_some_and(|f| f == "json")
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
            &["restatus", "journal", "--journal-interval", "0s"],
            &["restatus", "journal", "--base-refresh", "0s"],
        ] {
            let err = Cli::try_parse_from(flags).err().expect("refused");
            assert!(err.to_string().contains("must be greater than zero"), "{flags:?}: {err}");
        }
        assert!(Cli::try_parse_from(["restatus", "controller", "--snapshot-refresh", "1s"]).is_ok());
    }

    /// The controller's write limit does not grow beyond where it starts unless told (its
    /// Lease waits behind the writes queued at the API server); a restore's grows to 64.
    #[test]
    fn the_controllers_write_limit_stays_at_its_start_unless_told() {
        let controller = |extra: &[&str]| match Cli::try_parse_from([&["restatus", "controller"][..], extra].concat()) {
            Ok(Cli { command: Command::Controller(args), .. }) => args.limit,
            _ => panic!("controller {extra:?} refused"),
        };
        let restore = |extra: &[&str]| match Cli::try_parse_from([&["restatus", "restore"][..], extra].concat()) {
            Ok(Cli { command: Command::Restore(args), .. }) => args.limit,
            _ => panic!("restore {extra:?} refused"),
        };
        let max = |limit: LimitArgs, default: usize| limit.write_limit(default).report().max;
        let own_start = |limit: LimitArgs| max(limit, limit.concurrency);
        assert_eq!(own_start(controller(&[])), 16);
        assert_eq!(own_start(controller(&["--concurrency", "8"])), 8);
        assert_eq!(own_start(controller(&["--max-concurrency", "48"])), 48);
        assert_eq!(controller(&[]).objects_in_flight(16), 16);
        assert_eq!(max(restore(&[]), restatus::k8s::limit::DEFAULT_MAX), 64);
        assert_eq!(max(restore(&["--max-concurrency", "0"]), 64), 1, "at least 1");
    }

    #[test]
    fn a_point_in_time_is_rfc_3339() {
        for at in ["yesterday", "2026-12-03", "2026-12-03 10:00", "1764756000"] {
            assert!(Cli::try_parse_from(["restatus", "restore", "--at", at]).is_err(), "{at}");
        }
        for (at, utc) in [
            ("2026-12-03T10:00:00Z", "2026-12-03T10:00:00Z"),
            ("2026-12-03T11:00:00.5+01:00", "2026-12-03T10:00:00.5Z"),
        ] {
            let Ok(Cli { command: Command::Restore(args), .. }) =
                Cli::try_parse_from(["restatus", "restore", "--at", at])
            else {
                panic!("{at} refused");
            };
            assert_eq!(args.at, Some(utc.parse::<jiff::Timestamp>().unwrap()), "{at}");
        }
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
    fn json_logs_are_asked_by_the_last_flag_or_else_the_environment() {
        let asked =
            |args: &[&str], env: Option<&str>| json_logs_asked(args.iter().map(Into::into), env.map(Into::into));
        assert!(asked(&["--log-format", "json", "bogus"], None));
        assert!(asked(&["snapshots", "--log-format=json", "list", "--bogus"], None));
        assert!(asked(&["--bogus"], Some("json")));
        assert!(!asked(&["--log-format", "plain"], Some("json")), "the flag wins");
        assert!(!asked(&["--log-format=json", "--log-format", "plain"], None), "the last one wins");
        assert!(!asked(&["--", "--log-format", "json"], None));
        assert!(!asked(&["--log-format"], None) && !asked(&[], Some("plain")) && !asked(&[], None));
    }

    #[test]
    fn delete_takes_an_explicit_id_never_latest() {
        let err = Cli::try_parse_from(["restatus", "snapshots", "delete", "latest"]).err().expect("refused");
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(err.to_string().contains("`latest` is not taken here"), "{err}");
        let err = Cli::try_parse_from(["restatus", "snapshots", "delete", "yesterday"]).err().expect("refused");
        assert!(err.to_string().contains("invalid snapshot id"), "{err}");
        let cli = Cli::try_parse_from([
            "restatus",
            "snapshots",
            "delete",
            "20261130T090000.000Z-00ab12",
            "--force",
            "-o",
            "json",
        ]);
        assert!(cli.is_ok(), "an id parses");
    }

    #[test]
    fn a_record_drop_threshold_is_a_percentage() {
        let threshold =
            |value: &str| match Cli::try_parse_from(["restatus", "backup", &format!("--max-record-drop={value}")]) {
                Ok(Cli { command: Command::Backup { backup, .. }, .. }) => Ok(backup.max_record_drop),
                Ok(_) => panic!("not a backup"),
                Err(e) => Err(e.to_string()),
            };
        assert_eq!(threshold("0"), Ok(0));
        assert_eq!(threshold("100"), Ok(100));
        for bad in ["101", "-1", "50%", "lots"] {
            assert!(threshold(bad).unwrap_err().contains("--max-record-drop"), "{bad}");
        }
        match Cli::try_parse_from(["restatus", "backup"]) {
            Ok(Cli { command: Command::Backup { backup, .. }, .. }) => assert_eq!(backup.max_record_drop, 50),
            _ => panic!("backup refused"),
        }
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
