//! Sliding window: two epoch-aligned fixed windows, the previous one weighted.
//!
//! At `e` milliseconds into the current window, the estimate of the units in
//! the last `per` is `prev·(per − e)/per + cur`: the previous window's count
//! is assumed spread evenly over it. A request of `cost` passes when
//! `prev·(per − e) + (cur + cost)·per ≤ limit·per` — integers, exact.
//!
//! # Error bound
//!
//! The estimate is exact when traffic is uniform within each window. It can
//! over-admit when the previous window's units were bunched at its end:
//!
//! - within any one aligned window the count never exceeds `limit` (the
//!   estimate is at least `cur`);
//! - over an arbitrary span of `per`, at most `cur + prev ≤ limit + prev·e/per
//!   < 2·limit` units are admitted: the worst case is `prev = limit` all at
//!   the very end of the previous window, followed by a steady stream.
//!
//! The property tests hold the algorithm to both bounds, and
//! `docs/BENCHMARKS.md` records the error measured on random traffic. Use
//! `gcra` or `sliding_log` when the limit must be exact over every span.
//!
//! # Debt
//!
//! A debit may leave the current window counting more than `limit` (at
//! most `limit + max_debt`). When the windows move on, the window that
//! becomes the previous one holds at most `limit`, and what it owed beyond
//! that opens the new current window: each window that passes repays
//! `limit`, as a fixed window's debt is repaid.

use super::Outcome;
use crate::rule::Rule;

/// Counts of the current aligned window and the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Windows {
    /// Start of the current window (a multiple of `per`).
    pub start_ms: u64,
    /// Units admitted in the previous window.
    pub prev: u64,
    /// Units admitted in the current window.
    pub cur: u64,
}

/// Decides a request; `Some(new windows)` when admitted.
pub fn decide(rule: &Rule, windows: Windows, now: u64, cost: u64) -> (Outcome, Option<Windows>) {
    let per = rule.period_ms();
    let limit = rule.limit();
    // A state from the future was repaired first (`Rule::decide`).
    let start_ms = now - now % per;
    let (prev, cur) = moved(windows, start_ms, per, limit);
    let elapsed = now - start_ms;
    let capacity = limit * per;
    let weighted = prev * (per - elapsed) + cur * per;
    let need = cost * per;
    if weighted + need <= capacity {
        let cur = cur + cost;
        let remaining = (capacity - weighted - need) / per;
        let reset = start_ms + full_after(cur, limit) * per - now;
        (
            Outcome::allowed(remaining, reset),
            Some(Windows {
                start_ms,
                prev,
                cur,
            }),
        )
    } else {
        let remaining = capacity.saturating_sub(weighted) / per;
        let reset = start_ms + full_after(cur, limit) * per - now;
        let retry = retry_after(per, limit, prev, cur, cost, elapsed);
        (Outcome::denied(remaining, reset, retry), None)
    }
}

/// The counts `(prev, cur)` as of the window starting at `start_ms`: the
/// stored ones moved on by the windows that passed, each repaying `limit`
/// of what was owed (without debt: `(cur, 0)` one window on, nothing two
/// windows on).
fn moved(windows: Windows, start_ms: u64, per: u64, limit: u64) -> (u64, u64) {
    if windows.start_ms == start_ms {
        return (windows.prev, windows.cur);
    }
    let passed = (start_ms - windows.start_ms) / per;
    let owed = |windows: u64| windows.saturating_mul(limit);
    (
        windows.cur.saturating_sub(owed(passed - 1)).min(limit),
        windows.cur.saturating_sub(owed(passed)),
    )
}

/// In how many windows from the current one's start nothing is counted
/// any more (at least 1: the previous window's weight ends with this one).
fn full_after(cur: u64, limit: u64) -> u64 {
    1 + cur.div_ceil(limit)
}

/// The first moment the request passes, counted from `elapsed` into the
/// current window, assuming nothing else is admitted meanwhile.
fn retry_after(per: u64, limit: u64, prev: u64, cur: u64, cost: u64, elapsed: u64) -> u64 {
    // Later in this window: prev·(per − e) ≤ (limit − cur − cost)·per.
    if cur + cost <= limit && prev > 0 {
        let slack = (limit - cur - cost) * per;
        let at = per - (slack / prev).min(per);
        if at < per {
            return at - elapsed;
        }
    }
    // In a later window j, where the counts have moved on (`moved`):
    // prev_j·(per − e) ≤ (limit − cur_j − cost)·per, from the first window
    // whose carried debt leaves room for the cost. At `e = per` the window
    // after it is tried from its start.
    let mut j = (cur + cost).saturating_sub(limit).div_ceil(limit).max(1);
    loop {
        let prev_j = cur.saturating_sub((j - 1) * limit).min(limit);
        let cur_j = cur.saturating_sub(j * limit);
        let at = ((limit - cur_j - cost) * per)
            .checked_div(prev_j)
            .map_or(0, |slack| per - slack.min(per));
        if at < per {
            return j * per - elapsed + at;
        }
        j += 1;
    }
}

/// Charges `cost` units whatever the windows hold, the current window
/// counting at most `limit + max_debt`: the new windows and the units
/// forgiven beyond it.
pub fn debit(rule: &Rule, windows: Windows, now: u64, cost: u64) -> (Windows, u64) {
    let per = rule.period_ms();
    let limit = rule.limit();
    let start_ms = now - now % per;
    let (prev, cur) = moved(windows, start_ms, per, limit);
    let deepest = (limit + rule.max_debt()).max(cur);
    let counted = cur.saturating_add(cost);
    let windows = Windows {
        start_ms,
        prev,
        cur: counted.min(deepest),
    };
    (windows, counted - windows.cur)
}

/// The windows as they must be read at `now`:
///
/// - when the current one starts later than the window `now` falls in
///   (the clock stepped back): moved to the window of `now` with both
///   counts, so nothing consumed is forgotten;
/// - when they hold what the rule can never hold (the current window more
///   than `limit + max_debt`, the previous one more than `limit`, or a
///   start that is no window of `per`), they were written under another
///   rule (a reload lowered the limit or changed `per`): the window they
///   name is spent and nothing is carried past it, so the tenant waits at
///   most about one period of the new rule, never the old usage repaid at
///   the new rate.
pub fn repair(rule: &Rule, windows: Windows, now: u64) -> Option<Windows> {
    let (per, limit) = (rule.period_ms(), rule.limit());
    let start_ms = now - now % per;
    let ahead = windows.start_ms > start_ms;
    let foreign = windows.cur > limit.saturating_add(rule.max_debt())
        || windows.prev > limit
        || !windows.start_ms.is_multiple_of(per);
    (ahead || foreign).then(|| {
        let start = if ahead { start_ms } else { windows.start_ms };
        if foreign {
            Windows {
                start_ms: start - start % per,
                prev: windows.prev.min(limit),
                cur: windows.cur.min(limit),
            }
        } else {
            Windows {
                start_ms: start,
                ..windows
            }
        }
    })
}

/// Gives back `cost` units admitted at `at`, from the window they were
/// counted in, if it is still there.
pub fn refund(rule: &Rule, windows: Windows, at: u64, cost: u64) -> Option<Windows> {
    let per = rule.period_ms();
    let window = at - at % per;
    if windows.start_ms == window {
        Some(Windows {
            cur: windows.cur.saturating_sub(cost),
            ..windows
        })
    } else if windows.start_ms == window + per {
        Some(Windows {
            prev: windows.prev.saturating_sub(cost),
            ..windows
        })
    } else {
        None
    }
}

/// Both windows closed, and what was owed repaid: nothing is remembered.
pub fn idle_at(rule: &Rule, windows: Windows) -> u64 {
    let windows_on = full_after(windows.cur, rule.limit()).max(2);
    windows.start_ms + windows_on * rule.period_ms()
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testing::{Run, rule};
    use crate::rule::Algorithm;

    #[test]
    fn previous_window_decays_linearly() {
        let mut run = Run::new(rule(Algorithm::SlidingWindow, 10, 1_000, None));
        assert!(run.at(500, 10).allowed);
        assert!(!run.at(999, 1).allowed);
        // At 1250 the previous 10 weigh 7.5: two more pass, the third waits.
        assert!(run.at(1_250, 2).allowed);
        let denied = run.at(1_250, 1);
        assert!(!denied.allowed);
        assert_eq!(denied.remaining, 0);
        // prev·(1000 − e) ≤ (10 − 2 − 1)·1000 → e ≥ 300.
        assert_eq!(denied.retry_after_ms, 50);
        assert!(!run.at(1_299, 1).allowed);
        assert!(run.at(1_300, 1).allowed);
    }

    #[test]
    fn retry_rolls_into_the_next_window_when_this_one_is_full() {
        let mut run = Run::new(rule(Algorithm::SlidingWindow, 4, 1_000, None));
        assert!(run.at(2_100, 4).allowed);
        let denied = run.at(2_100, 1);
        assert!(!denied.allowed);
        // Next window: 4·(1000 − e) ≤ 3·1000 → e ≥ 250, so at 3250.
        assert_eq!(denied.retry_after_ms, 1_150);
        assert!(!run.at(3_249, 1).allowed);
        assert!(run.at(3_250, 1).allowed);
    }
}
