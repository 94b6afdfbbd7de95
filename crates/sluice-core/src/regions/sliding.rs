//! A `sliding_window` shared across regions: its record, and the twin of
//! `shared_sliding` in the store crate's `redis/regions/shared.lua` (and
//! of its steps in `ledger.lua`, `adjust.lua` and `common.lua`).
//!
//! # The bound
//!
//! One sliding window of the pool `T` admits while `prev·w + cur ≤ T`,
//! `w = (per − e)/per` the previous window's weight `e` ms into the
//! current one. Across regions, region `r` admitted `prev_r` in the
//! previous window and `cur_r` in this one, and `m_r` moved to it in this
//! window (heard less granted, as for a `fixed_window`; `Σ m_r ≤ 0`). It
//! keeps `net_r = cur_r − m_r` and, from the previous window,
//! `p_r = max(0, net'_r)` (`net'_r` that window's `net_r`), and admits
//! `cost` when
//!
//! ```text
//! p_r·w + net_r + cost ≤ s_r        (its share s_r, Σ s_r = T)
//! ```
//!
//! which holds at every instant after: `w` only falls, a grant is checked
//! against it, and hearing or giving back lowers `net_r`. So, with `k_r =
//! prev_r − p_r = min(m'_r, prev_r) ≤ m'_r` (`m'_r` what moved to it in
//! the previous window),
//!
//! ```text
//! Σ (prev_r·w + cur_r) = Σ (p_r·w + net_r) + Σ m_r + w·Σ k_r ≤ T + 0 + w·Σ m'_r ≤ T.
//! ```
//!
//! The regions together are never more than one sliding window of the
//! pool, whatever moves between them. A region that granted budget in
//! the previous window carries what it granted (the receiver admitted it,
//! and the fleet's estimate counts it); a region that received and spent
//! it carries only its share of it.
//!
//! # Debt
//!
//! A debit may leave `net_r` past `s_r` (at most `max_debt` past what
//! remains). When the windows move on, the previous window weighs at most
//! `s_r`, and what it owed beyond opens the new window's `net_r`: each
//! window that passes repays `s_r`, as a local `sliding_window` repays its
//! limit.

use super::record::{Answer, SharedRecord, window_of};

/// A shared `sliding_window`'s record: its window, what the previous one
/// still weighs here, and what it admitted less what moved here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slide {
    /// The window's start (ms, a multiple of the rule's period).
    pub start_ms: u64,
    /// When it goes idle: two windows after its start, more while it
    /// owes.
    pub idle_ms: u64,
    /// What the previous window weighs here at full weight (`p_r`).
    pub carried: u64,
    /// Units admitted in the window less what moved here (`net_r`).
    pub net: i64,
}

impl Slide {
    /// What remains at `now` against `share`, in units × ms (`slide_room`
    /// in shared.lua):
    /// `share·per − carried·(per − e) − net·per` (below 0: owing).
    fn room(&self, now: u64, share: u64, per: u64) -> i128 {
        let elapsed = now.saturating_sub(self.start_ms).min(per);
        i128::from(share) * i128::from(per)
            - i128::from(self.carried) * i128::from(per - elapsed)
            - i128::from(self.net) * i128::from(per)
    }

    /// The first moment in this record's window at which `cost` fits, if
    /// it does before the window ends (`slide_fits` in shared.lua).
    fn fits(&self, cost: u64, share: u64, per: u64) -> Option<u64> {
        let free = (i128::from(share) - i128::from(self.net) - i128::from(cost)) * i128::from(per);
        if free < 0 {
            return None;
        }
        let at = if self.carried == 0 {
            0
        } else {
            let weight = (free / i128::from(self.carried)).min(i128::from(per));
            i128::from(per) - weight
        };
        (at < i128::from(per)).then(|| self.start_ms + at as u64)
    }

    /// When a denied `cost` fits again, from `now`, if nothing moves here
    /// and nothing is given back (`slide_retry` in shared.lua): in this
    /// window as the previous one's weight falls; else in the first
    /// window whose debt leaves room for it (`j`), or the next, at its
    /// start. A cost above the share never fits without grants: when all
    /// is repaid.
    fn retry(self, now: u64, cost: u64, (share, per): (u64, u64), max_debt: u64) -> u64 {
        let from_now = |at: u64| at.saturating_sub(now).max(1);
        if let Some(at) = self.fits(cost, share, per) {
            return from_now(at);
        }
        if share == 0 {
            return from_now(self.start_ms + per);
        }
        let later = |j: u64| Slide::at(Some(self), self.start_ms + j * per, share, per, max_debt);
        // What it still owes as the next window opens, its weight included.
        let next = later(1);
        let owed = u128::from(next.carried) + u128::try_from(next.net.max(0)).unwrap_or(0);
        let share_wide = u128::from(share);
        if cost > share {
            if self.carried == 0 && self.net <= 0 {
                return from_now(self.start_ms + per);
            }
            let j = 1 + owed.div_ceil(share_wide);
            return from_now(self.start_ms + (j as u64 + 1) * per);
        }
        let over = (owed + u128::from(cost)).saturating_sub(share_wide);
        let j = over.div_ceil(share_wide).max(1) as u64;
        match later(j).fits(cost, share, per) {
            Some(at) => from_now(at),
            None => from_now(self.start_ms + (j + 1) * per),
        }
    }
}

impl SharedRecord for Slide {
    type Terms = u64;

    /// `slide_at` in shared.lua: a window of its own past `share +
    /// max_debt` reads as spent (`share`), nothing carried past it.
    fn at(record: Option<Slide>, window: u64, share: u64, per: u64, max_debt: u64) -> Slide {
        let r = record.unwrap_or(Slide {
            start_ms: window,
            idle_ms: window + 2 * per,
            carried: 0,
            net: 0,
        });
        if r.start_ms >= window {
            return r;
        }
        let passed = u128::from(((window - r.start_ms) / per).max(1));
        let mut owed = u128::try_from(r.net.max(0)).unwrap_or(0);
        if owed > u128::from(share) + u128::from(max_debt) {
            owed = u128::from(share);
        }
        let share = u128::from(share);
        let carried = owed.saturating_sub((passed - 1) * share).min(share);
        let net = owed.saturating_sub(passed * share);
        Slide {
            start_ms: window,
            idle_ms: window + 2 * per,
            carried: u64::try_from(carried).unwrap_or(u64::MAX),
            net: i64::try_from(net).unwrap_or(i64::MAX),
        }
    }

    fn stored([idle, start, carried, net]: [f64; 4]) -> Slide {
        Slide {
            start_ms: start as u64,
            idle_ms: idle as u64,
            carried: carried as u64,
            net: net as i64,
        }
    }

    /// Idle two windows after its start, and as many more as `share`
    /// takes to repay what it owes (`slide_idle` in shared.lua).
    fn written(mut self, share: u64, per: u64, _: u64) -> Slide {
        let owed = u64::try_from(self.net.max(0)).unwrap_or(0);
        self.idle_ms = self.start_ms + per * (1 + owed.div_ceil(share.max(1))).max(2);
        self
    }

    fn foreign(&self, window: u64, per: u64, now: u64) -> bool {
        let span = self.idle_ms - self.start_ms;
        let ours = self.start_ms.is_multiple_of(per) && span.is_multiple_of(per) && span >= 2 * per;
        (!ours && self.idle_ms > now) || self.start_ms > window
    }

    fn left(&self, now: u64, share: u64, per: u64, _: u64) -> u64 {
        let left = self.room(now, share, per).max(0) / i128::from(per);
        u64::try_from(left).unwrap_or(u64::MAX)
    }

    fn owed(&self, now: u64, share: u64, per: u64, _: u64) -> u64 {
        let owed = (-self.room(now, share, per)).max(0);
        u64::try_from((owed + i128::from(per) - 1) / i128::from(per)).unwrap_or(u64::MAX)
    }

    /// The previous window's weight (rounded up) and what it admitted
    /// (`used_at` in ledger.lua).
    fn used(&self, now: u64, per: u64, moved: i64) -> u64 {
        let elapsed = now.saturating_sub(self.start_ms).min(per);
        let weight =
            (u128::from(self.carried) * u128::from(per - elapsed)).div_ceil(u128::from(per));
        let used = weight as i128 + i128::from(self.net) + i128::from(moved);
        u64::try_from(used.max(0)).unwrap_or(u64::MAX)
    }

    /// Counted in the window's own admissions: it does not fall with the
    /// previous window's weight (what was lost of that weight counts
    /// until the window ends).
    fn restore(&mut self, used: u64) {
        self.net = self
            .net
            .saturating_add(i64::try_from(used).unwrap_or(i64::MAX));
    }

    fn shift(&mut self, units: i64, _: u64, _: (u64, u64), _: u64) {
        self.net = self.net.saturating_sub(units);
    }

    /// Admits while `carried·w + net + cost ≤ share` (`shared_sliding` in
    /// shared.lua).
    fn decide(
        record: Option<Slide>,
        now: u64,
        cost: u64,
        (share, per): (u64, u64),
        max_debt: u64,
    ) -> (Answer, Option<Slide>) {
        let mut r = Slide::at(record, window_of(now, per), share, per, max_debt);
        let room = r.room(now, share, per);
        let need = i128::from(cost) * i128::from(per);
        if room >= need {
            r.net = r
                .net
                .saturating_add(i64::try_from(cost).unwrap_or(i64::MAX));
            let r = r.written(share, per, max_debt);
            let answer = Answer {
                allowed: true,
                remaining: u64::try_from((room - need) / i128::from(per)).unwrap_or(u64::MAX),
                reset_ms: r.idle_ms.saturating_sub(now).max(1),
                retry_ms: 0,
            };
            return (answer, Some(r));
        }
        let answer = Answer {
            allowed: false,
            remaining: u64::try_from(room.max(0) / i128::from(per)).unwrap_or(u64::MAX),
            reset_ms: r
                .written(share, per, max_debt)
                .idle_ms
                .saturating_sub(now)
                .max(1),
            retry_ms: r.retry(now, cost, (share, per), max_debt),
        };
        (answer, None)
    }

    /// The window of now counts it, at most `max_debt` past what remains
    /// (`debit_numbers` in adjust.lua).
    fn debit(
        record: Option<Slide>,
        now: u64,
        cost: u64,
        (share, per): (u64, u64),
        max_debt: u64,
    ) -> (Slide, u64) {
        let mut r = Slide::at(record, window_of(now, per), share, per, max_debt);
        let most = r.room(now, share.saturating_add(max_debt), per).max(0) / i128::from(per);
        let kept = i128::from(cost).min(most);
        r.net = r.net.saturating_add(kept as i64);
        (r.written(share, per, max_debt), cost - kept as u64)
    }

    /// Given back in its window, `net` goes down (never below 0 by it); in
    /// the window before, what it carries (`give_back` in common.lua).
    fn give_back(&mut self, (at, cost): (u64, u64), _: u64, (_, per): (u64, u64), _: u64) {
        if at >= self.start_ms && at < self.start_ms + per {
            if self.net > 0 {
                self.net = (self.net - i64::try_from(cost).unwrap_or(i64::MAX)).max(0);
            }
        } else if at < self.start_ms && at + per >= self.start_ms {
            self.carried = self.carried.saturating_sub(cost);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::stored::Stored;
    use super::*;

    const PER: u64 = 10_000;
    const T0: u64 = 1_000 * PER;

    #[test]
    fn a_region_admits_its_share_less_what_the_last_window_still_weighs() {
        let mut a: Stored<Slide> = Stored::default();
        assert!((0..10).all(|_| a.decide(T0 + 1, 1, 10, PER, 10).allowed));
        assert!(!a.decide(T0 + 2, 1, 10, PER, 10).allowed);
        // A quarter into the next window the last one weighs 7.5 of 10.
        let now = T0 + PER + PER / 4;
        let admitted = (0..10)
            .filter(|_| a.decide(now, 1, 10, PER, 10).allowed)
            .count();
        assert_eq!(admitted, 2);
    }

    #[test]
    fn a_denial_names_the_first_moment_it_fits_and_not_before() {
        let mut a: Stored<Slide> = Stored::default();
        assert!(a.decide(T0, 10, 10, PER, 10).allowed);
        let now = T0 + PER + 100;
        let denied = a.decide(now, 3, 10, PER, 10);
        assert!(!denied.allowed);
        let at = now + denied.retry_ms;
        assert!(!a.clone().decide(at - 1, 3, 10, PER, 10).allowed);
        assert!(a.decide(at, 3, 10, PER, 10).allowed);
    }

    #[test]
    fn a_count_made_under_a_higher_limit_is_not_carried_as_debt() {
        let mut a: Stored<Slide> = Stored::default();
        assert!(a.decide(T0, 100, 100, PER, 100).allowed);
        // A reload lowers the share to 1 (max_debt 1): the last window
        // weighs what a share of 1 can, and two windows on it is free.
        assert!(!a.decide(T0 + PER + PER / 2, 1, 1, PER, 1).allowed);
        assert!(a.decide(T0 + 2 * PER, 1, 1, PER, 1).allowed);
    }

    #[test]
    fn a_deep_debt_names_when_it_is_repaid() {
        for (debt, share, per) in [(100, 1, PER), (63, 1, 1), (7, 3, PER), (30, 4, 7)] {
            let mut a: Stored<Slide> = Stored::default();
            assert_eq!(a.debit(T0, debt, share, per, 1_000), 0);
            for cost in 1..=share {
                let denied = a.decide(T0 + 1, cost, share, per, 1_000);
                assert!(!denied.allowed);
                let at = T0 + 1 + denied.retry_ms;
                let said =
                    format!("debt {debt}, share {share}, per {per}, cost {cost}: retry at {at}");
                assert!(
                    !a.clone().decide(at - 1, cost, share, per, 1_000).allowed,
                    "{said}: early"
                );
                assert!(
                    a.clone().decide(at, cost, share, per, 1_000).allowed,
                    "{said}: late"
                );
            }
        }
    }

    #[test]
    fn a_grant_spent_weighs_on_its_giver_and_the_fleet_stays_one_window() {
        // a grants 6 of its 10 to b, which spends 16; a spends 4.
        let (mut a, mut b): (Stored<Slide>, Stored<Slide>) = Default::default();
        let w = window_of(T0, PER);
        let view = super::super::Heard::default();
        assert_eq!(a.grant(T0, w, (PER, 10), 10, (1, 6), 2), Some(6));
        assert_eq!(
            b.hear(T0, (w, PER, 10), (20, 10), 0, 6, view, 0, 2),
            Some(6)
        );
        assert_eq!(
            (0..20)
                .filter(|_| b.decide(T0, 1, 10, PER, 10).allowed)
                .count(),
            16
        );
        assert_eq!(
            (0..20)
                .filter(|_| a.decide(T0, 1, 10, PER, 10).allowed)
                .count(),
            4
        );
        // Half into the next window the fleet's estimate is 10 of 20: a
        // carries 10 (its 4 and the 6 b spent), b 10.
        let now = T0 + PER + PER / 2;
        let more = (0..40)
            .filter(|i| [&mut a, &mut b][i % 2].decide(now, 1, 10, PER, 10).allowed)
            .count();
        assert_eq!(more, 10);
    }
}
