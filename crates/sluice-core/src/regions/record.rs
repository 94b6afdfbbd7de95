//! What the steps of a shared rule ([`Stored`](super::stored::Stored))
//! ask of its record, whatever the rule's algorithm: the record kinds are
//! a `fixed_window`'s ([`Record`](super::window::Record)), a
//! `sliding_window`'s ([`Slide`](super::sliding::Slide)) and a `gcra` or
//! `token_bucket`'s ([`Bucket`](super::bucket::Bucket)).

/// A shared rule's record, by algorithm: what the steps of [`Stored`](super::stored::Stored) ask
/// of it. Each is the twin of its functions in the scripts.
pub trait SharedRecord: Copy + std::fmt::Debug + PartialEq + Eq {
    /// What its steps read of the rule beside this region's share and the
    /// rule's period: a window's `max_debt`; a bucket's
    /// ([`Terms`](super::bucket::Terms)) also how its capacity follows its
    /// rate.
    type Terms: Copy + std::fmt::Debug;
    /// The span its ledger counts in for a rule of `per` ms: the window
    /// itself; a bucket's epoch.
    fn period(per: u64) -> u64 {
        per
    }
    /// Whether its demand is what was asked in about the latest second
    /// ([`Demand`](super::stored::Demand): a bucket's), not in its window
    /// so far.
    const RECENT_DEMAND: bool = false;
    /// The record as the window starting at `window` reads it: itself in
    /// its own window and in a later one (never re-dated back), moved on
    /// from an earlier one (what it still owes carried, when no more than
    /// `max_debt`: a count more than that past the cap was made under
    /// another limit and reads
    /// as spent, nothing carried), or afresh.
    fn at(record: Option<Self>, window: u64, share: u64, per: u64, terms: Self::Terms) -> Self;
    /// The record from its numbers as the scripts store them: when it
    /// goes idle, then its three numbers (a window's start and two
    /// numbers; a bucket's tokens, −at and moved).
    fn stored(numbers: [f64; 4]) -> Self;
    /// The record as written: when it goes idle set.
    fn written(self, share: u64, per: u64, terms: Self::Terms) -> Self;
    /// Whether the link leaves it alone at `now` for a rule of `per` ms
    /// whose window starts at `window`: written under another period and
    /// still running, or of a later window (the clock is behind).
    fn foreign(&self, window: u64, per: u64, now: u64) -> bool;
    /// What remains to admit at `now`, against `share` and what moved
    /// here.
    fn left(&self, now: u64, share: u64, per: u64, terms: Self::Terms) -> u64;
    /// How far past what it may admit it is at `now` (in debt), in units.
    fn owed(&self, now: u64, share: u64, per: u64, terms: Self::Terms) -> u64;
    /// What it may grant its peers at `now`: what remains to admit (a
    /// bucket: its whole rate).
    fn grantable(&self, now: u64, share: u64, per: u64, terms: Self::Terms) -> u64 {
        self.left(now, share, per, terms)
    }
    /// What it counts as admitted at `now`, as peers are told, `moved`
    /// being what moved here in the window as its ledger says.
    fn used(&self, now: u64, per: u64, moved: i64) -> u64;
    /// Counts `used` more units as admitted: what a peer last heard this
    /// region used in a window whose record and ledger the region has
    /// since lost (its Redis flushed). A bucket's parts are rates, which
    /// tell no use: nothing.
    fn restore(&mut self, used: u64);
    /// `units` moved here at `now` (below 0: moved away, granted).
    fn shift(&mut self, units: i64, now: u64, share_per: (u64, u64), terms: Self::Terms);
    /// A decision of `cost` units at `now`: its answer, and the record to
    /// write when it admitted.
    fn decide(
        record: Option<Self>,
        now: u64,
        cost: u64,
        share_per: (u64, u64),
        terms: Self::Terms,
    ) -> (Answer, Option<Self>);
    /// Charges `cost` units spent already, at most `max_debt` past what
    /// remains: the record to write, and the units forgiven.
    fn debit(
        record: Option<Self>,
        now: u64,
        cost: u64,
        share_per: (u64, u64),
        terms: Self::Terms,
    ) -> (Self, u64);
    /// Gives back, at `now`, `cost` units admitted at `at`, where they
    /// still count.
    fn give_back(
        &mut self,
        at_cost: (u64, u64),
        now: u64,
        share_per: (u64, u64),
        terms: Self::Terms,
    );
}

/// A decision's answer (as `decide.lua` returns each rule's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// Whether it fits.
    pub allowed: bool,
    /// Units left after it.
    pub remaining: u64,
    /// When the record is full again, from now (ms, at least 1): a fixed
    /// window's end; a sliding window's when it goes idle; a bucket's when
    /// its rate refills it.
    pub reset_ms: u64,
    /// When to retry (0: admitted): when the request fits if nothing
    /// moves here (a grant may admit it sooner).
    pub retry_ms: u64,
}

/// The window `now` falls in, for a period of `per` ms.
pub fn window_of(now: u64, per: u64) -> u64 {
    now - now % per
}
