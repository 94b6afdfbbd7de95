//! Edge tests of a `gcra` / `token_bucket` shared across regions
//! (`sluice_core::regions::bucket`, SPEC appendix H): the fleet bound
//! `burst + pool × d / per` over any span `d`, retry-after never early,
//! and liveness at the edges of the range.

use proptest::prelude::*;
use sluice_core::regions::bucket::{Bucket, EPOCH_MS, Terms, epoch};
use sluice_core::regions::stored::{SharedRecord, Stored, window_of};
use sluice_core::regions::{Heard, shares};

const MAX_DEBT: u64 = 3;
const T0: u64 = 1_764_460_800_000 + 7;

fn view() -> Heard {
    Heard::default()
}

/// Every admission as (at, cost): the most admitted over any span must not
/// exceed `burst + pool × d / per` (one bucket of the pool).
fn check_bound(admitted: &[(u64, u64)], burst: u64, pool: u64, per: u64) -> Result<(), String> {
    let mut sorted = admitted.to_vec();
    sorted.sort();
    for i in 0..sorted.len() {
        let mut total = 0u128;
        for j in i..sorted.len() {
            total += u128::from(sorted[j].1);
            let d = u128::from(sorted[j].0 - sorted[i].0);
            // total ≤ burst + pool·d/per  ⇔  total·per ≤ burst·per + pool·d
            let most = u128::from(burst) * u128::from(per) + u128::from(pool) * d;
            if total * u128::from(per) > most {
                return Err(format!(
                    "admitted {total} in [{}, {}] ({} ms): more than burst {burst} + pool {pool} × {d}/{per}",
                    sorted[i].0, sorted[j].0, d
                ));
            }
        }
    }
    Ok(())
}

/// How long the scripts keep a record past when it goes idle (SLACK in
/// decide.lua).
const SLACK: u64 = 1_000;

/// A region as Redis keeps it: the record is dropped once the store's
/// clock passes when it goes idle, and SLACK (the key's expiry).
fn expire(stored: &mut Stored<Bucket>, now: u64) {
    if stored.record.is_some_and(|r| now > r.idle_ms + SLACK) {
        stored.record = None;
    }
}

// ---------------------------------------------------------------------
// Range: a burst smaller than the number of regions.
// ---------------------------------------------------------------------

/// limit 1 per second, three regions: shares 1/0/0. The region with the
/// share admits; the others wait for grants. What a region of share 0 says
/// in retry-after must not be a moment at which it is admitted anyway.
#[test]
fn limit_one_over_three_regions_admits_in_the_region_holding_the_share() {
    let per = 1_000;
    let shares = shares(1, &[1, 1, 1]);
    assert_eq!(shares, [1, 0, 0]);
    let t = Terms::new(1, per, 1, 0);
    let mut a: Stored<Bucket> = Stored::default();
    assert!(a.decide(T0, 1, 1, per, t).allowed);
    let denied = a.decide(T0, 1, 1, per, t);
    assert!(!denied.allowed);
    assert!(
        !a.clone()
            .decide(T0 + denied.retry_ms - 1, 1, 1, per, t)
            .allowed
    );
    assert!(a.decide(T0 + denied.retry_ms, 1, 1, per, t).allowed);
    let mut b: Stored<Bucket> = Stored::default();
    let denied = b.decide(T0, 1, 0, per, t);
    assert!(!denied.allowed);
    assert!(!b.decide(T0 + denied.retry_ms, 1, 0, per, t).allowed);
}

/// A region that granted most of its rate away sits full at the low
/// capacity; its record goes idle at the end of the epoch. At the next
/// epoch the kept record would refill from that low capacity at its
/// share's rate; the expired key reads as a fresh, full share instead.
#[test]
fn a_giver_record_goes_idle_only_once_it_reads_as_fresh() {
    let (limit, burst, per) = (30u64, 60u64, 1_000u64);
    let t = Terms::new(burst, per, limit, 0);
    let e = epoch(per);
    let now = window_of(T0, e) + 1_000;
    let w = window_of(now, e);
    let mut a: Stored<Bucket> = Stored::default();
    // Share 10/s, 20 at once; grants 9/s away: 1/s, 2 at once.
    assert_eq!(a.grant(now, w, (per, t), 10, (1, 9), 3), Some(9));
    let r = a.record.unwrap();
    let idle = r.idle_ms;
    // Dropped by the store once idle for SLACK.
    let after = idle + SLACK + 1;
    let kept = Bucket::at(Some(r), window_of(after, e), 10, per, t);
    let fresh = Bucket::at(None, window_of(after, e), 10, per, t);
    // How many units each admits at `after`.
    let count = |record: Option<Bucket>| {
        let mut s = Stored::<Bucket> {
            record,
            ..Stored::default()
        };
        (0..100)
            .filter(|_| s.decide(after, 1, 10, per, t).allowed)
            .count()
    };
    assert_eq!(
        count(Some(r)),
        count(None),
        "the record goes idle at {idle} (epoch end {}), yet when dropped (+{SLACK} ms) it reads {kept:?}, \
         a fresh one {fresh:?}",
        w + e
    );
}

/// The same as seen by the fleet: 30/s, a burst of 300 (each share 100
/// at once), A grants 9/s to B. B and C spend everything a moment before
/// the epoch ends and again SLACK later; A (whose key was dropped) spends
/// a fresh share then: more than one bucket of the pool admits over that
/// second.
#[test]
fn an_expired_giver_and_a_drained_receiver_stay_within_one_bucket() {
    let (limit, burst, per) = (30u64, 300u64, 1_000u64);
    let shares = shares(limit, &[1, 1, 1]);
    let t = Terms::new(burst, per, limit, 0);
    let e = epoch(per);
    let start = window_of(T0, e) + e; // an epoch's start
    let w = start;
    let (mut a, mut b, mut c): (Stored<Bucket>, Stored<Bucket>, Stored<Bucket>) =
        Default::default();
    // A grants 9/s to B at once.
    let total = a.grant(start, w, (per, t), shares[0], (1, 9), 3).unwrap();
    assert_eq!(
        b.hear(
            start,
            (w, per, t),
            (limit, shares[1]),
            0,
            total,
            view(),
            0,
            3
        ),
        Some(9)
    );
    let mut admitted = Vec::new();
    let end = start + e;
    let spend = |s: &mut Stored<Bucket>, share: u64, now: u64, admitted: &mut Vec<(u64, u64)>| {
        expire(s, now);
        let mut n = 0;
        while s.decide(now, 1, share, per, t).allowed {
            admitted.push((now, 1));
            n += 1;
        }
        n
    };
    let before = spend(&mut b, shares[1], end - 1, &mut admitted)
        + spend(&mut c, shares[2], end - 1, &mut admitted);
    let after = end + SLACK + 1;
    let later = spend(&mut b, shares[1], after, &mut admitted)
        + spend(&mut c, shares[2], after, &mut admitted);
    let by_a = spend(&mut a, shares[0], after, &mut admitted);
    assert!(
        check_bound(&admitted, burst, limit, per).is_ok(),
        "over {} ms across the epoch's end: B and C {before} then {later}, A {by_a}: {} \
         admitted, one bucket of the pool {:.2}",
        after - (end - 1),
        before + later + by_a,
        burst as f64 + limit as f64 * (after - (end - 1)) as f64 / per as f64
    );
}

// ---------------------------------------------------------------------
// A reload of `per` within an epoch.
// ---------------------------------------------------------------------

/// A region alone: stepping its clock back and forward, deciding at
/// epoch boundaries and the ms before them, never admits more than its
/// own share's bucket would (its capacity plus its share's refill over
/// the span, by the latest clock it has seen).
#[test]
fn clock_steps_and_epoch_edges_admit_no_more_than_the_share() {
    for per in [
        1u64, 3_000, 7, 60_000, 1_000, 9_999, 10_001, 59_999, 60_001, 7_000,
    ] {
        let (limit, burst) = (30u64, 45u64);
        let share = shares(limit, &[1, 1, 1])[0];
        let t = Terms::new(burst, per, limit, 0);
        let e = epoch(per);
        assert!(e >= EPOCH_MS && e.is_multiple_of(per) && e - per < EPOCH_MS.max(per));
        let base = window_of(T0, e) + e;
        let times = [
            base,
            base + e - 1,
            base + e,
            base + e - 1, // back a ms
            base + 3 * e - 1,
            base + e + 5, // back two epochs
            base + 3 * e,
            base + 3 * e + 1,
        ];
        let mut a: Stored<Bucket> = Stored::default();
        let mut admitted = 0u128;
        let mut latest = 0;
        for &now in &times {
            latest = latest.max(now);
            while a.decide(now, 1, share, per, t).allowed {
                admitted += 1;
                assert!(admitted < 1_000_000, "per {per}: unbounded at {now}");
            }
            // What a share's bucket admits from base to the latest clock.
            let cap = u128::from(share) * u128::from(burst) * u128::from(per) / u128::from(limit);
            let most = (cap + u128::from(share) * u128::from(latest - base)) / u128::from(per);
            assert!(
                admitted <= most,
                "per {per}: admitted {admitted} by {now} (latest {latest}), at most {most}"
            );
        }
    }
}

/// Retry-after is never early (nothing moving), for costs up to what a
/// share holds, from a region in debt, granted away or granted to, at an
/// epoch's last ms.
#[test]
fn retry_after_is_never_early_at_epoch_edges() {
    for per in [1_000u64, 3_000, 7, 60_000, 1] {
        let (limit, burst) = (30u64, 60u64);
        let share = 10;
        let t = Terms::new(burst, per, limit, 5);
        let e = epoch(per);
        let base = window_of(T0, e) + e;
        for at in [base, base + e - 1, base + e - per.min(e - 1), base + e / 2] {
            for moved in [-9i64, 0, 15] {
                let mut a: Stored<Bucket> = Stored::default();
                let w = window_of(at, e);
                if moved < 0 {
                    a.grant(at, w, (per, t), share, (1, moved.unsigned_abs()), 3);
                } else if moved > 0 {
                    a.hear(
                        at,
                        (w, per, t),
                        (limit, share),
                        1,
                        moved as u64,
                        view(),
                        0,
                        3,
                    );
                }
                a.debit(at, 23, share, per, t);
                for cost in 1..=20u64 {
                    let d = a.clone().decide(at, cost, share, per, t);
                    if d.allowed {
                        continue;
                    }
                    let retry = at + d.retry_ms;
                    let said = format!(
                        "per {per} at {at} moved {moved} cost {cost}: retry {}",
                        d.retry_ms
                    );
                    // Not early: denied a ms before.
                    if d.retry_ms > 1 {
                        assert!(
                            !a.clone().decide(retry - 1, cost, share, per, t).allowed,
                            "{said}: early"
                        );
                    }
                }
            }
        }
    }
}

// ---------------------------------------------------------------------
// The fleet bound, by a random schedule of decisions, debits, give-backs,
// grants (shipped late, twice, or never) and clock steps, with the store's
// expiry modelled.
// ---------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Wait(u64),
    /// To the epoch's last ms, less this.
    ToEdge(u64),
    /// The clock steps back.
    Back(u64),
    Decide(usize, u64),
    Debit(usize, u64),
    Grant(usize, usize, u64),
    /// Delivers the oldest grant in flight.
    Deliver,
    /// Delivers a grant again.
    Again,
    /// Loses the oldest grant in flight.
    Lose,
    GiveBack(usize),
}

fn ops(per: u64) -> impl Strategy<Value = Vec<Op>> {
    let e = epoch(per);
    prop::collection::vec(
        prop_oneof![
            3 => (0..per.max(2) / 2).prop_map(Op::Wait),
            1 => (e / 2..e * 2).prop_map(Op::Wait),
            1 => (0..3u64).prop_map(Op::ToEdge),
            1 => (1..per.max(2)).prop_map(Op::Back),
            8 => (0..3usize, 1u64..=5).prop_map(|(r, c)| Op::Decide(r, c)),
            1 => (0..3usize, 1u64..=5).prop_map(|(r, c)| Op::Debit(r, c)),
            2 => (0..3usize, 0..3usize, 1u64..=12).prop_map(|(f, to, u)| Op::Grant(f, to, u)),
            2 => Just(Op::Deliver),
            1 => Just(Op::Again),
            1 => Just(Op::Lose),
            1 => (0..3usize).prop_map(Op::GiveBack),
        ],
        1..150,
    )
}

/// Tokens of `r` at `now` (a debit of nothing).
fn tokens_at(r: Option<Bucket>, now: u64, share: u64, per: u64, t: Terms) -> i128 {
    i128::from(Bucket::debit(r, now, 0, (share, per), t).0.tokens)
}

/// Every admission as (at, units × per): over any span, at most
/// `burst × per + pool × d` (one bucket of the pool).
fn check_scaled(admitted: &[(u64, i128)], burst: u64, pool: u64, per: u64) -> Result<(), String> {
    // Debits may leave each of the three regions owing MAX_DEBT.
    let burst = burst + 3 * MAX_DEBT;
    let mut sorted = admitted.to_vec();
    sorted.sort();
    for i in 0..sorted.len() {
        let mut total = 0i128;
        for j in i..sorted.len() {
            total += sorted[j].1;
            let d = i128::from(sorted[j].0 - sorted[i].0);
            let most = i128::from(burst) * i128::from(per) + i128::from(pool) * d;
            if total > most {
                return Err(format!(
                    "admitted {total} units x per in [{}, {}] ({d} ms): more than {most}",
                    sorted[i].0, sorted[j].0
                ));
            }
        }
    }
    Ok(())
}

fn run_fleet(
    limit: u64,
    burst: u64,
    per: u64,
    weights: &[u32],
    expiry: bool,
    script: Vec<Op>,
) -> Result<(), String> {
    let shares = shares(limit, weights);
    let t = Terms::new(burst, per, limit, MAX_DEBT);
    let mut regions: Vec<Stored<Bucket>> = vec![Stored::default(); 3];
    let mut now = T0;
    // Admissions and debits, as (at, units × per), and per region the
    // indexes of its admissions.
    let mut admitted: Vec<(u64, i128)> = Vec::new();
    let mut by_region: Vec<Vec<(usize, u64, u64)>> = vec![Vec::new(); 3];
    // (from, to, window, total)
    let mut flight: Vec<(usize, usize, u64, u64)> = Vec::new();
    let mut delivered: Vec<(usize, usize, u64, u64)> = Vec::new();
    let mut log = Vec::new();
    for op in script {
        if expiry {
            for r in regions.iter_mut() {
                expire(r, now);
            }
        }
        let e = epoch(per);
        let w = window_of(now, e);
        log.push(format!("{op:?} at {now}"));
        match op {
            Op::Wait(ms) => now += ms,
            Op::ToEdge(k) => now = (w + e - 1 - k).max(now),
            Op::Back(ms) => now -= ms,
            Op::Decide(r, cost) => {
                if regions[r].decide(now, cost, shares[r], per, t).allowed {
                    by_region[r].push((admitted.len(), now, cost));
                    admitted.push((now, i128::from(cost * per)));
                }
            }
            Op::Debit(r, cost) => {
                let forgiven = regions[r].debit(now, cost, shares[r], per, t);
                admitted.push((now, i128::from((cost - forgiven) * per)));
            }
            Op::Grant(from, to, units) => {
                if from != to
                    && let Some(total) =
                        regions[from].grant(now, w, (per, t), shares[from], (to, units), 3)
                {
                    flight.push((from, to, w, total));
                }
            }
            Op::Deliver => {
                if !flight.is_empty() {
                    let (from, to, win, total) = flight.remove(0);
                    regions[to].hear(
                        now,
                        (win, per, t),
                        (limit, shares[to]),
                        from,
                        total,
                        view(),
                        0,
                        3,
                    );
                    delivered.push((from, to, win, total));
                }
            }
            Op::Again => {
                if let Some(&(from, to, win, total)) = delivered.last() {
                    regions[to].hear(
                        now,
                        (win, per, t),
                        (limit, shares[to]),
                        from,
                        total,
                        view(),
                        0,
                        3,
                    );
                }
            }
            Op::Lose => {
                if !flight.is_empty() {
                    flight.remove(0);
                }
            }
            Op::GiveBack(r) => {
                if let Some((i, at, cost)) = by_region[r].pop() {
                    let before = tokens_at(regions[r].record, now, shares[r], per, t);
                    regions[r].give_back((at, cost), now, (shares[r], per), t);
                    let after = tokens_at(regions[r].record, now, shares[r], per, t);
                    // What came back cancels that much of the admission.
                    admitted[i].1 -= after - before;
                }
            }
        }
        if let Err(e) = check_scaled(&admitted, burst, limit, per) {
            return Err(format!("{e}\nshares {shares:?}\n{}", log.join("\n")));
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, failure_persistence: None, ..ProptestConfig::default() })]

    /// Without the store's expiry (the twin as it is).
    #[test]
    fn three_regions_admit_no_more_than_one_bucket_of_the_pool(
        limit in 3u64..=60,
        burst_x in 1u64..=4,
        weights in prop::collection::vec(1u32..=3, 3),
        (per, script) in prop_oneof![Just(1_000u64), Just(3_000), Just(60_000), 200u64..=4_000]
            .prop_flat_map(|per| (Just(per), ops(per))),
    ) {
        let r = run_fleet(limit, limit * burst_x, per, &weights, false, script);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }

    /// With records dropped when they go idle, as Redis drops the key.
    #[test]
    fn three_regions_admit_no_more_than_one_bucket_of_the_pool_with_expiry(
        limit in 3u64..=60,
        burst_x in 1u64..=4,
        weights in prop::collection::vec(1u32..=3, 3),
        (per, script) in prop_oneof![Just(1_000u64), Just(3_000), Just(60_000), 200u64..=4_000]
            .prop_flat_map(|per| (Just(per), ops(per))),
    ) {
        let r = run_fleet(limit, limit * burst_x, per, &weights, true, script);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

/// `SharedRecord::stored` of the numbers the scripts write round-trips.
#[test]
fn stored_numbers_round_trip() {
    let b = Bucket {
        idle_ms: T0 + 10_000,
        tokens: -5_000,
        at_ms: T0,
        moved: -3,
    };
    let back = Bucket::stored([
        b.idle_ms as f64,
        b.tokens as f64,
        -(b.at_ms as f64),
        b.moved as f64,
    ]);
    assert_eq!(back, b);
}
