//! Valves that follow their downstream (appendix I of the specification):
//! an `adaptive` valve's terms, the priorities it sheds by, and the law
//! ([`law`]) that moves its effective limit between `min` and `limit`.
//!
//! # Priorities
//!
//! A plan's `priority` says which share of an adaptive valve's effective
//! limit `L` its requests may fill: a request of priority `p` is admitted
//! by the valve only while what the valve holds stays within
//! `⌊L × share(p)⌋` ([`Priority::share`]). While the valve sheds (it is
//! full at `L`), a `low` request is denied from `L/4` on, a `normal` one
//! from `L/2`, a `high` one from `3L/4` and a `critical` one only at `L`:
//! a lower priority is always denied first, and a higher one only once
//! every lower one is.
//!
//! The law sees the valve full whatever priority it denied, so `L` grows
//! until the downstream's latency reaches its target: what the lower
//! priorities hold, `L` makes up for. With `L*` requests in flight at the
//! target, and critical traffic needing `c` of them, the law settles where
//! low traffic holds `L/4 = L* − c`: critical has `3L/4 ≥ 3(L* − c)` of
//! room beyond what it uses, however much low traffic asks. Traffic of
//! one low priority alone gets the downstream's capacity as long as the
//! valve's `limit` is at least `4 L*`: write `limit` as a ceiling, well
//! above what the downstream holds.

pub mod law;

/// An adaptive valve's terms: `adaptive: { latency_target, min }`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adaptive {
    /// The downstream latency the law steers to, in ms.
    pub latency_target_ms: u64,
    /// The least effective limit (at least 1, at most the valve's limit).
    pub min: u64,
}

/// An adaptive valve among the rules of a request: where it is, and its
/// terms.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveValve {
    /// Its place among the rules.
    pub index: usize,
    /// Its terms.
    pub terms: Adaptive,
}

/// A request's priority at adaptive valves (`priority:` on a plan).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Shed first.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Shed after normal.
    High,
    /// Shed last: only when the valve is full at its effective limit.
    Critical,
}

impl Priority {
    /// Every priority, lowest first.
    pub const ALL: [Priority; 4] = [
        Priority::Low,
        Priority::Normal,
        Priority::High,
        Priority::Critical,
    ];

    /// Its name, as configured and in metrics.
    pub fn name(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
            Priority::Critical => "critical",
        }
    }

    /// The priority named `name`, if any.
    pub fn parse(name: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The share of an adaptive valve's effective limit its requests may
    /// fill (see the module's documentation).
    pub fn share(self) -> f64 {
        match self {
            Priority::Low => 0.25,
            Priority::Normal => 0.5,
            Priority::High => 0.75,
            Priority::Critical => 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_higher_priority_may_fill_more_of_the_valve() {
        for pair in Priority::ALL.windows(2) {
            assert!(pair[0] < pair[1]);
            assert!(pair[0].share() < pair[1].share());
        }
        assert_eq!(Priority::Critical.share(), 1.0);
        for p in Priority::ALL {
            assert_eq!(Priority::parse(p.name()), Some(p));
        }
        assert_eq!(Priority::parse("urgent"), None);
        assert_eq!(Priority::default(), Priority::Normal);
    }
}
