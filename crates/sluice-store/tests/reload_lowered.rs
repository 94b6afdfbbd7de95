//! A reload that lowers a limit never locks a tenant out for longer than
//! the new rule's own period: what was used under the old rule is not
//! read as debt to repay at the new rate. On the memory store, Redis and
//! Redis Cluster, with one hand-set clock.
//!
//! The case of the report: 1200 per minute, 600 used, then 50 per 10 s.
//! The window algorithms read the 600 as debt and refused for 65 to over
//! 117 s (Retry-After 96–117 s).

use std::sync::Arc;
use std::time::Duration;

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{
    Clock, ClusterStore, ConnectOptions, KeySet, Limiter, LimiterOptions, ManualClock, MemoryStore,
    RedisStore, Store, TimeSource,
};
use sluice_testkit::{RedisCluster, RedisServer};

const START_MS: u64 = 1_764_460_800_000;

/// Every algorithm a reload can lower, as (name, extra YAML).
const ALGORITHMS: [(&str, &str); 6] = [
    ("fixed_window", ""),
    ("fixed_window", ", aligned: true"),
    ("sliding_window", ""),
    ("sliding_log", ""),
    ("gcra", ""),
    ("token_bucket", ""),
];

fn policy(algorithm: &str, extra: &str, limit: u64, per: &str) -> Policy {
    let yaml = format!(
        "default_plan: p\nplans:\n  p:\n    tenant: [{{ name: t, algorithm: {algorithm}, limit: {limit}, per: {per}{extra} }}]\n"
    );
    Policy::compile(&Config::from_yaml(&yaml, "reload.yaml").unwrap().limits)
}

fn keys() -> KeySet {
    KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'r'; 32]).unwrap()),
        previous: None,
    }
}

/// Uses 600 of 1200 per minute over 30 s, lowers the rule to 50 per 10 s,
/// and answers how long until a request passes, and the Retry-After the
/// first denial gave.
async fn locked_out<S: Store>(store: S, clock: &Arc<ManualClock>, case: usize) -> (u64, u64) {
    let (algorithm, extra) = ALGORITHMS[case];
    let mut options = LimiterOptions::new(OnError::Deny);
    options.clock = clock.clone();
    let limiter = Limiter::with_options(policy(algorithm, extra, 1_200, "1m"), store, options);
    let tenant = format!("tenant-{case}");
    let request = |cost| Request::new(&tenant, "GET /", None, cost).unwrap();
    let old = limiter.policy();
    for _ in 0..30 {
        assert!(limiter.decide(&old, &request(20)).await.allowed);
        clock.advance(1_000);
    }
    limiter.set_policy(policy(algorithm, extra, 50, "10s"));
    let new = limiter.policy();
    let reloaded = clock.now_ms();
    let mut retry_after = None;
    loop {
        let decision = limiter.decide(&new, &request(1)).await;
        if decision.allowed {
            return (clock.now_ms() - reloaded, retry_after.unwrap_or(0));
        }
        retry_after.get_or_insert(decision.retry_after_ms().unwrap_or(0));
        assert!(
            clock.now_ms() - reloaded < 300_000,
            "{algorithm}{extra}: still refused 5 minutes after the reload"
        );
        clock.advance(250);
    }
}

async fn every_algorithm<S: Store>(mut store: impl FnMut(&Arc<ManualClock>) -> S) {
    for (case, (algorithm, extra)) in ALGORITHMS.iter().enumerate() {
        let clock = Arc::new(ManualClock::new(START_MS));
        let (waited, retry_after) = locked_out(store(&clock), &clock, case).await;
        assert!(
            waited <= 10_000 && retry_after <= 10_000,
            "{algorithm}{extra}: refused {waited} ms after the reload (Retry-After {retry_after} ms), longer than the new rule's 10 s"
        );
    }
}

#[tokio::test]
async fn a_lowered_limit_locks_out_for_at_most_its_period_in_memory() {
    every_algorithm(|clock| MemoryStore::with_clock(10_000, clock.clone())).await;
}

#[tokio::test]
async fn a_lowered_limit_locks_out_for_at_most_its_period_on_redis() {
    let server = RedisServer::start();
    let options = ConnectOptions::with_timeout(Duration::from_secs(5));
    let mut stores = Vec::new();
    for _ in 0..ALGORITHMS.len() {
        stores.push(
            RedisStore::connect(&server.url(), keys(), &options)
                .await
                .unwrap(),
        );
    }
    every_algorithm(|clock| {
        let store = stores.pop().expect("a store per algorithm");
        store.with_time(TimeSource::Client(clock.clone()))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_limit_locks_out_for_at_most_its_period_on_redis_cluster() {
    let cluster = RedisCluster::start(3, 1);
    let options = ConnectOptions::with_timeout(Duration::from_secs(5));
    let urls = cluster.urls();
    let mut stores = Vec::new();
    for _ in 0..ALGORITHMS.len() {
        let store = ClusterStore::connect(&urls, keys(), &options, 1);
        stores.push(store.await.unwrap());
    }
    every_algorithm(|clock| {
        let store = stores.pop().expect("a store per algorithm");
        store.with_time(TimeSource::Client(clock.clone()))
    })
    .await;
}
