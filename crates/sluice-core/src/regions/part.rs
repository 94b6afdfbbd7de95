//! One region's part of one shared rule's window (see the module's
//! documentation for why the fleet stays within its pool).

/// What a region's store keeps for one key and window: its share, what it
/// admitted and was asked, and the running totals of grants to and from
/// each peer (indexed by region; a region's own entries stay 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Its share of the pool when the window began.
    pub share: u64,
    /// Units admitted here this window.
    pub used: u64,
    /// Units asked here this window, admitted or not: its demand.
    pub wanted: u64,
    /// Per region, the total this region has granted it.
    pub given: Vec<u64>,
    /// Per region, the total it granted this region, as heard here.
    pub heard: Vec<u64>,
}

impl Part {
    /// The part a window starts with: `share`, among `regions` regions.
    pub fn new(share: u64, regions: usize) -> Part {
        Part {
            share,
            used: 0,
            wanted: 0,
            given: vec![0; regions],
            heard: vec![0; regions],
        }
    }

    /// What this region may admit in the window, in all: its share, less
    /// what it granted, plus what it heard granted to it. Never below
    /// `used` (a grant never takes what was admitted).
    pub fn cap(&self) -> u64 {
        // Totals a peer shipped are its word: added without overflowing.
        let total = |totals: &[u64]| totals.iter().fold(0u64, |t, &n| t.saturating_add(n));
        let (given, heard) = (total(&self.given), total(&self.heard));
        self.share.saturating_add(heard).saturating_sub(given)
    }

    /// What remains to admit here.
    pub fn left(&self) -> u64 {
        self.cap().saturating_sub(self.used)
    }

    /// Decides a request of `cost` units: admitted (and counted) when it
    /// fits the cap. Its units count as demand either way.
    pub fn admit(&mut self, cost: u64) -> bool {
        self.wanted = self.wanted.saturating_add(cost);
        let fits = self.used.checked_add(cost).is_some_and(|u| u <= self.cap());
        if fits {
            self.used += cost;
        }
        fits
    }

    /// Grants `units` of what remains here to region `to`, when that much
    /// remains (atomically with the decisions, in the store): the new
    /// total granted to `to`, for the link to ship; `None` when it does
    /// not fit (nothing granted).
    pub fn grant(&mut self, to: usize, units: u64) -> Option<u64> {
        if units == 0 || units > self.left() {
            return None;
        }
        self.given[to] += units;
        Some(self.given[to])
    }

    /// Applies a total region `from` shipped as granted to this one: the
    /// larger of it and what was heard before (a total shipped again, late
    /// or out of order changes nothing). Returns the units it added.
    pub fn hear(&mut self, from: usize, total: u64) -> u64 {
        let added = total.saturating_sub(self.heard[from]);
        self.heard[from] += added;
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_leaves_what_was_admitted_and_a_total_is_heard_once() {
        let mut a = Part::new(10, 2);
        let mut b = Part::new(10, 2);
        assert!((0..7).all(|_| a.admit(1)));
        // 3 remain: 4 cannot be granted, 3 can.
        assert_eq!(a.grant(1, 4), None);
        assert_eq!(a.grant(1, 3), Some(3));
        assert!(!a.admit(1), "nothing left after the grant");
        assert_eq!(a.wanted, 8);
        // Heard twice, and an older total after a newer one: once.
        assert_eq!(b.hear(0, 3), 3);
        assert_eq!(b.hear(0, 3), 0);
        assert_eq!(b.hear(0, 1), 0);
        assert_eq!(b.cap(), 13);
        assert!((0..13).all(|_| b.admit(1)));
        assert!(!b.admit(1));
        assert_eq!(a.used + b.used, 20);
    }
}
