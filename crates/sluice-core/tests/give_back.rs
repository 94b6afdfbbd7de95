//! Property tests of give-backs: reservations held across refills and
//! settled below their estimate never bank units.
//!
//! A run mixes decisions with reservations (an estimate admitted now, an
//! actual cost known later) settled at random later times, in any order:
//! the settle gives back `Rule::returnable` of the difference
//! (`Rule::refund`), the store noting when it last gave back.
//! Counting each reservation at its actual cost, at the time it was
//! admitted, every interval of the run admits no more than the burst plus
//! what the rate refills over it: a give-back never returns units the
//! bucket had refilled already.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use sluice_core::algorithm::State;
use sluice_core::{Algorithm, Rule};

/// One step of a run, `gap` ms after the previous one.
#[derive(Debug, Clone)]
enum Op {
    /// A request of `cost` units.
    Decide { gap: u64, cost: u64 },
    /// A reservation of `estimate` units that will cost `actual`.
    Reserve {
        gap: u64,
        estimate: u64,
        actual: u64,
    },
    /// Settles the open reservation `pick` modulo their number.
    Settle { gap: u64, pick: usize },
}

fn rule_strategy() -> impl Strategy<Value = Rule> {
    let algorithm = prop_oneof![Just(Algorithm::Gcra), Just(Algorithm::TokenBucket)];
    let period = prop_oneof![1u64..=20, 100u64..=2_000, Just(1_000u64)];
    (algorithm, 1u64..=20, period, 0u64..=10).prop_map(|(algorithm, limit, per, extra)| {
        Rule::new(
            algorithm,
            limit.into(),
            per,
            Some(i128::from(limit + extra)),
            false,
        )
        .expect("valid rule")
    })
}

fn ops(rule: Rule) -> impl Strategy<Value = Vec<Op>> {
    let per = rule.period_ms();
    let gap = prop_oneof![
        3 => Just(0u64),
        3 => 0u64..50,
        2 => 0u64..(3 * per + 1),
        1 => Just(per + per / 7),
    ];
    let capacity = rule.capacity();
    let op = prop_oneof![
        3 => (gap.clone(), 1..=capacity).prop_map(|(gap, cost)| Op::Decide { gap, cost }),
        2 => (gap.clone(), 1..=capacity, 0..=capacity)
            .prop_map(|(gap, estimate, actual)| Op::Reserve { gap, estimate, actual: actual.min(estimate) }),
        2 => (gap, 0usize..8).prop_map(|(gap, pick)| Op::Settle { gap, pick }),
    ];
    proptest::collection::vec(op, 1..120)
}

/// A reservation not yet settled.
struct Open {
    at: u64,
    estimate: u64,
    actual: u64,
    whole_at: u64,
}

/// Runs `ops` from `start`: the admissions as (time, units), each
/// reservation at its actual cost.
fn run(rule: &Rule, start: u64, ops: &[Op]) -> Vec<(u64, u64)> {
    let mut state = State::Fresh;
    let mut now = start;
    let mut admitted = Vec::new();
    let mut open: Vec<Open> = Vec::new();
    let mut given_back = 0;
    let mut settle = |state: &mut State, now: u64, held: Open| {
        let cost = held.estimate - held.actual;
        if let Some(next) = rule.give_back(state, held.at, cost, held.whole_at, given_back, now) {
            *state = next;
            given_back = now;
        }
    };
    for op in ops {
        match *op {
            Op::Decide { gap, cost } => {
                now += gap;
                let (outcome, step) = rule.decide(&state, now, cost);
                rule.commit(&mut state, step);
                if outcome.allowed {
                    admitted.push((now, cost));
                }
            }
            Op::Reserve {
                gap,
                estimate,
                actual,
            } => {
                now += gap;
                let (outcome, step) = rule.decide(&state, now, estimate);
                rule.commit(&mut state, step);
                if outcome.allowed {
                    admitted.push((now, actual));
                    open.push(Open {
                        at: now,
                        estimate,
                        actual,
                        whole_at: now + outcome.reset_after_ms,
                    });
                }
            }
            Op::Settle { gap, pick } => {
                now += gap;
                if !open.is_empty() {
                    let held = open.remove(pick % open.len());
                    settle(&mut state, now, held);
                }
            }
        }
    }
    admitted
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 400,
        max_shrink_time: 20_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    /// No interval admits more than the burst and its refill, counting
    /// every reservation at its actual cost.
    #[test]
    fn a_give_back_never_banks_a_refill(
        (rule, start, ops) in rule_strategy().prop_flat_map(|r| {
            (Just(r), prop_oneof![Just(0u64), 0u64..10_000, Just(1_764_500_000_000u64)], ops(r))
        })
    ) {
        let admitted = run(&rule, start, &ops);
        let (limit, per, burst) = (rule.limit(), rule.period_ms(), rule.burst());
        for (i, &(from, _)) in admitted.iter().enumerate() {
            let mut units = 0;
            for &(to, cost) in &admitted[i..] {
                units += cost;
                // units ≤ burst + (to − from)·limit/per, multiplied through.
                prop_assert!(
                    units * per <= burst * per + (to - from) * limit,
                    "{units} units admitted in [{from}, {to}] ms: more than the burst {burst} and {limit}/{per}ms"
                );
            }
        }
    }
}

/// The case of the report: limit 10/s, burst 10; a reservation of 10
/// held across a refill and settled at 0 gives back nothing, while one
/// settled at once gives back everything.
#[test]
fn a_reservation_held_across_a_refill_gives_nothing_back() {
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let rule = Rule::new(algorithm, 10, 1_000, Some(10), false).unwrap();
        let (taken, step) = rule.decide(&State::Fresh, 0, 10);
        let mut state = State::Fresh;
        rule.commit(&mut state, step);
        let whole_at = taken.reset_after_ms;
        // In units × per (1,000 a unit).
        let back = |now| rule.returnable(10, 0, whole_at, 0, now);
        assert_eq!(back(0), 10_000, "{algorithm:?} at once");
        assert_eq!(back(500), 5_000, "{algorithm:?} half refilled");
        // 1.15 s later the bucket is whole again and another 10 pass.
        let (again, step) = rule.decide(&state, 1_150, 10);
        assert!(again.allowed);
        rule.commit(&mut state, step);
        assert_eq!(
            back(1_150),
            0,
            "{algorithm:?}: the estimate refilled already"
        );
        if let Some(next) = rule.give_back(&state, 0, 10, whole_at, 0, 1_150) {
            state = next;
        }
        assert!(
            !rule.decide(&state, 1_150, 1).0.allowed,
            "{algorithm:?}: a settle at 0 banked the refill"
        );
    }
}

/// A give-back returns parts of a unit: an estimate of one unit settled
/// at 0 a few milliseconds later returns what it still holds, so that a
/// bucket of one (5 per 15 minutes, one at a time) is free again at once,
/// not three minutes later.
#[test]
fn a_unit_given_back_moments_later_frees_its_room() {
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let rule = Rule::new(algorithm, 5, 900_000, Some(1), false).unwrap();
        let mut state = State::Fresh;
        let (taken, step) = rule.decide(&state, 1_000, 1);
        rule.commit(&mut state, step);
        assert!(taken.allowed);
        assert!(
            !rule.decide(&state, 1_003, 1).0.allowed,
            "{algorithm:?} full"
        );
        let whole_at = 1_000 + taken.reset_after_ms;
        state = rule
            .give_back(&state, 1_000, 1, whole_at, 0, 1_003)
            .expect("a change");
        assert!(
            rule.decide(&state, 1_003, 1).0.allowed,
            "{algorithm:?}: the unit given back 3 ms later is room again"
        );
    }
}
