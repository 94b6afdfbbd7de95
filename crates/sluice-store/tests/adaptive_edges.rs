//! Adaptive valves at their edges (appendix I), in the limiter on the
//! memory store with a hand-set clock: a window valve's shares, a cost
//! above a priority's part, the clock stepped back, a bad latency, a small
//! limit, and a valve made adaptive again after a day.

use std::sync::Arc;

use sluice_core::config::{Config, OnError};
use sluice_core::{Policy, Reason, Request};
use sluice_store::limiter::LimiterOptions;
use sluice_store::{Clock, Limiter, ManualClock, MemoryStore};

const START_MS: u64 = 1_764_460_800_000;

fn limiter(yaml: &str) -> (Limiter<MemoryStore>, Arc<ManualClock>) {
    let config = Config::from_yaml(yaml, "adaptive.yaml").unwrap();
    let clock = Arc::new(ManualClock::new(START_MS));
    let store = MemoryStore::with_clock(10_000, clock.clone());
    let options = LimiterOptions {
        clock: clock.clone(),
        ..LimiterOptions::new(OnError::Deny)
    };
    (
        Limiter::with_options(Policy::compile(&config.limits), store, options),
        clock,
    )
}

fn plans(valve: &str) -> String {
    format!(
        r#"
default_plan: low
plans:
  low: {{ priority: low, tenant: [{{ name: t, limit: 100000, per: 1s }}] }}
  critical: {{ priority: critical, tenant: [{{ name: t, limit: 100000, per: 1s }}] }}
  gold: {{ priority: critical, tenant: [{{ name: t, limit: 100000, per: 1s }}] }}
tenants:
  vip: {{ plan: critical }}
  goldie: {{ plan: gold }}
  sharded: {{ plan: low, shards: 2 }}
global:
  "POST /v1/search":
    - {valve}
"#
    )
}

fn search(tenant: &str, cost: u64) -> Request<'_> {
    Request::new(tenant, "POST /v1/search", None, cost).unwrap()
}

/// Admissions of `tenant` (cost 1) at this instant, up to 300.
async fn admitted(limiter: &Limiter<MemoryStore>, tenant: &str) -> u32 {
    let policy = limiter.policy();
    let mut n = 0;
    for _ in 0..300 {
        if !limiter.decide(&policy, &search(tenant, 1)).await.allowed {
            break;
        }
        n += 1;
    }
    n
}

/// Reports `n` requests of `latency_ms`, 100 ms apart.
async fn slow(limiter: &Limiter<MemoryStore>, clock: &ManualClock, n: u32, latency_ms: f64) {
    let policy = limiter.policy();
    for _ in 0..n {
        clock.advance(100);
        limiter
            .observe(&policy, &search("vip", 1), latency_ms, None)
            .await;
    }
}

/// On a window valve each priority fills its part (low 25, critical to
/// 100).
#[tokio::test]
async fn a_window_valves_shares_hold() {
    let (limiter, _) = limiter(&plans(
        "{ name: db, algorithm: fixed_window, limit: 100, per: 1s, adaptive: { latency_target: 100ms } }",
    ));
    assert_eq!(admitted(&limiter, "anyone").await, 25);
    assert_eq!(admitted(&limiter, "vip").await, 75);
}

/// A request whose cost is above its priority's part of the effective
/// limit is a `global_capacity` denial with a Retry-After (appendix I), not
/// `cost_exceeds_capacity` ("it can never pass"), on every path: an
/// unsharded tenant's and a sharded one's (`on_shards`, the path every
/// Redis decision takes).
#[tokio::test]
async fn above_the_share_is_global_capacity_on_every_path() {
    let yaml = plans(
        "{ name: db, algorithm: fixed_window, limit: 100, per: 1s, share: first_come, adaptive: { latency_target: 100ms } }",
    );
    let (limiter, clock) = limiter(&yaml);
    let policy = limiter.policy();
    let plain = limiter.decide(&policy, &search("anyone", 30)).await;
    assert_eq!(plain.reason, Some(Reason::GlobalCapacity), "{plain:?}");
    // The same limits compiled as for a Redis backend (tenants' shards kept).
    let config = Config::from_yaml(&yaml, "adaptive.yaml").unwrap();
    let sharded_limiter = Limiter::with_options(
        Policy::compile_for(&config.limits, true),
        MemoryStore::with_clock(10_000, clock.clone()),
        LimiterOptions {
            clock: clock.clone(),
            ..LimiterOptions::new(OnError::Deny)
        },
    );
    let policy = sharded_limiter.policy();
    let sharded = sharded_limiter
        .decide(&policy, &search("sharded", 30))
        .await;
    assert_eq!(
        sharded.reason,
        Some(Reason::GlobalCapacity),
        "retry after {:?}",
        sharded.retry_after_ms()
    );
}

/// A clock stepped back (NTP) an hour: the law still steps, and a slow
/// downstream is still cut.
#[tokio::test]
async fn a_clock_stepped_back_never_freezes_the_law() {
    let (limiter, clock) = limiter(&plans(
        "{ name: db, algorithm: concurrency, limit: 100, lease: 1m, adaptive: { latency_target: 100ms, min: 5 } }",
    ));
    slow(&limiter, &clock, 2, 10.0).await;
    clock.set(clock.now_ms() - 3_600_000);
    slow(&limiter, &clock, 600, 400.0).await;
    let level = limiter.adaptive_levels()[0].clone();
    assert_eq!(
        level.effective_limit, 5,
        "a minute of 400 ms latencies (target 100 ms) after the clock stepped back an hour: {level:?}"
    );
}

/// At its least limit (`min`, 4 by default) every priority keeps a part
/// of its own: low holds its one slot, and critical is still admitted.
#[tokio::test]
async fn at_its_least_limit_every_priority_keeps_its_part() {
    let (limiter, clock) = limiter(&plans(
        "{ name: db, algorithm: concurrency, limit: 40, lease: 1m, adaptive: { latency_target: 100ms } }",
    ));
    slow(&limiter, &clock, 60, 400.0).await;
    assert_eq!(limiter.adaptive_levels()[0].effective_limit, 4);
    let policy = limiter.policy();
    let (low, _low) = limiter.acquire(&policy, &search("anyone", 1)).await;
    let (second, _second) = limiter.acquire(&policy, &search("anyone", 1)).await;
    assert!(low.allowed && !second.allowed, "low: a quarter of 4");
    let mut critical = Vec::new();
    for _ in 0..4 {
        critical.push(limiter.acquire(&policy, &search("vip", 1)).await);
    }
    let admitted = critical.iter().filter(|(d, _)| d.allowed).count();
    assert_eq!(admitted, 3, "critical: the rest of 4");
}

/// A non-finite latency given to the library's `observe` is not counted:
/// the estimate stays a number, and a slow downstream is cut.
#[tokio::test]
async fn an_infinite_latency_never_poisons_the_law() {
    let (limiter, clock) = limiter(&plans(
        "{ name: db, algorithm: concurrency, limit: 100, lease: 1m, adaptive: { latency_target: 100ms, min: 5 } }",
    ));
    slow(&limiter, &clock, 1, f64::INFINITY).await;
    slow(&limiter, &clock, 100, 400.0).await;
    let level = limiter.adaptive_levels()[0].clone();
    assert!(
        level.latency_ms.is_finite() && level.effective_limit == 5,
        "10 s of 400 ms latencies after one infinite one: {level:?}"
    );
}

/// Reload: a valve cut to min during an incident, made non-adaptive, and
/// adaptive again a day later starts afresh at its limit.
#[tokio::test]
async fn a_valve_made_adaptive_again_after_a_day_starts_afresh() {
    let adaptive = plans(
        "{ name: db, algorithm: fixed_window, limit: 100, per: 1s, share: first_come, adaptive: { latency_target: 100ms, min: 5 } }",
    );
    let (limiter, clock) = limiter(&adaptive);
    slow(&limiter, &clock, 40, 400.0).await;
    assert_eq!(limiter.adaptive_levels()[0].effective_limit, 5);
    let plain = adaptive.replace(", adaptive: { latency_target: 100ms, min: 5 }", "");
    limiter.set_policy(Policy::compile(
        &Config::from_yaml(&plain, "a.yaml").unwrap().limits,
    ));
    clock.advance(86_400_000);
    limiter.set_policy(Policy::compile(
        &Config::from_yaml(&adaptive, "a.yaml").unwrap().limits,
    ));
    clock.advance(1_000);
    let critical = admitted(&limiter, "vip").await;
    assert_eq!(
        critical, 100,
        "a day later, made adaptive again: critical admitted {critical}"
    );
}

/// A shadow adaptive valve denies nothing, and counts what it would shed
/// by priority.
#[tokio::test]
async fn a_shadow_adaptive_valve_counts_what_it_would_shed() {
    let (limiter, clock) = limiter(&plans(
        "{ name: db, algorithm: fixed_window, limit: 100, per: 1m, shadow: true, adaptive: { latency_target: 100ms, min: 8 } }",
    ));
    slow(&limiter, &clock, 40, 400.0).await;
    assert_eq!(limiter.adaptive_levels()[0].effective_limit, 8);
    // Low's part of 8 is 2: every request admitted, all but 2 counted shed.
    assert_eq!(
        admitted(&limiter, "anyone").await,
        300,
        "shadow: nothing denied"
    );
    let level = &limiter.adaptive_levels()[0];
    let low = level
        .shed
        .iter()
        .find(|(p, _)| p.name() == "low")
        .unwrap()
        .1;
    assert_eq!(low, 300 - 2, "{level:?}");
}

/// A route's priority (`priorities:`) wins over the plan's: a tenant of
/// the low plan fills the whole valve on a critical route.
#[tokio::test]
async fn a_routes_priority_wins_over_the_plans() {
    let yaml = plans(
        "{ name: db, algorithm: fixed_window, limit: 100, per: 1m, adaptive: { latency_target: 100ms } }",
    ) + "priorities:\n  \"POST /v1/search\": critical\n";
    let (limiter, _) = limiter(&yaml);
    assert_eq!(
        admitted(&limiter, "anyone").await,
        100,
        "low plan, critical route"
    );
}
