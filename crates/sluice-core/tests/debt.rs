//! Property tests of debits: random decisions and debits on every
//! algorithm that can owe, with random `max_debt`.
//!
//! A debit always counts and may leave a rule owing; what a decision then
//! says must stay true: a bucket in debt denies, `retry_after_ms` is exact,
//! `remaining` is what still passes, an idle state is fresh, and over any
//! run what was admitted and debited (less what was forgiven) never
//! exceeds what the rate allows plus the burst and the deepest debt.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use sluice_core::algorithm::{Debit, State, Step};
use sluice_core::{Algorithm, Rule};

fn rule_strategy(algorithm: Algorithm) -> impl Strategy<Value = Rule> {
    let period = prop_oneof![1u64..=20, 100u64..=2_000, Just(1_000u64)];
    (1u64..=20, period, 0u64..=10, any::<bool>(), 0u64..=40).prop_map(
        move |(limit, per, extra, aligned, debt)| {
            let burst = algorithm.has_burst().then_some(i128::from(limit + extra));
            let aligned = aligned && algorithm == Algorithm::FixedWindow;
            Rule::new(algorithm, limit.into(), per, burst, aligned)
                .and_then(|r| r.with_max_debt(debt.into()))
                .expect("valid rule")
        },
    )
}

/// Operations as (ms since the previous one, cost, whether it is a debit).
fn operations(rule: Rule) -> impl Strategy<Value = Vec<(u64, u64, bool)>> {
    let per = rule.period_ms();
    let gap = prop_oneof![
        3 => Just(0u64),
        4 => 0u64..50,
        2 => 0u64..3_000,
        1 => Just(per - 1),
        1 => Just(per),
    ];
    let cost = 1..=rule.capacity() * 3 + 2;
    proptest::collection::vec((gap, cost, prop::bool::weighted(0.3)), 1..150)
}

fn owing_algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::Gcra),
        Just(Algorithm::TokenBucket),
        Just(Algorithm::SlidingLog),
        Just(Algorithm::FixedWindow),
        Just(Algorithm::SlidingWindow),
    ]
}

fn case() -> impl Strategy<Value = (Rule, u64, Vec<(u64, u64, bool)>)> {
    owing_algorithm()
        .prop_flat_map(rule_strategy)
        .prop_flat_map(|r| {
            (
                Just(r),
                prop_oneof![Just(0u64), 0u64..10_000, Just(1_764_500_000_000u64)],
                operations(r),
            )
        })
}

/// Applies one operation at `now`: (units counted, units forgiven).
fn apply(rule: &Rule, state: &mut State, now: u64, cost: u64, debit: bool) -> (u64, u64) {
    if debit {
        let Debit { step, forgiven } = rule.debit(state, now, cost);
        rule.commit(state, step);
        (cost - forgiven, forgiven)
    } else {
        let cost = cost.min(rule.capacity());
        let (outcome, step) = rule.decide(state, now, cost);
        rule.commit(state, step);
        (if outcome.allowed { cost } else { 0 }, 0)
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        max_shrink_time: 20_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    /// After any mix of decisions and debits, a denied request passes
    /// exactly `retry_after_ms` later, and `remaining` is what passes now.
    #[test]
    fn retry_and_remaining_stay_exact_in_debt((rule, start, ops) in case()) {
        let mut state = State::Fresh;
        let mut now = start;
        for &(gap, cost, debit) in &ops {
            now += gap;
            apply(&rule, &mut state, now, cost, debit);
            let probe = cost.min(rule.capacity());
            let (outcome, _) = rule.decide(&state, now, probe);
            if !outcome.allowed {
                let retry = outcome.retry_after_ms;
                prop_assert!(rule.decide(&state, now + retry, probe).0.allowed,
                    "denied again at +{retry}ms: {state:?}");
                prop_assert!(!rule.decide(&state, now + retry - 1, probe).0.allowed,
                    "already allowed at +{}ms: {state:?}", retry - 1);
            }
            // What passes now: an admitted probe's remaining is what is
            // left after it.
            let (one, _) = rule.decide(&state, now, 1);
            let left = u64::from(one.remaining) + u64::from(one.allowed);
            if left >= 1 {
                prop_assert!(rule.decide(&state, now, left).0.allowed, "remaining {left} does not pass");
            }
            if left < rule.capacity() {
                prop_assert!(!rule.decide(&state, now, left + 1).0.allowed, "more than remaining {left} passes");
            }
        }
    }

    /// A state older than `idle_at` decides like a fresh one, debts and all
    /// (so a store may forget it, and no debt is forgotten early).
    #[test]
    fn idle_state_is_fresh_once_debts_are_repaid((rule, start, ops) in case()) {
        let mut state = State::Fresh;
        let mut now = start;
        for &(gap, cost, debit) in &ops {
            now += gap;
            apply(&rule, &mut state, now, cost, debit);
        }
        let idle = rule.idle_at(&state).max(now);
        for cost in [1, rule.capacity()] {
            prop_assert_eq!(rule.decide(&state, idle, cost).0, rule.decide(&State::Fresh, idle, cost).0);
        }
        if idle > now {
            // Not idle a millisecond before: the full bucket is not back yet.
            let (before, _) = rule.decide(&state, idle - 1, rule.capacity());
            let (fresh, _) = rule.decide(&State::Fresh, idle - 1, rule.capacity());
            prop_assert!(before != fresh || rule.algorithm() == Algorithm::SlidingWindow
                || rule.algorithm() == Algorithm::SlidingLog,
                "{state:?} is already fresh at {}", idle - 1);
        }
    }

    /// Debts are repaid: over a run of `d` ms, what was admitted plus what
    /// was debited and not forgiven is at most the burst, the deepest debt
    /// and the rate over `d` (exact algorithms; a fixed window counts the
    /// windows the run touched).
    #[test]
    fn debt_is_repaid_before_more_passes((rule, start, ops) in case()) {
        prop_assume!(rule.algorithm() != Algorithm::SlidingWindow);
        let mut state = State::Fresh;
        let mut now = start;
        let mut counted = 0;
        for &(gap, cost, debit) in &ops {
            now += gap;
            counted += apply(&rule, &mut state, now, cost, debit).0;
        }
        let per = rule.period_ms();
        let span = now - start;
        let bound = match rule.algorithm() {
            Algorithm::FixedWindow => rule.limit() * (span / per + 2) + rule.max_debt(),
            Algorithm::SlidingLog => (rule.limit() + rule.max_debt()) * (span / per + 1),
            _ => rule.capacity() + rule.max_debt() + (rule.limit() * span).div_ceil(per),
        };
        prop_assert!(counted <= bound, "counted {counted} > {bound} over {span}ms");
    }

    /// A debit never leaves more than `max_debt` owing: after any mix of
    /// decisions and debits, debiting everything the bucket could ever
    /// owe and more forgives the excess, and a debit after that is
    /// forgiven entirely.
    #[test]
    fn a_debit_owes_at_most_max_debt((rule, start, ops) in case()) {
        let mut state = State::Fresh;
        let mut now = start;
        let deepest = rule.capacity() + rule.max_debt();
        for &(gap, cost, debit) in &ops {
            now += gap;
            apply(&rule, &mut state, now, cost, debit);
            let mut deepened = state.clone();
            let Debit { step, forgiven } = rule.debit(&deepened, now, deepest + 7);
            prop_assert!(forgiven >= 7, "forgave {forgiven} of {} from {state:?}", deepest + 7);
            rule.commit(&mut deepened, step);
            let Debit { forgiven, .. } = rule.debit(&deepened, now, 3);
            prop_assert_eq!(forgiven, 3, "owed beyond max_debt from {:?}", state);
        }
    }
}

#[test]
fn a_debit_past_the_limit_denies_until_it_is_repaid() {
    // 10 per second, owing up to 10: 15 units debited at once from a fresh
    // bucket owe 5 beyond the burst, so the next unit waits 600 ms on gcra
    // and token_bucket, and on a window the next window repays 10.
    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
        let rule = Rule::new(algorithm, 10, 1_000, None, false).unwrap();
        let Debit { step, forgiven } = rule.debit(&State::Fresh, 0, 15);
        assert_eq!(forgiven, 0);
        let mut state = State::Fresh;
        rule.commit(&mut state, step);
        let (denied, _) = rule.decide(&state, 0, 1);
        assert!(!denied.allowed, "{algorithm}");
        assert_eq!(denied.retry_after_ms, 600, "{algorithm}");
        assert_eq!(denied.remaining, 0, "{algorithm}");
        assert!(rule.decide(&state, 600, 1).0.allowed, "{algorithm}");
    }
    let rule = Rule::new(Algorithm::FixedWindow, 10, 1_000, None, true).unwrap();
    let mut state = State::Fresh;
    let Debit { step, forgiven } = rule.debit(&state, 500, 18);
    assert_eq!(forgiven, 0);
    rule.commit(&mut state, step);
    // 18 counted: the next window starts owing 8, the one after nothing.
    let (denied, _) = rule.decide(&state, 500, 6);
    assert_eq!(denied.retry_after_ms, 1_500);
    assert_eq!(denied.reset_after_ms, 1_500);
    assert!(rule.decide(&state, 1_000, 2).0.allowed);
    assert!(!rule.decide(&state, 1_999, 3).0.allowed);
    assert!(rule.decide(&state, 2_000, 10).0.allowed);
    // max_debt 0: a debit fills the bucket and forgives the rest.
    let rule = rule.with_max_debt(0).unwrap();
    let Debit { step, forgiven } = rule.debit(&State::Fresh, 500, 25);
    assert_eq!(forgiven, 15);
    assert!(matches!(step, Step::Replace(_)));
}
