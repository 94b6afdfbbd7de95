//! Attempts on rules that count by outcome, on a real `redis-server` and a
//! real Redis Cluster, as a fleet of two instances runs them: fifty failed
//! logins at once let through no more than the rule's limit, and the
//! attempts that succeed are given back at once (adjust.lua's give-back,
//! parts of a unit included).

use std::sync::Arc;
use std::time::Duration;

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{ClusterStore, ConnectOptions, KeySet, Limiter, RedisStore, Store};
use sluice_testkit::{RedisCluster, RedisServer};

/// Five failed logins per 15 minutes per (IP, user), on `algorithm`.
fn policy(algorithm: &str) -> Policy {
    let yaml = format!(
        "default_plan: p\nplans:\n  p:\n    subject:\n      \"POST /login\":\n        - {{ name: failed-logins, algorithm: {algorithm}, limit: 5, per: 15m, count_if: {{ status: [401] }} }}\n"
    );
    Policy::compile_for(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits, true)
}

fn keys() -> KeySet {
    KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'w'; 32]).unwrap()),
        previous: None,
    }
}

fn login(user: &str) -> Request<'_> {
    Request::new("acme", "POST /login", Some(user), 1).unwrap()
}

const ALGORITHMS: [&str; 5] = [
    "gcra",
    "token_bucket",
    "fixed_window",
    "sliding_window",
    "sliding_log",
];

/// Fifty logins of `user` at once over both `instances`, concluded as
/// failures: how many were admitted; then whether a sixth passes.
async fn fifty_at_once<S: Store + 'static>(
    instances: &[Arc<Limiter<S>>; 2],
    user: &'static str,
) -> (usize, bool) {
    let mut checks = tokio::task::JoinSet::new();
    for i in 0..50 {
        let limiter = instances[i % 2].clone();
        checks.spawn(async move {
            let policy = limiter.policy();
            let decision = limiter.decide(&policy, &login(user)).await;
            limiter.attempt(&policy, &login(user), &decision)
        });
    }
    let attempts: Vec<_> = checks.join_all().await.into_iter().flatten().collect();
    for (i, attempt) in attempts.iter().enumerate() {
        let limiter = &instances[i % 2];
        let policy = limiter.policy();
        limiter
            .conclude_attempt(&policy, attempt, Some(401), 60_000)
            .await
            .unwrap();
    }
    let limiter = &instances[0];
    let policy = limiter.policy();
    let sixth = limiter.decide(&policy, &login(user)).await.allowed;
    (attempts.len(), sixth)
}

/// Ten rounds of five logins of `user` that succeed: each round passes
/// whole, the one before given back.
async fn successes_give_back<S: Store + 'static>(instances: &[Arc<Limiter<S>>; 2], user: &str) {
    for round in 0..10 {
        let mut attempts = Vec::new();
        for i in 0..5 {
            let limiter = &instances[i % 2];
            let policy = limiter.policy();
            let decision = limiter.decide(&policy, &login(user)).await;
            assert!(decision.allowed, "{user}: round {round}, login {i}");
            attempts.extend(limiter.attempt(&policy, &login(user), &decision));
        }
        for attempt in &attempts {
            let policy = instances[1].policy();
            instances[1]
                .conclude_attempt(&policy, attempt, Some(200), 60_000)
                .await
                .unwrap();
        }
        // Of five given back one after another, each keeps what its own
        // refill gave it meanwhile (a few ms of a unit's three minutes):
        // on gcra and token_bucket the next round waits that long.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Both cases on `algorithm` (the `n`th: users of their own, the store is
/// not emptied between algorithms).
async fn exercise<S: Store + 'static>(instances: [Arc<Limiter<S>>; 2], algorithm: &str, n: usize) {
    let failing: &'static str = Box::leak(format!("10.0.0.1|alice-{n}").into_boxed_str());
    let (admitted, sixth) = fifty_at_once(&instances, failing).await;
    assert_eq!((admitted, sixth), (5, false), "{algorithm}");
    successes_give_back(&instances, &format!("10.0.0.2|bob-{n}")).await;
}

fn limiter<S: Store>(store: S, algorithm: &str) -> Arc<Limiter<S>> {
    Arc::new(Limiter::new(policy(algorithm), store, OnError::Deny))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_failed_logins_at_once_let_five_through_on_redis() {
    let server = RedisServer::start();
    let (url, options) = (
        server.url(),
        ConnectOptions::with_timeout(Duration::from_secs(5)),
    );
    for (n, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let connect = || RedisStore::connect(&url, keys(), &options);
        let instances = [
            limiter(connect().await.unwrap(), algorithm),
            limiter(connect().await.unwrap(), algorithm),
        ];
        exercise(instances, algorithm, n).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_failed_logins_at_once_let_five_through_on_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let (urls, options) = (
        cluster.urls(),
        ConnectOptions::with_timeout(Duration::from_secs(5)),
    );
    for (n, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let connect = || ClusterStore::connect(&urls, keys(), &options, 1);
        let instances = [
            limiter(connect().await.unwrap(), algorithm),
            limiter(connect().await.unwrap(), algorithm),
        ];
        exercise(instances, algorithm, n).await;
    }
}
