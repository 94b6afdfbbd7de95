//! Attacks on attempts on a real `redis-server` and a real Redis Cluster,
//! two instances: a sharded tenant (count_if rules whole on shard 0, the
//! others divided), fifty at once; successes given back; and a shadow
//! rule counting by outcome (adjust.lua's give-back).

use std::sync::Arc;
use std::time::Duration;

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{ClusterStore, ConnectOptions, KeySet, Limiter, RedisStore, Store};
use sluice_testkit::{RedisCluster, RedisServer};

fn keys() -> KeySet {
    KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'q'; 32]).unwrap()),
        previous: None,
    }
}

const ALGORITHMS: [&str; 5] = [
    "gcra",
    "token_bucket",
    "fixed_window",
    "sliding_window",
    "sliding_log",
];

fn sharded(algorithm: &str) -> Policy {
    let yaml = format!(
        r#"
default_plan: p
plans:
  p:
    routes:
      "POST /login": [{{ name: logins, algorithm: gcra, limit: 4000, per: 1s }}]
    subject:
      "POST /login":
        - {{ name: failed-logins, algorithm: {algorithm}, limit: 3, per: 15m, count_if: {{ status: [401] }} }}
tenants:
  acme: {{ plan: p, shards: 4 }}
"#
    );
    Policy::compile_for(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits, true)
}

fn login(user: &str) -> Request<'_> {
    Request::new("acme", "POST /login", Some(user), 1).unwrap()
}

/// Runs `decide` with the Redis process `pid` stopped for its first 20 ms
/// (none: at once): its calls there run apart from those elsewhere, in
/// another millisecond.
async fn with_one_node_late<T>(pid: Option<u32>, decide: impl Future<Output = T>) -> T {
    let Some(pid) = pid else {
        return decide.await;
    };
    sluice_testkit::signal(pid, "STOP");
    let resume = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        sluice_testkit::signal(pid, "CONT");
    };
    let (decided, ()) = tokio::join!(decide, resume);
    decided
}

async fn sharded_case<S: Store + 'static>(
    instances: [Arc<Limiter<S>>; 2],
    algorithm: &str,
    n: usize,
    nodes: &[u32],
) {
    // Successes, concluded on the other instance: never locked out, with
    // each node of a cluster in turn answering late.
    let bob = format!("bob-{n}");
    for i in 0..12 {
        let limiter = &instances[i % 2];
        let policy = limiter.policy();
        let late = (!nodes.is_empty()).then(|| nodes[i % nodes.len()]);
        let decision = with_one_node_late(late, limiter.decide(&policy, &login(&bob))).await;
        assert!(decision.allowed, "{algorithm}: success {i} locked out");
        let attempt = limiter.attempt(&policy, &login(&bob), &decision).unwrap();
        let other = &instances[(i + 1) % 2];
        let policy = other.policy();
        other
            .conclude_attempt(&policy, &attempt, Some(200), 60_000)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Fifty failures at once over both: three pass.
    let alice: &'static str = Box::leak(format!("alice-{n}").into_boxed_str());
    let mut checks = tokio::task::JoinSet::new();
    for i in 0..50 {
        let limiter = instances[i % 2].clone();
        checks.spawn(async move {
            let policy = limiter.policy();
            let decision = limiter.decide(&policy, &login(alice)).await;
            limiter.attempt(&policy, &login(alice), &decision)
        });
    }
    let attempts: Vec<_> = checks.join_all().await.into_iter().flatten().collect();
    assert_eq!(attempts.len(), 3, "{algorithm}: at once");
    for attempt in &attempts {
        let policy = instances[1].policy();
        instances[1]
            .conclude_attempt(&policy, attempt, Some(401), 60_000)
            .await
            .unwrap();
    }
    let policy = instances[0].policy();
    assert!(!instances[0].decide(&policy, &login(alice)).await.allowed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_tenants_attempts_on_redis() {
    let server = RedisServer::start();
    let (url, options) = (
        server.url(),
        ConnectOptions::with_timeout(Duration::from_secs(5)),
    );
    for (n, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let connect = || RedisStore::connect(&url, keys(), &options);
        let make = |s| Arc::new(Limiter::new(sharded(algorithm), s, OnError::Deny));
        let instances = [
            make(connect().await.unwrap()),
            make(connect().await.unwrap()),
        ];
        sharded_case(instances, algorithm, n, &[]).await;
    }
}

/// A sharded tenant's decision on Redis Cluster spans two slots (its
/// divided rules on its shard's, the rule counting by outcome whole on
/// shard 0's), each dated by its own node; a give-back names each slot's
/// own time: with one node answering 20 ms late (each in turn), a
/// `sliding_log` success's entry is found and given back all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_tenants_attempts_on_redis_cluster() {
    let mut cluster = RedisCluster::start(3, 0);
    let (urls, options) = (
        cluster.urls(),
        ConnectOptions::with_timeout(Duration::from_secs(5)),
    );
    let nodes: Vec<u32> = cluster
        .master_ports()
        .into_iter()
        .map(|port| cluster.node(port).pid())
        .collect();
    for (n, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let connect = || ClusterStore::connect(&urls, keys(), &options, 1);
        let make = |s| Arc::new(Limiter::new(sharded(algorithm), s, OnError::Deny));
        let instances = [
            make(connect().await.unwrap()),
            make(connect().await.unwrap()),
        ];
        sharded_case(instances, algorithm, n, &nodes).await;
    }
}

/// adjust.lua: a shadow `count_if` rule that denied took nothing, and a
/// success must not give it back a unit (see the memory twin in
/// attempts_edges.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_rule_is_not_given_back_what_it_never_took_on_redis() {
    let server = RedisServer::start();
    let options = ConnectOptions::with_timeout(Duration::from_secs(5));
    let mut broken = Vec::new();
    for (n, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let yaml = format!(
            "default_plan: p\nplans:\n  p:\n    routes:\n      \"POST /login\": [{{ name: logins, algorithm: gcra, limit: 100, per: 1s }}]\n    subject:\n      \"POST /login\":\n        - {{ name: f, algorithm: {algorithm}, limit: 2, per: 15m, shadow: true, count_if: {{ status: [401] }} }}\n"
        );
        let policy = Policy::compile_for(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits, true);
        let store = RedisStore::connect(&server.url(), keys(), &options)
            .await
            .unwrap();
        let limiter = Limiter::new(policy, store, OnError::Deny);
        let user = format!("carol-{n}");
        let mut shadow_denied = Vec::new();
        for status in [401, 401, 200, 200, 200, 401] {
            let policy = limiter.policy();
            let decision = limiter.decide(&policy, &login(&user)).await;
            assert!(decision.allowed);
            shadow_denied.push(decision.shadow_denied);
            let attempt = limiter.attempt(&policy, &login(&user), &decision).unwrap();
            limiter
                .conclude_attempt(&policy, &attempt, Some(status), 60_000)
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        if shadow_denied != [false, false, true, true, true, true] {
            broken.push(format!("{algorithm}: shadow denials {shadow_denied:?}"));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}

/// adjust.lua: an attempt concluded as a success after its unit refilled
/// (two windows later) gives nothing back: five failures counted since
/// fill the rule of 5 per second, and no sixth passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_concluded_after_its_refill_frees_nothing_on_redis() {
    let server = RedisServer::start();
    let options = ConnectOptions::with_timeout(Duration::from_secs(5));
    let mut broken = Vec::new();
    for (n, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let yaml = format!(
            "default_plan: p\nplans:\n  p:\n    subject:\n      \"POST /login\":\n        - {{ name: f, algorithm: {algorithm}, limit: 5, per: 1s, count_if: {{ status: [401] }} }}\n"
        );
        let policy = Policy::compile_for(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits, true);
        let store = RedisStore::connect(&server.url(), keys(), &options)
            .await
            .unwrap();
        let limiter = Limiter::new(policy, store, OnError::Deny);
        let user = format!("dave-{n}");
        let policy = limiter.policy();
        let decision = limiter.decide(&policy, &login(&user)).await;
        let old = limiter.attempt(&policy, &login(&user), &decision).unwrap();
        tokio::time::sleep(Duration::from_millis(2_200)).await;
        let mut failures = Vec::new();
        for _ in 0..5 {
            let decision = limiter.decide(&policy, &login(&user)).await;
            assert!(decision.allowed, "{algorithm}");
            failures.push(limiter.attempt(&policy, &login(&user), &decision).unwrap());
        }
        for attempt in &failures {
            limiter
                .conclude_attempt(&policy, attempt, Some(401), 60_000)
                .await
                .unwrap();
        }
        limiter
            .conclude_attempt(&policy, &old, Some(200), 60_000)
            .await
            .unwrap();
        if limiter.decide(&policy, &login(&user)).await.allowed {
            broken.push(format!("{algorithm}: a sixth failure passed"));
        }
    }
    assert!(broken.is_empty(), "{broken:#?}");
}
