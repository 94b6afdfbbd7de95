//! Adaptive valves (appendix I) on a real redis-server this test starts:
//! a cost above a priority's part on the path every Redis decision takes,
//! and an instance that hears no signal still reading the law.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::config::{Config, OnError};
use sluice_core::{Policy, Reason, Request};
use sluice_store::limiter::LimiterOptions;
use sluice_store::{Clock, ConnectOptions, KeySet, Limiter, ManualClock, RedisStore, TimeSource};
use sluice_testkit::RedisServer;

const START_MS: u64 = 1_764_460_800_000;

const YAML: &str = r#"
default_plan: low
plans:
  low: { priority: low, tenant: [{ name: t, limit: 100000, per: 1s }] }
  critical: { priority: critical, tenant: [{ name: t, limit: 100000, per: 1s }] }
tenants:
  vip: { plan: critical }
global:
  "POST /v1/search":
    - { name: search-db, algorithm: concurrency, limit: 100, lease: 1m, adaptive: { latency_target: 100ms, min: 5 } }
  "POST /v1/batch":
    - { name: batch-db, algorithm: fixed_window, limit: 100, per: 1s, share: first_come, adaptive: { latency_target: 100ms } }
"#;

fn request<'a>(tenant: &'a str, route: &'static str, cost: u64) -> Request<'a> {
    Request::new(tenant, route, None, cost).unwrap()
}

async fn instance(
    server: &RedisServer,
    clock: &Arc<ManualClock>,
    timeout: Duration,
) -> Limiter<RedisStore> {
    let keys = KeySet {
        current: sluice_core::keys::Keyer::new(
            "sl",
            &sluice_core::keys::Pepper::parse(&[7u8; 32]).unwrap(),
        ),
        previous: None,
    };
    let store = RedisStore::connect(&server.url(), keys, &ConnectOptions::with_timeout(timeout))
        .await
        .unwrap()
        .with_time(TimeSource::Client(clock.clone()));
    let policy = Policy::compile(&Config::from_yaml(YAML, "a.yaml").unwrap().limits);
    Limiter::with_options(
        policy,
        store,
        LimiterOptions {
            clock: clock.clone(),
            timeout: Some(timeout),
            ..LimiterOptions::new(OnError::Deny)
        },
    )
}

/// A low request of cost 30 at a valve of 100 (low's part 25) is denied
/// `global_capacity` with a Retry-After on Redis too, never
/// `cost_exceeds_capacity` ("it can never pass").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_above_a_prioritys_part_waits_on_redis_too() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(START_MS));
    let limiter = instance(&server, &clock, Duration::from_secs(2)).await;
    let policy = limiter.policy();
    let decision = limiter
        .decide(&policy, &request("anyone", "POST /v1/batch", 30))
        .await;
    assert_eq!(
        decision.reason,
        Some(Reason::GlobalCapacity),
        "retry after {:?}",
        decision.retry_after_ms()
    );
}

/// Appendix I: "every instance uses the same effective limit". An instance
/// that decides but hears no signal reads the law at its next refresh
/// (`sluice serve` refreshes every 100 ms): the limit another instance's
/// observations cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_hears_no_signal_reads_the_law_at_its_refresh() {
    let server = RedisServer::start();
    let clock = Arc::new(ManualClock::new(START_MS));
    let a = instance(&server, &clock, Duration::from_secs(2)).await;
    let b = instance(&server, &clock, Duration::from_secs(2)).await;
    let policy = a.policy();
    for _ in 0..40 {
        clock.set(clock.now_ms() + 100);
        a.observe(&policy, &request("vip", "POST /v1/search", 1), 400.0, None)
            .await;
    }
    assert_eq!(a.adaptive_levels()[0].effective_limit, 5);
    // b has decided (so knows the valve), heard nothing; a refresh later
    // it enforces the limit of 5.
    let policy = b.policy();
    let (_, first) = b
        .acquire(&policy, &request("vip", "POST /v1/search", 1))
        .await;
    drop(first);
    clock.set(clock.now_ms() + 60_000);
    b.refresh_adaptive().await;
    let mut taken = Vec::new();
    for _ in 0..100 {
        let (decision, lease) = b
            .acquire(&policy, &request("vip", "POST /v1/search", 1))
            .await;
        if !decision.allowed {
            break;
        }
        taken.push(lease);
    }
    assert!(
        taken.len() <= 5,
        "b admitted {} leases a minute after the law was cut to 5",
        taken.len()
    );
}
