//! Usage known after the fact on a real Redis Cluster: a settle whose
//! rules live on several slots is finished by its retry, slot by slot,
//! after a failure cut it short, and applied once in each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{
    Batch, ClusterStore, ConnectOptions, KeySet, Limiter, LimiterOptions, MarkerAnswer, Store,
    Valve,
};
use sluice_testkit::RedisCluster;

/// Each call's budget: generous, since a call past it fails (and a
/// decision is denied) on a loaded machine; a stalled master is still
/// given up on within it.
const BUDGET: Duration = Duration::from_secs(2);

fn keys() -> KeySet {
    KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'q'; 32]).unwrap()),
        previous: None,
    }
}

/// Tenants `t0`..`t19` of three shards each: `tokens` is split (20
/// each), `calls` (2 a minute, below 3) is kept whole on shard 0. A
/// decision on shard 1 so touches two slots.
fn split() -> Policy {
    let mut yaml = "default_plan: p\nplans:\n  p:\n    tenant:\n      - { name: tokens, algorithm: fixed_window, limit: 60, per: 1m }\n      - { name: calls, algorithm: fixed_window, limit: 2, per: 1m }\ntenants:\n".to_owned();
    for i in 0..20 {
        yaml += &format!("  t{i}: {{ plan: p, shards: 3 }}\n");
    }
    Policy::compile_for(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits, true)
}

/// The master port that serves `key`'s slot (the others answer MOVED).
fn master_of(cluster: &mut RedisCluster, key: &str) -> u16 {
    for port in cluster.master_ports() {
        let owned: redis::RedisResult<i64> = redis::cmd("EXISTS")
            .arg(key)
            .query(&mut cluster.node(port).connection());
        if owned.is_ok() {
            return port;
        }
    }
    panic!("no master serves {key}");
}

/// A tenant whose shard 0 and shard 1 are served by different masters:
/// the tenant, and shard 0's master.
fn tenant_on_two_masters(cluster: &mut RedisCluster, policy: &Policy) -> (String, u16) {
    for i in 0..20 {
        let tenant = format!("t{i}");
        let rules = policy.applicable(&tenant, "POST /chat", false).rules;
        let key = |shard: u16| {
            let batch = Batch {
                shard,
                ..Batch::new(&tenant, None, 1, rules)
            };
            KeySet::keys(&keys().current, &batch, Valve::WHOLE).keys[0].clone()
        };
        let (zero, one) = (master_of(cluster, &key(0)), master_of(cluster, &key(1)));
        if zero != one {
            return (tenant, zero);
        }
    }
    panic!("no tenant of 20 has shards 0 and 1 on different masters of 3")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_cut_short_between_slots_is_finished_by_its_retry() {
    let mut cluster = RedisCluster::start(3, 0);
    let store = ClusterStore::connect(
        &cluster.urls(),
        keys(),
        &ConnectOptions::with_timeout(BUDGET),
        1,
    )
    .await
    .unwrap();
    let policy = split();
    let (tenant, shard_zero) = tenant_on_two_masters(&mut cluster, &policy);
    let limiter = Arc::new(Limiter::with_options(
        policy,
        store,
        LimiterOptions::new(OnError::Deny),
    ));
    let policy = limiter.policy();
    let request = |cost| Request::new(&tenant, "POST /chat", None, cost).unwrap();

    // The first decision takes shard 0, the reservation shard 1: both
    // `calls` are spent (on shard 0).
    assert!(limiter.decide(&policy, &request(1)).await.allowed);
    let estimate = request(1);
    let decision = limiter.decide(&policy, &estimate).await;
    assert!(decision.allowed, "{decision:?}");
    let reservation = limiter.reserve(&policy, &estimate, &decision).unwrap();
    assert_eq!(reservation.shard, 1);
    assert!(!limiter.decide(&policy, &request(1)).await.allowed);
    // Five more `tokens` on shard 1, besides the reservation's one: what a
    // second give-back there would take away.
    let tokens: Vec<_> = policy
        .own_rules(&tenant, "POST /chat", false)
        .iter()
        .filter(|r| r.name() == "tokens")
        .cloned()
        .collect();
    let on_shard_one = |cost| Batch {
        shard: 1,
        ..Batch::new(&tenant, None, cost, &tokens)
    };
    let taken = limiter.store().decide(&on_shard_one(5)).await.unwrap();
    assert!(taken.outcomes[0].allowed);
    assert_eq!(tokens_used(&limiter, &on_shard_one(1)).await, 6);

    // Shard 0's master stalls: the settle gives back on shard 1, then
    // cannot reach shard 0.
    cluster.node(shard_zero).signal("STOP");
    let cut = limiter.settle(&policy, &reservation, 0, 60_000).await;
    cluster.node(shard_zero).signal("CONT");
    // Made under its lead marker (shard 1's slot), counted once, and said
    // to be unfinished: the stalled slot is a retry's to finish.
    let cut = cut.expect("the lead slot applied");
    assert_eq!(cut.marker, MarkerAnswer::Applied);
    assert!(cut.unfinished.is_some(), "the stalled slot is not reached");
    assert_eq!(
        tokens_used(&limiter, &on_shard_one(1)).await,
        5,
        "given back on shard 1"
    );

    // Its retry finishes it: the `calls` unit comes back on shard 0, and
    // nothing is given back twice on shard 1.
    let deadline = Instant::now() + Duration::from_secs(10);
    let retried = loop {
        match limiter.settle(&policy, &reservation, 0, 60_000).await {
            Ok(retried) => break retried,
            Err(e) => assert!(
                Instant::now() < deadline,
                "the retry never got through: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Answered as a repeat: the attempt cut short counted the settle.
    assert_eq!(retried.marker, MarkerAnswer::Again);
    assert!(retried.unfinished.is_none());
    // The reservation's `tokens` unit is back on shard 1, once: the five
    // others are still spent.
    assert_eq!(tokens_used(&limiter, &on_shard_one(1)).await, 5);
    // The `calls` unit the reservation took is back, once.
    assert!(limiter.decide(&policy, &request(1)).await.allowed);
    assert!(!limiter.decide(&policy, &request(1)).await.allowed);
}

/// The `tokens` spent in the window of `batch`'s shard.
async fn tokens_used(limiter: &Limiter<ClusterStore>, batch: &Batch<'_>) -> u64 {
    let peeked = limiter.peek(batch).await.unwrap();
    match &peeked.rows[0].state {
        sluice_core::State::FixedWindow(window) => window.count,
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_settles_at_once_are_applied_once() {
    let mut cluster = RedisCluster::start(3, 0);
    let store = ClusterStore::connect(
        &cluster.urls(),
        keys(),
        &ConnectOptions::with_timeout(Duration::from_secs(5)),
        1,
    )
    .await
    .unwrap();
    let policy = split();
    let (tenant, _) = tenant_on_two_masters(&mut cluster, &policy);
    let limiter = Arc::new(Limiter::new(policy, store, OnError::Deny));
    let policy = limiter.policy();
    let request = |cost| Request::new(&tenant, "POST /chat", None, cost).unwrap();
    // A reservation on shard 1, whose settle touches two slots.
    assert!(limiter.decide(&policy, &request(1)).await.allowed);
    let estimate = request(1);
    let decision = limiter.decide(&policy, &estimate).await;
    let reservation = limiter.reserve(&policy, &estimate, &decision).unwrap();
    assert_eq!(reservation.shard, 1);
    let rounds = 5u8;
    for round in 0..rounds {
        // The same settle, one unit above the estimate, sent ten times at
        // once (a client's retries): one answer says applied, the others
        // repeated, whichever reached the second slot first.
        let reservation = sluice_store::Reservation {
            id: [round; 16],
            ..reservation.clone()
        };
        let settles: Vec<_> = (0..10)
            .map(|_| {
                let (limiter, reservation) = (limiter.clone(), reservation.clone());
                tokio::spawn(async move {
                    let policy = limiter.policy();
                    let settled = limiter.settle(&policy, &reservation, 2, 60_000).await;
                    settled.unwrap().marker
                })
            })
            .collect();
        let mut applied = 0;
        for settle in settles {
            applied += usize::from(settle.await.unwrap() == MarkerAnswer::Applied);
        }
        assert_eq!(applied, 1, "round {round}: one settle counted");
    }
    // And each round charged its unit once: shard 1's `tokens` window
    // holds the reservation's unit and one per round.
    let own = policy.own_rules(&tenant, "POST /chat", false);
    let batch = Batch {
        shard: 1,
        ..Batch::new(&tenant, None, 1, &own[..1])
    };
    let peeked = limiter.peek(&batch).await.unwrap();
    match &peeked.rows[0].state {
        sluice_core::State::FixedWindow(window) => {
            assert_eq!(window.count, 1 + u64::from(rounds), "charged once a round");
        }
        other => panic!("a fixed window, not {other:?}"),
    }
}
