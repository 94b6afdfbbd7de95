//! The adjustment script (`adjust.lua`) held to its Rust twins
//! (`Rule::debit`, `Rule::refund`, the memory store's markers): random
//! decisions, debits past the limit, give-backs and settle markers, on
//! every algorithm with a random `max_debt`, against a real Redis and the
//! memory store on one hand-driven clock; every answer must be identical,
//! and so must every decision after.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Algorithm, Config, Policy};
use sluice_store::{
    Batch, Change, Clock, ConnectOptions, KeySet, ManualClock, Marker, MemoryStore, RedisStore,
    Store, TimeSource,
};
use sluice_testkit::RedisServer;

/// A rule in YAML: algorithm, limit, per (ms), burst, aligned, max_debt.
fn rule() -> impl Strategy<Value = String> {
    let algorithm = prop_oneof![
        Just(Algorithm::Gcra),
        Just(Algorithm::TokenBucket),
        Just(Algorithm::SlidingLog),
        Just(Algorithm::SlidingWindow),
        Just(Algorithm::FixedWindow),
        Just(Algorithm::Concurrency),
    ];
    let per = prop_oneof![1u64..=30, 100u64..=2_000, Just(1_000u64)];
    (
        algorithm,
        1u64..=12,
        per,
        0u64..=6,
        any::<bool>(),
        prop::option::of(0u64..=30),
    )
        .prop_map(|(a, limit, per, extra, aligned, debt)| {
            if a == Algorithm::Concurrency {
                return format!("{{ algorithm: concurrency, limit: {limit}, lease: {per}ms }}");
            }
            let mut s = format!("{{ algorithm: {}, limit: {limit}, per: {per}ms", a.name());
            if a.has_burst() {
                s.push_str(&format!(", burst: {}", limit + extra));
            }
            if aligned && a == Algorithm::FixedWindow {
                s.push_str(", aligned: true");
            }
            if let Some(debt) = debt {
                s.push_str(&format!(", max_debt: {debt}"));
            }
            s.push_str(" }");
            s
        })
}

#[derive(Debug, Clone, Copy)]
enum Step {
    Decide,
    Debit,
    /// Give back part of an admission still open (the one picked, modulo
    /// their number), naming when each rule would have refilled or not:
    /// what it returns depends on the time since, and on give-backs made
    /// in between.
    GiveBack(u8, bool),
    /// A debit under a settle marker: a new one, the same one again, or
    /// the same id with another value.
    Settle(u8),
    Back,
    Forward,
}

fn steps() -> impl Strategy<Value = Vec<(u64, u64, bool, Step)>> {
    let gap = prop_oneof![3 => Just(0u64), 4 => 0u64..40, 2 => 0u64..2_500, 1 => Just(1_000u64)];
    let step = prop_oneof![
        6 => Just(Step::Decide),
        4 => Just(Step::Debit),
        3 => (any::<u8>(), any::<bool>()).prop_map(|(pick, whole)| Step::GiveBack(pick, whole)),
        2 => (0u8..3).prop_map(Step::Settle),
        1 => Just(Step::Back),
        1 => Just(Step::Forward),
    ];
    proptest::collection::vec((gap, 1u64..=40, any::<bool>(), step), 1..50)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 160,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn redis_and_memory_adjust_identically(
        tenant in proptest::collection::vec(rule(), 1..=2),
        subject in rule(),
        start in prop_oneof![Just(1_764_460_800_000u64), 1_700_000_000_000u64..1_800_000_000_000],
        steps in steps(),
    ) {
        let yaml = format!(
            "default_plan: p\nplans:\n  p:\n    tenant: [{}]\n    subject:\n      \"*\": [{subject}]\n",
            tenant.join(", ")
        );
        let config = Config::from_yaml(&yaml, "adjust.yaml").unwrap();
        let policy = Policy::compile(&config.limits);
        let server = RedisServer::start();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let clock = Arc::new(ManualClock::new(start));
        let memory = MemoryStore::with_clock(10_000, clock.clone());
        let keys = KeySet {
            current: Keyer::new("sl", &Pepper::parse(&[42u8; 32]).unwrap()),
            previous: None,
        };
        let redis = runtime
            .block_on(RedisStore::connect(&server.url(), keys, &ConnectOptions::with_timeout(Duration::from_secs(5))))
            .unwrap()
            .with_time(TimeSource::Client(clock.clone()));
        // Admissions not yet given back: when, their cost, with the
        // subject or not, and per rule when it would have refilled.
        let mut admitted: Vec<(u64, u64, bool, Vec<u64>)> = Vec::new();
        let mut whole_at = Vec::new();
        let mut settles = 0u8;
        for (i, (gap, cost, with_subject, step)) in steps.into_iter().enumerate() {
            clock.advance(gap);
            let applicable = policy.applicable("tenant-a", "GET /x", with_subject);
            let subject = with_subject.then_some("user-1");
            let (change, cost, marker) = match step {
                Step::Back => { clock.set(clock.now_ms() - 3_600_000); continue; }
                Step::Forward => { clock.advance(3_600_000); continue; }
                Step::Decide => {
                    if cost > applicable.max_cost { continue; }
                    let batch = Batch::new("tenant-a", subject, cost, applicable.rules);
                    let expected = memory.decide_now(&batch).unwrap();
                    let actual = runtime.block_on(redis.decide(&batch)).unwrap().outcomes;
                    prop_assert_eq!(expected.as_slice(), actual.as_slice(), "step {} decide at {}: {}", i, clock.now_ms(), yaml);
                    if expected.iter().all(|o| o.allowed) {
                        let now = clock.now_ms();
                        let whole = expected.iter().map(|o| now + o.reset_after_ms).collect();
                        admitted.push((now, cost, with_subject, whole));
                    }
                    continue;
                }
                Step::Debit => (Change::Debit, cost, None),
                Step::GiveBack(pick, whole) => {
                    let open: Vec<usize> = (0..admitted.len()).filter(|&k| admitted[k].2 == with_subject).collect();
                    if open.is_empty() { continue; }
                    let (at, spent, _, whole_of) = admitted.remove(open[usize::from(pick) % open.len()]);
                    whole_at = if whole { whole_of } else { Vec::new() };
                    (Change::GiveBack { at }, 1 + cost % spent, None)
                }
                Step::Settle(kind) => {
                    if kind == 0 { settles += 1; }
                    let value = if kind == 2 { "other".to_owned() } else { format!("c={cost}") };
                    let marker = Marker { id: [settles; 16], value, ttl_ms: 30 * 86_400_000, shard: 0 };
                    (Change::Debit, cost, Some(marker))
                }
            };
            let batch = Batch {
                whole_at: &whole_at,
                ..Batch::new("tenant-a", subject, cost, applicable.rules)
            };
            let expected = memory.adjust_now(&batch, change, marker.as_ref()).unwrap();
            let actual = runtime.block_on(redis.adjust(&batch, change, marker.as_ref())).unwrap();
            prop_assert_eq!(expected.marker, actual.marker, "step {} {:?} marker", i, step);
            prop_assert_eq!(expected.forgiven, actual.forgiven, "step {} {:?} forgiven: {}", i, step, yaml);
            prop_assert_eq!(
                expected.outcomes.as_slice(),
                actual.outcomes.as_slice(),
                "step {} {:?} cost {} at {}: {}",
                i, step, cost, clock.now_ms(), yaml
            );
        }
    }
}
