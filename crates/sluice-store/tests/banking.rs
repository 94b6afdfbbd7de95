//! Reservations held across refills cannot be banked: a settle gives back
//! only what its estimate still holds (`Rule::returnable`), on the memory
//! store, on Redis and on Redis Cluster, with one hand-set clock.
//!
//! The attack: reserve the whole burst again and again as the bucket
//! refills, hold the reservations, then at one instant spend what passes,
//! settle one reservation at 0, spend again, settle the next... Each
//! settle used to give its whole estimate back on top of the refill:
//! fifteen reservations let 160 units through in one instant where the
//! burst is 10.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{
    ClusterStore, ConnectOptions, KeySet, Limiter, LimiterOptions, ManualClock, MemoryStore,
    RedisStore, Reservation, Store, TimeSource,
};
use sluice_testkit::{RedisCluster, RedisServer};

const START_MS: u64 = 1_764_460_800_000;

fn yaml(algorithm: &str) -> String {
    format!(
        "default_plan: p\nplans:\n  p:\n    tenant: [{{ algorithm: {algorithm}, limit: 10, per: 1s, burst: 10 }}]\n"
    )
}

fn keys() -> KeySet {
    KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'g'; 32]).unwrap()),
        previous: None,
    }
}

fn limiter<S: Store>(store: S, clock: &Arc<ManualClock>, yaml: &str) -> Limiter<S> {
    let config = Config::from_yaml(yaml, "banking.yaml").unwrap();
    let mut options = LimiterOptions::new(OnError::Deny);
    options.clock = clock.clone();
    Limiter::with_options(Policy::compile(&config.limits), store, options)
}

fn request(tenant: &str, cost: u64) -> Request<'_> {
    Request::new(tenant, "POST /v1/chat", None, cost).unwrap()
}

/// Every unit of one that passes now.
async fn spend<S: Store>(limiter: &Limiter<S>, policy: &Policy, tenant: &str) -> u64 {
    let mut passed = 0;
    while limiter.decide(policy, &request(tenant, 1)).await.allowed {
        passed += 1;
        assert!(passed <= 1_000, "no end to what passes");
    }
    passed
}

/// `held` reservations of the whole burst, each made once the bucket has
/// refilled, then settled at 0 one by one at one instant, spending what
/// passes between: what passed in that instant.
async fn banked<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
    tenant: &str,
    held: usize,
) -> u64 {
    let policy = limiter.policy();
    let mut reservations: Vec<Reservation> = Vec::new();
    for _ in 0..held {
        let estimate = request(tenant, 10);
        let decision = limiter.decide(&policy, &estimate).await;
        assert!(decision.allowed, "the bucket refilled: {decision:?}");
        reservations.push(limiter.reserve(&policy, &estimate, &decision).unwrap());
        clock.advance(1_150);
    }
    let mut passed = spend(limiter, &policy, tenant).await;
    for reservation in &reservations {
        limiter
            .settle(&policy, reservation, 0, 60_000)
            .await
            .unwrap();
        passed += spend(limiter, &policy, tenant).await;
    }
    passed
}

/// Two reservations of half the burst at one instant; the first settled
/// at 0 at once, which moves the second's units down to where the first's
/// were; 600 ms later the bucket is whole again and what passes is spent;
/// then the second is settled at 0: nothing of it is still missing, so
/// nothing more passes.
async fn interleaved<S: Store>(limiter: &Limiter<S>, clock: &ManualClock, tenant: &str) -> u64 {
    let policy = limiter.policy();
    let mut reservations = Vec::new();
    for _ in 0..2 {
        let estimate = request(tenant, 5);
        let decision = limiter.decide(&policy, &estimate).await;
        reservations.push(limiter.reserve(&policy, &estimate, &decision).unwrap());
    }
    let settle = |reservation| limiter.settle(&policy, reservation, 0, 60_000);
    settle(&reservations[0]).await.unwrap();
    clock.advance(600);
    let mut passed = spend(limiter, &policy, tenant).await;
    settle(&reservations[1]).await.unwrap();
    passed += spend(limiter, &policy, tenant).await;
    passed
}

async fn attack<S: Store>(store: impl Fn(&Arc<ManualClock>) -> S) {
    for algorithm in ["gcra", "token_bucket"] {
        let clock = Arc::new(ManualClock::new(START_MS));
        let limiter = limiter(store(&clock), &clock, &yaml(algorithm));
        let tenant = format!("{algorithm}-interleaved");
        assert_eq!(
            interleaved(&limiter, &clock, &tenant).await,
            10,
            "{algorithm}: a give-back after another returns only what its own refill leaves"
        );
    }
    for algorithm in ["gcra", "token_bucket"] {
        for held in [1, 3, 15] {
            let clock = Arc::new(ManualClock::new(START_MS));
            let limiter = limiter(store(&clock), &clock, &yaml(algorithm));
            let tenant = format!("{algorithm}-{held}");
            let passed = banked(&limiter, &clock, &tenant, held).await;
            assert_eq!(
                passed, 10,
                "{algorithm}, {held} reservations held across refills: only the burst passes in one instant"
            );
        }
    }
}

#[tokio::test]
async fn reservations_held_across_refills_bank_nothing_in_memory() {
    attack(|clock| MemoryStore::with_clock(10_000, clock.clone())).await;
}

/// [`attack`] with a store of `stores` (one per run, as it keeps what it
/// learned of the scripts) on the hand-set clock.
async fn attack_each<S: Store>(stores: Vec<S>, on_clock: fn(S, TimeSource) -> S) {
    let stores = std::sync::Mutex::new(stores);
    attack(|clock| {
        let store = stores.lock().unwrap().pop().expect("a store per run");
        on_clock(store, TimeSource::Client(clock.clone()))
    })
    .await;
}

#[tokio::test]
async fn reservations_held_across_refills_bank_nothing_on_redis() {
    let server = RedisServer::start();
    let options = ConnectOptions::with_timeout(Duration::from_secs(5));
    let mut stores = Vec::new();
    for _ in 0..8 {
        stores.push(
            RedisStore::connect(&server.url(), keys(), &options)
                .await
                .unwrap(),
        );
    }
    attack_each(stores, RedisStore::with_time).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_held_across_refills_bank_nothing_on_redis_cluster() {
    let cluster = RedisCluster::start(3, 1);
    let options = ConnectOptions::with_timeout(Duration::from_secs(5));
    let urls = cluster.urls();
    let mut stores = Vec::new();
    for _ in 0..8 {
        let store = ClusterStore::connect(&urls, keys(), &options, 1);
        stores.push(store.await.unwrap());
    }
    attack_each(stores, ClusterStore::with_time).await;
}
