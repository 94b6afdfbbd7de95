//! Sliding log: every admitted unit is remembered for `per`.
//!
//! Exact over every span of `per`: a unit admitted at `t` counts until
//! `t + per`. Memory is O(limit), so `limit` is capped at
//! [`SLIDING_LOG_MAX_LIMIT`](crate::rule::SLIDING_LOG_MAX_LIMIT).
//!
//! In memory, units admitted in the same millisecond share one entry with a
//! count; in Redis each unit is its own sorted-set member. Both count the
//! same units, so both decide the same.

use std::collections::VecDeque;

use super::Outcome;
use crate::rule::Rule;

/// Admitted units, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Log {
    entries: VecDeque<(u64, u64)>,
    total: u64,
}

/// What admitting a request does to the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Append {
    expired: usize,
    at_ms: u64,
    units: u64,
}

impl Log {
    /// Entries as `(admitted at, units)`, oldest first.
    pub fn entries(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.entries.iter().copied()
    }

    /// Units in the log, expired or not.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Builds a log from entries, oldest first (for stores that keep it
    /// elsewhere).
    pub fn from_entries(entries: impl IntoIterator<Item = (u64, u64)>) -> Log {
        let entries: VecDeque<_> = entries.into_iter().collect();
        let total = entries.iter().map(|(_, n)| n).sum();
        Log { entries, total }
    }

    pub(super) fn apply(&mut self, append: Append) {
        for (_, units) in self.entries.drain(..append.expired) {
            self.total -= units;
        }
        match self.entries.back_mut() {
            Some((at, units)) if *at == append.at_ms => *units += append.units,
            _ => self.entries.push_back((append.at_ms, append.units)),
        }
        self.total += append.units;
    }
}

/// How many of the log's oldest entries have expired at `now`, and the
/// units still live: a unit admitted at `t` is live while `t + per > now`.
fn live(log: &Log, now: u64, per: u64) -> (usize, u64) {
    let expired = log
        .entries
        .iter()
        .take_while(|(at, _)| at + per <= now)
        .count();
    let expired_units: u64 = log.entries.iter().take(expired).map(|(_, n)| n).sum();
    (expired, log.total - expired_units)
}

/// Decides a request; `Some(append)` when admitted.
pub fn decide(rule: &Rule, log: &Log, now: u64, cost: u64) -> (Outcome, Option<Append>) {
    let per = rule.period_ms();
    let limit = rule.limit();
    let (expired, live) = live(log, now, per);
    if live + cost <= limit {
        let append = Append {
            expired,
            at_ms: now.max(log.entries.back().map_or(0, |(at, _)| *at)),
            units: cost,
        };
        let reset = append.at_ms + per - now;
        (Outcome::allowed(limit - live - cost, reset), Some(append))
    } else {
        // The request passes once `live + cost − limit` of the oldest units
        // have expired.
        let must_expire = live + cost - limit;
        let mut seen = 0;
        let mut retry = per;
        for (at, units) in log.entries.iter().skip(expired) {
            seen += units;
            if seen >= must_expire {
                retry = at + per - now;
                break;
            }
        }
        let newest = log.entries.back().map_or(now, |(at, _)| *at);
        let reset = (newest + per).saturating_sub(now);
        (
            Outcome::denied(limit.saturating_sub(live), reset, retry),
            None,
        )
    }
}

/// Charges `cost` units whatever the log holds, as one entry at `now` (it
/// counts, and expires, all at once), the live units at most `limit +
/// max_debt`: what to append (nothing when nothing fits) and the units
/// forgiven beyond it. The log is read as [`decide`] reads it.
pub fn debit(rule: &Rule, log: &Log, now: u64, cost: u64) -> (Option<Append>, u64) {
    let (expired, live) = live(log, now, rule.period_ms());
    let room = (rule.limit() + rule.max_debt()).saturating_sub(live);
    let units = cost.min(room);
    let append = (units > 0).then(|| Append {
        expired,
        at_ms: now.max(log.entries.back().map_or(0, |(at, _)| *at)),
        units,
    });
    (append, cost - units)
}

/// The log as it must be read at `now` when it holds admissions later than
/// `now` (the clock stepped back): those count as admitted at `now`, so
/// they expire one period from `now` and nothing consumed is forgotten.
pub fn repair(log: &Log, now: u64) -> Option<Log> {
    if log.entries.back().is_none_or(|(at, _)| *at <= now) {
        return None;
    }
    let mut entries = log.entries.clone();
    let mut moved = 0;
    while let Some(&(at, units)) = entries.back() {
        if at < now {
            break;
        }
        moved += units;
        entries.pop_back();
    }
    entries.push_back((now, moved));
    Some(Log {
        entries,
        total: log.total,
    })
}

/// Gives back up to `cost` units admitted at `at`.
pub fn refund(log: &Log, at: u64, cost: u64) -> Option<Log> {
    let index = log.entries.iter().position(|(t, _)| *t == at)?;
    let mut log = log.clone();
    let units = &mut log.entries[index].1;
    let taken = cost.min(*units);
    *units -= taken;
    log.total -= taken;
    if *units == 0 {
        log.entries.remove(index);
    }
    Some(log)
}

/// Every unit expired.
pub fn idle_at(rule: &Rule, log: &Log) -> u64 {
    log.entries
        .back()
        .map_or(0, |(at, _)| at + rule.period_ms())
}

#[cfg(test)]
mod tests {
    use crate::algorithm::testing::{Run, rule};
    use crate::rule::Algorithm;

    #[test]
    fn units_expire_one_period_after_admission() {
        let mut run = Run::new(rule(Algorithm::SlidingLog, 5, 1_000, None));
        assert!(run.at(100, 2).allowed);
        assert!(run.at(400, 3).allowed);
        let denied = run.at(900, 2);
        assert!(!denied.allowed);
        // Two units must expire: both from 100ms, free at 1100ms.
        assert_eq!(denied.retry_after_ms, 200);
        assert!(!run.at(1_099, 1).allowed);
        let after = run.at(1_100, 2);
        assert!(after.allowed);
        assert_eq!(after.remaining, 0);
    }

    #[test]
    fn same_millisecond_admissions_share_an_entry() {
        let mut run = Run::new(rule(Algorithm::SlidingLog, 10, 1_000, None));
        run.at(5, 1);
        run.at(5, 2);
        let crate::algorithm::State::SlidingLog(log) = run.state() else {
            panic!("expected a log")
        };
        assert_eq!(log.entries().collect::<Vec<_>>(), vec![(5, 3)]);
    }
}
