//! What a region's store keeps of one shared rule, and the steps the
//! scripts take on it: the Rust twin of the store crate's
//! `redis/regions/ledger.lua` and of `shared_window`, `shared_sliding`
//! and `shared_bucket` in `redis/regions/shared.lua`, step for step (a
//! differential test holds them to identical answers).
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
pub use super::record::{Answer, SharedRecord, window_of};
pub use super::window::Record;

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

/// What one key keeps of one shared rule in a region's store: `K` is its
/// record's kind, a `fixed_window`'s ([`Record`]), a `sliding_window`'s
/// ([`Slide`](super::sliding::Slide)) or a bucket's
/// ([`Bucket`](super::bucket::Bucket)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored<K = Record> {
    /// The record, when there is one.
    pub record: Option<K>,
    /// The ledger, when there is one.
    pub ledger: Option<Ledger>,
    /// A bucket's recent demand (beside the ledger, kept across its
    /// windows).
    pub demand: Demand,
}

impl<K> Default for Stored<K> {
    fn default() -> Self {
        Stored {
            record: None,
            ledger: None,
            demand: Demand::default(),
        }
    }
}

/// What a region was asked of a bucket in its latest spans of
/// [`DEMAND_MS`], kept beside the ledger (the
/// scripts keep it under the record's name and "a"): a bucket's epoch
/// lasts many spans, and its demand is the latest's, the span before
/// weighed as a sliding window weighs it, so that it follows demand within
/// about a second and does not start afresh (its grants churning) at each
/// span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Demand {
    /// The window `asked` counts in.
    pub window_ms: u64,
    /// Units asked in it.
    pub asked: u64,
    /// Units asked in the window before it.
    pub before: u64,
}

/// The most units of demand counted (what a weight multiplies stays exact
/// in the scripts' doubles).
const MOST_ASKED: u64 = 1 << 40;

/// The span a bucket's demand is counted over (ms): a few syncs.
pub const DEMAND_MS: u64 = 1_000;

impl Demand {
    /// With `units` asked at `now` (`noted` in ledger.lua).
    fn noted(self, now: u64, units: u64) -> Demand {
        let per = DEMAND_MS;
        let window = window_of(now, per);
        let units = units.min(MOST_ASKED);
        if self.window_ms == window {
            Demand {
                asked: (self.asked + units).min(MOST_ASKED),
                ..self
            }
        } else if self.window_ms + per == window {
            Demand {
                window_ms: window,
                asked: units,
                before: self.asked,
            }
        } else {
            Demand {
                window_ms: window,
                asked: units,
                before: 0,
            }
        }
    }

    /// The demand at `now`: what the span of now was asked, and the one
    /// before weighed by how much of it still falls within a span of now,
    /// in 1024ths (`demand` in ledger.lua).
    fn at(self, now: u64) -> u64 {
        let per = DEMAND_MS;
        let window = window_of(now, per);
        let weight = (per - (now - window)) * 1024 / per;
        let weigh = |units: u64| units * weight / 1024;
        if self.window_ms == window {
            weigh(self.before) + self.asked
        } else if self.window_ms + per == window {
            weigh(self.asked)
        } else {
            0
        }
    }
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

impl Ledger {
    /// What moved here in its window: heard less granted.
    fn moved(&self) -> i64 {
        let total = |t: &[u64]| t.iter().fold(0i64, |a, &n| a.saturating_add(n as i64));
        total(&self.heard).saturating_sub(total(&self.given))
    }

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

impl<K: SharedRecord> Stored<K> {
    /// Whether the record or the ledger is of another period whose window
    /// still runs.
    fn foreign(&self, per: u64, now: u64) -> bool {
        let window = window_of(now, K::period(per));
        self.record.is_some_and(|r| r.foreign(window, per, now))
            || self
                .ledger
                .as_ref()
                .is_some_and(|l| l.per_ms != per && l.window_ms + K::period(l.per_ms) > now)
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
    /// nothing written (the read-only checks): what remains to admit, and
    /// how far past it the region is (in debt).
    pub fn standing(&self, now: u64, share: u64, per: u64, terms: K::Terms) -> (u64, u64) {
        let record = K::at(
            self.record,
            window_of(now, K::period(per)),
            share,
            per,
            terms,
        );
        (
            record.left(now, share, per, terms),
            record.owed(now, share, per, terms),
        )
    }

    /// A decision of `cost` units against this region's `share`
    /// (`shared_window`, `shared_sliding` or `shared_bucket` in shared.lua): admitted, it
    /// is counted.
    pub fn decide(&mut self, now: u64, cost: u64, share: u64, per: u64, terms: K::Terms) -> Answer {
        let (answer, written) = K::decide(self.record, now, cost, (share, per), terms);
        if written.is_some() {
            self.record = written;
        }
        answer
    }

    /// Charges `cost` units spent already (usage after the fact): the
    /// window of now counts them, at most `max_debt` past what remains.
    /// Returns the units forgiven beyond it (`debit_numbers` in
    /// adjust.lua).
    pub fn debit(&mut self, now: u64, cost: u64, share: u64, per: u64, terms: K::Terms) -> u64 {
        let (record, forgiven) = K::debit(self.record, now, cost, (share, per), terms);
        self.record = Some(record);
        forgiven
    }

    /// Gives back `cost` units admitted at `at`, where they still count
    /// (`give_back` in common.lua; when it goes idle is kept).
    pub fn give_back(
        &mut self,
        (at, cost): (u64, u64),
        now: u64,
        (share, per): (u64, u64),
        terms: K::Terms,
    ) {
        if let Some(r) = self.record.as_mut() {
            r.give_back((at, cost), now, (share, per), terms);
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
        if window_of(now, K::period(per)) != window || self.foreign(per, now) {
            return false;
        }
        if K::RECENT_DEMAND {
            self.demand = self.demand.noted(now, wanted);
        }
        let ledger = self.ledger_at(window, per, regions);
        ledger.pool = pool;
        ledger.wanted = ledger.wanted.saturating_add(wanted);
        true
    }

    /// The part of the window of now, with `share` as this region's. A
    /// part that has used anything is given a ledger of its window if it
    /// has none, before any peer hears of its use (see [`Stored::hear`]).
    pub fn read(
        &mut self,
        now: u64,
        (per, terms): (u64, K::Terms),
        share: u64,
        regions: usize,
    ) -> Snapshot {
        let window = window_of(now, K::period(per));
        let foreign = self.foreign(per, now);
        let kept = if foreign { None } else { self.record };
        let record = K::at(kept, window, share, per, terms);
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
        let used = record.used(now, per, ledger.moved());
        if used > 0 && !foreign {
            self.ledger = Some(ledger.clone());
        }
        Snapshot {
            window_ms: window,
            pool: ledger.pool,
            part: Part {
                share,
                used,
                wanted: if K::RECENT_DEMAND {
                    self.demand.at(now)
                } else {
                    ledger.wanted
                },
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
        (per, terms): (u64, K::Terms),
        share: u64,
        (to, units): (usize, u64),
        regions: usize,
    ) -> Option<u64> {
        if window_of(now, K::period(per)) != window || to >= regions || self.foreign(per, now) {
            return None;
        }
        let mut record = K::at(self.record, window, share, per, terms);
        if units == 0 || units > record.grantable(now, share, per, terms) {
            return None;
        }
        let ledger = self.ledger_at(window, per, regions);
        ledger.given[to] += units;
        let total = ledger.given[to];
        record.shift(-(units as i64), now, (share, per), terms);
        self.record = Some(record.written(share, per, terms));
        Some(total)
    }

    /// What region `from` shipped for `window`: the total it granted here
    /// (kept as the larger of it and what was heard: added to what moved
    /// here by the difference), the total it heard from here (larger than
    /// what this region knows it granted when its store lost its ledger:
    /// counted as granted again), its view of itself, and `yours`, what it
    /// last heard this region used in the window; `share` is this
    /// region's. Returns the units added; `None` when `window` is not the
    /// window of now here (dropped: that budget ended with its window).
    ///
    /// A region that tells a peer it used anything has a ledger of the
    /// window ([`Stored::read`]), kept until the window ends: a peer that
    /// heard of its use while it has none finds it lost its store (a
    /// flush). Its record is then lost too: what the peer heard it used is
    /// counted again, so that a flush does not let it admit its part a
    /// second time. (A ledger is lost only so; a view heard of a later
    /// use than the peer's, or none, only under-counts.)
    #[allow(clippy::too_many_arguments)]
    pub fn hear(
        &mut self,
        now: u64,
        (window, per, terms): (u64, u64, K::Terms),
        (pool, share): (u64, u64),
        from: usize,
        total: u64,
        view: Heard,
        yours: u64,
        regions: usize,
    ) -> Option<u64> {
        if window_of(now, K::period(per)) != window || from >= regions || self.foreign(per, now) {
            return None;
        }
        let mut record = K::at(self.record, window, share, per, terms);
        let forgotten = self
            .ledger
            .as_ref()
            .is_none_or(|l| l.window_ms != window || l.per_ms != per || l.given.len() != regions);
        if forgotten && yours > 0 {
            record.restore(yours);
        }
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
        record.shift(
            (added as i64).saturating_sub(lost as i64),
            now,
            (share, per),
            terms,
        );
        self.record = Some(record.written(share, per, terms));
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

    /// A region whose store is flushed after it used its share is told
    /// back, at its peer's next shipping, what it used: it does not admit
    /// its share a second time in the window. A give-back it made since
    /// the peer last heard it is not undone by the peer's older view.
    #[test]
    fn a_flushed_region_counts_again_what_its_peer_heard_it_used() {
        let (mut a, mut b): (Stored, Stored) = Default::default();
        let now = 5 * PER + 10;
        let w = window_of(now, PER);
        assert!((0..10).all(|_| a.decide(now, 1, 10, PER, 0).allowed));
        // a tells b what it used: b's view of a, echoed back to a.
        let told = a.read(now, (PER, 0), 10, 2);
        assert_eq!(told.part.used, 10);
        b.hear(now, (w, PER, 0), (20, 10), 0, 0, view_of(&told), 0, 2);
        let yours = b.read(now, (PER, 0), 10, 2).views[0].unwrap().heard.used;
        assert_eq!(yours, 10);
        // Flushed: a admits afresh until b's next shipping reaches it.
        a = Stored::default();
        assert!(a.decide(now, 1, 10, PER, 0).allowed);
        assert_eq!(
            a.hear(now, (w, PER, 0), (20, 10), 1, 0, view(0), yours, 2),
            Some(0)
        );
        assert!(
            !a.decide(now, 1, 10, PER, 0).allowed,
            "11 of a share of 10 counted: {:?}",
            a.record
        );
        // Not flushed: a gives back 5 after b heard it used 10; b's view
        // of 10, echoed, does not take them back.
        let (mut a, _) = (Stored::<Record>::default(), ());
        assert!((0..10).all(|_| a.decide(now, 1, 10, PER, 0).allowed));
        let told = a.read(now, (PER, 0), 10, 2);
        a.give_back((now, 5), now, (10, PER), 0);
        assert_eq!(
            a.hear(now, (w, PER, 0), (20, 10), 1, 0, view(0), told.part.used, 2),
            Some(0)
        );
        assert!(
            (0..5).all(|_| a.decide(now, 1, 10, PER, 0).allowed),
            "{:?}",
            a.record
        );
    }

    fn view_of(snapshot: &Snapshot) -> Heard {
        Heard {
            cap: snapshot.part.cap(),
            used: snapshot.part.used,
            wanted: snapshot.part.wanted,
            heard_from_you: 0,
        }
    }

    #[test]
    fn budget_moves_by_grants_heard_once_and_ends_with_its_window() {
        let (mut a, mut b): (Stored, Stored) = Default::default();
        let now = 5 * PER + 10;
        let w = window_of(now, PER);
        assert!((0..4).all(|_| a.decide(now, 1, 10, PER, 10).allowed));
        assert_eq!(
            a.grant(now, w, (PER, 10), 10, (1, 7), 2),
            None,
            "only 6 left"
        );
        assert_eq!(a.grant(now, w, (PER, 10), 10, (1, 6), 2), Some(6));
        assert!(!a.decide(now, 1, 10, PER, 10).allowed);
        // Heard three times, and an older total after it: counted once.
        assert_eq!(
            b.hear(now, (w, PER, 10), (20, 10), 0, 6, view(0), 0, 2),
            Some(6)
        );
        assert_eq!(
            b.hear(now, (w, PER, 10), (20, 10), 0, 6, view(0), 0, 2),
            Some(0)
        );
        assert_eq!(
            b.hear(now, (w, PER, 10), (20, 10), 0, 2, view(0), 0, 2),
            Some(0)
        );
        assert_eq!(b.record.unwrap().moved, 6);
        assert!((0..16).all(|_| b.decide(now, 1, 10, PER, 10).allowed));
        assert!(!b.decide(now, 1, 10, PER, 10).allowed);
        // The next window starts from the share again; a late total of the
        // last one is dropped.
        let next = now + PER;
        assert_eq!(
            b.hear(next, (w, PER, 10), (20, 10), 0, 9, view(0), 0, 2),
            None
        );
        assert_eq!(b.decide(next, 1, 10, PER, 10).remaining, 9);
    }

    #[test]
    fn a_count_made_under_a_higher_limit_is_not_carried_as_debt() {
        let mut a: Stored = Stored::default();
        let now = 3 * PER + 1;
        assert!(a.decide(now, 100, 100, PER, 100).allowed);
        // A reload lowers the share to 1 (max_debt 1): denied in this
        // window, admitted in the next (read as spent, as a fixed_window
        // of its own reads it), not 99 windows later.
        assert!(!a.decide(now + 1, 1, 1, PER, 1).allowed);
        assert!(a.decide(now + PER, 1, 1, PER, 1).allowed);
        // A debt within max_debt is still carried.
        let mut b: Stored = Stored::default();
        assert_eq!(b.debit(now, 15, 10, PER, 5), 0);
        assert!(!b.decide(now + PER, 6, 10, PER, 5).allowed);
        assert!(b.decide(now + PER, 5, 10, PER, 5).allowed);
    }

    #[test]
    fn a_window_in_debt_retries_when_it_is_repaid() {
        for (debt, share, max_debt) in [(25, 10, 15), (40, 10, 40), (9, 3, 9), (12, 10, 1)] {
            let mut a: Stored = Stored::default();
            let now = 7 * PER + 3;
            a.debit(now, debt, share, PER, max_debt);
            for cost in 1..=share {
                let denied = a.decide(now, cost, share, PER, max_debt);
                assert!(!denied.allowed);
                let at = now + denied.retry_ms;
                let said = format!("debt {debt}, share {share}, cost {cost}: retry at {at}");
                assert!(
                    !a.clone().decide(at - 1, cost, share, PER, max_debt).allowed,
                    "{said}: early"
                );
                assert!(
                    a.clone().decide(at, cost, share, PER, max_debt).allowed,
                    "{said}: late"
                );
            }
        }
    }

    #[test]
    fn a_giver_that_lost_its_ledger_counts_its_grants_again_when_told() {
        let mut a: Stored = Stored::default();
        let now = PER + 1;
        let w = window_of(now, PER);
        assert_eq!(a.grant(now, w, (PER, 10), 10, (1, 8), 2), Some(8));
        a = Stored::default(); // flushed
        assert_eq!(
            a.hear(now, (w, PER, 10), (20, 10), 1, 0, view(8), 0, 2),
            Some(0)
        );
        assert_eq!(a.read(now, (PER, 10), 10, 2).part.left(), 2);
        assert!(!a.decide(now, 3, 10, PER, 10).allowed);
    }
}
