//! Fixed window: one counter per window of `per`.
//!
//! Unaligned (the default), a window opens with the first request after the
//! previous one closed, so every key gets full windows. Aligned
//! (`aligned: true`), windows start at multiples of `per` since the Unix
//! epoch, as envoyproxy/ratelimit counts them: every key's minute starts at
//! :00. Exact within a window; a client can still get `2·limit` across the
//! boundary of two windows, which is what fixed windows are.
//!
//! # Debt
//!
//! A debit may leave a window counting more than `limit` (at most `limit +
//! max_debt`). What is beyond `limit` is owed by the next window, which
//! opens counting it: each window that passes repays `limit`, so a window
//! opening `k` windows after one that counted `c` starts at
//! `max(0, c − k·limit)`.

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
    let current = current(rule, window, now);
    let ends_in = (current.start_ms + per).saturating_sub(now).max(1);
    if current.count + cost <= limit {
        let next = Window {
            start_ms: current.start_ms,
            count: current.count + cost,
        };
        (Outcome::allowed(limit - next.count, ends_in), Some(next))
    } else {
        // Owing, the request waits for the window whose carried debt
        // leaves room for it, and the bucket is full once nothing is
        // carried.
        let remaining = limit.saturating_sub(current.count);
        let waits = (current.count + cost - limit).div_ceil(limit).max(1);
        let full = current.count.div_ceil(limit).max(1);
        (
            Outcome::denied(
                remaining,
                ends_in.saturating_add((full - 1).saturating_mul(per)),
                ends_in.saturating_add((waits - 1).saturating_mul(per)),
            ),
            None,
        )
    }
}

/// The window `now` counts in: `window` itself, or the next one opened
/// with the debt `window` carries into it.
fn current(rule: &Rule, window: Window, now: u64) -> Window {
    let per = rule.period_ms();
    // The windows that passed since `window` opened, and what it still
    // owes in the one `now` falls in.
    let passed = now.saturating_sub(window.start_ms) / per;
    let owed = window
        .count
        .saturating_sub(passed.saturating_mul(rule.limit()));
    if rule.aligned() {
        let start_ms = now - now % per;
        if window.start_ms == start_ms {
            window
        } else {
            Window {
                start_ms,
                count: owed,
            }
        }
    } else if window.count == 0 || (passed >= 1 && owed == 0) {
        Window {
            start_ms: now,
            count: 0,
        }
    } else if passed >= 1 {
        // Owing, the windows follow one another from the one that owed, so
        // that the debt is repaid on the schedule a denial announced.
        Window {
            start_ms: window.start_ms + passed * per,
            count: owed,
        }
    } else {
        window
    }
}

/// Charges `cost` units whatever the window holds, counting at most `limit
/// + max_debt`: the new window and the units forgiven beyond it.
pub fn debit(rule: &Rule, window: Window, now: u64, cost: u64) -> (Window, u64) {
    let current = current(rule, window, now);
    let deepest = rule.limit() + rule.max_debt();
    let count = current.count.saturating_add(cost);
    let window = Window {
        start_ms: current.start_ms,
        count: count.min(deepest.max(current.count)),
    };
    (window, count - window.count)
}

/// The window as it must be read at `now`:
///
/// - when it starts later than the window `now` falls in (the clock
///   stepped back): the window of `now`, keeping its count, so nothing
///   consumed is forgotten and it reopens within one period;
/// - when it counts more than the rule can ever owe (`limit + max_debt`),
///   it was written under another rule (a reload lowered the limit): its
///   window is spent, and nothing is carried past it, so the tenant waits
///   at most one period of the new rule, never the old usage repaid at
///   the new rate.
pub fn repair(rule: &Rule, window: Window, now: u64) -> Option<Window> {
    let start_ms = if rule.aligned() {
        now - now % rule.period_ms()
    } else {
        now
    };
    let ahead = window.start_ms > start_ms;
    let foreign = window.count > rule.limit().saturating_add(rule.max_debt());
    (ahead || foreign).then_some(Window {
        start_ms: if ahead { start_ms } else { window.start_ms },
        count: if foreign { rule.limit() } else { window.count },
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

/// A closed window holds nothing, once the windows after it have repaid
/// what it owed.
pub fn idle_at(rule: &Rule, window: Window) -> u64 {
    let windows = window.count.div_ceil(rule.limit()).max(1);
    window
        .start_ms
        .saturating_add(windows.saturating_mul(rule.period_ms()))
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
