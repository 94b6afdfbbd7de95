//! Helpers for the algorithm tests: drive one rule through time.

use super::{Outcome, State};
use crate::rule::{Algorithm, Rule};

/// A rule with the given parameters (unaligned), panicking on bad ones.
pub(crate) fn rule(algorithm: Algorithm, limit: u64, per_ms: u64, burst: Option<u64>) -> Rule {
    Rule::new(
        algorithm,
        limit.into(),
        per_ms,
        burst.map(Into::into),
        false,
    )
    .unwrap()
}

/// One key's state under one rule, committed on every admission.
pub(crate) struct Run {
    rule: Rule,
    state: State,
}

impl Run {
    pub(crate) fn new(rule: Rule) -> Run {
        Run {
            rule,
            state: State::Fresh,
        }
    }

    pub(crate) fn at(&mut self, now: u64, cost: u64) -> Outcome {
        let (outcome, step) = self.rule.decide(&self.state, now, cost);
        self.rule.commit(&mut self.state, step);
        outcome
    }

    pub(crate) fn state(&self) -> &State {
        &self.state
    }
}
