//! Fixed window: one counter per window of `per`.
//!
//! Unaligned (the default), a window opens with the first request after the
//! previous one closed, so every key gets full windows. Aligned
//! (`aligned: true`), windows start at multiples of `per` since the Unix
//! epoch, as envoyproxy/ratelimit counts them: every key's minute starts at
//! :00. Exact within a window; a client can still get `2·limit` across the
//! boundary of two windows, which is what fixed windows are.

use super::Outcome;
use crate::rule::Rule;

/// The open window and what it has admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// When the window opened.
    pub start_ms: u64,
    /// Units admitted in it.
    pub count: u64,
}

/// Decides a request; `Some(new window)` when admitted.
pub fn decide(rule: &Rule, window: Window, now: u64, cost: u64) -> (Outcome, Option<Window>) {
    let per = rule.period_ms();
    let limit = rule.limit();
    let current = if rule.aligned() {
        let start_ms = now - now % per;
        if window.start_ms == start_ms {
            window
        } else {
            Window { start_ms, count: 0 }
        }
    } else if window.count == 0 || now >= window.start_ms.saturating_add(per) {
        Window {
            start_ms: now,
            count: 0,
        }
    } else {
        window
    };
    let ends_in = (current.start_ms + per).saturating_sub(now).max(1);
    if current.count + cost <= limit {
        let next = Window {
            start_ms: current.start_ms,
            count: current.count + cost,
        };
        (Outcome::allowed(limit - next.count, ends_in), Some(next))
    } else {
        let remaining = limit.saturating_sub(current.count);
        (Outcome::denied(remaining, ends_in, ends_in), None)
    }
}

/// The window as it must be read at `now` when it starts later than the
/// window `now` falls in (the clock stepped back): the window of `now`,
/// keeping its count, so nothing consumed is forgotten and it reopens
/// within one period.
pub fn repair(rule: &Rule, window: Window, now: u64) -> Option<Window> {
    let start_ms = if rule.aligned() {
        now - now % rule.period_ms()
    } else {
        now
    };
    (window.start_ms > start_ms).then_some(Window {
        start_ms,
        count: window.count,
    })
}

/// Gives back `cost` units admitted at `at`, if they still count in this
/// window.
pub fn refund(rule: &Rule, window: Window, at: u64, cost: u64) -> Option<Window> {
    (at >= window.start_ms && at < window.start_ms + rule.period_ms()).then_some(Window {
        start_ms: window.start_ms,
        count: window.count.saturating_sub(cost),
    })
}

/// A closed window holds nothing.
pub fn idle_at(rule: &Rule, window: Window) -> u64 {
    window.start_ms + rule.period_ms()
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testing::{Run, rule};
    use crate::rule::{Algorithm, Rule};

    #[test]
    fn unaligned_window_opens_on_first_request() {
        let mut run = Run::new(rule(Algorithm::FixedWindow, 2, 1_000, None));
        assert!(run.at(1_500, 1).allowed);
        assert!(run.at(2_000, 1).allowed);
        let denied = run.at(2_400, 1);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after_ms, 100);
        assert!(run.at(2_500, 2).allowed);
    }

    #[test]
    fn aligned_window_follows_the_clock() {
        let r = Rule::new(Algorithm::FixedWindow, 2, 1_000, None, true).unwrap();
        let mut run = Run::new(r);
        assert!(run.at(1_500, 2).allowed);
        let denied = run.at(1_900, 1);
        assert!(!denied.allowed);
        assert_eq!(denied.retry_after_ms, 100);
        assert!(run.at(2_000, 2).allowed);
    }
}
