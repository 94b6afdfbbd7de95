//! A shadow rule with a tolerance reports the over-admission its
//! tolerance would have allowed, changing nothing: replayed on this
//! instance's traffic, the rule with its tolerance against the rule
//! exactly, window by window.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sluice_core::config::OnError;
use sluice_core::{BoundRule, Config, Policy, Request};
use sluice_store::{Limiter, LimiterOptions, ManualClock, MemoryStore, Telemetry};

/// The over-admission reported, by rule name.
#[derive(Default)]
struct Over(Mutex<HashMap<String, u64>>);

impl Telemetry for Over {
    fn slice_shadow_over(&self, rule: &BoundRule, units: u64) {
        *self
            .0
            .lock()
            .unwrap()
            .entry(rule.name().to_owned())
            .or_default() += units;
    }
}

impl Over {
    fn of(&self, rule: &str) -> u64 {
        self.0.lock().unwrap().get(rule).copied().unwrap_or(0)
    }
}

const START_MS: u64 = 1_764_460_800_000;

fn limiter(yaml: &str) -> (Arc<ManualClock>, Arc<Over>, Limiter<MemoryStore>) {
    let config = Config::from_yaml(yaml, "shadow.yaml").unwrap();
    let clock = Arc::new(ManualClock::new(START_MS));
    let over = Arc::new(Over::default());
    let mut options = LimiterOptions::new(OnError::Deny);
    options.clock = clock.clone();
    options.telemetry = over.clone();
    let store = MemoryStore::with_clock(10_000, clock.clone());
    let limiter = Limiter::with_options(Policy::compile(&config.limits), store, options);
    (clock, over, limiter)
}

/// Requests of `tenant`, one every `every_ms`, for `ms`: how many were
/// admitted (a shadow rule never denies).
async fn drive(
    limiter: &Limiter<MemoryStore>,
    clock: &ManualClock,
    tenant: &str,
    every_ms: u64,
    ms: u64,
) -> u64 {
    let policy = limiter.policy();
    let request = Request::new(tenant, "GET /", None, 1).unwrap();
    let mut admitted = 0;
    for _ in 0..ms / every_ms {
        admitted += u64::from(limiter.decide(&policy, &request).await.allowed);
        clock.advance(every_ms);
    }
    admitted
}

/// 1,000 a second with a burst of 200, in shadow with 10 %.
const GCRA: &str = r#"
default_plan: p
plans:
  p:
    tenant:
      - { name: watch, algorithm: gcra, limit: 1000, per: 1s, burst: 200, shadow: true, tolerance: "10%" }
"#;

/// `per_ms` requests of `tenant` every millisecond, for `ms`.
async fn burst(limiter: &Limiter<MemoryStore>, clock: &ManualClock, per_ms: u64, ms: u64) {
    let policy = limiter.policy();
    let request = Request::new("hot", "GET /", None, 1).unwrap();
    for _ in 0..ms {
        for _ in 0..per_ms {
            assert!(
                limiter.decide(&policy, &request).await.allowed,
                "a shadow rule denies nothing"
            );
        }
        clock.advance(1);
    }
}

#[tokio::test]
async fn a_hot_key_that_bursts_shows_what_the_tolerance_would_over_admit() {
    let (clock, over, limiter) = limiter(GCRA);
    // 200 a second, under the limit: hot, and the bucket stays full, so
    // the store refills what a slice holds while it is spent (what a full
    // bucket would have dropped).
    drive(&limiter, &clock, "hot", 5, 3_000).await;
    assert_eq!(over.of("watch"), 0, "under the limit, both admit all");
    // Then 4,000 a second for a second, four times the limit: exactly,
    // the burst and the refill pass; with the tolerance, what the slices
    // held on top.
    burst(&limiter, &clock, 4, 1_000).await;
    let reported = over.of("watch");
    assert!(reported > 0, "a slice's units would have passed on top");
    assert!(
        reported <= 100,
        "{reported}: at most the bound, 10 % of 1,000"
    );
}

#[tokio::test]
async fn a_key_held_at_its_limit_would_not_over_admit() {
    let (clock, over, limiter) = limiter(GCRA);
    // Twice the limit, steadily: slices are taken only with room for two
    // more, so near the limit both copies decide exactly.
    drive(&limiter, &clock, "saturated", 1, 3_000).await;
    assert_eq!(over.of("watch"), 0);
}

#[tokio::test]
async fn a_key_under_its_limit_or_cold_would_not_over_admit() {
    let (clock, over, limiter) = limiter(GCRA);
    // Hot (200 a second) but under the limit: both copies admit all.
    drive(&limiter, &clock, "under", 5, 5_000).await;
    // Cold (20 a second), far past the limit's share of its rate: no
    // slice is ever taken.
    let yaml = GCRA.replace(
        "limit: 1000, per: 1s, burst: 200",
        "limit: 10, per: 1s, burst: 10",
    );
    let (cold_clock, cold_over, cold) = self::limiter(&yaml);
    drive(&cold, &cold_clock, "cold", 50, 5_000).await;
    assert_eq!(over.of("watch"), 0);
    assert_eq!(cold_over.of("watch"), 0);
}

#[tokio::test]
async fn an_aligned_fixed_window_never_over_admits() {
    let (clock, over, limiter) = limiter(
        r#"
default_plan: p
plans:
  p:
    tenant:
      - { name: watch, algorithm: fixed_window, aligned: true, limit: 1000, per: 1s, shadow: true, tolerance: "10%" }
"#,
    );
    drive(&limiter, &clock, "hot", 1, 10_000).await;
    assert_eq!(over.of("watch"), 0, "its slices end with their window");
}

#[tokio::test]
async fn an_enforced_rule_or_one_without_tolerance_is_not_replayed() {
    let (clock, over, limiter) = limiter(
        r#"
default_plan: p
plans:
  p:
    tenant:
      - { name: enforced, algorithm: gcra, limit: 1000, per: 1s, tolerance: "10%" }
      - { name: watch, algorithm: gcra, limit: 1000, per: 1s, shadow: true }
"#,
    );
    drive(&limiter, &clock, "hot", 1, 5_000).await;
    assert_eq!(over.of("enforced"), 0);
    assert_eq!(over.of("watch"), 0);
}
