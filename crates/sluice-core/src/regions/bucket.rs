//! A `gcra` or `token_bucket` shared across regions: its record, the twin
//! of `shared_bucket` in the store crate's `redis/regions/shared.lua` (and
//! of its steps in `ledger.lua`, `adjust.lua` and `common.lua`).
//!
//! # The bound
//!
//! A bucket of the fleet refills at `T` units per `per` (`T` the pool,
//! `limit + ⌊limit × tolerance⌋`) and holds at most `B = burst` units.
//! Region `r` holds a bucket of its own, refilling at its rate `c_r`
//! units per `per` and holding at most `K(c_r) = ⌊c_r·f⌋` units × per,
//! `f = B·per/T` (the milliseconds the fleet's whole rate takes to fill its
//! burst): its capacity follows its rate. Rates move between regions as a
//! window's units do (see [`crate::regions`]): `c_r = s_r − Σ g + Σ h`,
//! a grant lowering the giver's rate before the receiver hears it, so
//! that at every instant `Σ c_r ≤ T`, hence `Σ K(c_r) ≤ B·per`.
//!
//! A region's tokens never exceed its capacity: lowering its rate (a
//! grant) first counts its refill so far at the old rate, then clips its
//! tokens to the new capacity; raising it (a grant heard) counts the refill
//! so far at the old rate too, and adds no tokens. Over any span `[t₀,
//! t₁]` a region admits its tokens at `t₀`, plus what it refilled, less
//! what it holds at `t₁` and what was clipped: at most `K(c_r(t₀))/per +
//! ∫c_r/per`. Summed over regions:
//!
//! ```text
//! admitted in [t₀, t₁] ≤ B + T·(t₁ − t₀)/per
//! ```
//!
//! the bound of one bucket of the pool, whatever moves between regions and
//! when (delays, losses, partitions: a rate in flight refills no one).
//!
//! # Epochs
//!
//! Rates move within an epoch: the smallest multiple of `per` at least ten
//! seconds ([`epoch`]), aligned as windows are. At the next epoch every
//! region's rate starts again from its share (grants and what was heard
//! are of the epoch, as a window's are): its refill counted at the old
//! rate to the epoch's end, then its tokens clipped to the share's
//! capacity. Demand is what each region was asked in about the latest
//! second ([`Demand`](super::stored::Demand)), so a region whose demand
//! rises gets its part within a few syncs. The epoch's length
//! weighs two costs: the syncs after it starts, while rates move back to
//! where demand is (a region that had most of the rate runs on its share
//! for a few hundred milliseconds), and a rate granted to a peer just cut
//! off, which stays in flight, admitted by no one, until the epoch ends.
//! Regions whose clocks differ by `δ` disagree on the epoch for `δ`: up to
//! `δ` ms of the rate that moved can count twice.

//! # Debt
//!
//! A debit may leave its tokens below 0, at most `max_debt` units: they
//! are repaid as the bucket refills, whatever its rate. A record owing
//! more than that was written under another rule and reads as empty.

use super::record::{Answer, SharedRecord, window_of};

/// The shortest epoch (ms): rates move between regions within one.
pub const EPOCH_MS: u64 = 10_000;

/// The epoch of a bucket refilling per `per` ms: the smallest multiple of
/// `per` at least [`EPOCH_MS`].
pub fn epoch(per: u64) -> u64 {
    let per = per.max(1);
    per * EPOCH_MS.div_ceil(per).max(1)
}

/// How a shared bucket's capacity follows its rate, and how deep it may
/// owe.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Terms {
    /// The most units it may owe.
    pub max_debt: u64,
    /// `burst × per / pool` (ms): a rate of `c` units per `per` holds at
    /// most `⌊c × fill⌋` units × per.
    pub fill: f64,
}

impl Terms {
    /// The terms of a bucket of `burst` units refilled at `pool` units
    /// per `per` ms: computed as the scripts compute them (one product of
    /// integers below 2^53 and one division, rounded alike).
    pub fn new(burst: u64, per: u64, pool: u64, max_debt: u64) -> Terms {
        Terms {
            max_debt,
            fill: (burst as f64 * per as f64) / pool.max(1) as f64,
        }
    }

    /// What a rate of `rate` units per `per` holds at most, in units × per.
    pub(crate) fn capacity(&self, rate: i64) -> i64 {
        (rate as f64 * self.fill).floor() as i64
    }
}

/// A shared bucket's record: its tokens, when they were counted, and the
/// rate moved here in the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// When it goes idle: the end of the epoch it is full in (the store
    /// keeps it until then).
    pub idle_ms: u64,
    /// Units × per it holds (below 0: owing).
    pub tokens: i64,
    /// When they were counted (ms); 0 when the record was another
    /// algorithm's (stored with at ≥ 0, where a bucket stores −at).
    pub at_ms: u64,
    /// The rate heard from peers less granted to them in the epoch, units
    /// per `per`.
    pub moved: i64,
}

impl Bucket {
    /// Its rate with `share`: never below 0.
    fn rate(&self, share: u64) -> i64 {
        (i128::from(share) + i128::from(self.moved)).clamp(0, i128::from(i64::MAX)) as i64
    }

    /// Refilled at its rate up to `now`, at most its capacity now (a
    /// reload may have lowered it; `bucket_settled` in common.lua); a clock
    /// behind refills nothing.
    fn settled(mut self, now: u64, share: u64, terms: Terms) -> Bucket {
        let rate = self.rate(share);
        let since = now.saturating_sub(self.at_ms);
        let refilled = i128::from(self.tokens) + i128::from(since) * i128::from(rate);
        self.tokens = refilled.min(i128::from(terms.capacity(rate))) as i64;
        self.at_ms = self.at_ms.max(now);
        self
    }

    /// When its tokens reach `need`, if they do before its epoch ends, at
    /// its rate.
    fn reaches(&self, need: i64, share: u64, per: u64, terms: Terms) -> Option<u64> {
        let rate = self.rate(share);
        if need > terms.capacity(rate) || rate == 0 {
            return None;
        }
        let short = i128::from(need) - i128::from(self.tokens);
        let at = i128::from(self.at_ms) + (short.max(0) + i128::from(rate) - 1) / i128::from(rate);
        let end = window_of(self.at_ms, epoch(per)) + epoch(per);
        (at < i128::from(end)).then_some(at as u64)
    }

    /// When it is full again, from now (ms, at least 1): at its rate; with
    /// none, when its epoch ends.
    fn full_in(&self, now: u64, share: u64, per: u64, terms: Terms) -> u64 {
        let rate = self.rate(share);
        if rate == 0 {
            let end = window_of(self.at_ms, epoch(per)) + epoch(per);
            return end.saturating_sub(now).max(1);
        }
        let short = i128::from(terms.capacity(rate)) - i128::from(self.tokens);
        let ms = (short.max(0) + i128::from(rate) - 1) / i128::from(rate);
        (i128::from(self.at_ms) + ms - i128::from(now)).max(1) as u64
    }

    /// When `need` units × per fit, from `now`, if nothing moves here
    /// (`bucket_retry` in shared.lua): in its epoch at its rate; else after
    /// it, at its share's rate. A need above the share's capacity fits only
    /// with grants: the epoch's end.
    fn retry(&self, now: u64, need: i64, (share, per): (u64, u64), terms: Terms) -> u64 {
        let from_now = |at: u64| at.saturating_sub(now).max(1);
        if let Some(at) = self.reaches(need, share, per, terms) {
            return from_now(at);
        }
        let end = window_of(self.at_ms, epoch(per)) + epoch(per);
        let next = Bucket::at(Some(*self), end, share, per, terms);
        match next.reaches_at_share(need, share, terms) {
            Some(at) => from_now(at),
            None => from_now(end),
        }
    }

    /// When a bucket with nothing moved reaches `need`, at its share's
    /// rate, however many epochs on.
    fn reaches_at_share(&self, need: i64, share: u64, terms: Terms) -> Option<u64> {
        let rate = self.rate(share);
        if need > terms.capacity(rate) || rate == 0 {
            return None;
        }
        let short = (i128::from(need) - i128::from(self.tokens)).max(0);
        Some(self.at_ms + ((short + i128::from(rate) - 1) / i128::from(rate)) as u64)
    }
}

/// A region's bucket at a moment: what a read-only check reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// Units × per it holds (below 0: owing).
    pub tokens: i64,
    /// Its rate, units per `per`.
    pub rate: u64,
    /// The most units × per it holds at that rate.
    pub capacity: i64,
}

impl Bucket {
    /// The bucket `record` keeps at `now` for this region's `share`, as a
    /// decision would find it.
    pub fn standing(
        record: Option<Bucket>,
        now: u64,
        (share, per): (u64, u64),
        terms: Terms,
    ) -> Standing {
        let window = window_of(now, epoch(per));
        let r = Bucket::at(record, window, share, per, terms).settled(now, share, terms);
        let rate = r.rate(share);
        Standing {
            tokens: r.tokens,
            rate: rate as u64,
            capacity: terms.capacity(rate),
        }
    }
}

impl SharedRecord for Bucket {
    type Terms = Terms;

    const RECENT_DEMAND: bool = true;

    fn period(per: u64) -> u64 {
        epoch(per)
    }

    /// `bucket_at` in shared.lua: the record as the epoch starting at
    /// `window` reads it. None, or another algorithm's: full. Of an earlier
    /// epoch: refilled at its rate to that epoch's end, nothing moved, its
    /// tokens clipped to the share's capacity, and refilled at the share's
    /// rate since. Its own epoch or a later one (a clock behind): itself.
    /// Owing more than `max_debt`, it reads as empty.
    fn at(record: Option<Bucket>, window: u64, share: u64, per: u64, terms: Terms) -> Bucket {
        let e = epoch(per);
        let full = Bucket {
            idle_ms: window + e,
            tokens: terms.capacity(share as i64),
            at_ms: window,
            moved: 0,
        };
        let mut r = match record {
            Some(r) if r.at_ms != 0 => r,
            _ => return full,
        };
        let deepest = i128::from(terms.max_debt) * i128::from(per);
        if i128::from(r.tokens) < -deepest {
            r.tokens = 0;
        }
        let start = window_of(r.at_ms, e);
        if start >= window {
            return r;
        }
        r = r.settled(start + e, share, terms);
        r.moved = 0;
        r.tokens = r.tokens.min(terms.capacity(r.rate(share)));
        r.settled(window, share, terms)
    }

    /// Numbers as stored: idle, tokens, −at, moved.
    fn stored([idle, tokens, at, moved]: [f64; 4]) -> Bucket {
        Bucket {
            idle_ms: idle as u64,
            tokens: tokens as i64,
            at_ms: if at < 0.0 { (-at) as u64 } else { 0 },
            moved: moved as i64,
        }
    }

    /// Idle once it reads as a record of none would (`bucket_idle` in
    /// shared.lua): at the end of its epoch at the soonest (what moved
    /// here counts until then), and not before its tokens, refilled to
    /// that end at its rate and at its share's rate after, hold the share's
    /// capacity (a region that granted rate away holds less; a record
    /// dropped sooner would read as full).
    fn written(mut self, share: u64, per: u64, terms: Terms) -> Bucket {
        let e = epoch(per);
        let start = window_of(self.at_ms, e);
        let end = start + e;
        let full = terms.capacity(share as i64);
        let next = Bucket::at(Some(self), end, share, per, terms);
        let fresh = if next.tokens >= full {
            end
        } else {
            next.reaches_at_share(full, share, terms).unwrap_or(end + e)
        };
        self.idle_ms = start + e * fresh.saturating_sub(start).div_ceil(e).max(1);
        self
    }

    fn foreign(&self, window: u64, per: u64, now: u64) -> bool {
        // Another algorithm's record still running, or of a later epoch
        // (the clock is behind).
        let ours = self.at_ms != 0;
        (!ours && self.idle_ms > now) || (ours && window_of(self.at_ms, epoch(per)) > window)
    }

    fn left(&self, now: u64, share: u64, per: u64, terms: Terms) -> u64 {
        let tokens = self.settled(now, share, terms).tokens.max(0);
        tokens as u64 / per
    }

    fn owed(&self, now: u64, share: u64, per: u64, terms: Terms) -> u64 {
        let owed = -self.settled(now, share, terms).tokens.min(0);
        (owed as u64).div_ceil(per)
    }

    /// Its whole rate (a grant clips its tokens to what is left).
    fn grantable(&self, _: u64, share: u64, _: u64, _: Terms) -> u64 {
        self.rate(share) as u64
    }

    /// A rate has no units admitted to tell peers: each region's rate is
    /// its cap.
    fn used(&self, _: u64, _: u64, _: i64) -> u64 {
        0
    }

    fn restore(&mut self, _: u64) {}

    /// The refill so far counted at the old rate, then the tokens clipped
    /// to the new rate's capacity.
    fn shift(&mut self, units: i64, now: u64, (share, _): (u64, u64), terms: Terms) {
        let mut r = self.settled(now, share, terms);
        r.moved = r.moved.saturating_add(units);
        r.tokens = r.tokens.min(terms.capacity(r.rate(share)));
        *self = r;
    }

    /// Admits while its tokens hold `cost × per` (`shared_bucket` in
    /// shared.lua).
    fn decide(
        record: Option<Bucket>,
        now: u64,
        cost: u64,
        (share, per): (u64, u64),
        terms: Terms,
    ) -> (Answer, Option<Bucket>) {
        let window = window_of(now, epoch(per));
        let mut r = Bucket::at(record, window, share, per, terms).settled(now, share, terms);
        let need = i64::try_from(u128::from(cost) * u128::from(per)).unwrap_or(i64::MAX);
        if r.tokens >= need {
            r.tokens -= need;
            let r = r.written(share, per, terms);
            let answer = Answer {
                allowed: true,
                remaining: r.tokens as u64 / per,
                reset_ms: r.full_in(now, share, per, terms),
                retry_ms: 0,
            };
            return (answer, Some(r));
        }
        let answer = Answer {
            allowed: false,
            remaining: r.tokens.max(0) as u64 / per,
            reset_ms: r.full_in(now, share, per, terms),
            retry_ms: r.retry(now, need, (share, per), terms),
        };
        (answer, None)
    }

    /// Its tokens of now count it, at most `max_debt` units below 0
    /// (`debit_numbers` in adjust.lua).
    fn debit(
        record: Option<Bucket>,
        now: u64,
        cost: u64,
        (share, per): (u64, u64),
        terms: Terms,
    ) -> (Bucket, u64) {
        let window = window_of(now, epoch(per));
        let mut r = Bucket::at(record, window, share, per, terms).settled(now, share, terms);
        let room = i128::from(r.tokens) + i128::from(terms.max_debt) * i128::from(per);
        let most = (room.max(0) / i128::from(per)) as u64;
        let kept = cost.min(most);
        r.tokens -= (kept * per) as i64;
        (r.written(share, per, terms), cost - kept)
    }

    /// Gives back what the admission still holds, when it and the record
    /// are of the epoch of now (a record of an earlier one has moved on:
    /// what moved to it is over): its units less what its rate refilled
    /// since, at most its capacity (`give_back` in common.lua; when it goes
    /// idle is kept).
    fn give_back(
        &mut self,
        (at, cost): (u64, u64),
        now: u64,
        (share, per): (u64, u64),
        terms: Terms,
    ) {
        let e = epoch(per);
        let epoch_of_now = window_of(now, e);
        if self.at_ms == 0
            || window_of(at, e) != epoch_of_now
            || window_of(self.at_ms, e) != epoch_of_now
            || at > now
        {
            return;
        }
        let r = self.settled(now, share, terms);
        let rate = r.rate(share);
        let refilled = i128::from(now - at) * i128::from(rate);
        let held = i128::from(cost) * i128::from(per) - refilled;
        if held > 0 {
            let tokens = (i128::from(r.tokens) + held).min(i128::from(terms.capacity(rate)));
            *self = Bucket {
                tokens: tokens as i64,
                ..r
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::stored::Stored;
    use super::*;

    const PER: u64 = 1_000;
    const T0: u64 = 30_000 * 60_000;

    fn terms(burst: u64, pool: u64) -> Terms {
        Terms::new(burst, PER, pool, 10)
    }

    #[test]
    fn a_region_holds_its_share_of_the_burst_and_refills_at_its_share() {
        // A pool of 30/s and a burst of 60, three regions: this one 10/s
        // and 20 at once.
        let t = terms(60, 30);
        let mut a: Stored<Bucket> = Stored::default();
        let admitted = (0..40)
            .filter(|_| a.decide(T0 + 1, 1, 10, PER, t).allowed)
            .count();
        assert_eq!(admitted, 20);
        let later = (0..40)
            .filter(|_| a.decide(T0 + 1 + PER, 1, 10, PER, t).allowed)
            .count();
        assert_eq!(later, 10);
    }

    #[test]
    fn a_rate_granted_away_clips_the_giver_and_fills_the_receiver_slowly() {
        let t = terms(60, 30);
        let (mut a, mut b): (Stored<Bucket>, Stored<Bucket>) = Default::default();
        let w = window_of(T0, epoch(PER));
        let view = super::super::Heard::default();
        assert_eq!(a.grant(T0, w, (PER, t), 10, (1, 8), 2), Some(8));
        // a keeps 2/s and 4 at once.
        let kept = (0..40)
            .filter(|_| a.decide(T0, 1, 10, PER, t).allowed)
            .count();
        assert_eq!(kept, 4);
        // b hears 8/s more: no tokens added, its capacity 36 filled at 18/s.
        assert_eq!(b.hear(T0, (w, PER, t), (30, 10), 0, 8, view, 0, 2), Some(8));
        let now = (0..40)
            .filter(|_| b.decide(T0, 1, 10, PER, t).allowed)
            .count();
        assert_eq!(now, 20);
        let second = (0..40)
            .filter(|_| b.decide(T0 + PER, 1, 10, PER, t).allowed)
            .count();
        assert_eq!(second, 18);
    }

    #[test]
    fn a_denial_names_the_first_moment_it_fits_and_not_before() {
        let t = terms(60, 30);
        for (cost, at) in [(1, T0 + 5), (7, T0 + 9_990), (20, T0 + 9_999), (3, T0)] {
            let mut a: Stored<Bucket> = Stored::default();
            assert!(a.decide(at, 20, 10, PER, t).allowed);
            a.debit(at, 4, 10, PER, t);
            let denied = a.decide(at, cost, 10, PER, t);
            assert!(!denied.allowed);
            let retry = at + denied.retry_ms;
            let said = format!("cost {cost} at {at}: retry at {retry}");
            assert!(
                !a.clone().decide(retry - 1, cost, 10, PER, t).allowed,
                "{said}: early"
            );
            assert!(a.decide(retry, cost, 10, PER, t).allowed, "{said}: late");
        }
    }

    #[test]
    fn the_next_epoch_starts_from_the_share() {
        let t = terms(60, 30);
        let mut a: Stored<Bucket> = Stored::default();
        let w = window_of(T0, epoch(PER));
        let view = super::super::Heard::default();
        assert_eq!(
            a.hear(T0, (w, PER, t), (30, 10), 1, 20, view, 0, 2),
            Some(20)
        );
        let next = w + epoch(PER) + 10 * PER;
        let admitted = (0..100)
            .filter(|_| a.decide(next, 1, 10, PER, t).allowed)
            .count();
        assert_eq!(admitted, 20, "the share's capacity, not the epoch's rate");
    }

    #[test]
    fn a_give_back_in_the_next_epoch_keeps_nothing_of_what_moved() {
        let t = terms(60, 30);
        let mut a: Stored<Bucket> = Stored::default();
        let w = window_of(T0, epoch(PER));
        let view = super::super::Heard::default();
        assert_eq!(
            a.hear(T0, (w, PER, t), (30, 10), 1, 20, view, 0, 2),
            Some(20)
        );
        let end = w + epoch(PER);
        assert!(a.decide(end - 5, 15, 10, PER, t).allowed);
        // Settled in the next epoch: the rate that moved here was of the
        // last one, and stays there.
        let next = end + 1;
        a.give_back((end - 5, 15), next, (10, PER), t);
        let later = next + 2 * PER;
        let admitted = (0..200)
            .filter(|_| a.decide(later, 1, 10, PER, t).allowed)
            .count();
        assert_eq!(admitted, 20, "the share's capacity");
    }

    #[test]
    fn another_algorithms_record_reads_as_full_and_a_deep_debt_as_empty() {
        let t = terms(60, 30);
        // A local token_bucket's numbers: tokens, last, given.
        let theirs = Bucket::stored([(T0 + 5) as f64, 1e12, T0 as f64, T0 as f64]);
        assert_eq!(theirs.at_ms, 0);
        let a = Stored::<Bucket> {
            record: Some(theirs),
            ..Stored::default()
        };
        assert_eq!(a.standing(T0 + 1, 10, PER, t), (20, 0));
        let owing = Bucket {
            idle_ms: window_of(T0, epoch(PER)) + epoch(PER),
            tokens: -50 * PER as i64,
            at_ms: T0,
            moved: 0,
        };
        let b = Stored::<Bucket> {
            record: Some(owing),
            ..Stored::default()
        };
        assert_eq!(b.standing(T0, 10, PER, t), (0, 0));
    }
}
