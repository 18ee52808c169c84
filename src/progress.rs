//! Progress of long runs (a restore's writes, a backup's capture), for whoever watches: the CLI
//! draws a bar on a terminal or logs a line now and then. The library only reports.

use std::fmt;
use std::sync::Arc;

/// Receives the progress of one run. Calls come from the run's task; keep them cheap.
pub trait Progress: Send + Sync {
    /// A phase begins (`restore`, `backup`); `total` items when known in advance.
    fn start(&self, phase: &str, total: Option<u64>);
    /// `items` more are done.
    fn advance(&self, items: u64);
    /// The phase is over.
    fn finish(&self);
    /// Something to show beside the count until the next note (a restore's write limit).
    fn note(&self, _note: &str) {}
}

/// An optional [`Progress`], to carry in options: reports nowhere unless set.
#[derive(Clone, Default)]
pub struct ProgressHook(Option<Arc<dyn Progress>>);

impl ProgressHook {
    pub fn new(progress: Arc<dyn Progress>) -> Self {
        ProgressHook(Some(progress))
    }

    pub fn start(&self, phase: &str, total: Option<u64>) {
        if let Some(p) = &self.0 {
            p.start(phase, total);
        }
    }

    pub fn advance(&self, items: u64) {
        if let Some(p) = &self.0 {
            p.advance(items);
        }
    }

    pub fn finish(&self) {
        if let Some(p) = &self.0 {
            p.finish();
        }
    }

    pub fn note(&self, note: &str) {
        if let Some(p) = &self.0 {
            p.note(note);
        }
    }
}

impl fmt::Debug for ProgressHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() { "ProgressHook(set)" } else { "ProgressHook(none)" })
    }
}
