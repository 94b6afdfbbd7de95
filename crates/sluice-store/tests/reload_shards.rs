//! A reload that changes a sharded tenant's shards while a reservation is
//! held, on Redis Cluster: a settle never gives back to a key the
//! reservation did not take from (that would erase other requests' usage
//! and admit past the limit); what it holds is then not known, and its
//! estimate stands. (Found by a hostile review of per-slot give-back
//! times.)

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{
    Clock, ClusterStore, ConnectOptions, KeySet, Limiter, LimiterOptions, TimeSource,
};
use sluice_testkit::RedisCluster;

fn keys() -> KeySet {
    KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'v'; 32]).unwrap()),
        previous: None,
    }
}

async fn store(cluster: &RedisCluster) -> ClusterStore {
    ClusterStore::connect(
        &cluster.urls(),
        keys(),
        &ConnectOptions::with_timeout(Duration::from_secs(5)),
        1,
    )
    .await
    .unwrap()
}

/// How many of `n` requests `tenant` is admitted now.
async fn admitted(limiter: &Limiter<ClusterStore>, tenant: &str, n: usize) -> usize {
    let mut passed = 0;
    for _ in 0..n {
        let policy = limiter.policy();
        let request = Request::new(tenant, "GET /", None, 1).unwrap();
        passed += usize::from(limiter.decide(&policy, &request).await.allowed);
    }
    passed
}

/// Tenant `acme` of `shards` shards: `tokens` divided; `calls` (3 a
/// minute) divided at 3 shards (1 each), kept whole on shard 0 at 4.
fn calls(shards: u16) -> Policy {
    let yaml = format!(
        "default_plan: p\nplans:\n  p:\n    tenant:\n      - {{ name: tokens, algorithm: fixed_window, limit: 600, per: 1m }}\n      - {{ name: calls, algorithm: fixed_window, limit: 3, per: 1m }}\ntenants:\n  acme: {{ plan: p, shards: {shards} }}\n"
    );
    Policy::compile_for(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits, true)
}

/// A reservation admitted on shard 1 while `calls` was divided, settled
/// at 0 after a reload that keeps `calls` whole on shard 0: its unit was
/// taken from shard 1's `calls`; given to shard 0's, which counts the
/// first request, the window would admit 4 of 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_after_a_reload_never_gives_back_where_it_did_not_take() {
    let cluster = RedisCluster::start(3, 0);
    let limiter = Limiter::with_options(
        calls(3),
        store(&cluster).await,
        LimiterOptions::new(OnError::Deny),
    );
    let request = Request::new("acme", "GET /", None, 1).unwrap();
    let policy = limiter.policy();
    // The first decision takes shard 0 (its `calls` share, 1), the
    // reservation shard 1.
    assert!(limiter.decide(&policy, &request).await.allowed);
    let decision = limiter.decide(&policy, &request).await;
    let reservation = limiter.reserve(&policy, &request, &decision).unwrap();
    assert_eq!(reservation.shard, 1);

    limiter.set_policy(calls(4));
    // `calls` whole on shard 0 holds the first decision's unit: 2 more.
    let before = admitted(&limiter, "acme", 5).await;
    let policy = limiter.policy();
    limiter
        .settle(&policy, &reservation, 0, 60_000)
        .await
        .unwrap();
    let after = admitted(&limiter, "acme", 5).await;
    assert_eq!(
        (before, after),
        (2, 0),
        "`calls` (3 a minute, whole on shard 0) admitted before and after the settle at 0"
    );
}

/// The store's clock: every read 7 ms after the one before, so that the
/// two slot calls of one decision are dated apart (as a node answering
/// late, or another node's clock, dates them).
struct Ticking(AtomicU64);

impl Clock for Ticking {
    fn now_ms(&self) -> u64 {
        self.0.fetch_add(7, Ordering::SeqCst)
    }
}

/// Tenants t0..t9 of `shards` shards: `tokens` divided, `calls` (2 a
/// minute, sliding_log) kept whole on shard 0.
fn kept_whole(shards: u16) -> Policy {
    let mut yaml = "default_plan: p\nplans:\n  p:\n    tenant:\n      - { name: tokens, algorithm: sliding_log, limit: 60, per: 1m }\n      - { name: calls, algorithm: sliding_log, limit: 2, per: 1m }\ntenants:\n".to_owned();
    for i in 0..10 {
        yaml += &format!("  t{i}: {{ plan: p, shards: {shards} }}\n");
    }
    Policy::compile_for(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits, true)
}

/// Reservations admitted off shard 0 (their `calls` entry in shard 0's
/// slot, dated apart): settled at 0, `calls` gets its unit back, found
/// by its own slot's time; after a reload that lowered the tenant's
/// shards the estimate stands (never given back at a wrong time or to a
/// wrong key).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_whole_entry_is_given_back_at_its_slots_time_and_not_after_a_reshard() {
    let cluster = RedisCluster::start(3, 0);
    let clock = Arc::new(Ticking(AtomicU64::new(1_764_460_800_000)));
    let store = store(&cluster)
        .await
        .with_time(TimeSource::Client(clock.clone()));
    let limiter = Limiter::with_options(kept_whole(3), store, LimiterOptions::new(OnError::Deny));
    let mut off_zero = Vec::new();
    for i in 0..10 {
        let tenant = format!("t{i}");
        let policy = limiter.policy();
        let request = Request::new(&tenant, "GET /", None, 1).unwrap();
        let decision = limiter.decide(&policy, &request).await;
        assert!(decision.allowed);
        let reservation = limiter.reserve(&policy, &request, &decision).unwrap();
        if reservation.shard != 0 {
            assert_ne!(
                reservation.first_shard_admitted_ms, reservation.admitted_ms,
                "the two slots were dated apart"
            );
            off_zero.push((tenant, reservation));
        }
        if off_zero.len() == 2 {
            break;
        }
    }
    assert_eq!(off_zero.len(), 2, "two reservations off shard 0");
    let policy = limiter.policy();
    limiter
        .settle(&policy, &off_zero[0].1, 0, 60_000)
        .await
        .unwrap();
    assert_eq!(admitted(&limiter, &off_zero[0].0, 3).await, 2, "given back");

    limiter.set_policy(kept_whole(1));
    let policy = limiter.policy();
    limiter
        .settle(&policy, &off_zero[1].1, 0, 60_000)
        .await
        .unwrap();
    assert_eq!(
        admitted(&limiter, &off_zero[1].0, 3).await,
        1,
        "after the reshard the estimate stands"
    );
}
