//! Usage known after the fact on a real `redis-server`, on Redis's own
//! clock (`TIME`), as a fleet runs: a settle gives back where and when the
//! store admitted, whatever the instance's clock reads.

use std::time::Duration;

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{ConnectOptions, KeySet, Limiter, MarkerAnswer, RedisStore};
use sluice_testkit::RedisServer;

async fn limiter(server: &RedisServer, yaml: &str) -> Limiter<RedisStore> {
    let keys = KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'g'; 32]).unwrap()),
        previous: None,
    };
    let store = RedisStore::connect(
        &server.url(),
        keys,
        &ConnectOptions::with_timeout(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let config = Config::from_yaml(yaml, "after.yaml").unwrap();
    // As on Redis: tenants are spread over their shards.
    Limiter::new(
        Policy::compile_for(&config.limits, true),
        store,
        OnError::Deny,
    )
}

fn of_a(cost: u64) -> Request<'static> {
    Request::new("a", "POST /chat", None, cost).unwrap()
}

#[tokio::test]
async fn a_settle_below_the_estimate_gives_back_a_sliding_logs_entries() {
    let server = RedisServer::start();
    let limiter = limiter(
        &server,
        "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: sliding_log, limit: 10, per: 1m }]\n",
    )
    .await;
    let policy = limiter.policy();
    // Let the instance's clock and Redis's part: a give-back names when
    // Redis admitted, not when this instance thinks it did.
    let estimate = of_a(8);
    let decision = limiter.decide(&policy, &estimate).await;
    assert!(decision.allowed);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let reservation = limiter.reserve(&policy, &estimate, &decision).unwrap();
    let settled = limiter
        .settle(&policy, &reservation, 2, 60_000)
        .await
        .unwrap();
    assert_eq!(settled.marker, MarkerAnswer::Applied);
    // 6 of the 8 came back: 2 held, one more unit would leave 7.
    assert_eq!(settled.decision.remaining(), Some(7));
    assert!(limiter.decide(&policy, &of_a(8)).await.allowed);
}

#[tokio::test]
async fn an_expiry_and_a_settle_meet_on_the_shard_that_admitted() {
    let server = RedisServer::start();
    let limiter = limiter(
        &server,
        "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: fixed_window, limit: 10, per: 1m }]\ntenants:\n  a: { plan: p, shards: 2 }\n",
    )
    .await;
    let policy = limiter.policy();
    // The first unit takes shard 0, the reservation shard 1.
    assert!(limiter.decide(&policy, &of_a(1)).await.allowed);
    let estimate = of_a(5);
    let decision = limiter.decide(&policy, &estimate).await;
    let reservation = limiter.reserve(&policy, &estimate, &decision).unwrap();
    assert_eq!(reservation.shard, 1);
    // Claimed as expired first: a late settle finds the claim, and the
    // estimate stands.
    assert!(limiter.expire(&reservation, 60_000).await.unwrap());
    let late = limiter
        .settle(&policy, &reservation, 0, 60_000)
        .await
        .unwrap();
    assert_eq!(late.marker, MarkerAnswer::Conflict);
    let mut admitted = 0;
    while limiter.decide(&policy, &of_a(1)).await.allowed {
        admitted += 1;
    }
    assert_eq!(admitted, 4, "4 + 1 + 5 of the tenant's 10");
}

#[tokio::test]
async fn a_settles_excess_is_owed_on_every_shard() {
    let server = RedisServer::start();
    let limiter = limiter(
        &server,
        "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 1000, per: 1h }]\ntenants:\n  a: { plan: p, shards: 4 }\n",
    )
    .await;
    let policy = limiter.policy();
    let estimate = of_a(1);
    let decision = limiter.decide(&policy, &estimate).await;
    let reservation = limiter.reserve(&policy, &estimate, &decision).unwrap();
    let settled = limiter
        .settle(&policy, &reservation, 100_000, 60_000)
        .await
        .unwrap();
    assert_eq!(settled.marker, MarkerAnswer::Applied);
    assert!(
        !limiter.decide(&policy, &of_a(1)).await.allowed,
        "the excess is owed on every shard (750 units passed when one shard owed it)"
    );
    let again = limiter
        .settle(&policy, &reservation, 100_000, 60_000)
        .await
        .unwrap();
    assert_eq!(again.marker, MarkerAnswer::Again);
    // The expiry finds the settle on the shard that admitted.
    assert!(!limiter.expire(&reservation, 60_000).await.unwrap());
}
