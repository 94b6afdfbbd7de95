//! GCRA, the generic cell rate algorithm.
//!
//! One unit is emitted every `T = per / limit` milliseconds. The state is the
//! theoretical arrival time `TAT` of the next unit; a request of `cost` units
//! at `now` moves it to `max(TAT, now) + cost·T` and is admitted when that is
//! no further than `burst·T` ahead of `now`. So a fresh key admits `burst`
//! units at once and then `limit` per `per`.
//!
//! `T` is rarely a whole number of milliseconds (3 per second is 333.3…ms),
//! so `TAT` is kept exactly as `ms + frac/limit` with `0 ≤ frac < limit`.
//! Comparisons multiply through by `limit`: `(TAT − now)·limit ≤ burst·per`.
//! With `burst·per < 2^52` (checked when the rule is built) every value stays
//! exact, in Rust and in Lua alike.

use super::Outcome;
use crate::rule::Rule;

/// The theoretical arrival time, `ms + frac / limit` milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tat {
    /// Whole milliseconds.
    pub ms: u64,
    /// Fraction of a millisecond, in units of `1/limit`.
    pub frac: u64,
}

/// Decides a request; `Some(new TAT)` when admitted.
#[inline]
pub fn decide(rule: &Rule, tat: Tat, now: u64, cost: u64) -> (Outcome, Option<Tat>) {
    let limit = rule.limit();
    let per = rule.period_ms();
    // A TAT written under another limit may carry a fraction ≥ limit.
    let tat = normal(tat, limit);
    let base = if tat.ms > now || (tat.ms == now && tat.frac > 0) {
        tat
    } else {
        Tat { ms: now, frac: 0 }
    };
    // Distances ahead of `now`, in units of 1/limit ms, and the whole
    // milliseconds (rounded up) they amount to.
    let ahead = |t: Tat| (t.ms - now).saturating_mul(limit).saturating_add(t.frac);
    let ahead_ms = |t: Tat| t.ms - now + u64::from(t.frac > 0);
    let capacity = rule.burst() * per;
    let total = base.frac + cost * per;
    let next = Tat {
        ms: base.ms.saturating_add(total / limit),
        frac: total % limit,
    };
    let next_ahead = ahead(next);
    if next_ahead <= capacity {
        let remaining = (capacity - next_ahead) / per;
        (Outcome::allowed(remaining, ahead_ms(next)), Some(next))
    } else {
        let base_ahead = ahead(base);
        let remaining = capacity.saturating_sub(base_ahead) / per;
        let retry = (next_ahead - capacity).div_ceil(limit);
        (Outcome::denied(remaining, ahead_ms(base), retry), None)
    }
}

/// The TAT as it must be read at `now` when it lies further ahead than a
/// bucket in its deepest debt allows (`burst + max_debt` intervals: the
/// clock stepped back, or the state was written by a node whose clock was
/// ahead): an exhausted bucket as of `now`. Nothing consumed is forgotten,
/// and a full recovery takes `burst` emission intervals from `now`, never
/// the size of the step. (A step back shorter than that reads as debt.)
#[inline]
pub fn repair(rule: &Rule, tat: Tat, now: u64) -> Option<Tat> {
    let limit = rule.limit();
    let capacity = rule.burst() * rule.period_ms();
    let deepest = capacity + rule.max_debt() * rule.period_ms();
    let tat = normal(tat, limit);
    if tat.ms <= now {
        return None;
    }
    // Compared in two steps so that a step of years cannot overflow.
    let ahead_ms = tat.ms - now;
    let beyond = ahead_ms > deepest / limit + 1 || ahead_ms * limit + tat.frac > deepest;
    beyond.then(|| Tat {
        ms: now + capacity / limit,
        frac: capacity % limit,
    })
}

/// The same TAT with `frac` below `limit` (a state written under a smaller
/// limit can hold more).
#[inline]
fn normal(tat: Tat, limit: u64) -> Tat {
    if tat.frac < limit {
        tat
    } else {
        Tat {
            ms: tat.ms.saturating_add(tat.frac / limit),
            frac: tat.frac % limit,
        }
    }
}

/// Charges `cost` units whatever the bucket holds: the TAT moves ahead by
/// `cost·per/limit` from `max(TAT, now)`, at most `burst + max_debt`
/// intervals ahead of `now`. Returns the new TAT and the whole units
/// forgiven beyond `max_debt`.
pub fn debit(rule: &Rule, tat: Tat, now: u64, cost: u64) -> (Tat, u64) {
    let limit = rule.limit();
    let per = rule.period_ms();
    let deepest_units = rule.burst() + rule.max_debt();
    // What lies beyond the deepest debt from a fresh bucket is forgiven
    // before multiplying (a cost of 2^32 × a year would overflow).
    let charged = cost.min(deepest_units);
    let tat = normal(tat, limit);
    let base = if tat.ms > now || (tat.ms == now && tat.frac > 0) {
        tat
    } else {
        Tat { ms: now, frac: 0 }
    };
    let ahead = (base.ms - now) * limit + base.frac + charged * per;
    let deepest = deepest_units * per;
    let (ahead, excess) = if ahead > deepest {
        (deepest, ahead - deepest)
    } else {
        (ahead, 0)
    };
    let next = Tat {
        ms: now + ahead / limit,
        frac: ahead % limit,
    };
    (next, cost - charged + excess.div_ceil(per))
}

/// Gives back `cost` units: the TAT moves back by `cost·per/limit`,
/// borrowing whole milliseconds (never multiplying `ms` by `limit`).
pub fn refund(rule: &Rule, tat: Tat, cost: u64) -> Tat {
    refund_scaled(rule, tat, cost * rule.period_ms())
}

/// Gives back `need` units × `per` (a part of a unit included): the TAT
/// moves back by `need/limit` ms.
pub fn refund_scaled(rule: &Rule, tat: Tat, need: u64) -> Tat {
    let limit = rule.limit();
    if tat.frac >= need {
        return Tat {
            ms: tat.ms,
            frac: tat.frac - need,
        };
    }
    let borrow = (need - tat.frac).div_ceil(limit);
    Tat {
        ms: tat.ms.saturating_sub(borrow),
        frac: tat.frac + borrow * limit - need,
    }
}

/// A TAT in the past is a full bucket.
#[inline]
pub fn idle_at(_rule: &Rule, tat: Tat) -> u64 {
    tat.ms + u64::from(tat.frac > 0)
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testing::{Run, rule};
    use crate::rule::Algorithm;

    #[test]
    fn fresh_key_admits_burst_then_one_per_interval() {
        let r = rule(Algorithm::Gcra, 3, 1_000, Some(3));
        let mut run = Run::new(r);
        assert!(run.at(0, 1).allowed);
        assert!(run.at(0, 1).allowed);
        let third = run.at(0, 1);
        assert!(third.allowed);
        assert_eq!(third.remaining, 0);
        let fourth = run.at(0, 1);
        assert!(!fourth.allowed);
        // T = 333.33…ms, so the next unit is free at 333.33…ms: rounded up.
        assert_eq!(fourth.retry_after_ms, 334);
        assert!(!run.at(333, 1).allowed);
        assert!(run.at(334, 1).allowed);
    }

    #[test]
    fn cost_consumes_several_emission_intervals() {
        let r = rule(Algorithm::Gcra, 10, 1_000, Some(10));
        let mut run = Run::new(r);
        let o = run.at(5_000, 7);
        assert!(o.allowed);
        assert_eq!(o.remaining, 3);
        assert_eq!(o.reset_after_ms, 700);
        let denied = run.at(5_000, 4);
        assert!(!denied.allowed);
        assert_eq!(denied.remaining, 3);
        assert_eq!(denied.retry_after_ms, 100);
        assert!(run.at(5_100, 4).allowed);
    }
}
