//! Slices of hot keys on a real Redis and a real Redis Cluster, each test
//! starting its own: two instances (two limiters, each with its own
//! connection) hammering one tenant from many tasks. Under its limit the
//! store sees at most one call per hundred decisions; against an aligned
//! window offered several times its limit, what is admitted in the
//! window is at most the limit (read back from the store's counter) and
//! close to it; a cold tenant beside the hot one gets one call each; an
//! override keeps the slices of rules it leaves alone and gives back
//! those of the rule it changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request, State};
use sluice_store::{
    Batch, ClusterStore, ConnectOptions, KeySet, Limiter, LimiterOptions, RedisStore, Store,
    StoreError, Telemetry,
};
use sluice_testkit::{RedisCluster, RedisServer};

const TIMEOUT: Duration = Duration::from_secs(5);

fn keys() -> KeySet {
    KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b's'; 32]).unwrap()),
        previous: None,
    }
}

/// Counts every store call a limiter makes, and of those the takes.
#[derive(Default)]
struct Calls(AtomicU64, AtomicU64);

impl Telemetry for Calls {
    fn store_call(&self, _: Duration, _: Option<&StoreError>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn slice_taken(&self, _: &sluice_core::BoundRule, _: u64) {
        self.1.fetch_add(1, Ordering::Relaxed);
    }
}

fn limiter<S: Store>(yaml: &str, store: S, calls: &Arc<Calls>) -> Arc<Limiter<S>> {
    let policy = Policy::compile(&Config::from_yaml(yaml, "t.yaml").unwrap().limits);
    let mut options = LimiterOptions::new(OnError::Deny);
    options.telemetry = calls.clone();
    options.denial_cache = true; // as the service runs
    Arc::new(Limiter::with_options(policy, store, options))
}

/// Decides for `tenant` from `tasks` tasks on each instance until `until`,
/// `per_second` decisions a second in all: decisions made and admitted.
async fn hammer<S: Store + 'static>(
    instances: &[Arc<Limiter<S>>],
    tenant: &'static str,
    tasks: usize,
    until: Instant,
    per_second: u64,
) -> (u64, u64) {
    let mut handles = Vec::new();
    // Every 10 ms, each task decides its share of the rate.
    let per_tick = (per_second / 100 / (tasks * instances.len()) as u64).max(1);
    for limiter in instances {
        for _ in 0..tasks {
            let limiter = limiter.clone();
            handles.push(tokio::spawn(async move {
                let (mut decided, mut admitted) = (0u64, 0u64);
                let policy = limiter.policy();
                let request = Request::new(tenant, "GET /", None, 1).unwrap();
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                while Instant::now() < until {
                    tick.tick().await;
                    for _ in 0..per_tick {
                        decided += 1;
                        admitted += u64::from(limiter.decide(&policy, &request).await.allowed);
                    }
                }
                (decided, admitted)
            }));
        }
    }
    let mut total = (0, 0);
    for handle in handles {
        let (d, a) = handle.await.unwrap();
        total.0 += d;
        total.1 += a;
    }
    total
}

const HOT: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ limit: 1200000, per: 1m, tolerance: "1%" }]
"#;

async fn under_the_limit<S: Store + 'static>(stores: [S; 2]) {
    let calls = Arc::new(Calls::default());
    let instances = stores.map(|s| limiter(HOT, s, &calls));
    // 16,000 a second: under the limit of 20,000.
    let until = Instant::now() + Duration::from_secs(3);
    let (decided, admitted) = hammer(&instances, "hot", 8, until, 16_000).await;
    let takes = calls.1.load(Ordering::Relaxed);
    let calls = calls.0.load(Ordering::Relaxed);
    eprintln!("under the limit: {decided} decisions, {calls} store calls of which {takes} takes");
    assert_eq!(admitted, decided, "under its limit, all admitted");
    assert!(decided > 30_000, "only {decided} decisions");
    assert!(
        calls * 100 <= decided,
        "{calls} store calls for {decided} decisions"
    );
}

const WINDOW: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: fixed_window, aligned: true, limit: 5000, per: 4s, tolerance: "1%" }]
"#;

/// Waits for the start of the next aligned window of `per_ms` (Redis reads
/// the same wall clock); its start.
async fn next_window(per_ms: u64) -> u64 {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let start = now - now % per_ms + per_ms;
    tokio::time::sleep(Duration::from_millis(start - now + 100)).await;
    start
}

/// The store's window for `tenant`: its start and count.
async fn stored_window<S: Store>(limiter: &Limiter<S>, tenant: &str) -> (u64, u64) {
    let policy = limiter.policy();
    let rules = policy.applicable(tenant, "GET /", false).rules;
    let peeked = limiter
        .peek(&Batch::new(tenant, None, 1, rules))
        .await
        .unwrap();
    match &peeked.rows[0].state {
        State::FixedWindow(w) => (w.start_ms, w.count),
        other => panic!("{other:?}"),
    }
}

async fn over_the_limit<S: Store + 'static>(stores: [S; 2]) {
    let calls = Arc::new(Calls::default());
    let instances = stores.map(|s| limiter(WINDOW, s, &calls));
    let start = next_window(4_000).await;
    // Inside the window: from 100 ms after it opens to 300 ms before it
    // closes.
    // 6,000 a second: over four times the limit (1,250 a second).
    let until = Instant::now() + Duration::from_millis(3_600);
    let (decided, admitted) = hammer(&instances, "hot", 8, until, 6_000).await;
    let calls = calls.0.load(Ordering::Relaxed);
    let (stored_start, counted) = stored_window(&instances[0], "hot").await;
    assert_eq!(stored_start, start, "still the same window");
    assert!(
        admitted <= counted && counted <= 5_000,
        "admitted {admitted}, the store counted {counted}"
    );
    assert!(
        admitted >= 4_900,
        "admitted {admitted} of 5000 (store counted {counted}, {decided} decisions, {calls} calls): slices lost at most one each"
    );
    assert!(
        decided >= 3 * 5_000,
        "offered {decided}: not several times the limit"
    );
    assert!(
        calls * 10 <= decided,
        "{calls} store calls for {decided} decisions"
    );
}

async fn cold_beside_hot<S: Store + 'static>(stores: [S; 2]) {
    let calls = Arc::new(Calls::default());
    let instances = stores.map(|s| limiter(HOT, s, &calls));
    let until = Instant::now() + Duration::from_secs(2);
    let hot = {
        let instances = instances.clone();
        tokio::spawn(async move { hammer(&instances, "hot", 4, until, 8_000).await })
    };
    let policy = instances[0].policy();
    let request = Request::new("cold", "GET /", None, 1).unwrap();
    // A decision is answered here only from a slice: a tenant that never
    // holds one had every decision made by the store.
    let mut held = Vec::new();
    while Instant::now() < until {
        assert!(instances[0].decide(&policy, &request).await.allowed);
        held.push(instances[0].slices_of("cold").len());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    hot.await.unwrap();
    assert!(held.len() > 50 && held.iter().all(|&n| n == 0), "{held:?}");
    assert!(!instances[0].slices_of("hot").is_empty() || !instances[1].slices_of("hot").is_empty());
}

const CHANGED: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: fixed_window, aligned: true, limit: 400000, per: 4s, tolerance: "1%" }]
"#;

/// An override of another tenant keeps the hot tenant's slice; one of its
/// own rule drops it, and what it held goes back: the store counts what
/// was admitted.
async fn kept_or_given_back<S: Store + 'static>(store: S) {
    let calls = Arc::new(Calls::default());
    let limiter = limiter(CHANGED, store, &calls);
    next_window(4_000).await;
    let policy = limiter.policy();
    let request = Request::new("hot", "GET /", None, 1).unwrap();
    let mut admitted = 0;
    for _ in 0..1_000 {
        admitted += u64::from(limiter.decide(&policy, &request).await.allowed);
    }
    let held =
        |limiter: &Limiter<S>| -> u64 { limiter.slices_of("hot").iter().map(|s| s.units).sum() };
    // What earlier takes replaced goes back first.
    limiter.give_back_dropped_slices().await;
    let before = held(&limiter);
    assert!(before > 0, "a slice is held");
    let limits = Config::from_yaml(CHANGED, "t.yaml").unwrap().limits;
    let halved = sluice_core::policy::TenantOverride {
        factor: Some(0.5),
        ..Default::default()
    };
    limiter.set_policy(Policy::compile_overridden(
        &limits,
        false,
        &[("other", &halved)],
    ));
    assert_eq!(held(&limiter), before, "another tenant's override keeps it");
    limiter.set_policy(Policy::compile_overridden(
        &limits,
        false,
        &[("hot", &halved)],
    ));
    assert_eq!(held(&limiter), 0, "its own drops it");
    assert_eq!(limiter.give_back_dropped_slices().await, before);
    let (_, counted) = stored_window(&limiter, "hot").await;
    assert_eq!(counted, admitted, "the store counts what was admitted");
}

async fn redis_stores(server: &RedisServer) -> [RedisStore; 2] {
    let connect = || async {
        RedisStore::connect(
            &server.url(),
            keys(),
            &ConnectOptions::with_timeout(TIMEOUT),
        )
        .await
        .unwrap()
    };
    [connect().await, connect().await]
}

async fn cluster_stores(cluster: &RedisCluster) -> [ClusterStore; 2] {
    let connect = || async {
        ClusterStore::connect(
            &cluster.urls(),
            keys(),
            &ConnectOptions::with_timeout(TIMEOUT),
            1,
        )
        .await
        .unwrap()
    };
    [connect().await, connect().await]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_hot_tenant_under_its_limit_costs_one_call_per_hundred_decisions() {
    let server = RedisServer::start();
    under_the_limit(redis_stores(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_aligned_window_admits_at_most_its_limit_across_instances() {
    let server = RedisServer::start();
    over_the_limit(redis_stores(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_cold_tenant_beside_a_hot_one_stays_exact() {
    let server = RedisServer::start();
    cold_beside_hot(redis_stores(&server).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_slice_is_kept_or_given_back_on_an_override() {
    let server = RedisServer::start();
    let [store, _] = redis_stores(&server).await;
    kept_or_given_back(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_slice_is_kept_or_given_back_on_an_override() {
    let cluster = RedisCluster::start(3, 0);
    let [store, _] = cluster_stores(&cluster).await;
    kept_or_given_back(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_hot_tenant_under_its_limit_costs_one_call_per_hundred_decisions() {
    let cluster = RedisCluster::start(3, 0);
    under_the_limit(cluster_stores(&cluster).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_an_aligned_window_admits_at_most_its_limit_across_instances() {
    let cluster = RedisCluster::start(3, 0);
    over_the_limit(cluster_stores(&cluster).await).await;
}
