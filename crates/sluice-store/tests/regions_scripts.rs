//! A `gcra` / `token_bucket` shared across regions (`shared_bucket`,
//! code 9) on a real redis-server, by function and by script (a Redis
//! without functions): the refund script, debit and give-back.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::config::{NamedRule, RegionScope};
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Algorithm, BoundRule, Rule, Scope};
use sluice_store::redis::regions::Regions;
use sluice_store::{
    Batch, Change, ConnectOptions, KeySet, ManualClock, RedisStore, Store, TimeSource,
};
use sluice_testkit::RedisServer;

const T0: u64 = 1_764_460_800_000 + 7;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A linked region "a" of three (even weights), as `sluice serve` makes
/// it: its keyer links regions (shared buckets named apart with their
/// per). `scripts`: a Redis user without FCALL.
fn region_a(
    server: &RedisServer,
    runtime: &tokio::runtime::Runtime,
    clock: Arc<ManualClock>,
    scripts: bool,
) -> RedisStore {
    let url = if scripts {
        server.scripts_only_url()
    } else {
        server.url()
    };
    let keys = KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[7u8; 32]).unwrap()).linking_regions(),
        previous: None,
    };
    let options = ConnectOptions::with_timeout(Duration::from_secs(5));
    let regions = Arc::new(Regions::new(&[("a", 1), ("b", 1), ("c", 1)], "a", 100).unwrap());
    runtime
        .block_on(RedisStore::connect(&url, keys, &options))
        .unwrap()
        .with_time(TimeSource::Client(clock))
        .with_regions(regions)
}

fn bucket(
    algorithm: Algorithm,
    (limit, per, burst, max_debt): (i128, u64, i128, i128),
) -> BoundRule {
    let rule = Rule::new(algorithm, limit, per, Some(burst), false)
        .unwrap()
        .with_max_debt(max_debt)
        .unwrap();
    let named = NamedRule {
        name: "rate".into(),
        rule,
        shadow: false,
        count_if: None,
        tolerance: sluice_core::tolerance::Tolerance::EXACT,
        regions: Some(RegionScope::Shared),
    };
    BoundRule::new(Scope::Tenant, "", &named, 0.8)
}

fn admitted(
    runtime: &tokio::runtime::Runtime,
    store: &RedisStore,
    rules: &[BoundRule],
    n: u32,
) -> u32 {
    (0..n)
        .filter(|_| {
            runtime
                .block_on(store.decide(&Batch::new("tenant", None, 1, rules)))
                .unwrap()
                .outcomes[0]
                .allowed
        })
        .count() as u32
}

/// The refund script (`RedisStore::refund`, Redis Cluster's give-back of
/// a tenant's rules when a valve denies) gives a shared bucket back at
/// most what the admission consumed, by function and by script alike.
#[test]
fn a_refund_of_a_shared_bucket_gives_back_what_it_took_by_script_too() {
    let mut seen = Vec::new();
    for scripts in [false, true] {
        for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket] {
            let server = RedisServer::start();
            let runtime = runtime();
            let clock = Arc::new(ManualClock::new(T0));
            let store = region_a(&server, &runtime, clock.clone(), scripts);
            let rules = [bucket(algorithm, (30, 1_000, 30, 0))];
            assert_eq!(admitted(&runtime, &store, &rules, 9), 9);
            let batch = Batch::new("tenant", None, 1, &rules);
            let last = runtime.block_on(store.decide(&batch)).unwrap();
            assert!(last.outcomes[0].allowed);
            assert_eq!(admitted(&runtime, &store, &rules, 5), 0, "spent");
            clock.set(T0 + 20);
            runtime.block_on(store.refund(&batch, last.at_ms)).unwrap();
            // 20 ms at 10/s refill 0.2 of a unit; one given back.
            let again = admitted(&runtime, &store, &rules, 5);
            assert_eq!(again, 1, "scripts {scripts} {algorithm:?}");
            // A refund of an admission of an earlier epoch gives nothing.
            clock.set(T0 + 20_000);
            assert_eq!(admitted(&runtime, &store, &rules, 50), 10);
            runtime.block_on(store.refund(&batch, last.at_ms)).unwrap();
            let after = admitted(&runtime, &store, &rules, 5);
            assert_eq!(
                after, 0,
                "scripts {scripts} {algorithm:?}: an old refund refilled"
            );
            seen.push((again, after));
        }
    }
    assert_eq!(seen[..2], seen[2..]);
}

/// Debit (`/v1/report`) and give-back (settle) of a shared bucket answer
/// alike by script and by function, and a debit owes at most max_debt.
#[test]
fn a_shared_buckets_debit_and_give_back_answer_alike_by_script() {
    let mut answers = Vec::new();
    for scripts in [false, true] {
        let server = RedisServer::start();
        let runtime = runtime();
        let clock = Arc::new(ManualClock::new(T0));
        let store = region_a(&server, &runtime, clock.clone(), scripts);
        let rules = [bucket(Algorithm::Gcra, (30, 1_000, 30, 6))];
        let mut seen = Vec::new();
        let batch = |cost| Batch::new("tenant", None, cost, &rules);
        // Debit 25 (10 held, 6 of debt at most: 9 forgiven).
        let d = runtime
            .block_on(store.adjust(&batch(25), Change::Debit, None))
            .unwrap();
        seen.push(("debit", d.forgiven, 0));
        assert_eq!(d.forgiven, 9, "scripts {scripts}: {d:?}");
        // Owing 6 at 10/s: nothing until 600 ms, then one per 100 ms.
        clock.set(T0 + 650);
        seen.push(("owing", u64::from(admitted(&runtime, &store, &rules, 5)), 0));
        clock.set(T0 + 2_000);
        let got = runtime.block_on(store.decide(&batch(3))).unwrap();
        assert!(got.outcomes[0].allowed);
        clock.set(T0 + 2_010);
        let g = runtime
            .block_on(store.adjust(
                &batch(3),
                Change::GiveBack {
                    at: got.at_ms,
                    first_shard_at: got.at_ms,
                },
                None,
            ))
            .unwrap();
        seen.push(("give back", g.forgiven, 0));
        seen.push((
            "after",
            u64::from(admitted(&runtime, &store, &rules, 50)),
            0,
        ));
        answers.push(seen);
    }
    println!("{answers:?}");
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0][1].1, 0, "owing 6, admitted at 650 ms");
}
