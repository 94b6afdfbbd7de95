//! A shadow rule with a tolerance reports the over-admission its
//! tolerance would have allowed, changing nothing: replayed on this
//! instance's traffic, the rule with its tolerance against the rule
//! exactly, window by window. (On the memory store behind the remote path,
//! where slices are taken, as on Redis.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sluice_core::config::OnError;
use sluice_core::{BoundRule, Config, Policy, Request};
use sluice_store::{Limiter, LimiterOptions, ManualClock, MemoryStore, Telemetry};

mod remote;
use remote::Remote;

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

fn limiter(yaml: &str) -> (Arc<ManualClock>, Arc<Over>, Limiter<Remote>) {
    let config = Config::from_yaml(yaml, "shadow.yaml").unwrap();
    let clock = Arc::new(ManualClock::new(START_MS));
    let over = Arc::new(Over::default());
    let mut options = LimiterOptions::new(OnError::Deny);
    options.clock = clock.clone();
    options.telemetry = over.clone();
    let store = Remote::new(MemoryStore::with_clock(10_000, clock.clone()));
    let limiter = Limiter::with_options(Policy::compile(&config.limits), store, options);
    (clock, over, limiter)
}

/// Requests of `tenant`, one every `every_ms`, for `ms`: how many were
/// admitted (a shadow rule never denies).
async fn drive(
    limiter: &Limiter<Remote>,
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

/// `per_ms` requests of `tenant` every millisecond, for `ms`: how many
/// were admitted.
async fn offer(
    limiter: &Limiter<Remote>,
    clock: &ManualClock,
    tenant: &str,
    per_ms: u64,
    ms: u64,
) -> u64 {
    let policy = limiter.policy();
    let request = Request::new(tenant, "GET /", None, 1).unwrap();
    let mut admitted = 0;
    for _ in 0..ms {
        for _ in 0..per_ms {
            admitted += u64::from(limiter.decide(&policy, &request).await.allowed);
        }
        clock.advance(1);
    }
    admitted
}

/// `per_ms` requests of a hot key every millisecond, for `ms`, on shadow
/// rules: all admitted.
async fn burst(limiter: &Limiter<Remote>, clock: &ManualClock, per_ms: u64, ms: u64) {
    let admitted = offer(limiter, clock, "hot", per_ms, ms).await;
    assert_eq!(admitted, per_ms * ms, "a shadow rule denies nothing");
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
    // Twice the limit, steadily: once the burst is spent, slices are taken
    // only with room for two more, and there is none, so both copies
    // decide exactly.
    burst(&limiter, &clock, 2, 2_000).await;
    let before = over.of("watch");
    burst(&limiter, &clock, 2, 5_000).await;
    assert_eq!(over.of("watch"), before, "held at its limit, nothing over");
}

#[tokio::test]
async fn a_cold_key_past_its_limit_would_not_over_admit() {
    // The traffic that shows over-admission on a hot key (see the first
    // test), below the hot threshold: 40 a second under a limit of 50,
    // then 90 a second past it. No slice is taken, so what the full
    // bucket refills is dropped both ways.
    let yaml = GCRA.replace(
        "limit: 1000, per: 1s, burst: 200",
        "limit: 50, per: 1s, burst: 20",
    );
    let (clock, over, cold) = self::limiter(&yaml);
    drive(&cold, &clock, "cold", 25, 3_000).await;
    drive(&cold, &clock, "cold", 11, 1_000).await;
    assert_eq!(over.of("watch"), 0);
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
    // 200 a second, then twice the limit, five times over: each window
    // starts hot with a full budget, slices are taken, and it runs out.
    for _ in 0..5 {
        drive(&limiter, &clock, "hot", 5, 1_000).await;
        burst(&limiter, &clock, 2, 1_000).await;
    }
    assert_eq!(over.of("watch"), 0, "its slices end with their window");
}

#[tokio::test]
async fn an_enforced_rule_is_not_replayed() {
    // The traffic that shows over-admission on a shadow rule (see the
    // first test), on the same rule enforced: the store takes slices for
    // it itself, nothing is replayed.
    let (clock, over, limiter) = limiter(&GCRA.replace(", shadow: true", ""));
    drive(&limiter, &clock, "hot", 5, 3_000).await;
    offer(&limiter, &clock, "hot", 4, 1_000).await;
    assert_eq!(over.of("watch"), 0);
}

#[tokio::test]
async fn each_instance_replays_its_share_of_the_rule() {
    let (clock, over, limiter) = limiter(GCRA);
    // One of four live instances, seeing a quarter of the key's traffic:
    // its copies hold a quarter of the rule (250 a second, a burst of 50),
    // so its 200 a second are near that share and its burst well past it.
    limiter.set_live_instances(4);
    drive(&limiter, &clock, "hot", 5, 3_000).await;
    burst(&limiter, &clock, 1, 1_000).await;
    let alone = over.of("watch");
    // Alone, the same traffic is under the whole rule: nothing over.
    let (clock, solo_over, solo) = self::limiter(GCRA);
    drive(&solo, &clock, "hot", 5, 3_000).await;
    burst(&solo, &clock, 1, 1_000).await;
    assert_eq!(
        solo_over.of("watch"),
        0,
        "1,000 a second is the whole limit"
    );
    assert!(
        alone > 0,
        "past its share, it shows what its slices would add"
    );
}

#[tokio::test]
async fn a_request_an_exact_rule_keeps_exact_is_not_replayed() {
    // An enforced rule without a tolerance keeps every request exact,
    // enforced or not: the shadow rule's tolerance would change nothing.
    let yaml = GCRA.replace(
        "    tenant:\n",
        "    tenant:\n      - { name: exact, algorithm: gcra, limit: 100000, per: 1s }\n",
    );
    let (clock, over, limiter) = limiter(&yaml);
    drive(&limiter, &clock, "hot", 5, 3_000).await;
    burst(&limiter, &clock, 4, 1_000).await;
    assert_eq!(over.of("watch"), 0);
}

#[tokio::test]
async fn nothing_is_replayed_on_a_store_that_takes_no_slices() {
    // The memory store decides in process: no slice is ever taken there.
    let config = Config::from_yaml(GCRA, "shadow.yaml").unwrap();
    let clock = Arc::new(ManualClock::new(START_MS));
    let over = Arc::new(Over::default());
    let mut options = LimiterOptions::new(OnError::Deny);
    options.clock = clock.clone();
    options.telemetry = over.clone();
    let store = MemoryStore::with_clock(10_000, clock.clone());
    let limiter = Limiter::with_options(Policy::compile(&config.limits), store, options);
    let policy = limiter.policy();
    let request = Request::new("hot", "GET /", None, 1).unwrap();
    for _ in 0..600 {
        limiter.decide(&policy, &request).await;
        clock.advance(5);
    }
    for _ in 0..1_000 {
        for _ in 0..4 {
            limiter.decide(&policy, &request).await;
        }
        clock.advance(1);
    }
    assert_eq!(over.of("watch"), 0);
}
