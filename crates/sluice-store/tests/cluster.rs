//! The Redis Cluster backend on a real cluster: 3 masters with a replica
//! each, started on free loopback ports by each test.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redis::cluster_routing::Slot;
use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Reason, Request};
use sluice_store::{
    Batch, ClusterStore, ConnectOptions, KeySet, Limiter, LimiterOptions, ManualClock, MemoryStore,
    Partition, Store, TimeSource,
};
use sluice_testkit::{RedisCluster, command_calls};

mod scenarios;

const BUDGET: Duration = Duration::from_millis(200);

fn keys() -> KeySet {
    KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'q'; 32]).unwrap()),
        previous: None,
    }
}

async fn store(cluster: &RedisCluster, valve_shards: u16) -> ClusterStore {
    store_within(cluster, valve_shards, BUDGET).await
}

async fn store_within(cluster: &RedisCluster, valve_shards: u16, budget: Duration) -> ClusterStore {
    ClusterStore::connect(
        &cluster.urls(),
        keys(),
        &ConnectOptions::with_timeout(budget),
        valve_shards,
    )
    .await
    .unwrap()
}

fn limiter(store: ClusterStore, yaml: &str, on_error: OnError) -> Arc<Limiter<ClusterStore>> {
    limiter_within(store, yaml, on_error, BUDGET)
}

fn limiter_within(
    store: ClusterStore,
    yaml: &str,
    on_error: OnError,
    budget: Duration,
) -> Arc<Limiter<ClusterStore>> {
    let mut options = LimiterOptions::new(on_error);
    options.timeout = Some(budget);
    let policy = Policy::compile_for(
        &Config::from_yaml(yaml, "cluster.yaml").unwrap().limits,
        true,
    );
    Arc::new(Limiter::with_options(policy, store, options))
}

/// Which master holds each key of the cluster, by port.
fn keys_by_master(cluster: &mut RedisCluster) -> HashMap<u16, Vec<String>> {
    let masters = cluster.master_ports();
    masters
        .into_iter()
        .map(|port| {
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("sl:{*")
                .query(&mut cluster.node(port).connection())
                .unwrap();
            (port, keys)
        })
        .collect()
}

const LAYOUT: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: t, algorithm: gcra, limit: 10, per: 1h }]
    routes:
      "*": [{ name: r, algorithm: sliding_log, limit: 8, per: 1h }]
    subject:
      "*": [{ name: s, algorithm: token_bucket, limit: 6, per: 1h }]
tenants:
  huge: { shards: 8 }
global:
  "POST /scarce": [{ name: valve, algorithm: fixed_window, limit: 3, per: 1h }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_exactness_valve_refunds_and_shards() {
    let mut cluster = RedisCluster::start(3, 1);
    let limiter = limiter(store(&cluster, 1).await, LAYOUT, OnError::Deny);
    let policy = limiter.policy();

    // 1000 tenants through every scope: every master holds keys, no call
    // crosses slots (a CROSSSLOT error would make decisions fail over).
    for i in 0..1000 {
        let tenant = format!("tenant-{i}");
        let decision = limiter
            .decide(
                &policy,
                &Request::new(&tenant, "GET /x", Some("u"), 1).unwrap(),
            )
            .await;
        assert!(
            decision.allowed && decision.degraded.is_none(),
            "{decision:?}"
        );
    }
    let layout = keys_by_master(&mut cluster);
    assert_eq!(layout.len(), 3);
    for (port, keys) in &layout {
        assert!(keys.len() > 300, "master {port} holds {} keys", keys.len());
    }

    // A tenant's three scopes share one slot.
    let tag = keys().current.tenant_tag("tenant-7", 0);
    let tenant_keys: Vec<&String> = layout
        .values()
        .flatten()
        .filter(|k| k.contains(tag.as_str()))
        .collect();
    assert_eq!(tenant_keys.len(), 3);
    assert_eq!(
        tenant_keys
            .iter()
            .map(Slot::for_key)
            .collect::<HashSet<_>>()
            .len(),
        1
    );

    // Exact under concurrency, across two instances.
    let second = limiter_from(&cluster, LAYOUT).await;
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for l in [limiter.clone(), second] {
        for _ in 0..4 {
            let (l, admitted) = (l.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                let policy = l.policy();
                let request = Request::new("contended", "GET /x", None, 1).unwrap();
                for _ in 0..10 {
                    let decision = l.decide(&policy, &request).await;
                    assert!(decision.degraded.is_none());
                    admitted.fetch_add(u64::from(decision.allowed), Ordering::Relaxed);
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        admitted.load(Ordering::Relaxed),
        8,
        "the route's sliding log admits exactly 8"
    );

    // The valve denies after the tenant's rules admitted: the tenant's
    // consumption is refunded.
    let scarce = Request::new("valve-user", "POST /scarce", None, 1).unwrap();
    let mut reasons = Vec::new();
    for _ in 0..5 {
        let d = limiter.decide(&policy, &scarce).await;
        reasons.push(d.reason);
    }
    assert_eq!(&reasons[..3], &[None, None, None]);
    assert_eq!(
        &reasons[3..],
        &[Some(Reason::GlobalCapacity), Some(Reason::GlobalCapacity)]
    );
    // Only the 3 admitted requests count: once the refunds landed, the
    // tenant has 7 of its 10 left and the shared "*" route log 5 of its 8.
    let other = Request::new("valve-user", "GET /y", None, 1).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut passed = 0;
    while limiter.decide(&policy, &other).await.allowed {
        passed += 1;
        assert!(passed <= 10);
    }
    assert_eq!(
        passed, 5,
        "denied requests consumed nothing from the tenant's rules"
    );

    // A mega-tenant's shards land on different masters.
    for _ in 0..16 {
        limiter
            .decide(&policy, &Request::new("huge", "GET /x", None, 1).unwrap())
            .await;
    }
    let mut masters_with_huge = 0;
    for keys in keys_by_master(&mut cluster).values() {
        let huge: HashSet<u16> = (0..8)
            .filter(|shard| {
                let tag = self::keys().current.tenant_tag("huge", *shard);
                keys.iter().any(|k| k.contains(tag.as_str()))
            })
            .collect();
        masters_with_huge += usize::from(!huge.is_empty());
    }
    assert!(
        masters_with_huge >= 2,
        "the 8 shards sit on {masters_with_huge} master(s)"
    );
}

async fn limiter_from(cluster: &RedisCluster, yaml: &str) -> Arc<Limiter<ClusterStore>> {
    limiter(store(cluster, 1).await, yaml, OnError::Deny)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn global_valves_are_sharded_over_slots() {
    let cluster = RedisCluster::start(3, 1);
    let limiter = limiter(store(&cluster, 16).await, LAYOUT, OnError::Deny);
    let policy = limiter.policy();
    // 16 shards of a valve of 3: each shard holds max(1, 3/16) = 1.
    for i in 0..16 {
        let tenant = format!("v{i}");
        limiter
            .decide(
                &policy,
                &Request::new(&tenant, "POST /scarce", None, 1).unwrap(),
            )
            .await;
    }
    let store = limiter.store();
    let rules = policy.applicable("x", "POST /scarce", false).rules;
    let valve = rules
        .iter()
        .find(|r| r.scope() == sluice_core::Scope::Global)
        .unwrap();
    let slots: HashSet<Slot> = (0..16)
        .map(|shard| {
            Slot::for_key(store.keys().current.key(
                &store.keys().current.global_tag(valve, shard),
                valve,
                None,
            ))
        })
        .collect();
    assert!(slots.len() >= 15, "valve shards on {} slots", slots.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_and_memory_decide_identically() {
    let cluster = RedisCluster::start(3, 1);
    let clock = Arc::new(ManualClock::new(1_764_460_800_000));
    let store = store(&cluster, 1)
        .await
        .with_time(TimeSource::Client(clock.clone()));
    let memory = MemoryStore::with_clock(10_000, clock.clone());
    let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 5, per: 1s, burst: 7 }, { algorithm: sliding_window, limit: 9, per: 2s }]
    routes:
      "*": [{ algorithm: fixed_window, limit: 4, per: 700ms, aligned: true }, { algorithm: sliding_log, limit: 6, per: 1500ms }]
    subject:
      "*": [{ algorithm: token_bucket, limit: 3, per: 1s, burst: 5 }]
"#;
    let policy = Policy::compile_for(&Config::from_yaml(yaml, "d.yaml").unwrap().limits, true);
    let gaps = [0u64, 0, 37, 120, 0, 5, 333, 0, 700, 1, 0, 999, 64];
    for step in 0..300usize {
        clock.advance(gaps[step % gaps.len()]);
        let tenant = ["a", "b", "c"][step % 3];
        let subject = (step % 2 == 0).then_some("u");
        let rules = policy.applicable(tenant, "GET /", subject.is_some()).rules;
        let batch = Batch::new(tenant, subject, 1 + (step as u64 % 3), rules);
        let expected = memory.decide_now(&batch).unwrap();
        let actual = store.decide(&batch).await.unwrap().outcomes;
        assert_eq!(expected.as_slice(), actual.as_slice(), "step {step}");
    }
}

/// What a load worker saw: admissions per tenant, decisions the store could
/// not make, and the slowest decision.
type Seen = (HashMap<String, u64>, u64, Duration);

/// Decides continuously for `tenants` until `stop`, counting admissions per
/// tenant and failures (decisions the store could not make).
fn spawn_load(
    limiter: &Arc<Limiter<ClusterStore>>,
    tenants: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Seen>> {
    (0..4)
        .map(|worker| {
            let (limiter, stop) = (limiter.clone(), stop.clone());
            tokio::spawn(async move {
                let policy = limiter.policy();
                let mut admitted: HashMap<String, u64> = HashMap::new();
                let (mut degraded, mut slowest) = (0, Duration::ZERO);
                let mut i = worker;
                while !stop.load(Ordering::Relaxed) {
                    i = (i + 1) % tenants;
                    let tenant = format!("live-{i}");
                    let started = Instant::now();
                    let decision = limiter
                        .decide(&policy, &Request::new(&tenant, "GET /x", None, 1).unwrap())
                        .await;
                    slowest = slowest.max(started.elapsed());
                    if decision.degraded.is_some() {
                        degraded += 1;
                    } else if decision.allowed {
                        *admitted.entry(tenant).or_default() += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                (admitted, degraded, slowest)
            })
        })
        .collect()
}

const LIVE: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 30, per: 1h }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_under_load_loses_no_decision_and_admits_no_more_than_the_limit() {
    let cluster = RedisCluster::start(3, 1);
    // What is tested is that MOVED and ASK are followed, not speed: a budget
    // a CPU-starved machine (the suite starts many servers at once) cannot
    // overrun, so that a decision falls back only if it was lost.
    let budget = Duration::from_secs(3);
    let limiter = limiter_within(
        store_within(&cluster, 1, budget).await,
        LIVE,
        OnError::Deny,
        budget,
    );
    let stop = Arc::new(AtomicBool::new(false));
    let load = spawn_load(&limiter, 50, &stop);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Move a third of the first master's slots (with the live keys in them)
    // to the second, while decisions run.
    let masters = cluster.master_ports();
    let (from, to) = (masters[0], masters[1]);
    let reshard = tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        cluster.reshard(from, to, 2000);
        (cluster, started.elapsed())
    });
    let (mut cluster, took) = reshard.await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let mut admitted: HashMap<String, u64> = HashMap::new();
    let mut degraded = 0;
    for task in load {
        let (a, d, _) = task.await.unwrap();
        degraded += d;
        for (tenant, n) in a {
            *admitted.entry(tenant).or_default() += n;
        }
    }
    println!("resharding 2000 slots took {took:?}; {degraded} decisions fell back");
    assert_eq!(degraded, 0, "every decision was made by the cluster");
    assert!(admitted.values().all(|&n| n <= 30), "{admitted:?}");
    assert!(
        admitted.values().any(|&n| n == 30),
        "the tenants reached their limits"
    );
    // The moved slots hold live keys on their new master.
    assert!(cluster.key_count(to) > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_failure_is_bridged_by_the_failure_policy_and_recovered() {
    let mut cluster = RedisCluster::start(3, 1);
    let limiter = limiter(store(&cluster, 1).await, LIVE, OnError::Local);
    let stop = Arc::new(AtomicBool::new(false));
    let load = spawn_load(&limiter, 50, &stop);
    tokio::time::sleep(Duration::from_millis(500)).await;

    let victim = cluster.master_ports()[0];
    let killed = Instant::now();
    cluster.node(victim).stop();
    // The replica is promoted after cluster-node-timeout (1 s); decisions on
    // the victim's slots fail over to `local` meanwhile.
    cluster.wait_for_failover(victim, Duration::from_secs(30));
    let promoted = killed.elapsed();
    // Then, within 5 s (the breaker's cool-down and probes included), every
    // decision is made by the cluster again.
    let policy = limiter.policy();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut recovered = None;
    while recovered.is_none() {
        let mut all = true;
        for i in 0..50 {
            let tenant = format!("probe-{i}");
            let decision = limiter
                .decide(&policy, &Request::new(&tenant, "GET /x", None, 1).unwrap())
                .await;
            all &= decision.degraded.is_none();
        }
        if all {
            recovered = Some(killed.elapsed());
        }
        assert!(
            Instant::now() < deadline,
            "decisions did not return to the cluster within 5 s of the promotion"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut degraded = 0;
    let mut slowest = Duration::ZERO;
    for task in load {
        let (_, d, s) = task.await.unwrap();
        degraded += d;
        slowest = slowest.max(s);
    }
    println!(
        "master killed: cluster ok again after {promoted:?}, every decision back on the cluster after {:?}; {degraded} decisions by on_error; slowest {slowest:?}",
        recovered.unwrap()
    );
    assert!(degraded > 0, "the gap was bridged by the failure policy");
    assert!(
        slowest <= BUDGET + Duration::from_millis(100),
        "a decision took {slowest:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_made_before_the_cluster_is_up_connects_when_it_is() {
    let ports = sluice_testkit::free_node_ports(3);
    let urls: Vec<String> = ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect();
    let started = Instant::now();
    let store = ClusterStore::connect(&urls, keys(), &ConnectOptions::with_timeout(BUDGET), 1)
        .await
        .expect("the store exists while the cluster is down");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "connecting is bounded: {:?}",
        started.elapsed()
    );
    let policy = Policy::compile_for(&Config::from_yaml(LIVE, "c.yaml").unwrap().limits, true);
    let rules = policy.applicable("early", "GET /x", false).rules;
    let batch = Batch::new("early", None, 1, rules);
    let error = store.decide(&batch).await.expect_err("no cluster yet");
    assert!(error.to_string().contains("not connected"), "{error}");

    let _cluster = RedisCluster::start_on(&ports, 0);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match store.decide(&batch).await {
            Ok(outcomes) => {
                assert!(outcomes.outcomes[0].allowed);
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "never connected: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_never_exceed_their_limits() {
    let cluster = RedisCluster::start(3, 0);
    let (a, b) = (store(&cluster, 1).await, store(&cluster, 1).await);
    scenarios::leases_never_exceed_their_limits(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_submission_is_admitted_once() {
    let cluster = RedisCluster::start(3, 0);
    let (a, b) = (store(&cluster, 1).await, store(&cluster, 1).await);
    scenarios::one_submission_is_admitted_once(a, b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_requests_pass_a_guarded_route() {
    let cluster = RedisCluster::start(3, 0);
    scenarios::weighted_requests_pass_a_guarded_route(store(&cluster, 1).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_instances_never_over_admit_and_denials_consume_nothing() {
    let cluster = RedisCluster::start(3, 1);
    let mut stores = Vec::new();
    for _ in 0..5 {
        stores.push(store(&cluster, 1).await);
    }
    scenarios::concurrent_instances_never_over_admit_and_denials_consume_nothing(stores).await;
}

/// Decisions run by the masters since their stats were reset: as the
/// function, and as scripts (the fallback).
fn scripts_run(cluster: &mut RedisCluster) -> (u64, u64) {
    let mut totals = (0, 0);
    for port in cluster.master_ports() {
        let calls = command_calls(&mut cluster.node(port).connection());
        totals.0 += calls.get("fcall").copied().unwrap_or(0);
        totals.1 += calls.get("evalsha").copied().unwrap_or(0);
        totals.1 += calls.get("eval").copied().unwrap_or(0);
    }
    totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_script_call_per_decision_and_two_with_a_valve() {
    let mut cluster = RedisCluster::start(3, 1);
    let store = store(&cluster, 4).await;
    let policy = Policy::compile_for(&Config::from_yaml(LAYOUT, "c.yaml").unwrap().limits, true);
    let decide = |tenant: String, route: &'static str| {
        let (store, policy) = (&store, &policy);
        async move {
            let rules = policy.applicable(&tenant, route, true).rules;
            store
                .decide(&Batch::new(&tenant, Some("u"), 1, rules))
                .await
                .unwrap()
        }
    };
    // Every master has the function (loaded on all of them by the first
    // call that found it missing).
    for i in 0..100 {
        decide(format!("warm-{i}"), "POST /scarce").await;
    }
    for port in cluster.master_ports() {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut cluster.node(port).connection())
            .unwrap();
    }

    for i in 0..200 {
        decide(format!("plain-{i}"), "GET /x").await;
    }
    assert_eq!(
        scripts_run(&mut cluster),
        (200, 0),
        "tenant, route and subject in one call"
    );

    // The valve (3 an hour over 4 shards: 1 each) was used up by the
    // warm-up: requests of fresh tenants pass their own rules (one call),
    // are denied by the valve (a second call) and refunded (a third, not
    // waited for).
    let mut admitted = 0;
    for i in 0..20 {
        let outcomes = decide(format!("scarce-{i}"), "POST /scarce").await;
        admitted += usize::from(outcomes.outcomes.iter().all(|o| o.allowed));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(admitted, 0, "the warm-up used the valve up");
    // The refunds are a script of their own.
    assert_eq!(scripts_run(&mut cluster), (200 + 20 * 2, 20));
}

const SLOTS: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: t, algorithm: fixed_window, limit: 100, per: 1h }]
global:
  "POST /two": [{ name: v1, algorithm: fixed_window, limit: 5, per: 1h, share: first_come },
                { name: v2, algorithm: gcra, limit: 3, per: 1h, share: first_come }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_on_several_slots_are_decided_all_or_nothing() {
    let cluster = RedisCluster::start(3, 0);
    let store = store(&cluster, 1).await;
    let policy = Policy::compile_for(&Config::from_yaml(SLOTS, "s.yaml").unwrap().limits, true);

    // Two valves on one route have tags of their own: three slots. v2 admits
    // 3; the two requests it denies are refunded to the tenant and to v1.
    let rules = policy.applicable("multi", "POST /two", false).rules;
    let batch = Batch::new("multi", None, 1, rules);
    let mut allowed = Vec::new();
    for _ in 0..5 {
        let outcomes = store.decide(&batch).await.expect("no CROSSSLOT").outcomes;
        allowed.push(outcomes.iter().all(|o| o.allowed));
    }
    assert_eq!(allowed, [true, true, true, false, false]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let outcomes = store.decide(&batch).await.unwrap().outcomes;
    assert!(!outcomes[2].allowed, "v2 is used up");
    assert_eq!(
        outcomes[0].remaining,
        100 - 3 - 1,
        "the tenant counts only the 3 admitted"
    );
    assert_eq!(
        outcomes[1].remaining,
        5 - 3 - 1,
        "v1 counts only the 3 admitted"
    );

    // Rules partitioned as Envoy descriptors (each its own tag) are decided
    // together: when one denies, the other gives back what it took.
    let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: small, algorithm: fixed_window, limit: 2, per: 1h },
             { name: large, algorithm: sliding_log, limit: 5, per: 1h }]
"#;
    let policy = Policy::compile_for(&Config::from_yaml(yaml, "e.yaml").unwrap().limits, true);
    let rules = policy.applicable("domain", "*", false).rules;
    let partitions = [
        Partition::Tenant("descriptor-a"),
        Partition::Tenant("descriptor-b"),
    ];
    let batch = Batch {
        partitions: &partitions,
        ..Batch::new("domain", None, 1, rules)
    };
    let mut allowed = Vec::new();
    for _ in 0..4 {
        let outcomes = store.decide(&batch).await.expect("no CROSSSLOT").outcomes;
        allowed.push(outcomes.iter().all(|o| o.allowed));
    }
    assert_eq!(allowed, [true, true, false, false]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let outcomes = store.decide(&batch).await.unwrap().outcomes;
    assert_eq!(
        outcomes[1].remaining,
        5 - 2 - 1,
        "the large limit counts only the 2 admitted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_over_tls_to_a_cluster_signed_by_a_private_ca() {
    let mut cluster = RedisCluster::start_tls(3, 0);
    let options = ConnectOptions {
        tls_ca_pem: Some(cluster.ca_pem()),
        ..ConnectOptions::with_timeout(Duration::from_secs(2))
    };
    let store = ClusterStore::connect(&cluster.tls_urls(), keys(), &options, 1)
        .await
        .unwrap();
    let policy = Policy::compile_for(&Config::from_yaml(LIVE, "c.yaml").unwrap().limits, true);
    // The nodes tell a TLS client their TLS ports: every master is reached
    // over TLS (its plain port would refuse the handshake).
    for i in 0..300 {
        let tenant = format!("tls-{i}");
        let rules = policy.applicable(&tenant, "GET /x", false).rules;
        let outcomes = store
            .decide(&Batch::new(&tenant, None, 1, rules))
            .await
            .expect("decided over TLS");
        assert!(outcomes.outcomes[0].allowed);
    }
    for (port, keys) in keys_by_master(&mut cluster) {
        assert!(!keys.is_empty(), "master {port} holds no key");
    }

    // Without the CA, the servers' certificates are not trusted.
    let untrusted = ClusterStore::connect(
        &cluster.tls_urls(),
        keys(),
        &ConnectOptions::with_timeout(BUDGET),
        1,
    )
    .await
    .unwrap();
    let rules = policy.applicable("x", "GET /x", false).rules;
    assert!(
        untrusted
            .decide(&Batch::new("x", None, 1, rules))
            .await
            .is_err()
    );
}

const DROPPED: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: t, algorithm: fixed_window, limit: 4, per: 1h }]
global:
  "POST /v": [{ name: valve, algorithm: fixed_window, limit: 12, per: 1h, share: first_come }]
"#;

/// Callers that go away at any `.await` of a two-phase decision (tenant's
/// slot, then the valve's) leave nothing consumed: each call finishes and
/// what nobody collected is refunded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_dropped_between_reserve_and_refund_consumes_nothing() {
    let cluster = RedisCluster::start(3, 1);
    let limiter = limiter(store(&cluster, 1).await, DROPPED, OnError::Deny);
    let policy = limiter.policy();
    fn request(tenant: &str) -> Request<'_> {
        Request::new(tenant, "POST /v", None, 1).unwrap()
    }
    // Warm the connection and the scripts.
    assert!(limiter.decide(&policy, &request("warm")).await.allowed);
    // Dropped after 0, 1, 2, … µs: on the first poll, while the tenant's
    // call is in flight, between the phases, while the valve's is.
    let mut finished = [0u32; 2];
    for i in 0..40u64 {
        let tenant = ["d1", "d2"][(i % 2) as usize];
        let asked = request(tenant);
        let decision = limiter.decide(&policy, &asked);
        let wait = Duration::from_micros(i * 50);
        if let Ok(d) = tokio::time::timeout(wait, decision).await {
            finished[(i % 2) as usize] += u32::from(d.allowed);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (t, tenant) in ["d1", "d2"].into_iter().enumerate() {
        let mut passed = 0;
        while limiter.decide(&policy, &request(tenant)).await.allowed {
            passed += 1;
            assert!(passed <= 4);
        }
        assert_eq!(
            passed + finished[t],
            4,
            "{tenant}: dropped decisions left budget consumed"
        );
    }
    // The valve, too, holds only what was admitted: the warm-up and the
    // 2 × 4 the tenants got, so 3 of its 12 are left.
    let mut passed = 0;
    for i in 0..10 {
        let tenant = format!("fresh{i}");
        passed += u32::from(limiter.decide(&policy, &request(&tenant)).await.allowed);
    }
    assert_eq!(passed, 3, "dropped decisions left valve budget consumed");
}

const SHADOW_VALVE: &str = r#"
default_plan: p
plans:
  p:
    tenant:
      - { name: t, algorithm: token_bucket, limit: 10, per: 1h }
      - { name: watch, algorithm: token_bucket, limit: 1, per: 1h, shadow: true }
global:
  "POST /scarce": [{ name: valve, algorithm: fixed_window, limit: 1, per: 1h }]
"#;

/// A shadow rule that denied wrote nothing: when the valve denies after
/// the tenant's slot admitted, the refund gives back what the tenant's
/// enforced rule consumed and nothing to the shadow rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_gives_nothing_to_a_shadow_rule_that_denied() {
    let cluster = RedisCluster::start(3, 1);
    let limiter = limiter(store(&cluster, 1).await, SHADOW_VALVE, OnError::Deny);
    let policy = limiter.policy();
    let scarce = Request::new("watched", "POST /scarce", None, 1).unwrap();
    let first = limiter.decide(&policy, &scarce).await;
    assert!(first.allowed && !first.shadow_denied, "{first:?}");
    // The tenant's rule admits, the shadow rule (its token spent) would
    // deny, the valve (spent) denies: the tenant's slot is refunded.
    let second = limiter.decide(&policy, &scarce).await;
    assert_eq!(second.reason, Some(Reason::GlobalCapacity), "{second:?}");
    let other = Request::new("watched", "GET /y", None, 1).unwrap();
    let third = limiter.decide(&policy, &other).await;
    assert!(
        third.allowed && third.shadow_denied,
        "the shadow rule got no token back: {third:?}"
    );
    assert_eq!(
        third.remaining(),
        Some(8),
        "the tenant's rule got back what the denied request consumed: {third:?}"
    );
}

/// A decision on `runtime`; the runtime runs its other tasks (a thread's
/// connection being made) while it waits.
fn decide_on(runtime: &tokio::runtime::Runtime, limiter: &Limiter<ClusterStore>) -> bool {
    runtime.block_on(async {
        let policy = limiter.policy();
        let request = Request::new("acme", "GET /v1/x", None, 1).unwrap();
        let allowed = limiter.decide(&policy, &request).await.allowed;
        tokio::time::sleep(Duration::from_millis(50)).await;
        allowed
    })
}

/// Clients connected to the first master.
fn clients(cluster: &RedisCluster) -> usize {
    let client = redis::Client::open(cluster.urls()[0].as_str()).unwrap();
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut client.get_connection().unwrap())
        .unwrap();
    // Less the connection asking.
    list.lines().count() - 1
}

/// As on one Redis: each thread calls the cluster over a connection of
/// its own, driven on its own runtime, once it is up, and a thread whose
/// runtime went away gets a new one on its next runtime (on Deny, a
/// decision the cluster did not make would be a denial).
#[test]
fn each_thread_calls_the_cluster_over_its_own_connection() {
    let cluster = RedisCluster::start(3, 0);
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    // The store's shared connection on a runtime of its own, as the
    // server's main runtime: a thread's first call goes over it.
    let first = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let limiter = limiter(
        first.block_on(store(&cluster, 1)),
        "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 1000, per: 1h }]\n",
        OnError::Deny,
    );
    let before = clients(&cluster);
    assert!((0..3).all(|_| decide_on(&first, &limiter)));
    let deciding = limiter.clone();
    let (decided, during) = sluice_testkit::while_threads_stand(
        2,
        move || {
            let runtime = runtime();
            ((0..5).all(|_| decide_on(&runtime, &deciding)), runtime)
        },
        || clients(&cluster),
    );
    assert!(decided, "decided by the cluster on other threads");
    assert_eq!(
        during,
        before + 3,
        "one connection per calling thread to each master ({before} before)"
    );
    // The shared connection was driven by the first runtime: gone with it.
    drop(first);
    let second = runtime();
    assert!(
        (0..40).any(|_| decide_on(&second, &limiter)),
        "a thread on a new runtime decides over a new connection of its own"
    );
}
