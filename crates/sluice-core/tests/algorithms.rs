//! Property tests of every algorithm under random costs and timings.
//!
//! Each case drives one rule through a random sequence of requests, commits
//! every admission, and then checks the admitted units against the
//! algorithm's documented bound over every span.

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use sluice_core::algorithm::{Outcome, State};
use sluice_core::{Algorithm, Rule};

/// A rule with small parameters, so that limits are actually reached.
fn rule_strategy(algorithm: Algorithm) -> impl Strategy<Value = Rule> {
    let period = prop_oneof![1u64..=20, 100u64..=2_000, Just(1_000u64), Just(60_000u64)];
    (1u64..=20, period, 0u64..=10, any::<bool>()).prop_map(move |(limit, per, extra, aligned)| {
        let burst = algorithm.has_burst().then_some(i128::from(limit + extra));
        let aligned = aligned && algorithm == Algorithm::FixedWindow;
        Rule::new(algorithm, limit.into(), per, burst, aligned).expect("valid rule")
    })
}

/// Requests as (milliseconds since the previous one, cost), with gaps that
/// often land right at the rule's period boundaries.
fn requests(rule: Rule) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let per = rule.period_ms();
    let gap = prop_oneof![
        3 => Just(0u64),
        4 => 0u64..50,
        2 => 0u64..3_000,
        1 => Just(per - 1),
        1 => Just(per),
        1 => (1..=per.min(100)).prop_map(move |k| per / k),
    ];
    proptest::collection::vec((gap, 1..=rule.capacity() + 2), 1..200)
}

/// Runs the requests, returning (time, cost, outcome) for each.
fn run(rule: &Rule, start: u64, requests: &[(u64, u64)]) -> Vec<(u64, u64, Outcome)> {
    let mut state = State::Fresh;
    let mut now = start;
    let mut out = Vec::with_capacity(requests.len());
    for &(gap, cost) in requests {
        now += gap;
        let cost = cost.min(rule.capacity());
        let (outcome, step) = rule.decide(&state, now, cost);
        rule.commit(&mut state, step);
        out.push((now, cost, outcome));
    }
    out
}

fn admitted(trace: &[(u64, u64, Outcome)]) -> Vec<(u64, u64)> {
    trace
        .iter()
        .filter(|(_, _, o)| o.allowed)
        .map(|&(t, c, _)| (t, c))
        .collect()
}

/// Units admitted in `[from, to)`.
fn units_between(admitted: &[(u64, u64)], from: u64, to: u64) -> u64 {
    admitted
        .iter()
        .filter(|(t, _)| *t >= from && *t < to)
        .map(|(_, c)| c)
        .sum()
}

fn start_time() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), 0u64..10_000, Just(1_764_500_000_000u64)]
}

fn exact_algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::Gcra),
        Just(Algorithm::TokenBucket),
        Just(Algorithm::SlidingLog),
        Just(Algorithm::FixedWindow),
    ]
}

fn any_algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![exact_algorithm(), Just(Algorithm::SlidingWindow)]
}

proptest! {
    // Failing cases are saved beside this file and committed, so that every
    // edge case ever found is replayed first on every run.
    #![proptest_config(ProptestConfig {
        cases: 400,
        max_shrink_time: 20_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    /// gcra and token_bucket: over any span of `d` ms, at most
    /// `burst + ⌊d·limit/per⌋` units — so at most `limit + burst` per `per`.
    #[test]
    fn rate_algorithms_never_exceed_burst_plus_rate(
        (rule, start, reqs) in prop_oneof![Just(Algorithm::Gcra), Just(Algorithm::TokenBucket)]
            .prop_flat_map(rule_strategy)
            .prop_flat_map(|r| (Just(r), start_time(), requests(r)))
    ) {
        let admitted = admitted(&run(&rule, start, &reqs));
        for (i, &(a, _)) in admitted.iter().enumerate() {
            let mut units = 0;
            for &(b, cost) in &admitted[i..] {
                units += cost;
                let allowance = rule.burst() + (b - a) * rule.limit() / rule.period_ms();
                prop_assert!(units <= allowance,
                    "{units} units in [{a}, {b}] > burst {} + rate allowance", rule.burst());
            }
        }
    }

    /// sliding_log: at most `limit` units in any span of `per`.
    #[test]
    fn sliding_log_is_exact_over_every_span(
        (rule, start, reqs) in rule_strategy(Algorithm::SlidingLog)
            .prop_flat_map(|r| (Just(r), start_time(), requests(r)))
    ) {
        let admitted = admitted(&run(&rule, start, &reqs));
        for &(a, _) in &admitted {
            let units = units_between(&admitted, a, a + rule.period_ms());
            prop_assert!(units <= rule.limit(), "{units} units in [{a}, +per) > {}", rule.limit());
        }
    }

    /// fixed_window: at most `limit` units in each window, where windows are
    /// aligned to the epoch or open with the first request after the last
    /// one closed.
    #[test]
    fn fixed_window_is_exact_per_window(
        (rule, start, reqs) in rule_strategy(Algorithm::FixedWindow)
            .prop_flat_map(|r| (Just(r), start_time(), requests(r)))
    ) {
        let per = rule.period_ms();
        let admitted = admitted(&run(&rule, start, &reqs));
        let mut window_start: Option<u64> = None;
        for &(t, _) in &admitted {
            let opens = if rule.aligned() {
                Some(t - t % per)
            } else {
                match window_start {
                    Some(s) if t < s + per => None,
                    _ => Some(t),
                }
            };
            if let Some(s) = opens.filter(|s| Some(*s) != window_start) {
                window_start = Some(s);
                let units = units_between(&admitted, s, s + per);
                prop_assert!(units <= rule.limit(), "{units} units in window at {s} > {}", rule.limit());
            }
        }
    }

    /// sliding_window: at most `limit` per aligned window, and under the
    /// documented bound of `2·limit` over any span of `per`.
    #[test]
    fn sliding_window_stays_within_its_error_bound(
        (rule, start, reqs) in rule_strategy(Algorithm::SlidingWindow)
            .prop_flat_map(|r| (Just(r), start_time(), requests(r)))
    ) {
        let per = rule.period_ms();
        let admitted = admitted(&run(&rule, start, &reqs));
        for &(t, _) in &admitted {
            let aligned = t - t % per;
            prop_assert!(units_between(&admitted, aligned, aligned + per) <= rule.limit());
            prop_assert!(units_between(&admitted, t, t + per) < 2 * rule.limit());
        }
    }

    /// A denied request passes exactly `retry_after_ms` later, not a
    /// millisecond before (rounded up, never early, never needlessly late).
    #[test]
    fn retry_after_is_exact(
        (rule, start, reqs) in any_algorithm()
            .prop_flat_map(rule_strategy)
            .prop_flat_map(|r| (Just(r), start_time(), requests(r)))
    ) {
        let mut state = State::Fresh;
        let mut now = start;
        for &(gap, cost) in &reqs {
            now += gap;
            let cost = cost.min(rule.capacity());
            let (outcome, step) = rule.decide(&state, now, cost);
            if !outcome.allowed {
                let retry = outcome.retry_after_ms;
                prop_assert!(retry >= 1);
                let (later, _) = rule.decide(&state, now + retry, cost);
                prop_assert!(later.allowed, "denied again at +{retry}ms: {later:?}");
                let (earlier, _) = rule.decide(&state, now + retry - 1, cost);
                prop_assert!(!earlier.allowed, "already allowed at +{}ms", retry - 1);
            }
            rule.commit(&mut state, step);
        }
    }

    /// `remaining` is exactly what can still be consumed at the same moment.
    #[test]
    fn remaining_is_exactly_what_still_passes(
        (rule, start, reqs) in any_algorithm()
            .prop_flat_map(rule_strategy)
            .prop_flat_map(|r| (Just(r), start_time(), requests(r)))
    ) {
        let mut state = State::Fresh;
        let mut now = start;
        for &(gap, cost) in &reqs {
            now += gap;
            let cost = cost.min(rule.capacity());
            let (outcome, step) = rule.decide(&state, now, cost);
            rule.commit(&mut state, step);
            let left = u64::from(outcome.remaining);
            prop_assert!(left <= rule.capacity());
            if left >= 1 {
                prop_assert!(rule.decide(&state, now, left).0.allowed, "remaining {left} does not pass");
            }
            if left < rule.capacity() {
                prop_assert!(!rule.decide(&state, now, left + 1).0.allowed, "more than remaining {left} passes");
            }
        }
    }

    /// A state older than `idle_at` decides exactly like a fresh one, so
    /// stores may forget it.
    #[test]
    fn idle_state_is_fresh(
        (rule, start, reqs, cost) in any_algorithm()
            .prop_flat_map(rule_strategy)
            .prop_flat_map(|r| (Just(r), start_time(), requests(r), 1..=r.capacity()))
    ) {
        let mut state = State::Fresh;
        let mut now = start;
        for &(gap, c) in &reqs {
            now += gap;
            let (_, step) = rule.decide(&state, now, c.min(rule.capacity()));
            rule.commit(&mut state, step);
        }
        let idle = rule.idle_at(&state).max(now);
        let (stored, _) = rule.decide(&state, idle, cost);
        let (fresh, _) = rule.decide(&State::Fresh, idle, cost);
        prop_assert_eq!(stored, fresh);
    }
}

/// A clock that steps back an hour after a bucket was emptied: the bucket
/// stays empty (no budget granted by the step) and opens again within one
/// period of the new time (nobody locked out for the hour), for every
/// algorithm. The repair is written once, as the stores do, even when the
/// request is denied.
#[test]
fn a_clock_stepping_back_an_hour_neither_locks_out_nor_grants_budget() {
    const HOUR: u64 = 3_600_000;
    for algorithm in Algorithm::ALL {
        for aligned in [false, true] {
            if aligned && algorithm != Algorithm::FixedWindow {
                continue;
            }
            let burst = algorithm.has_burst().then_some(5);
            let rule = Rule::new(algorithm, 5, 1_000, burst, aligned).unwrap();
            let label = format!("{algorithm} aligned={aligned}");
            let mut state = State::Fresh;
            let t = 1_764_460_800_250;
            // A concurrency rule takes a lease per admission (never
            // released here).
            let leases = std::cell::Cell::new(0u128);
            let decide = |state: &mut State, now: u64| {
                if let Some(repaired) = rule.repair(state, now) {
                    *state = repaired;
                }
                leases.set(leases.get() + 1);
                let (outcome, step) = rule.decide_lease(state, now, 1, Some(leases.get()));
                rule.commit(state, step);
                outcome
            };
            let mut spent = 0;
            while decide(&mut state, t).allowed {
                spent += 1;
            }
            assert_eq!(spent, 5, "{label}");
            let back = t - HOUR;
            let first = decide(&mut state, back);
            assert!(!first.allowed, "{label}: the step granted budget");
            assert!(
                first.retry_after_ms <= 1_000,
                "{label}: retry {} ms after the step",
                first.retry_after_ms
            );
            // Within one period of the new time, requests pass again, and
            // never more than the rule's capacity over that period.
            let mut admitted = 0;
            for ms in (back..=back + 1_000).step_by(10) {
                admitted += u64::from(decide(&mut state, ms).allowed);
            }
            assert!(admitted >= 1, "{label}: locked out after the step");
            assert!(admitted <= 5, "{label}: {admitted} admitted in one period");
        }
    }
}

/// A clock that steps forward and back again leaves every state readable:
/// deciding on a repaired state is deciding on the state.
#[test]
fn deciding_repairs_what_it_reads() {
    for algorithm in Algorithm::ALL {
        let rule = Rule::new(algorithm, 4, 500, algorithm.has_burst().then_some(6), false).unwrap();
        let mut state = State::Fresh;
        let t = 1_764_460_800_000;
        for (i, now) in [t, t + 3_600_000, t + 3_600_010, t + 5, t + 7, t + 9]
            .into_iter()
            .enumerate()
        {
            let lease = Some(i as u128);
            let direct = rule.decide_lease(&state, now, 1, lease);
            let repaired = rule.repair(&state, now).unwrap_or_else(|| state.clone());
            let (outcome, _) = rule.decide_lease(&repaired, now, 1, lease);
            assert_eq!(direct.0, outcome, "{algorithm} step {i}");
            rule.commit(&mut state, direct.1);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 300,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    /// A single rule decided in place (`admit_repaired_lease`, the memory
    /// store's one-rule path) answers and stores exactly what deciding and
    /// committing the step does, whatever the algorithm, the costs, the
    /// leases and a clock that also steps back.
    #[test]
    fn admitting_in_place_is_deciding_then_committing(
        (rule, start, reqs, back) in any_algorithm_or_concurrency()
            .prop_flat_map(rule_strategy)
            .prop_flat_map(|r| (Just(r), start_time(), requests(r), proptest::collection::vec(any::<bool>(), 200)))
    ) {
        let mut by_step = State::Fresh;
        let mut in_place = State::Fresh;
        let mut now = start + 10_000;
        for (i, &(gap, cost)) in reqs.iter().enumerate() {
            // Now and then the clock steps back by up to ten seconds.
            now = if back[i] && i % 3 == 0 { now.saturating_sub(gap.min(10_000)) } else { now + gap };
            let cost = cost.min(rule.capacity());
            let lease = Some(i as u128);
            if let Some(repaired) = rule.repair(&by_step, now) {
                by_step = repaired;
            }
            if let Some(repaired) = rule.repair(&in_place, now) {
                in_place = repaired;
            }
            let (expected, step) = rule.decide_repaired_lease(&by_step, now, cost, lease);
            if expected.allowed {
                rule.commit(&mut by_step, step);
            }
            let outcome = rule.admit_repaired_lease(&mut in_place, now, cost, lease);
            prop_assert_eq!(outcome, expected, "request {}", i);
            prop_assert_eq!(&in_place, &by_step, "state after request {}", i);
        }
    }
}

fn any_algorithm_or_concurrency() -> impl Strategy<Value = Algorithm> {
    prop_oneof![any_algorithm(), Just(Algorithm::Concurrency)]
}
