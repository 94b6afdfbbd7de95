//! What a region's store keeps of one shared rule, and the steps the
//! scripts take on it: the Rust twin of the store crate's
//! `redis/regions/regions.lua` and of `shared_window` in `decide.lua`,
//! step for step (a differential test holds them to identical answers).
//!
//! Two things are kept per key and rule, as the scripts keep them:
//!
//! - the rule's **record** among its group's (what a decision reads, in
//!   the one call it makes): the window's start, what it admitted, and
//!   `moved`, what moved to this region in the window (heard less
//!   granted). A decision admits when `count + cost ≤ share + moved`: the
//!   cap of [`Part::cap`] without reading anything more;
//! - its **ledger** (a hash beside the group's key, only read and written
//!   by the link): the window, the rule's pool and period, the demand
//!   noted by the instances, and per region the running totals granted
//!   to it and heard from it, and what it last said of itself.
//!
//! Both are of one window: each step first moves them to the window of
//! now (by the region's own clock), starting afresh when it moved on (a
//! record carrying what it owed, as a `fixed_window` carries debt). A
//! record or ledger of another period whose window still runs (a reload
//! changed the rule's `per`, or a peer has not reloaded yet) is left to
//! the decisions: the link's steps answer as if its window were over.

use super::giving::Heard;
use super::part::Part;

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

/// What a peer last said of itself, and when it was heard (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    /// Its part as it shipped it.
    pub heard: Heard,
    /// When it was heard, by this region's clock.
    pub at_ms: u64,
}

/// A shared rule's ledger (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    /// The window it is of.
    pub window_ms: u64,
    /// The period it was written under.
    pub per_ms: u64,
    /// The rule's pool per window, as the latest decision or peer gave it.
    pub pool: u64,
    /// Units asked here in the window, noted by the instances.
    pub wanted: u64,
    /// Per region, the total granted to it.
    pub given: Vec<u64>,
    /// Per region, the total it granted here, as heard.
    pub heard: Vec<u64>,
    /// Per region, what it last said of itself.
    pub views: Vec<Option<View>>,
}

/// What one key keeps of one shared rule in a region's store.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    /// The record, when there is one.
    pub record: Option<Record>,
    /// The ledger, when there is one.
    pub ledger: Option<Ledger>,
}

/// A decision's answer (as `decide.lua` returns each rule's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// Whether it fits.
    pub allowed: bool,
    /// Units left after it.
    pub remaining: u64,
    /// When the window ends, from now (ms, at least 1).
    pub reset_ms: u64,
    /// When to retry (0: admitted): the window's end, where a share of
    /// the pool comes back.
    pub retry_ms: u64,
}

/// What the link reads of a rule's part for the window of now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The window.
    pub window_ms: u64,
    /// The rule's pool.
    pub pool: u64,
    /// This region's part (its share as the caller gave it).
    pub part: Part,
    /// What each peer last said of itself.
    pub views: Vec<Option<View>>,
}

/// The window `now` falls in, for a period of `per` ms.
pub fn window_of(now: u64, per: u64) -> u64 {
    now - now % per
}

impl Record {
    /// What `record` holds at `now`, whose window starts at `window` of
    /// `per` ms, against `share` (`shared_at` in decide.lua): itself in its
    /// own window, and in a later one (the clock is behind the one that
    /// wrote it: never re-dated back, or what it granted would be
    /// forgotten); from an earlier window, what it owed beyond its cap and
    /// the shares of the windows between (debt), nothing moved.
    fn at(record: Option<Record>, window: u64, share: u64, per: u64) -> Record {
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
        let owed = u128::from(r.count)
            .saturating_sub(u128::from(r.cap(share)))
            .saturating_sub(u128::from(passed - 1) * u128::from(share));
        Record {
            start_ms: window,
            idle_ms: window + per,
            count: u64::try_from(owed).unwrap_or(u64::MAX),
            moved: 0,
        }
    }

    /// The record as written: idle at its window's end, and as many
    /// windows more as `share` takes to repay what it owes beyond its cap
    /// (`shared_idle` in decide.lua).
    fn written(mut self, share: u64, per: u64) -> Record {
        let owed = self.count.saturating_sub(self.cap(share));
        self.idle_ms = self.start_ms + per * (1 + owed.div_ceil(share.max(1)));
        self
    }

    /// The cap with `share`: never below 0.
    fn cap(&self, share: u64) -> u64 {
        let cap = i128::from(share) + i128::from(self.moved);
        u64::try_from(cap.max(0)).unwrap_or(u64::MAX)
    }

    /// Whether the link leaves it alone at `now` for a rule of `per` ms
    /// whose window starts at `window`: written under another period and
    /// its window still runs, or of a later window (the clock is behind).
    fn foreign(&self, window: u64, per: u64, now: u64) -> bool {
        let span = self.idle_ms - self.start_ms;
        let ours = self.start_ms.is_multiple_of(per) && span.is_multiple_of(per) && span >= per;
        (!ours && self.idle_ms > now) || self.start_ms > window
    }
}

impl Ledger {
    /// A ledger of `window_ms` with nothing in it (its pool not known).
    fn afresh(window_ms: u64, per_ms: u64, regions: usize) -> Ledger {
        Ledger {
            window_ms,
            per_ms,
            pool: 0,
            wanted: 0,
            given: vec![0; regions],
            heard: vec![0; regions],
            views: vec![None; regions],
        }
    }
}

impl Stored {
    /// Whether the record or the ledger is of another period whose window
    /// still runs.
    fn foreign(&self, per: u64, now: u64) -> bool {
        let window = window_of(now, per);
        self.record.is_some_and(|r| r.foreign(window, per, now))
            || self
                .ledger
                .as_ref()
                .is_some_and(|l| l.per_ms != per && l.window_ms + l.per_ms > now)
    }

    /// The ledger of `window` of `per` ms, made afresh when it is of
    /// another.
    fn ledger_at(&mut self, window: u64, per: u64, regions: usize) -> &mut Ledger {
        let ledger = self
            .ledger
            .get_or_insert_with(|| Ledger::afresh(window, per, regions));
        if ledger.window_ms != window || ledger.per_ms != per || ledger.given.len() != regions {
            *ledger = Ledger::afresh(window, per, regions);
        }
        ledger
    }

    /// What a decision at `now` would find against this region's `share`,
    /// nothing written (the read-only checks): the record of the window of
    /// now, and its cap.
    pub fn standing(&self, now: u64, share: u64, per: u64) -> (Record, u64) {
        let record = Record::at(self.record, window_of(now, per), share, per);
        (record, record.cap(share))
    }

    /// A decision of `cost` units against this region's `share`
    /// (`shared_window` in decide.lua): admitted, it is counted.
    pub fn decide(&mut self, now: u64, cost: u64, share: u64, per: u64) -> Answer {
        let window = window_of(now, per);
        let mut record = Record::at(self.record, window, share, per);
        let cap = record.cap(share);
        let ends_in = (record.start_ms + per - now).max(1);
        if record.count.saturating_add(cost) <= cap {
            record.count += cost;
            self.record = Some(record.written(share, per));
            return Answer {
                allowed: true,
                remaining: cap - record.count,
                reset_ms: ends_in,
                retry_ms: 0,
            };
        }
        Answer {
            allowed: false,
            remaining: cap.saturating_sub(record.count),
            reset_ms: ends_in,
            retry_ms: ends_in,
        }
    }

    /// Charges `cost` units spent already (usage after the fact): the
    /// window of now counts them, at most `max_debt` past the cap. Returns
    /// the units forgiven beyond it (`debit_numbers` in adjust.lua).
    pub fn debit(&mut self, now: u64, cost: u64, share: u64, per: u64, max_debt: u64) -> u64 {
        let window = window_of(now, per);
        let mut record = Record::at(self.record, window, share, per);
        let counted = record.count.saturating_add(cost);
        let deepest = record.cap(share).saturating_add(max_debt).max(record.count);
        record.count = counted.min(deepest);
        self.record = Some(record.written(share, per));
        counted - record.count
    }

    /// Gives back `cost` units admitted at `at`, when they still count in
    /// the record's window (`give_back` in common.lua; when it goes idle
    /// is kept).
    pub fn give_back(&mut self, at: u64, cost: u64, per: u64) {
        if let Some(r) = self.record.as_mut()
            && at >= r.start_ms
            && at < r.start_ms + per
        {
            r.count = r.count.saturating_sub(cost);
        }
    }

    /// An instance notes `wanted` units asked in `window` for a rule of
    /// `pool` per `per` ms, among `regions` regions: whether it was noted
    /// (not when `window` is no longer the window of now).
    #[allow(clippy::too_many_arguments)]
    pub fn note(
        &mut self,
        now: u64,
        window: u64,
        per: u64,
        pool: u64,
        wanted: u64,
        regions: usize,
    ) -> bool {
        if window_of(now, per) != window || self.foreign(per, now) {
            return false;
        }
        let ledger = self.ledger_at(window, per, regions);
        ledger.pool = pool;
        ledger.wanted = ledger.wanted.saturating_add(wanted);
        true
    }

    /// The part of the window of now, with `share` as this region's.
    pub fn read(&self, now: u64, per: u64, share: u64, regions: usize) -> Snapshot {
        let window = window_of(now, per);
        let foreign = self.foreign(per, now);
        let record = if foreign {
            Record::at(None, window, share, per)
        } else {
            Record::at(self.record, window, share, per)
        };
        let ledger = match &self.ledger {
            Some(l)
                if !foreign
                    && l.window_ms == window
                    && l.per_ms == per
                    && l.given.len() == regions =>
            {
                l.clone()
            }
            _ => Ledger::afresh(window, per, regions),
        };
        Snapshot {
            window_ms: window,
            pool: ledger.pool,
            part: Part {
                share,
                used: record.count,
                wanted: ledger.wanted,
                given: ledger.given,
                heard: ledger.heard,
            },
            views: ledger.views,
        }
    }

    /// Grants `units` to region `to` in `window`, when that much is left
    /// of `share` and what moved here: the new total granted to `to`;
    /// `None` when it does not fit or the window is over (nothing changed).
    pub fn grant(
        &mut self,
        now: u64,
        window: u64,
        per: u64,
        share: u64,
        (to, units): (usize, u64),
        regions: usize,
    ) -> Option<u64> {
        if window_of(now, per) != window || to >= regions || self.foreign(per, now) {
            return None;
        }
        let mut record = Record::at(self.record, window, share, per);
        let left = record.cap(share).saturating_sub(record.count);
        if units == 0 || units > left {
            return None;
        }
        let ledger = self.ledger_at(window, per, regions);
        ledger.given[to] += units;
        let total = ledger.given[to];
        record.moved -= units as i64;
        self.record = Some(record.written(share, per));
        Some(total)
    }

    /// What region `from` shipped for `window`: the total it granted here
    /// (kept as the larger of it and what was heard: added to what moved
    /// here by the difference), the total it heard from here (larger than
    /// what this region knows it granted when its store lost its ledger:
    /// counted as granted again), and its view of itself; `share` is this
    /// region's. Returns the units added; `None` when `window` is not the
    /// window of now here (dropped: that budget ended with its window).
    #[allow(clippy::too_many_arguments)]
    pub fn hear(
        &mut self,
        now: u64,
        (window, per): (u64, u64),
        (pool, share): (u64, u64),
        from: usize,
        total: u64,
        view: Heard,
        regions: usize,
    ) -> Option<u64> {
        if window_of(now, per) != window || from >= regions || self.foreign(per, now) {
            return None;
        }
        let mut record = Record::at(self.record, window, share, per);
        let ledger = self.ledger_at(window, per, regions);
        ledger.pool = pool;
        let added = total.saturating_sub(ledger.heard[from]);
        ledger.heard[from] += added;
        let lost = view.heard_from_you.saturating_sub(ledger.given[from]);
        ledger.given[from] += lost;
        ledger.views[from] = Some(View {
            heard: view,
            at_ms: now,
        });
        record.moved = record
            .moved
            .saturating_add(added as i64)
            .saturating_sub(lost as i64);
        self.record = Some(record.written(share, per));
        Some(added)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PER: u64 = 60_000;

    fn view(heard_from_you: u64) -> Heard {
        Heard {
            cap: 10,
            used: 10,
            wanted: 20,
            heard_from_you,
        }
    }

    #[test]
    fn budget_moves_by_grants_heard_once_and_ends_with_its_window() {
        let (mut a, mut b) = (Stored::default(), Stored::default());
        let now = 5 * PER + 10;
        let w = window_of(now, PER);
        assert!((0..4).all(|_| a.decide(now, 1, 10, PER).allowed));
        assert_eq!(a.grant(now, w, PER, 10, (1, 7), 2), None, "only 6 left");
        assert_eq!(a.grant(now, w, PER, 10, (1, 6), 2), Some(6));
        assert!(!a.decide(now, 1, 10, PER).allowed);
        // Heard three times, and an older total after it: counted once.
        assert_eq!(b.hear(now, (w, PER), (20, 10), 0, 6, view(0), 2), Some(6));
        assert_eq!(b.hear(now, (w, PER), (20, 10), 0, 6, view(0), 2), Some(0));
        assert_eq!(b.hear(now, (w, PER), (20, 10), 0, 2, view(0), 2), Some(0));
        assert_eq!(b.record.unwrap().moved, 6);
        assert!((0..16).all(|_| b.decide(now, 1, 10, PER).allowed));
        assert!(!b.decide(now, 1, 10, PER).allowed);
        // The next window starts from the share again; a late total of the
        // last one is dropped.
        let next = now + PER;
        assert_eq!(b.hear(next, (w, PER), (20, 10), 0, 9, view(0), 2), None);
        assert_eq!(b.decide(next, 1, 10, PER).remaining, 9);
    }

    #[test]
    fn a_giver_that_lost_its_ledger_counts_its_grants_again_when_told() {
        let mut a = Stored::default();
        let now = PER + 1;
        let w = window_of(now, PER);
        assert_eq!(a.grant(now, w, PER, 10, (1, 8), 2), Some(8));
        a = Stored::default(); // flushed
        assert_eq!(a.hear(now, (w, PER), (20, 10), 1, 0, view(8), 2), Some(0));
        assert_eq!(a.read(now, PER, 10, 2).part.left(), 2);
        assert!(!a.decide(now, 3, 10, PER).allowed);
    }
}
