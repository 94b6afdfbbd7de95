//! Slices of hot keys on a real Redis and a real Redis Cluster, each test
//! starting its own: two instances (two limiters, each with its own
//! connection) hammering one tenant from many tasks, on a clock set by
//! hand (sent to Redis with every call), so that a loaded machine changes
//! nothing the tests count. Under its limit the store sees at most one
//! call per hundred decisions; against an aligned window offered several
//! times its limit, what is admitted in the window is at most the limit
//! (read back from the store's counter) and close to it; a cold tenant
//! beside the hot one gets one call each; an override keeps the slices of
//! rules it leaves alone and gives back those of the rule it changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request, State};
use sluice_store::{
    Batch, ClusterStore, ConnectOptions, KeySet, Limiter, LimiterOptions, ManualClock, RedisStore,
    Store, StoreError, Telemetry, TimeSource,
};
use sluice_testkit::{RedisCluster, RedisServer};

const TIMEOUT: Duration = Duration::from_secs(5);

/// The start of an aligned window of 4 s (and of a second).
const START_MS: u64 = 1_764_460_800_000;

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

fn limiter<S: Store>(
    yaml: &str,
    store: S,
    clock: &Arc<ManualClock>,
    calls: &Arc<Calls>,
) -> Arc<Limiter<S>> {
    let policy = Policy::compile(&Config::from_yaml(yaml, "t.yaml").unwrap().limits);
    let mut options = LimiterOptions::new(OnError::Deny);
    options.clock = clock.clone();
    options.telemetry = calls.clone();
    options.denial_cache = true; // as the service runs
    Arc::new(Limiter::with_options(policy, store, options))
}

/// Decides for `tenant` for `ms` milliseconds of `clock`: each
/// millisecond, one decision from each of `tasks` tasks on each instance
/// at once, then the clock moves on; every 100 ms each instance gives back
/// the slices it dropped, as `sluice serve` does. Decisions made and
/// admitted.
async fn hammer<S: Store + 'static>(
    instances: &[Arc<Limiter<S>>],
    clock: &ManualClock,
    tenant: &'static str,
    tasks: usize,
    ms: u64,
) -> (u64, u64) {
    let (mut decided, mut admitted) = (0, 0);
    for ms in 0..ms {
        if ms % 100 == 0 {
            for limiter in instances {
                limiter.give_back_dropped_slices().await;
            }
        }
        let mut at_once = tokio::task::JoinSet::new();
        for limiter in instances {
            for _ in 0..tasks {
                let limiter = limiter.clone();
                at_once.spawn(async move {
                    let policy = limiter.policy();
                    let request = Request::new(tenant, "GET /", None, 1).unwrap();
                    limiter.decide(&policy, &request).await.allowed
                });
            }
        }
        while let Some(allowed) = at_once.join_next().await {
            decided += 1;
            admitted += u64::from(allowed.unwrap());
        }
        clock.advance(1);
    }
    (decided, admitted)
}

const HOT: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ limit: 1200000, per: 1m, tolerance: "1%" }]
"#;

async fn under_the_limit<S: Store + 'static>(stores: [S; 2], clock: Arc<ManualClock>) {
    let calls = Arc::new(Calls::default());
    let instances = stores.map(|s| limiter(HOT, s, &clock, &calls));
    // 16,000 a second for three seconds: under the limit of 20,000.
    let (decided, admitted) = hammer(&instances, &clock, "hot", 8, 3_000).await;
    let takes = calls.1.load(Ordering::Relaxed);
    let calls = calls.0.load(Ordering::Relaxed);
    eprintln!("under the limit: {decided} decisions, {calls} store calls of which {takes} takes");
    assert_eq!(decided, 48_000);
    assert_eq!(admitted, decided, "under its limit, all admitted");
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

async fn over_the_limit<S: Store + 'static>(stores: [S; 2], clock: Arc<ManualClock>) {
    let calls = Arc::new(Calls::default());
    let instances = stores.map(|s| limiter(WINDOW, s, &clock, &calls));
    // Inside the window: from 100 ms after it opens to 300 ms before it
    // closes, 6,000 a second: over four times the limit (1,250 a second).
    clock.set(START_MS + 100);
    let (decided, admitted) = hammer(&instances, &clock, "hot", 3, 3_600).await;
    let calls = calls.0.load(Ordering::Relaxed);
    let (stored_start, counted) = stored_window(&instances[0], "hot").await;
    assert_eq!(stored_start, START_MS, "still the same window");
    assert_eq!(decided, 6 * 3_600);
    assert!(
        admitted <= counted && counted <= 5_000,
        "admitted {admitted}, the store counted {counted}"
    );
    assert!(
        admitted >= 4_900,
        "admitted {admitted} of 5000 (store counted {counted}, {decided} decisions, {calls} calls): slices lost at most one each"
    );
    assert!(
        calls * 10 <= decided,
        "{calls} store calls for {decided} decisions"
    );
}

async fn cold_beside_hot<S: Store + 'static>(stores: [S; 2], clock: Arc<ManualClock>) {
    let calls = Arc::new(Calls::default());
    let instances = stores.map(|s| limiter(HOT, s, &clock, &calls));
    let policy = instances[0].policy();
    let request = Request::new("cold", "GET /", None, 1).unwrap();
    // The hot tenant at 8,000 a second; the cold one decided every 20 ms
    // between, for two seconds. A decision is answered here only from a
    // slice: a tenant that never holds one had every decision made by the
    // store.
    let mut held = Vec::new();
    for _ in 0..100 {
        hammer(&instances, &clock, "hot", 4, 20).await;
        assert!(instances[0].decide(&policy, &request).await.allowed);
        held.push(instances[0].slices_of("cold").len());
    }
    assert!(held.iter().all(|&n| n == 0), "{held:?}");
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
async fn kept_or_given_back<S: Store + 'static>(store: S, clock: Arc<ManualClock>) {
    let calls = Arc::new(Calls::default());
    let limiter = limiter(CHANGED, store, &clock, &calls);
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

/// Two connections to `server`, on a clock set by hand.
async fn redis_stores(server: &RedisServer) -> ([RedisStore; 2], Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(START_MS));
    let connect = || async {
        RedisStore::connect(
            &server.url(),
            keys(),
            &ConnectOptions::with_timeout(TIMEOUT),
        )
        .await
        .unwrap()
        .with_time(TimeSource::Client(clock.clone()))
    };
    ([connect().await, connect().await], clock.clone())
}

/// Two connections to `cluster`, on a clock set by hand.
async fn cluster_stores(cluster: &RedisCluster) -> ([ClusterStore; 2], Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(START_MS));
    let connect = || async {
        ClusterStore::connect(
            &cluster.urls(),
            keys(),
            &ConnectOptions::with_timeout(TIMEOUT),
            1,
        )
        .await
        .unwrap()
        .with_time(TimeSource::Client(clock.clone()))
    };
    ([connect().await, connect().await], clock.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_hot_tenant_under_its_limit_costs_one_call_per_hundred_decisions() {
    let server = RedisServer::start();
    let (stores, clock) = redis_stores(&server).await;
    under_the_limit(stores, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_aligned_window_admits_at_most_its_limit_across_instances() {
    let server = RedisServer::start();
    let (stores, clock) = redis_stores(&server).await;
    over_the_limit(stores, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_cold_tenant_beside_a_hot_one_stays_exact() {
    let server = RedisServer::start();
    let (stores, clock) = redis_stores(&server).await;
    cold_beside_hot(stores, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_hot_tenant_under_its_limit_costs_one_call_per_hundred_decisions() {
    let cluster = RedisCluster::start(3, 0);
    let (stores, clock) = cluster_stores(&cluster).await;
    under_the_limit(stores, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_an_aligned_window_admits_at_most_its_limit_across_instances() {
    let cluster = RedisCluster::start(3, 0);
    let (stores, clock) = cluster_stores(&cluster).await;
    over_the_limit(stores, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_slice_is_kept_or_given_back_on_an_override() {
    let server = RedisServer::start();
    let ([store, _], clock) = redis_stores(&server).await;
    kept_or_given_back(store, clock).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_slice_is_kept_or_given_back_on_an_override() {
    let cluster = RedisCluster::start(3, 0);
    let ([store, _], clock) = cluster_stores(&cluster).await;
    kept_or_given_back(store, clock).await;
}
