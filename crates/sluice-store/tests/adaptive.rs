//! Adaptive valves in the limiter (appendix I): each priority's share of
//! the effective limit, the limit following what callers report of the
//! downstream, on the memory store and on Redis with two instances
//! reading one law.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::config::{Config, OnError};
use sluice_core::{Policy, Reason, Request};
use sluice_store::limiter::LimiterOptions;
use sluice_store::{
    Clock, ConnectOptions, KeySet, Limiter, ManualClock, MemoryStore, RedisStore, Store, TimeSource,
};
use sluice_testkit::RedisServer;

const START_MS: u64 = 1_764_460_800_000;

const YAML: &str = r#"
default_plan: low
plans:
  low: { priority: low, tenant: [{ name: t, limit: 100000, per: 1s }] }
  normal: { tenant: [{ name: t, limit: 100000, per: 1s }] }
  critical: { priority: critical, tenant: [{ name: t, limit: 100000, per: 1s }] }
tenants:
  vip: { plan: critical }
  plain: { plan: normal }
global:
  "POST /v1/search":
    - { name: search-db, algorithm: concurrency, limit: 100, lease: 1m, adaptive: { latency_target: 100ms, min: 5 } }
"#;

fn policy() -> Policy {
    Policy::compile(&Config::from_yaml(YAML, "adaptive.yaml").unwrap().limits)
}

fn options(clock: &Arc<ManualClock>) -> LimiterOptions {
    LimiterOptions {
        clock: clock.clone(),
        ..LimiterOptions::new(OnError::Deny)
    }
}

fn request(tenant: &str) -> Request<'_> {
    Request::new(tenant, "POST /v1/search", None, 1).unwrap()
}

/// Leases `tenant` takes until the valve denies it (at most 200).
async fn leases<S: Store>(limiter: &Limiter<S>, policy: &Policy, tenant: &str) -> u32 {
    let mut taken = 0;
    for _ in 0..200 {
        let (decision, _lease) = limiter.acquire(policy, &request(tenant)).await;
        if !decision.allowed {
            assert_eq!(decision.reason, Some(Reason::GlobalCapacity));
            break;
        }
        taken += 1;
    }
    taken
}

/// Reports `n` requests of `latency_ms` on `tenant`'s route, `every_ms`
/// apart on `clock`.
async fn report<S: Store>(
    limiter: &Limiter<S>,
    policy: &Policy,
    clock: &ManualClock,
    (n, latency_ms, every_ms): (u32, f64, u64),
) {
    for _ in 0..n {
        clock.set(clock.now_ms() + every_ms);
        limiter
            .observe(policy, &request("plain"), latency_ms, None)
            .await;
    }
}

#[tokio::test]
async fn each_priority_fills_its_share_and_the_limit_follows_the_downstream() {
    let clock = Arc::new(ManualClock::new(START_MS));
    let store = MemoryStore::with_clock(10_000, clock.clone());
    let limiter = Limiter::with_options(policy(), store, options(&clock));
    let policy = limiter.policy();
    // At the full limit of 100: low holds 25, normal up to 50 in all,
    // critical up to 100 in all; lower priorities are denied first.
    assert_eq!(leases(&limiter, &policy, "anyone").await, 25, "low: 25%");
    assert_eq!(
        leases(&limiter, &policy, "plain").await,
        25,
        "normal: to 50%"
    );
    assert_eq!(
        leases(&limiter, &policy, "vip").await,
        50,
        "critical: to 100%"
    );
    assert_eq!(leases(&limiter, &policy, "anyone").await, 0);

    // The downstream answers in 400 ms against a target of 100: the limit
    // is cut at most once per 400 ms, by half, down to min.
    report(&limiter, &policy, &clock, (40, 400.0, 100)).await;
    let level = &limiter.adaptive_levels()[0];
    assert_eq!(level.valve.as_ref(), "search-db");
    assert_eq!(level.effective_limit, 5, "{level:?}");
    assert!((level.latency_ms - 400.0).abs() < 1.0, "{level:?}");
    let shed: u64 = level.shed.iter().map(|(_, n)| n).sum();
    assert!(shed >= 4, "the denials above are counted: {level:?}");

    // Fast again, and full: it grows back, a sixteenth per 100 ms at most.
    let limiter = Limiter::with_options(
        self::policy(),
        MemoryStore::with_clock(10_000, clock.clone()),
        options(&clock),
    );
    report(&limiter, &policy, &clock, (40, 400.0, 100)).await;
    assert_eq!(limiter.adaptive_levels()[0].effective_limit, 5);
    let mut seen = Vec::new();
    for _ in 0..30 {
        // Each round the valve is found full (a critical request denied),
        // and the downstream answers in 20 ms.
        leases(&limiter, &policy, "vip").await;
        report(&limiter, &policy, &clock, (1, 20.0, 100)).await;
        seen.push(limiter.adaptive_levels()[0].effective_limit);
    }
    assert!(
        seen.windows(2)
            .all(|w| w[1] >= w[0] && w[1] <= w[0] + w[0] / 16 + 1),
        "grows by a sixteenth per step at most: {seen:?}"
    );
    assert!(*seen.last().unwrap() > 5, "{seen:?}");
}

/// Two instances on one Redis step one law: what one reports, the other
/// enforces after its own next step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_redis_enforce_one_effective_limit() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(START_MS));
    let keys = KeySet {
        current: sluice_core::keys::Keyer::new(
            "sl",
            &sluice_core::keys::Pepper::parse(&[7u8; 32]).unwrap(),
        ),
        previous: None,
    };
    let connect = ConnectOptions::with_timeout(Duration::from_secs(2));
    let instance = || async {
        let store = RedisStore::connect(&server.url(), keys.clone(), &connect)
            .await
            .unwrap()
            .with_time(TimeSource::Client(clock.clone()));
        Limiter::with_options(policy(), store, options(&clock))
    };
    let (a, b) = (instance().await, instance().await);
    let policy = a.policy();
    // a hears of a slow downstream: the law, in Redis, is cut.
    report(&a, &policy, &clock, (40, 400.0, 100)).await;
    let cut = a.adaptive_levels()[0].effective_limit;
    assert_eq!(cut, 5, "cut to min");
    // b has not stepped: it still enforces the whole valve for low (25).
    assert_eq!(leases(&b, &policy, "anyone").await, 25);
    // One step of its own reads the law a stepped: critical now gets 5,
    // all held already.
    report(&b, &policy, &clock, (1, 400.0, 100)).await;
    assert_eq!(b.adaptive_levels()[0].effective_limit, cut);
    assert_eq!(leases(&b, &policy, "vip").await, 0, "critical: 5, all held");
}
