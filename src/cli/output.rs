//! What the CLI prints: the library's reports, listings and verification results as tables,
//! JSON or YAML. Nothing here reads the store.

use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use restatus::format::{Manifest, ObjectRef};
use restatus::moving::preflight::PreflightReport;
use restatus::restore::{ObjectLine, PlanItem, RestorePlan, RestoreReport, RestoreSummary};
use restatus::store::{JournalSummary, SignatureCheck, SnapshotState, SnapshotSummary};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
    Yaml,
}

/// Prints `value` as pretty JSON or YAML, or `table()` for a person. A reader gone before the
/// end (a closed pipe: `| head`) is no error; any other failed write is.
pub fn emit<T: Serialize>(format: OutputFormat, value: &T, table: impl FnOnce() -> String) -> anyhow::Result<()> {
    let text = match format {
        OutputFormat::Json => serde_json::to_string_pretty(value)? + "\n",
        OutputFormat::Yaml => yaml(value)?,
        OutputFormat::Table => table(),
    };
    let mut stdout = io::stdout().lock();
    match stdout.write_all(text.as_bytes()).and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(anyhow::anyhow!("cannot write to stdout: {e}")),
        _ => Ok(()),
    }
}

/// Lines written as they come (a streamed restore's): each line is written and flushed at
/// once, so a reader sees an object as soon as the restore decides it. The first write that
/// fails (the reader is gone: `| head -1`; a full disk) ends the writing: the later lines are
/// dropped, and [`Stream::closed`] completes, for the restore to stop.
pub struct Stream {
    out: Mutex<Box<dyn Write + Send>>,
    error: Mutex<Option<io::Error>>,
    closed: Arc<tokio::sync::Notify>,
}

impl Stream {
    pub fn new(out: impl Write + Send + 'static) -> Self {
        Stream { out: Mutex::new(Box::new(out)), error: Mutex::new(None), closed: Default::default() }
    }

    pub fn stdout() -> Self {
        Stream::new(io::stdout())
    }

    /// Writes `text` (whole lines) and flushes it, unless a write failed before.
    pub fn write(&self, text: &str) {
        let mut error = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if error.is_some() {
            return;
        }
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            *error = Some(e);
            self.closed.notify_one();
        }
    }

    /// Completes once a write has failed.
    pub fn closed(&self) -> impl Future<Output = ()> + Send + 'static {
        let closed = self.closed.clone();
        async move { closed.notified().await }
    }

    /// Why the writing ended, if it did.
    pub fn error(&self) -> Option<io::Error> {
        let error = self.error.lock().unwrap_or_else(|e| e.into_inner());
        error.as_ref().map(|e| io::Error::new(e.kind(), e.to_string()))
    }
}

/// A line of `restore -o jsonl` (docs/RESTORE.md): an object, or the closing summary.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum RestoreLine<'a> {
    Object(&'a ObjectLine),
    Summary(RestoreSummary<'a>),
}

impl RestoreLine<'_> {
    /// The line, with its newline.
    pub fn text(&self) -> String {
        match serde_json::to_string(self) {
            Ok(line) => line + "\n",
            // Plain data (strings, numbers, maps with string keys) always serializes.
            Err(e) => serde_json::json!({"type": "error", "error": e.to_string()}).to_string() + "\n",
        }
    }
}

pub fn yaml<T: Serialize>(value: &T) -> anyhow::Result<String> {
    serde_saphyr::to_string(value).map_err(|e| anyhow::anyhow!("cannot write YAML: {e}"))
}

/// One record of `snapshots show --objects`.
#[derive(Debug, Serialize)]
pub struct ObjectRow {
    pub kind: String,
    /// The primary identity key, `field=value`.
    pub key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectRow {
    pub fn of(record: &restatus::format::Record) -> Self {
        ObjectRow {
            kind: record.kind.clone(),
            key: record.primary_key().map(ToString::to_string).unwrap_or_default(),
            namespace: record.namespace.clone(),
            name: record.name.clone(),
        }
    }

    /// Of kind `kind` (case-insensitive) when given, and containing `filter` (case-insensitive)
    /// in its kind, key, namespace or name when given.
    pub fn matches(&self, kind: Option<&str>, filter: Option<&str>) -> bool {
        let kind_ok = kind.is_none_or(|k| self.kind.eq_ignore_ascii_case(k));
        let filter_ok = filter.is_none_or(|f| {
            let f = f.to_lowercase();
            [Some(&self.kind), Some(&self.key), self.namespace.as_ref(), Some(&self.name)]
                .into_iter()
                .flatten()
                .any(|field| field.to_lowercase().contains(&f))
        });
        kind_ok && filter_ok
    }
}

pub fn object_table(rows: &[ObjectRow]) -> String {
    let body = rows
        .iter()
        .map(|r| {
            let name = r.namespace.as_ref().map_or(r.name.clone(), |ns| format!("{ns}/{}", r.name));
            vec![r.kind.clone(), r.key.clone(), name]
        })
        .collect();
    table(&["KIND", "KEY", "NAME"], body)
}

/// `snapshots clusters` as a table.
pub fn cluster_table(clusters: &[restatus::store::clusters::ClusterEntry]) -> String {
    let body = clusters
        .iter()
        .map(|c| {
            vec![
                c.cluster_id.clone(),
                c.snapshots.to_string(),
                c.complete.to_string(),
                c.newest.as_ref().map(ToString::to_string).unwrap_or_else(|| "-".into()),
                c.newest_at.map(|t| t.to_string()).unwrap_or_default(),
            ]
        })
        .collect();
    table(&["CLUSTER ID", "SNAPSHOTS", "COMPLETE", "NEWEST", "TAKEN"], body)
}

/// `snapshots diff` as a table: one line per object, then one per changed field.
pub fn diff_table(d: &restatus::domain::compare::SnapshotDiff) -> String {
    let name = |o: &restatus::domain::compare::ObjectDiff| match (&o.name_in_a, &o.name_in_b) {
        (Some(a), Some(b)) if a != b => format!("{a} -> {b}"),
        (Some(n), _) | (None, Some(n)) => n.clone(),
        (None, None) => String::new(),
    };
    let mut rows = Vec::new();
    for o in d.changed.iter().chain(&d.only_in_a).chain(&d.only_in_b) {
        rows.push(vec![o.presence().to_string(), o.kind.clone(), o.key.clone(), name(o)]);
        for change in &o.changes {
            rows.push(vec![String::new(), String::new(), format!("  {change}"), String::new()]);
        }
    }
    let mut out = table(&["DIFF", "KIND", "KEY", "NAME"], rows);
    out += &format!(
        "A {} -> B {}: {} changed, {} only in A, {} only in B, {} unchanged\n",
        d.a,
        d.b,
        d.changed.len(),
        d.only_in_a.len(),
        d.only_in_b.len(),
        d.unchanged
    );
    out
}

/// A base's journal as `snapshots list`'s cell: `-` without segments, else the count, the
/// newest point and its lag.
pub fn journal_text(j: &JournalSummary) -> String {
    if let Some(error) = &j.error {
        return format!("{} segments, {error}", j.segments);
    }
    let mut out = match (&j.newest_at, j.lag_seconds) {
        (None, _) => return "-".into(),
        (Some(at), Some(lag)) if lag >= 0 => format!("{} to {at} ({} behind)", j.segments, human_age(lag)),
        (Some(at), _) => format!("{} to {at} (ahead of this clock)", j.segments),
    };
    if let Some(gap) = j.gap_at {
        out += &format!(", gap at {gap}");
    }
    out
}

/// Seconds as `42s`, `5m07s`, `3h04m`, `2d05h`.
fn human_age(seconds: i64) -> String {
    let (d, h, m, s) = (seconds / 86_400, seconds / 3600 % 24, seconds / 60 % 60, seconds % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s:02}s"),
        (0, _, _) => format!("{h}h{m:02}m"),
        _ => format!("{d}d{h:02}h"),
    }
}

/// `backup -o json|yaml`: the snapshot written.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupReport {
    pub snapshot: String,
    /// Where it lives: `<storage>/<cluster id>/<snapshot id>/`.
    pub url: String,
    pub cluster_id: String,
    pub created_at: String,
    pub records: u64,
    pub payload_bytes: u64,
    /// Records per kind.
    pub kinds: std::collections::BTreeMap<String, u64>,
    pub skipped: usize,
    pub conflicts: usize,
    /// `consistent`, or `inconsistent` (restore skips it unless `--allow-inconsistent`).
    pub consistency: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub inconsistencies: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<String>,
    /// The recipients its payload is encrypted to (`--encrypt-to`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encrypted_to: Option<Vec<String>>,
    /// The command's exit code: 0, or 3 when the snapshot is marked inconsistent.
    pub exit_code: u8,
    /// With `--keep-last`/`--max-age`: what retention deleted after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionReport>,
}

impl BackupReport {
    pub fn of(m: &Manifest, url: String, exit_code: u8, retention: Option<RetentionReport>) -> Self {
        let (consistency, inconsistencies) = restatus::store::listing::consistency(m);
        BackupReport {
            snapshot: m.snapshot_id.to_string(),
            url,
            cluster_id: m.cluster_id.clone(),
            created_at: m.created_at.to_string(),
            records: m.payload.records,
            payload_bytes: m.payload.size,
            kinds: m.kinds.iter().map(|k| (k.kind.clone(), k.records)).collect(),
            skipped: m.skipped_count(),
            conflicts: m.conflict_count(),
            consistency,
            inconsistencies,
            signed_by: m.signed_by.as_ref().map(ToString::to_string),
            encrypted_to: m.encryption.as_ref().map(|e| e.recipients.clone()),
            exit_code,
            retention,
        }
    }
}

/// What retention deleted (or with `dryRun` would delete), and what it kept against the policy.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionReport {
    pub dry_run: bool,
    pub deletions: Vec<RetentionRow>,
    pub kept: Vec<RetentionRow>,
}

#[derive(Debug, Serialize)]
pub struct RetentionRow {
    pub id: String,
    pub reason: String,
}

impl RetentionReport {
    pub fn of(plan: &restatus::store::retention::RetentionPlan, dry_run: bool) -> Self {
        let rows = |list: &[restatus::store::Deletion]| {
            list.iter().map(|d| RetentionRow { id: d.id.to_string(), reason: d.reason.clone() }).collect()
        };
        RetentionReport { dry_run, deletions: rows(&plan.deletions), kept: rows(&plan.kept) }
    }

    /// One line per snapshot: `deleted ID (reason)` (`would delete` in a dry run), `kept ID (reason)`.
    pub fn text(&self) -> String {
        let deleted = if self.dry_run { "would delete" } else { "deleted" };
        let mut out = String::new();
        for d in &self.deletions {
            out += &format!("{deleted} {} ({})\n", d.id, d.reason);
        }
        for k in &self.kept {
            out += &format!("kept {} ({})\n", k.id, k.reason);
        }
        out
    }
}

/// `snapshots delete`: the snapshot and the objects removed.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteReport {
    pub snapshot: String,
    pub url: String,
    /// It had a manifest (a folder without one is what a backup left that never finished).
    pub complete: bool,
    /// `--force` was given.
    pub forced: bool,
    pub files: Vec<FileRow>,
}

#[derive(Debug, Serialize)]
pub struct FileRow {
    pub name: String,
    pub bytes: u64,
}

impl DeleteReport {
    pub fn of(deleted: &restatus::store::retention::Deleted, url: String, forced: bool) -> Self {
        DeleteReport {
            snapshot: deleted.id.to_string(),
            url,
            complete: deleted.complete,
            forced,
            files: deleted.files.iter().map(|(name, bytes)| FileRow { name: name.clone(), bytes: *bytes }).collect(),
        }
    }

    pub fn text(&self) -> String {
        let files: Vec<String> = self.files.iter().map(|f| format!("{} ({})", f.name, human_bytes(f.bytes))).collect();
        let what = if self.complete { "snapshot" } else { "incomplete snapshot" };
        format!("deleted {what} {} ({}): {}\n", self.snapshot, self.url, files.join(", "))
    }
}

pub fn snapshot_table(rows: &[SnapshotSummary]) -> String {
    let body = rows
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                state_text(r.state).into(),
                r.created_at.clone().unwrap_or_default(),
                r.consistency.clone().unwrap_or_default(),
                r.records.map(|n| n.to_string()).unwrap_or_default(),
                r.payload_bytes.map(human_bytes).unwrap_or_default(),
                r.conflicts.to_string(),
                r.skipped.to_string(),
                r.captured_from.clone().unwrap_or_default(),
                match (&r.signed_by, r.signature) {
                    (_, None) => String::new(),
                    (None, Some(SignatureCheck::NotChecked)) => "unsigned".into(),
                    (None, Some(check)) => format!("unsigned ({})", signature_text(check)),
                    (Some(key), Some(check)) => format!("{key} ({})", signature_text(check)),
                },
                match &r.encrypted_to {
                    None if r.state == SnapshotState::Complete => "no".into(),
                    None => String::new(),
                    Some(recipients) => recipients.iter().map(|k| short_recipient(k)).collect::<Vec<_>>().join(","),
                },
                r.journal.as_ref().map(journal_text).unwrap_or_default(),
                match (&r.error, r.ahead_of_clock) {
                    (Some(e), _) => e.clone(),
                    (None, true) => "dated ahead of this clock (writer's clock skewed)".into(),
                    (None, false) => String::new(),
                },
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "STATE",
            "CREATED",
            "CONSISTENCY",
            "RECORDS",
            "SIZE",
            "CONFLICTS",
            "SKIPPED",
            "SOURCE",
            "SIGNED BY",
            "ENCRYPTED TO",
            "JOURNAL",
            "NOTE",
        ],
        body,
    )
}

fn state_text(state: SnapshotState) -> &'static str {
    match state {
        SnapshotState::Complete => "complete",
        SnapshotState::Incomplete => "incomplete",
        SnapshotState::Unreadable => "unreadable",
    }
}

fn signature_text(check: SignatureCheck) -> &'static str {
    match check {
        SignatureCheck::Verified => "verified",
        SignatureCheck::Refused => "refused",
        SignatureCheck::NotChecked => "not checked",
    }
}

/// A recipient shortened for a table: `age1` and the next 8 characters.
fn short_recipient(recipient: &str) -> String {
    match recipient.get(..12) {
        Some(head) if recipient.len() > 12 => format!("{head}…"),
        _ => recipient.to_string(),
    }
}

/// `snapshots show`: the manifest and the point of its journal shown (JSON: the manifest's
/// fields and `journalPoint`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShownSnapshot<'a> {
    #[serde(flatten)]
    pub manifest: &'a Manifest,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub journal_point: Option<&'a restatus::store::Point>,
}

impl ShownSnapshot<'_> {
    pub fn text(&self) -> String {
        let mut out = manifest_text(self.manifest);
        out += &point_text("Journal point", self.journal_point);
        out
    }
}

/// A point of a journal, as lines: base + N segments, time, verdict, gap, points passed over.
pub fn point_text(title: &str, point: Option<&restatus::store::Point>) -> String {
    let Some(p) = point else { return format!("\n{title}: none (the snapshot alone)\n") };
    let verdict = if p.consistent { "consistent" } else { "inconsistent" };
    let mut out = format!(
        "\n{title}: base {} + {} of {} verified segments, at {} ({verdict})\n",
        p.base, p.segments_applied, p.segments_verified, p.time
    );
    if let Some(gap) = &p.gap {
        out += &format!("  gap: {gap}\n");
    }
    for passed in &p.passed_over {
        out += &format!("  passed over: {passed}\n");
    }
    out
}

/// `snapshots diff` with the point of each side's journal.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PointDiff {
    #[serde(flatten)]
    pub diff: restatus::domain::compare::SnapshotDiff,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub a_point: Option<restatus::store::Point>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub b_point: Option<restatus::store::Point>,
}

impl PointDiff {
    pub fn text(&self) -> String {
        let mut out = diff_table(&self.diff);
        for (side, point) in [("A", &self.a_point), ("B", &self.b_point)] {
            if let Some(p) = point {
                out += &point_text(&format!("{side} journal point"), Some(p));
            }
        }
        out
    }
}

/// `snapshots show` as text: the manifest's summary, per-kind counts, conflicts and skips.
pub fn manifest_text(m: &Manifest) -> String {
    let mut out = String::new();
    let ratio = m.payload.size as f64 / m.payload.uncompressed_size.max(1) as f64;
    out += &format!("Snapshot:     {}\n", m.snapshot_id);
    out += &format!("Cluster:      {}\n", m.cluster_id);
    out += &format!("Format:       {}\n", m.format_version);
    out += &format!("Tool:         {} {}\n", m.tool, m.tool_version);
    out += &format!("Profile:      {}\n", m.profile);
    out += &format!("Created:      {}\n", m.created_at);
    out += &format!("Completed:    {}\n", m.completed_at);
    out += &format!(
        "Source:       {}\n",
        m.captured_from.as_deref().map_or("not recorded".into(), |uid| format!("{uid} (capturedFrom)"))
    );
    out += &format!("Signed by:    {}\n", m.signed_by.as_ref().map_or("unsigned".to_string(), |k| format!("key {k}")));
    out += &format!(
        "Encrypted to: {}\n",
        m.encryption.as_ref().map_or("not encrypted".to_string(), |e| format!(
            "{} ({})",
            e.recipients_text(),
            e.scheme
        ))
    );
    out += &format!(
        "Payload:      {} ({} records, {} uncompressed, ratio {ratio:.3}, sha256 {})\n\n",
        human_bytes(m.payload.size),
        m.payload.records,
        human_bytes(m.payload.uncompressed_size),
        m.payload.sha256
    );
    let kinds = m
        .kinds
        .iter()
        .map(|k| vec![k.kind.clone(), k.api_version.clone(), k.records.to_string(), k.skipped.to_string()])
        .collect();
    out += &table(&["KIND", "API VERSION", "RECORDS", "SKIPPED"], kinds);
    match &m.consistency {
        Some(c) if !c.consistent => {
            out += &format!(
                "\nInconsistent capture ({} reasons, {} attempts); restore skips it unless --allow-inconsistent:\n",
                c.reason_count, c.attempts
            );
            for r in &c.reasons {
                out += &format!("  {}: {}\n", r.object, r.reason);
            }
        }
        Some(c) => out += &format!("\nConsistent capture ({} attempts)\n", c.attempts),
        None => out += "\nConsistency not checked (format 1.0)\n",
    }
    if !m.conflicts.is_empty() {
        out += "\nKey conflicts (restore treats these as ambiguous):\n";
        for c in &m.conflicts {
            let objects: Vec<String> = c.objects.iter().map(ToString::to_string).collect();
            out += &format!("  {} {}: {}\n", c.kind, c.key, objects.join(", "));
        }
    }
    if let Some(e) = m.encryption.as_ref().filter(|e| e.withheld != Default::default()) {
        out += &format!(
            "\nWithheld from this encrypted manifest: {} skipped, {} key conflicts, {} inconsistency reasons\n",
            e.withheld.skipped, e.withheld.conflicts, e.withheld.reasons
        );
    }
    if !m.skipped.is_empty() {
        out += "\nSkipped:\n";
        for s in &m.skipped {
            let what = match (&s.namespace, &s.name) {
                (Some(ns), Some(name)) => format!("{} {ns}/{name}", s.kind),
                (None, Some(name)) => format!("{} {name}", s.kind),
                _ => format!("{} (all)", s.kind),
            };
            out += &format!("  {what}: {}\n", s.reason);
        }
    }
    out
}

/// `preflight` as text: READY or NOT READY, then one line per blocking object.
pub fn preflight_text(report: &PreflightReport) -> String {
    let mut out = String::new();
    if report.ready {
        out += "READY: nothing blocks a move";
        if let Some(s) = &report.snapshot {
            out += &format!(" (snapshot {s})");
        }
        out += "\n";
        return out;
    }
    out += &format!("NOT READY: {} blocking objects\n", report.blockers.len());
    let rows = report
        .blockers
        .iter()
        .map(|b| {
            let name =
                b.object.namespace.as_ref().map_or(b.object.name.clone(), |ns| format!("{ns}/{}", b.object.name));
            vec![b.object.kind.clone(), name, b.reason.clone()]
        })
        .collect();
    out += &table(&["KIND", "NAME", "REASON"], rows);
    if !report.label_commands.is_empty() {
        out += "\nclusterctl move would leave the objects above behind. On this (the source) cluster, run:\n";
        report.label_commands.iter().for_each(|c| out += &format!("  {c}\n"));
    }
    out
}

/// Left-aligned columns separated by three spaces, like kubectl.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| -> String {
        let padded: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        padded.join("   ").trim_end().to_string() + "\n"
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out += &line(row);
    }
    out
}

pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

const PLAN_HEADERS: [&str; 6] = ["KIND", "TARGET", "SOURCE", "KEY", "VERDICT", "REASON"];

/// The columns of a streamed plan table: its rows are printed before the widest is known. A
/// longer cell pushes the rest of its row to the right.
const PLAN_WIDTHS: [usize; 6] = [11, 30, 30, 52, 17, 0];

/// An item's rows: itself, then with `changes` its status diff, one field a row.
fn plan_rows(item: &PlanItem, changes: bool) -> Vec<Vec<String>> {
    let name = |o: &Option<ObjectRef>| {
        o.as_ref()
            .map(|o| o.namespace.as_ref().map_or(o.name.clone(), |ns| format!("{ns}/{}", o.name)))
            .unwrap_or_default()
    };
    let mut rows = vec![vec![
        item.kind.clone(),
        name(&item.target),
        name(&item.source),
        item.key.clone().unwrap_or_default(),
        item.verdict.to_string(),
        item.reason.clone(),
    ]];
    if changes {
        for change in &item.changes {
            let mut row = vec![String::new(); PLAN_HEADERS.len()];
            row[1] = format!("  {change}");
            rows.push(row);
        }
    }
    rows
}

/// A restore plan as a table; with `changes`, each restore is followed by its status diff.
pub fn plan_table(plan: &RestorePlan, changes: bool) -> String {
    let rows = plan.items.iter().flat_map(|item| plan_rows(item, changes)).collect();
    table(&PLAN_HEADERS, rows)
}

/// The header of a streamed plan table ([`plan_table_rows`]).
pub fn plan_table_header() -> String {
    fixed_row(PLAN_HEADERS.iter().map(|h| h.to_string()).collect(), &PLAN_WIDTHS)
}

/// An item's rows of a streamed plan table (fixed-width columns), with its status diff.
pub fn plan_table_rows(item: &PlanItem) -> String {
    plan_rows(item, true).into_iter().map(|row| fixed_row(row, &PLAN_WIDTHS)).collect()
}

fn fixed_row(cells: Vec<String>, widths: &[usize]) -> String {
    let padded: Vec<String> = cells.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
    padded.join("   ").trim_end().to_string() + "\n"
}

/// The closing lines of a restore: counts, writes, failures, pairing.
pub fn restore_summary(report: &RestoreReport) -> String {
    let mut out = String::new();
    for passed in &report.passed_over {
        out += &format!("skipped snapshot {}: {}\n", passed.snapshot, passed.reason);
    }
    let counts: Vec<String> = report.counts.iter().map(|(v, n)| format!("{v} {n}")).collect();
    out += &format!("snapshot {} (captured {}): {}\n", report.snapshot, report.snapshot_created_at, counts.join(", "));
    if let Some(point) = &report.restored_to {
        for passed in &point.passed_over {
            out += &format!("journal point passed over: {passed}\n");
        }
        if let Some(gap) = &point.gap {
            out += &format!("JOURNAL GAP: {gap}\n");
        }
        if let Some(behind) = &report.behind {
            out += &format!("BEHIND: {behind}\n");
        }
        out += &format!(
            "restored to {}: base {} + {} of {} journal segments\n",
            point.time, point.base, point.segments_applied, point.segments_verified
        );
    }
    if report.dry_run {
        out += "dry run: nothing written\n";
        return out;
    }
    out += &format!("{} API writes\n", report.writes);
    for failure in report.failures() {
        out += &format!("FAILED {}: {}\n", failure.object, failure.error.as_deref().unwrap_or_default());
    }
    for (object, held) in report.outcomes.iter().filter_map(|o| Some((&o.object, o.held.as_deref()?))) {
        out += &format!("HELD {object}: still ignored, {held}\n");
    }
    if let Some(stopped) = &report.stopped {
        out += &format!(
            "STOPPED by a signal: {} planned objects not started{}; every object started was finished and released\n",
            stopped.writes_not_started,
            match stopped.kinds_not_reached.as_slice() {
                [] => String::new(),
                kinds => format!(", kinds not reached: {}", kinds.join(", ")),
            }
        );
    }
    if report.pairing.is_empty() {
        out += "pairing: every Bound ServerClaim has its Reserved Server and back\n";
    } else {
        for v in &report.pairing {
            out += &format!("PAIRING {}: {}\n", v.object, v.reason);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes what is written until `room` bytes, then fails as a closed pipe does.
    struct Pipe {
        taken: Arc<Mutex<Vec<u8>>>,
        room: usize,
    }

    impl Write for Pipe {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let mut taken = self.taken.lock().unwrap();
            if taken.len() + buf.len() > self.room {
                return Err(io::Error::from(io::ErrorKind::BrokenPipe));
            }
            taken.extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Issue 22, item 2 (F110): a reader gone ends the writing without a panic: the later
    /// lines are dropped, `closed` completes (the restore stops), and the error says why.
    #[tokio::test]
    async fn a_stream_whose_reader_is_gone_drops_the_rest_and_says_closed() {
        let taken = Arc::new(Mutex::new(vec![]));
        let stream = Stream::new(Pipe { taken: taken.clone(), room: 10 });
        let closed = stream.closed();
        stream.write("line one\n");
        assert!(stream.error().is_none());
        stream.write("line two\n");
        stream.write("x\n");
        tokio::time::timeout(std::time::Duration::from_secs(5), closed).await.expect("closed completes");
        assert_eq!(stream.error().map(|e| e.kind()), Some(io::ErrorKind::BrokenPipe));
        assert_eq!(taken.lock().unwrap().as_slice(), b"line one\n", "nothing after the failed write");
    }

    /// `restore -o jsonl`: an object line is its plan item with `type: object` (and the outcome
    /// once written); the summary line has `type: summary` and no per-object list.
    fn plan_item(kind: &str, name: &str) -> PlanItem {
        PlanItem {
            kind: kind.into(),
            verdict: restatus::restore::Verdict::Restore,
            key: Some("spec.systemUUID=u-1".into()),
            target: Some(ObjectRef { kind: kind.into(), namespace: None, name: name.into() }),
            source: None,
            reason: "status differs".into(),
            forced: false,
            changes: vec![],
            release: false,
            record: None,
            live: None,
        }
    }

    #[test]
    fn jsonl_lines_say_their_type() {
        let item = plan_item("Server", "s-1");
        let line = ObjectLine { item: item.clone(), outcome: None };
        let text = RestoreLine::Object(&line).text();
        assert!(text.ends_with('\n') && !text.trim_end().contains('\n'), "one line: {text}");
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["type"], "object");
        assert_eq!(value["verdict"], "restore");
        assert_eq!(value["target"]["name"], "s-1");
        assert!(value.get("outcome").is_none());

        let report = RestoreReport {
            snapshot: "snap".into(),
            snapshot_created_at: "2026-12-03T10:00:00Z".parse().unwrap(),
            restored_to: None,
            behind: None,
            passed_over: vec![],
            dry_run: false,
            plan: RestorePlan {
                snapshot: restatus::format::SnapshotId::new("2026-12-03T10:00:00Z".parse().unwrap()),
                items: vec![item],
            },
            counts: [(restatus::restore::Verdict::Restore, 1)].into_iter().collect(),
            outcomes: vec![],
            writes: 3,
            pairing: vec![],
            write_limit: None,
            stopped: None,
            held: 0,
        };
        let value: serde_json::Value = serde_json::from_str(&RestoreLine::Summary(report.summary()).text()).unwrap();
        assert_eq!(value["type"], "summary");
        assert_eq!(
            (value["objects"].clone(), value["writes"].clone(), value["ok"].clone()),
            (1.into(), 3.into(), true.into())
        );
        assert!(value.get("plan").is_none() && value.get("outcomes").is_none(), "{value}");
    }

    /// A dry run's streamed table: fixed columns, the diff under its object.
    #[test]
    fn a_streamed_plan_row_has_fixed_columns() {
        let header = plan_table_header();
        let rows = plan_table_rows(&plan_item("BMC", "bmc-1"));
        assert_eq!(header.find("TARGET"), Some(14));
        assert_eq!(rows.find("bmc-1"), Some(14), "{header}{rows}");
        assert_eq!(header.find("VERDICT"), rows.find("restore"));
    }

    #[test]
    fn tables_align_columns() {
        let out = table(&["A", "LONGER"], vec![vec!["xyz".into(), "1".into()], vec!["q".into(), "22".into()]]);
        assert_eq!(out, "A     LONGER\nxyz   1\nq     22\n");
    }

    #[test]
    fn object_rows_filter_by_kind_and_text() {
        let row = ObjectRow {
            kind: "Server".into(),
            key: "spec.systemUUID=ab-12".into(),
            namespace: None,
            name: "compute-7".into(),
        };
        assert!(row.matches(None, None));
        assert!(row.matches(Some("server"), Some("AB-12")));
        assert!(row.matches(None, Some("compute")));
        assert!(!row.matches(Some("BMC"), None));
        assert!(!row.matches(None, Some("storage")));
    }

    #[test]
    fn yaml_is_written() {
        let row = ObjectRow { kind: "BMC".into(), key: "k=v".into(), namespace: Some("ns".into()), name: "b".into() };
        let text = yaml(&vec![row]).unwrap();
        assert!(text.contains("kind: BMC") && text.contains("namespace: ns"), "{text}");
    }

    /// `snapshots list`'s journal cell and JSON: none, segments with the newest point and its
    /// lag behind now, a gap, an unreadable newest header, a writer's clock ahead.
    #[test]
    fn a_journal_row_says_segments_newest_point_and_lag() {
        let at = |at: &str, lag: i64| JournalSummary {
            segments: 12,
            newest_segment: Some(12),
            newest_at: Some(at.into()),
            lag_seconds: Some(lag),
            ..JournalSummary::default()
        };
        assert_eq!(journal_text(&JournalSummary::default()), "-");
        assert_eq!(journal_text(&at("2026-12-03T10:05:00Z", 7)), "12 to 2026-12-03T10:05:00Z (7s behind)");
        let gap = JournalSummary { gap_at: Some(4), ..at("2026-12-03T07:01:00Z", 11_047) };
        assert_eq!(journal_text(&gap), "12 to 2026-12-03T07:01:00Z (3h04m behind), gap at 4");
        assert_eq!(journal_text(&at("2026-12-03T10:06:00Z", -53)), "12 to 2026-12-03T10:06:00Z (ahead of this clock)");
        let broken =
            JournalSummary { segments: 2, error: Some("segment 2 of base x is corrupt".into()), ..Default::default() };
        assert_eq!(journal_text(&broken), "2 segments, segment 2 of base x is corrupt");
        assert_eq!(human_age(59), "59s");
        assert_eq!(human_age(307), "5m07s");
        assert_eq!(human_age(2 * 86_400 + 5 * 3600 + 10), "2d05h");
    }

    #[test]
    fn bytes_are_human() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
