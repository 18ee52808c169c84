//! The summary Event of a restore: one per kind (and snapshot), instead of one per object.
//!
//! Events are for people. An object gets an Event of its own only where it needs attention
//! (refused by the target, restored in part, kept quiesced: see `apply`); every object a
//! restore wrote is counted here, and the snapshot it came from is on the object itself (its
//! `restored-from` annotation, set by the release write the restore makes anyway).

use kube::runtime::events::{Event, EventType};

use super::apply::Outcome;
use super::plan::Verdict;
use crate::k8s::events;

/// What a restore did to the objects of one kind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct KindSummary {
    /// Statuses written (and the objects released, unless held).
    pub restored: usize,
    /// Of those, objects restatus keeps quiesced (each has an Event of its own).
    pub held: usize,
    /// Records the target refused (`incompatible`).
    pub refused: usize,
    /// Objects whose writes failed (retried by the controller; a rerun does the rest).
    pub failed: usize,
}

impl KindSummary {
    pub fn add(&mut self, outcome: &Outcome) {
        if outcome.error.is_some() {
            self.failed += 1;
        } else if outcome.verdict == Verdict::Restore {
            self.restored += 1;
            self.held += usize::from(outcome.held.is_some());
        } else if outcome.verdict == Verdict::Incompatible {
            self.refused += 1;
        }
    }

    /// Nothing worth telling: no status written, refused or failed.
    pub fn is_empty(&self) -> bool {
        self.restored + self.refused + self.failed == 0
    }

    /// The Event for `kind` (its plural, for people: "Servers") restored from `snapshot`: a
    /// Warning when some objects were refused or failed.
    pub fn event(&self, plural: &str, snapshot: &str) -> Event {
        let mut note = format!("restored the status of {} {plural} from snapshot {snapshot}", self.restored);
        for (count, what) in [
            (self.held, "kept quiesced (see their own Events)"),
            (self.refused, "refused by the target's schema"),
            (self.failed, "failed (see restatus's log)"),
        ] {
            if count > 0 {
                note.push_str(&format!("; {count} {what}"));
            }
        }
        let type_ = match self.refused + self.failed {
            0 => EventType::Normal,
            _ => EventType::Warning,
        };
        Event {
            type_,
            reason: "StatusRestored".into(),
            note: Some(events::note(note)),
            action: "RestoreStatus".into(),
            secondary: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ObjectRef;

    fn outcome(verdict: Verdict, held: bool, error: bool) -> Outcome {
        Outcome {
            object: ObjectRef { kind: "Server".into(), namespace: None, name: "s".into() },
            verdict,
            writes: 3,
            reason: None,
            held: held.then(|| "waits for ServerClaim a/c".into()),
            error: error.then(|| "boom".into()),
            after: None,
            versions: vec![],
        }
    }

    #[test]
    fn a_summary_counts_each_outcome_once_and_says_only_what_happened() {
        let mut summary = KindSummary::default();
        assert!(summary.is_empty());
        for o in [
            outcome(Verdict::Restore, false, false),
            outcome(Verdict::Restore, true, false),
            outcome(Verdict::Restore, false, true),
            outcome(Verdict::AlreadyEqual, false, false),
        ] {
            summary.add(&o);
        }
        assert_eq!(summary, KindSummary { restored: 2, held: 1, refused: 0, failed: 1 });
        let event = summary.event("servers", "20261203T180000.000Z-abcdef");
        assert_eq!(event.type_, EventType::Warning, "a failure makes it a warning");
        assert_eq!(
            event.note.as_deref(),
            Some(
                "restored the status of 2 servers from snapshot 20261203T180000.000Z-abcdef; 1 kept quiesced \
                 (see their own Events); 1 failed (see restatus's log)"
            )
        );

        let mut quiet = KindSummary::default();
        quiet.add(&outcome(Verdict::Restore, false, false));
        let event = quiet.event("servers", "x");
        assert_eq!(
            (event.type_, event.note.as_deref()),
            (EventType::Normal, Some("restored the status of 1 servers from snapshot x"))
        );
    }

    #[test]
    fn a_note_longer_than_the_api_allows_is_cut_at_a_character() {
        let note = events::note("é".repeat(1000));
        assert!(note.len() <= 1024 && note.ends_with('…'), "{}", note.len());
        assert_eq!(events::note("short".into()), "short");
    }
}
