//! A `fixed_window` shared across regions: its record, the twin of
//! `shared_window` and `shared_at` in the store crate's
//! `redis/regions/shared.lua` (and of its steps in `ledger.lua`,
//! `adjust.lua` and `common.lua`). A decision admits while `count + cost
//! ≤ share + moved`; the bound is in [`crate::regions`].

use super::record::{Answer, SharedRecord, window_of};

/// A shared rule's record: its window, what it admitted, what moved here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// The window's start (ms, a multiple of the rule's period).
    pub start_ms: u64,
    /// When it goes idle: its window's end, and the windows after it while
    /// it owes (the store keeps it until then).
    pub idle_ms: u64,
    /// Units admitted in it.
    pub count: u64,
    /// Heard from peers less granted to them, in it.
    pub moved: i64,
}

impl SharedRecord for Record {
    type Terms = u64;

    /// What `record` holds at `now`, whose window starts at `window` of
    /// `per` ms, against `share` (`shared_at` in shared.lua): itself in its
    /// own window, and in a later one (the clock is behind the one that
    /// wrote it: never re-dated back, or what it granted would be
    /// forgotten); from an earlier window, what it owed beyond its cap and
    /// the shares of the windows between (debt, at most `max_debt`: a
    /// count past it reads as spent), nothing moved.
    fn at(record: Option<Record>, window: u64, share: u64, per: u64, max_debt: u64) -> Record {
        let r = record.unwrap_or(Record {
            start_ms: window,
            idle_ms: window + per,
            count: 0,
            moved: 0,
        });
        if r.start_ms >= window {
            return r;
        }
        let passed = ((window - r.start_ms) / per).max(1);
        let cap = r.cap(share);
        let count = if r.count > cap.saturating_add(max_debt) {
            cap
        } else {
            r.count
        };
        let owed = u128::from(count)
            .saturating_sub(u128::from(cap))
            .saturating_sub(u128::from(passed - 1) * u128::from(share));
        Record {
            start_ms: window,
            idle_ms: window + per,
            count: u64::try_from(owed).unwrap_or(u64::MAX),
            moved: 0,
        }
    }

    fn stored([idle, start, count, moved]: [f64; 4]) -> Record {
        Record {
            start_ms: start as u64,
            idle_ms: idle as u64,
            count: count as u64,
            moved: moved as i64,
        }
    }

    /// The record as written: idle at its window's end, and as many
    /// windows more as `share` takes to repay what it owes beyond its cap
    /// (`shared_idle` in shared.lua).
    fn written(mut self, share: u64, per: u64, _: u64) -> Record {
        let owed = self.count.saturating_sub(self.cap(share));
        self.idle_ms = self.start_ms + per * (1 + owed.div_ceil(share.max(1)));
        self
    }

    fn foreign(&self, window: u64, per: u64, now: u64) -> bool {
        let span = self.idle_ms - self.start_ms;
        let ours = self.start_ms.is_multiple_of(per) && span.is_multiple_of(per) && span >= per;
        (!ours && self.idle_ms > now) || self.start_ms > window
    }

    fn left(&self, _: u64, share: u64, _: u64, _: u64) -> u64 {
        self.cap(share).saturating_sub(self.count)
    }

    fn owed(&self, _: u64, share: u64, _: u64, _: u64) -> u64 {
        self.count.saturating_sub(self.cap(share))
    }

    fn used(&self, _: u64, _: u64, _: i64) -> u64 {
        self.count
    }

    fn restore(&mut self, used: u64) {
        self.count = self.count.saturating_add(used);
    }

    fn shift(&mut self, units: i64, _: u64, _: (u64, u64), _: u64) {
        self.moved = self.moved.saturating_add(units);
    }

    /// Admits while `count + cost ≤ share + moved` (`shared_window` in
    /// shared.lua).
    fn decide(
        record: Option<Record>,
        now: u64,
        cost: u64,
        (share, per): (u64, u64),
        max_debt: u64,
    ) -> (Answer, Option<Record>) {
        let window = window_of(now, per);
        let mut record = Record::at(record, window, share, per, max_debt);
        let cap = record.cap(share);
        let ends_in = (record.start_ms + per - now).max(1);
        if record.count.saturating_add(cost) <= cap {
            record.count += cost;
            let answer = Answer {
                allowed: true,
                remaining: cap - record.count,
                reset_ms: ends_in,
                retry_ms: 0,
            };
            return (answer, Some(record.written(share, per, max_debt)));
        }
        // Owing, it waits for the window whose carried debt leaves room
        // for it (a count more than max_debt past the cap carries nothing);
        // a cost above the
        // share fits only with grants: the window's end.
        let retry_ms = if cost > share {
            ends_in
        } else {
            let count = if record.count > cap.saturating_add(max_debt) {
                cap
            } else {
                record.count
            };
            let over = (u128::from(count) + u128::from(cost))
                .saturating_sub(u128::from(cap) + u128::from(share));
            let waits = over.div_ceil(u128::from(share)) as u64;
            ends_in.saturating_add(waits.saturating_mul(per))
        };
        let answer = Answer {
            allowed: false,
            remaining: cap.saturating_sub(record.count),
            reset_ms: ends_in,
            retry_ms,
        };
        (answer, None)
    }

    /// The window of now counts it, at most `max_debt` past the cap
    /// (`debit_numbers` in adjust.lua).
    fn debit(
        record: Option<Record>,
        now: u64,
        cost: u64,
        (share, per): (u64, u64),
        max_debt: u64,
    ) -> (Record, u64) {
        let window = window_of(now, per);
        let mut record = Record::at(record, window, share, per, max_debt);
        let counted = record.count.saturating_add(cost);
        let deepest = record.cap(share).saturating_add(max_debt).max(record.count);
        record.count = counted.min(deepest);
        (record.written(share, per, max_debt), counted - record.count)
    }

    /// `give_back` in common.lua: when it goes idle is kept.
    fn give_back(&mut self, (at, cost): (u64, u64), _: u64, (_, per): (u64, u64), _: u64) {
        if at >= self.start_ms && at < self.start_ms + per {
            self.count = self.count.saturating_sub(cost);
        }
    }
}

impl Record {
    /// The cap with `share`: never below 0.
    fn cap(&self, share: u64) -> u64 {
        let cap = i128::from(share) + i128::from(self.moved);
        u64::try_from(cap.max(0)).unwrap_or(u64::MAX)
    }
}
