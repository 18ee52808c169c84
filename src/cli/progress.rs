//! Progress of `restore` and `backup` for a person: a bar on a terminal, else a one-line
//! `info!` log every `--progress-interval` and when a phase ends (done/total, rate).

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use restatus::progress::Progress;
use tracing::info;

/// A bar on stderr when it is a terminal, else log lines.
pub fn for_stderr(interval: Duration) -> Box<dyn Progress> {
    if std::io::stderr().is_terminal() { Box::new(Bar::default()) } else { Box::new(LogLines::new(interval)) }
}

#[derive(Default)]
struct Bar {
    bar: Mutex<Option<ProgressBar>>,
    phase: Mutex<String>,
}

impl Progress for Bar {
    fn start(&self, phase: &str, total: Option<u64>) {
        let bar = match total {
            Some(total) => ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr()).with_style(
                ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} objects, {per_sec}, eta {eta}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            ),
            None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()).with_style(
                ProgressStyle::with_template("{spinner} {msg}: {pos} objects, {per_sec}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            ),
        };
        bar.set_message(phase.to_string());
        if let Ok(mut slot) = self.phase.lock() {
            *slot = phase.to_string();
        }
        bar.enable_steady_tick(Duration::from_millis(200));
        if let Ok(mut slot) = self.bar.lock() {
            *slot = Some(bar);
        }
    }

    fn advance(&self, items: u64) {
        if let Ok(slot) = self.bar.lock()
            && let Some(bar) = slot.as_ref()
        {
            bar.inc(items);
        }
    }

    fn finish(&self) {
        if let Ok(mut slot) = self.bar.lock()
            && let Some(bar) = slot.take()
        {
            bar.finish_and_clear();
        }
    }

    fn note(&self, note: &str) {
        let phase = self.phase.lock().map(|p| p.clone()).unwrap_or_default();
        if let Ok(slot) = self.bar.lock()
            && let Some(bar) = slot.as_ref()
        {
            bar.set_message(format!("{phase} ({note})"));
        }
    }
}

/// Log lines: at most one per interval while items come in, and one at the end.
struct LogLines {
    interval: Duration,
    state: Mutex<LogState>,
}

struct LogState {
    phase: String,
    total: Option<u64>,
    done: u64,
    started: Instant,
    last: Instant,
    /// The last note, appended to each line.
    note: String,
}

impl LogLines {
    fn new(interval: Duration) -> Self {
        let now = Instant::now();
        let state =
            LogState { phase: String::new(), total: None, done: 0, started: now, last: now, note: String::new() };
        LogLines { interval, state: Mutex::new(state) }
    }
}

/// `restore progress: 120/500 objects (24%), 40.0/s, 3.0s, eta 9s`: the estimate (at the rate
/// so far) only while the total is known and something is done and something left.
pub fn line(phase: &str, done: u64, total: Option<u64>, elapsed: Duration) -> String {
    let rate = if elapsed.as_secs_f64() > 0.0 { done as f64 / elapsed.as_secs_f64() } else { 0.0 };
    let count = match total {
        Some(total) if total > 0 => format!("{done}/{total} objects ({}%)", done * 100 / total),
        Some(total) => format!("{done}/{total} objects"),
        None => format!("{done} objects"),
    };
    let eta = match total {
        Some(total) if rate > 0.0 && done < total => format!(", eta {}", human((total - done) as f64 / rate)),
        _ => String::new(),
    };
    format!("{phase} progress: {count}, {rate:.1}/s, {:.1}s{eta}", elapsed.as_secs_f64())
}

/// Whole seconds as `42s`, `7m05s` or `1h02m`.
fn human(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

impl Progress for LogLines {
    fn start(&self, phase: &str, total: Option<u64>) {
        if let Ok(mut s) = self.state.lock() {
            let now = Instant::now();
            *s = LogState { phase: phase.to_string(), total, done: 0, started: now, last: now, note: String::new() };
        }
    }

    fn advance(&self, items: u64) {
        if let Ok(mut s) = self.state.lock() {
            s.done += items;
            if s.last.elapsed() >= self.interval {
                s.last = Instant::now();
                info!("{}{}", line(&s.phase, s.done, s.total, s.started.elapsed()), s.note);
            }
        }
    }

    fn finish(&self) {
        if let Ok(s) = self.state.lock() {
            info!("{}{} (done)", line(&s.phase, s.done, s.total, s.started.elapsed()), s.note);
        }
    }

    fn note(&self, note: &str) {
        if let Ok(mut s) = self.state.lock() {
            s.note = format!(", {note}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_say_done_total_rate_and_what_is_left() {
        assert_eq!(
            line("restore", 120, Some(480), Duration::from_secs(3)),
            "restore progress: 120/480 objects (25%), 40.0/s, 3.0s, eta 9s"
        );
        assert_eq!(
            line("restore", 30_000, Some(110_000), Duration::from_secs(450)),
            "restore progress: 30000/110000 objects (27%), 66.7/s, 450.0s, eta 20m00s"
        );
        assert_eq!(
            line("restore", 1_000, Some(110_000), Duration::from_secs(100)),
            "restore progress: 1000/110000 objects (0%), 10.0/s, 100.0s, eta 3h01m"
        );
        assert_eq!(
            line("restore", 480, Some(480), Duration::from_secs(12)),
            "restore progress: 480/480 objects (100%), 40.0/s, 12.0s"
        );
        assert_eq!(line("backup", 10, None, Duration::from_secs(2)), "backup progress: 10 objects, 5.0/s, 2.0s");
        assert_eq!(line("restore", 0, Some(0), Duration::ZERO), "restore progress: 0/0 objects, 0.0/s, 0.0s");
    }
}
