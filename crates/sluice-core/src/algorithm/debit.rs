//! Debits: units charged whatever the bucket holds.
//!
//! A decision admits a request only when every rule has room for it. A
//! debit records a cost that is already spent (a settled reservation's
//! excess, a reported usage, an Envoy quota): it always counts, and may
//! leave a rule owing up to its `max_debt` past an exhausted bucket. A rule
//! in debt denies until the debt is repaid, and its outcome says when:
//! each algorithm's module documents how it carries a debt. What a debit
//! would owe beyond `max_debt` is forgiven and reported. A concurrency
//! rule is never debited.
//!
//! The twin of `debit` in `adjust.lua`; the differential test holds the
//! two to the same states.

use super::{State, Step, fixed_window, gcra, sliding_log, sliding_window, token_bucket};
use crate::rule::{Algorithm, Rule};

/// What a debit does to one rule's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debit {
    /// The state to write (a repair included).
    pub step: Step,
    /// Whole units owed beyond `max_debt`, forgiven.
    pub forgiven: u64,
}

impl Rule {
    /// Charges `cost` units at `now` against `state` (repaired first, as
    /// [`decide`](Self::decide) repairs it).
    pub fn debit(&self, state: &State, now: u64, cost: u64) -> Debit {
        let repaired = self.repair(state, now);
        let state = repaired.as_ref().unwrap_or(state);
        let (step, forgiven) = match (self.algorithm(), state) {
            (Algorithm::Concurrency, _) => (Step::Keep, 0),
            (Algorithm::Gcra, state) => {
                let tat = match state {
                    State::Gcra(tat) => *tat,
                    _ => gcra::Tat::default(),
                };
                let (tat, forgiven) = gcra::debit(self, tat, now, cost);
                (Step::Replace(State::Gcra(tat)), forgiven)
            }
            (Algorithm::TokenBucket, state) => {
                let bucket = match state {
                    State::TokenBucket(b) => Some(*b),
                    _ => None,
                };
                let (bucket, forgiven) = token_bucket::debit(self, bucket, now, cost);
                (Step::Replace(State::TokenBucket(bucket)), forgiven)
            }
            (Algorithm::FixedWindow, state) => {
                let window = match state {
                    State::FixedWindow(w) => *w,
                    _ => fixed_window::Window::default(),
                };
                let (window, forgiven) = fixed_window::debit(self, window, now, cost);
                (Step::Replace(State::FixedWindow(window)), forgiven)
            }
            (Algorithm::SlidingWindow, state) => {
                let windows = match state {
                    State::SlidingWindow(w) => *w,
                    _ => sliding_window::Windows::default(),
                };
                let (windows, forgiven) = sliding_window::debit(self, windows, now, cost);
                (Step::Replace(State::SlidingWindow(windows)), forgiven)
            }
            (Algorithm::SlidingLog, state) => {
                let empty = sliding_log::Log::default();
                let log = match state {
                    State::SlidingLog(log) => log,
                    _ => &empty,
                };
                let (append, forgiven) = sliding_log::debit(self, log, now, cost);
                (append.map_or(Step::Keep, Step::Log), forgiven)
            }
        };
        let step = match (repaired, step) {
            (None, step) => step,
            (Some(repaired), Step::Keep) => Step::Replace(repaired),
            (Some(mut repaired), step) => {
                self.commit(&mut repaired, step);
                Step::Replace(repaired)
            }
        };
        Debit { step, forgiven }
    }
}
