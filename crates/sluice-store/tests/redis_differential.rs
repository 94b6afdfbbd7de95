//! The Lua script and the Rust engine give identical answers.
//!
//! Random sequences of (time step, cost, subject) run through the memory
//! store and a real Redis side by side, on the same injected clock; every
//! outcome of every rule — allowed, remaining, reset, retry — must match.
//! The sequences also step the clock an hour back or forward (a clock step,
//! a failover to a node whose clock differs) and refund admitted decisions
//! (what Redis Cluster does when a valve denies), so the Lua repair and
//! refund are held to their Rust twins (`Rule::repair`, `Rule::refund`);
//! concurrency rules take a lease at every admission and random earlier
//! leases are released, some twice (`Rule::release`); a route's duplicate
//! guard is decided with the other rules; rules near the
//! documented bounds and states left by another limit are covered too.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::rule::{
    CONCURRENCY_MAX_LIMIT, MAX_LEASE_MS, MAX_LIMIT, MAX_PERIOD_MS, MAX_SCALED,
    SLIDING_LOG_MAX_LIMIT,
};
use sluice_core::{Algorithm, Config, Policy, Rule};
use sluice_store::{
    Batch, Clock, ConnectOptions, KeySet, ManualClock, MemoryStore, RedisStore, Store, TimeSource,
};
use sluice_testkit::RedisServer;

fn rule_yaml(
    algorithm: Algorithm,
    limit: u64,
    per_ms: u64,
    burst: Option<u64>,
    aligned: bool,
) -> String {
    shadow_rule_yaml(algorithm, limit, per_ms, burst, aligned, false)
}

fn shadow_rule_yaml(
    algorithm: Algorithm,
    limit: u64,
    per_ms: u64,
    burst: Option<u64>,
    aligned: bool,
    shadow: bool,
) -> String {
    let window = if algorithm == Algorithm::Concurrency {
        "lease"
    } else {
        "per"
    };
    let mut s = format!(
        "{{ algorithm: {}, limit: {limit}, {window}: {per_ms}ms",
        algorithm.name()
    );
    if shadow {
        s.push_str(", shadow: true");
    }
    if let Some(b) = burst {
        s.push_str(&format!(", burst: {b}"));
    }
    if aligned {
        s.push_str(", aligned: true");
    }
    s.push_str(" }");
    s
}

fn any_algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::Gcra),
        Just(Algorithm::TokenBucket),
        Just(Algorithm::SlidingLog),
        Just(Algorithm::SlidingWindow),
        Just(Algorithm::FixedWindow),
        Just(Algorithm::Concurrency),
    ]
}

fn any_rule() -> impl Strategy<Value = (Algorithm, u64, u64, Option<u64>, bool)> {
    let per = prop_oneof![1u64..=30, 100u64..=3_000, Just(60_000u64)];
    let small = (any_algorithm(), 1u64..=12, per, 0u64..=6, any::<bool>()).prop_map(
        |(a, limit, per, extra, aligned)| {
            let burst = a.has_burst().then_some(limit + extra);
            (a, limit, per, burst, aligned && a == Algorithm::FixedWindow)
        },
    );
    // At the documented bounds: limit × per (and burst × per) at 2^52, the
    // longest period, sliding_log at its cap.
    let large = (any_algorithm(), any::<bool>(), any::<bool>()).prop_map(|(a, long, aligned)| {
        let (limit, per) = match (a, long) {
            (Algorithm::SlidingLog, false) => (SLIDING_LOG_MAX_LIMIT, 1_000),
            (Algorithm::SlidingLog, true) => (SLIDING_LOG_MAX_LIMIT, MAX_PERIOD_MS),
            (Algorithm::Concurrency, false) => (CONCURRENCY_MAX_LIMIT, 1_000),
            (Algorithm::Concurrency, true) => (CONCURRENCY_MAX_LIMIT, MAX_LEASE_MS),
            (_, false) => (MAX_LIMIT, MAX_SCALED / MAX_LIMIT),
            (_, true) => (MAX_SCALED / MAX_PERIOD_MS, MAX_PERIOD_MS),
        };
        let burst = a.has_burst().then_some(limit);
        (a, limit, per, burst, aligned && a == Algorithm::FixedWindow)
    });
    prop_oneof![6 => small, 1 => large]
}

/// What happens before a step's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    /// Nothing: time moves on by the gap.
    Tick,
    /// The clock steps back an hour.
    Back,
    /// The clock steps forward an hour.
    Forward,
    /// The previous decision, if every rule admitted it, is refunded.
    Refund,
    /// The lease of an earlier admitted decision is released (perhaps
    /// again).
    Release,
}

const HOUR: u64 = 3_600_000;

/// (gap, cost, with a subject, each rule its own cost, event).
fn steps() -> impl Strategy<Value = Vec<(u64, u64, bool, bool, Event)>> {
    let gap = prop_oneof![3 => Just(0u64), 4 => 0u64..40, 2 => 0u64..2_500, 1 => Just(1_000u64)];
    let event = prop_oneof![
        12 => Just(Event::Tick),
        1 => Just(Event::Back),
        1 => Just(Event::Forward),
        3 => Just(Event::Refund),
        3 => Just(Event::Release),
    ];
    proptest::collection::vec((gap, 1u64..=14, any::<bool>(), any::<bool>(), event), 1..60)
}

fn pepper() -> Pepper {
    Pepper::parse(&[42u8; 32]).unwrap()
}

/// A single-threaded runtime for the Redis store's calls.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A memory store and a Redis store on one hand-driven clock, so that the
/// same steps meet the same times.
fn paired(
    server: &RedisServer,
    runtime: &tokio::runtime::Runtime,
) -> (Arc<ManualClock>, MemoryStore, RedisStore) {
    let clock = Arc::new(ManualClock::new(1_764_460_800_123));
    let memory = MemoryStore::with_clock(1_000, clock.clone());
    let keys = KeySet {
        current: Keyer::new("sl", &pepper()),
        previous: None,
    };
    let redis = runtime
        .block_on(RedisStore::connect(
            &server.url(),
            keys,
            &ConnectOptions::with_timeout(Duration::from_secs(5)),
        ))
        .unwrap()
        .with_time(TimeSource::Client(clock.clone()));
    (clock, memory, redis)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 96,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn redis_and_memory_decide_identically(
        tenant_rules in proptest::collection::vec((any_rule(), proptest::bool::weighted(0.2)), 1..=2),
        subject_rule in any_rule(),
        dedupe_ms in prop::option::weighted(0.3, 10u64..=3_000),
        start in prop_oneof![Just(1_764_460_800_000u64), 1_700_000_000_000u64..1_800_000_000_000],
        steps in steps(),
    ) {
        let tenant: Vec<String> = tenant_rules
            .iter()
            .map(|&((a, l, p, b, al), shadow)| shadow_rule_yaml(a, l, p, b, al, shadow))
            .collect();
        let (a, l, p, b, al) = subject_rule;
        let mut yaml = format!(
            "default_plan: p\nplans:\n  p:\n    tenant: [{}]\n    subject:\n      \"*\": [{}]\n",
            tenant.join(", "),
            rule_yaml(a, l, p, b, al)
        );
        // The duplicate guard: its rule decided with the others.
        if let Some(ms) = dedupe_ms {
            yaml.push_str(&format!("    dedupe:\n      \"GET /x\": {{ window: {ms}ms }}\n"));
        }
        let config = Config::from_yaml(&yaml, "differential.yaml").unwrap();
        let policy = Policy::compile(&config.limits);

        let server = RedisServer::start();
        let runtime = runtime();
        let clock = Arc::new(ManualClock::new(start));
        let memory = MemoryStore::with_clock(10_000, clock.clone());
        let keys = KeySet { current: Keyer::new("sl", &pepper()), previous: None };
        let redis = runtime
            .block_on(RedisStore::connect(&server.url(), keys, &ConnectOptions::with_timeout(Duration::from_secs(5))))
            .unwrap()
            .with_time(TimeSource::Client(clock.clone()));

        // The last decision every rule admitted: (time, subject, cost,
        // costs, lease).
        let mut refundable: Option<(u64, bool, u64, Vec<u64>, u128)> = None;
        // Every lease taken: (id, with a subject).
        let mut leases: Vec<(u128, bool)> = Vec::new();
        for (i, (gap, cost, with_subject, each_own, event)) in steps.into_iter().enumerate() {
            clock.advance(gap);
            match event {
                Event::Tick => {}
                Event::Back => clock.set(clock.now_ms() - HOUR),
                Event::Forward => clock.advance(HOUR),
                Event::Refund => {
                    if let Some((at, with_subject, cost, costs, lease)) = refundable.take() {
                        let applicable = policy.applicable("tenant-a", "GET /x", with_subject);
                        let batch = Batch {
                            costs: &costs,
                            lease: Some(lease),
                            ..Batch::new("tenant-a", with_subject.then_some("user-1"), cost, applicable.rules)
                        };
                        let expected = memory.refund(&batch, at);
                        let actual = runtime.block_on(redis.refund(&batch, at)).unwrap();
                        prop_assert_eq!(expected, actual, "step {}: refund released", i);
                    }
                }
                Event::Release if !leases.is_empty() => {
                    let (lease, with_subject) = leases[gap as usize % leases.len()];
                    let applicable = policy.applicable("tenant-a", "GET /x", with_subject);
                    let rules: Vec<_> = applicable.rules.iter().filter(|r| r.rule().is_concurrency()).cloned().collect();
                    let batch = Batch {
                        lease: Some(lease),
                        ..Batch::new("tenant-a", with_subject.then_some("user-1"), 1, &rules)
                    };
                    let expected = memory.release_now(&batch);
                    let actual = runtime.block_on(redis.release(&batch)).unwrap();
                    prop_assert_eq!(expected, actual, "step {} at {}: released", i, clock.now_ms());
                }
                Event::Release => {}
            }
            let applicable = policy.applicable("tenant-a", "GET /x", with_subject);
            // Per-rule costs, each within its rule's capacity.
            let costs: Vec<u64> = if each_own {
                applicable.rules.iter().enumerate().map(|(j, r)| 1 + (cost + j as u64) % r.rule().capacity()).collect()
            } else {
                Vec::new()
            };
            if costs.is_empty() && cost > applicable.max_cost {
                continue;
            }
            let lease = (i as u128) << 64 | u128::from(start);
            let batch = Batch {
                costs: &costs,
                lease: Some(lease),
                ..Batch::new("tenant-a", with_subject.then_some("user-1"), cost, applicable.rules)
            };
            let expected = memory.decide_now(&batch).unwrap();
            let actual = runtime.block_on(redis.decide(&batch)).unwrap().outcomes;
            prop_assert_eq!(
                expected.as_slice(),
                actual.as_slice(),
                "step {} ({:?}) at {} cost {}: memory vs redis differ for {}",
                i,
                event,
                clock.now_ms(),
                cost,
                yaml
            );
            if expected.iter().all(|o| o.allowed) {
                refundable = Some((clock.now_ms(), with_subject, cost, costs.clone(), lease));
                leases.push((lease, with_subject));
            }
        }
    }
}

/// Every rule algorithm, including ones the random cases rarely reach:
/// a state under a changed limit, and long idle gaps.
#[test]
fn single_rules_match_over_long_runs() {
    let server = RedisServer::start();
    let runtime = runtime();
    for algorithm in Algorithm::ALL {
        let rule = Rule::new(algorithm, 7, 700, algorithm.has_burst().then_some(9), false).unwrap();
        let yaml = format!(
            "default_plan: p\nplans:\n  p:\n    tenant: [{}]\n",
            rule_yaml(
                algorithm,
                rule.limit(),
                rule.period_ms(),
                algorithm.has_burst().then_some(9),
                false
            )
        );
        let policy = Policy::compile(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits);
        let (clock, memory, redis) = paired(&server, &runtime);
        let rules = policy.applicable(algorithm.name(), "GET /", false).rules;
        for i in 0..400u64 {
            clock.advance([0, 13, 97, 1, 350, 0, 701][(i % 7) as usize]);
            let batch = Batch {
                lease: Some(u128::from(i)),
                ..Batch::new(algorithm.name(), None, 1 + i % 3, rules)
            };
            let expected = memory.decide_now(&batch).unwrap();
            let actual = runtime.block_on(redis.decide(&batch)).unwrap().outcomes;
            assert_eq!(
                expected.as_slice(),
                actual.as_slice(),
                "{algorithm} step {i}"
            );
        }
    }
}

/// Rules of one scope share a key, so one write carries every record that
/// changed: when a clock step back leaves a shadow rule's state ahead of
/// now, that rule denies with a repair while the enforced rule beside it
/// admits, and the repair must be written with the admission (otherwise
/// the next decision repairs again, later, and answers differently).
#[test]
fn a_shadow_rules_repair_is_written_with_the_admission_beside_it() {
    let server = RedisServer::start();
    let runtime = runtime();
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::TokenBucket,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
    ] {
        let yaml = format!(
            "default_plan: p\nplans:\n  p:\n    tenant: [{}, {}]\n",
            rule_yaml(Algorithm::TokenBucket, 1_000, 1_000, Some(1_000), false),
            shadow_rule_yaml(
                algorithm,
                2,
                HOUR,
                algorithm.has_burst().then_some(2),
                false,
                true
            )
        );
        let policy = Policy::compile(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits);
        let (clock, memory, redis) = paired(&server, &runtime);
        let rules = policy.applicable("tenant-s", "GET /", false).rules;
        let mut denied_with_repair = false;
        for (i, step) in [0, 1, 1, -1, 0, 600_000, 600_000, 1, 1_200_000, 0]
            .into_iter()
            .enumerate()
        {
            if step < 0 {
                clock.set(clock.now_ms() - HOUR);
            } else {
                clock.advance(step as u64);
            }
            let batch = Batch::new("tenant-s", None, 1, rules);
            let expected = memory.decide_now(&batch).unwrap();
            let actual = runtime.block_on(redis.decide(&batch)).unwrap().outcomes;
            assert_eq!(
                expected.as_slice(),
                actual.as_slice(),
                "{algorithm} step {i} at {}",
                clock.now_ms()
            );
            denied_with_repair |= step < 0 && expected[0].allowed && !expected[1].allowed;
        }
        assert!(denied_with_repair, "{algorithm}: the case never arose");
    }
}

/// A reload changes a rule's parameters but not its name: the bucket keeps
/// its key, so both engines read a state written under the old limit.
#[test]
fn states_written_under_another_limit_match() {
    let server = RedisServer::start();
    let runtime = runtime();
    let params = [
        (7u64, 700u64, 9u64),
        // Lowered under the same period: more held than the new limit.
        (2, 700, 3),
        (3, 250, 4),
        (12, 1_000, 20),
        (1, 60, 1),
    ];
    for algorithm in Algorithm::ALL {
        let (clock, memory, redis) = paired(&server, &runtime);
        for (round, (limit, per, burst)) in params.into_iter().cycle().take(10).enumerate() {
            let yaml = format!(
                "default_plan: p\nplans:\n  p:\n    tenant: [{{ name: same, algorithm: {}, limit: {limit}, {}: {per}ms{} }}]\n",
                algorithm.name(),
                if algorithm == Algorithm::Concurrency {
                    "lease"
                } else {
                    "per"
                },
                if algorithm.has_burst() {
                    format!(", burst: {burst}")
                } else {
                    String::new()
                }
            );
            let policy = Policy::compile(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits);
            let rules = policy.applicable("tenant-r", "GET /", false).rules;
            for i in 0..40u64 {
                clock.advance([0, 3, 41, 0, 170][(i % 5) as usize]);
                let cost = 1 + i % rules[0].rule().capacity().min(3);
                let batch = Batch {
                    lease: Some(u128::from(i) + 1_000 * round as u128),
                    ..Batch::new("tenant-r", None, cost, rules)
                };
                let expected = memory.decide_now(&batch).unwrap();
                let actual = runtime.block_on(redis.decide(&batch)).unwrap().outcomes;
                assert_eq!(
                    expected.as_slice(),
                    actual.as_slice(),
                    "{algorithm} round {round} ({limit}/{per}ms) step {i}"
                );
            }
        }
    }
}

/// The scripts' integer division (doubles inside Redis) against Rust's over
/// its whole domain (a + b < 2^53; sluice's values stay under 2^52):
/// divisors from 1 up, quotients just under, at and over whole numbers,
/// where a rounded division goes wrong.
#[test]
fn the_scripts_division_is_exact_up_to_the_bounds() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let mut pairs: Vec<(u64, u64)> = Vec::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..3_000 {
        let b = 1 + next() % (1 << (1 + next() % 40));
        let top = (1u64 << 53) - 1 - b;
        // Quotients near the top of the domain too, where they go wrong.
        let q = if next() % 2 == 0 {
            next() % (top / b + 1)
        } else {
            top / b - next() % (top / b / 1000 + 1)
        };
        for a in [q * b, (q * b).saturating_sub(1), q * b + 1, q * b + b - 1] {
            if a <= top {
                pairs.push((a, b));
            }
        }
    }
    pairs.extend([
        (MAX_SCALED, 1),
        (MAX_SCALED, 3),
        (MAX_SCALED - 1, MAX_SCALED),
        (0, 7),
    ]);
    let script = format!(
        "{}\nbind()\nlocal out = {{}}\nfor i = 1, #ARGV, 2 do out[#out + 1] = string.format('%d', idiv(tonumber(ARGV[i]), tonumber(ARGV[i + 1]))) end\nreturn out\n",
        sluice_store::redis::COMMON_LUA
    );
    for chunk in pairs.chunks(2_000) {
        let mut eval = redis::cmd("EVAL");
        eval.arg(&script).arg(0);
        for (a, b) in chunk {
            eval.arg(a).arg(b);
        }
        let got: Vec<String> = eval.query(&mut conn).unwrap();
        for ((a, b), q) in chunk.iter().zip(got) {
            assert_eq!(q, (a / b).to_string(), "{a} / {b}");
        }
    }
}

/// The expiry a Redis Function sends (common.lua's `expiry`): the text of
/// the ms rounded up to a multiple of 64, for every remainder and up to the
/// bound, from a cache that never holds more than 4096 texts, however many
/// expiries it meets; a script (no cache) sends the number itself, 1 at
/// the least.
#[test]
fn the_functions_expiry_rounds_up_to_64_ms_and_keeps_at_most_4096_texts() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let script = format!(
        "{}\nbind()\nlocal out = {{ tostring(expiry(0)), tostring(expiry(-5)), tostring(expiry(1)), tostring(expiry(777)) }}\n\
         px_text = {{ n = 0 }}\nlocal most = 0\n\
         for i = 1, #ARGV do\n  out[#out + 1] = expiry(tonumber(ARGV[i]))\n  if px_text.n > most then most = px_text.n end\nend\n\
         out[#out + 1] = tostring(most)\nreturn out\n",
        sluice_store::redis::COMMON_LUA
    );
    // Every remainder of 64 near 0, then 9,000 distinct multiples (more
    // than the cache keeps), then values near the largest state a rule
    // can have (2^52 ms is far beyond; a year is plenty).
    let mut ms: Vec<u64> = (0..200).collect();
    ms.extend((0..9_000u64).map(|i| 1_000 + 64 * i + i % 64));
    ms.extend((0..64u64).map(|i| 31_536_000_000 + i));
    let mut eval = redis::cmd("EVAL");
    eval.arg(&script).arg(0);
    for m in &ms {
        eval.arg(m);
    }
    let got: Vec<String> = eval.query(&mut conn).unwrap();
    assert_eq!(
        got[..4],
        ["1", "1", "1", "777"],
        "a script sends the number"
    );
    for (m, text) in ms.iter().zip(&got[4..]) {
        assert_eq!(
            *text,
            m.max(&1).div_ceil(64).max(1).saturating_mul(64).to_string(),
            "{m} ms"
        );
    }
    let most: usize = got.last().unwrap().parse().unwrap();
    assert!(
        (4_000..=4_096).contains(&most),
        "the cache held {most} texts"
    );
}
