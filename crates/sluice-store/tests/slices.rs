//! Slices of hot keys (`tolerance`), against the memory store behind the
//! remote path (so that the limiter takes slices as it does from Redis),
//! on a clock driven by hand: cold keys stay exact, hot keys cost the
//! store few calls, the fleet never admits more than `limit × (1 +
//! tolerance)` in a window whatever the number of instances, a killed
//! instance's slice is lost (never counted twice), a reload drops slices.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use sluice_core::config::OnError;

use sluice_core::Request;
use sluice_store::{Clock, Limiter, LimiterOptions, MemoryStore};

mod remote;
use remote::Remote;
use remote::fleet::{Fleet, policy, runtime, window_of};

const HOT: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ limit: 1200000, per: 1m, tolerance: "1%" }]
"#;

#[test]
fn a_hot_key_costs_the_store_at_most_one_call_per_hundred_decisions() {
    runtime().block_on(async {
        let fleet = Fleet::new(HOT, 2);
        let mut decisions = 0u64;
        // 4,000 decisions a second on each instance (four a millisecond),
        // for five seconds.
        for _ in 0..5_000 {
            for _ in 0..4 {
                for i in 0..2 {
                    assert!(fleet.decide(i, "hot").await);
                    decisions += 1;
                }
            }
            fleet.clock.advance(1);
        }
        assert_eq!(decisions, 2 * 4_000 * 5);
        let calls = fleet.calls();
        assert!(
            calls * 100 <= decisions,
            "{calls} store calls for {decisions} decisions"
        );
        let levels = fleet.instances[0].slice_levels();
        assert_eq!(levels.len(), 1);
        assert_eq!(levels[0].bound, 12_000, "1% of 1,200,000");
        assert!(!fleet.instances[0].slices_of("hot").is_empty());
        assert!(fleet.instances[0].slices_of("cold").is_empty());
    });
}

#[test]
fn cold_keys_and_rules_without_tolerance_stay_exact() {
    let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ limit: 1200000, per: 1m, tolerance: "1%" }]
  q:
    tenant: [{ limit: 1200000, per: 1m }]
tenants:
  exact: { plan: q }
"#;
    runtime().block_on(async {
        let fleet = Fleet::new(yaml, 2);
        // A cold key, 50 decisions a second (below the threshold), next to
        // a hot one: one call each.
        for second in 0..4 {
            for n in 0..1_000 {
                let before = fleet.calls();
                if n % 20 == 0 {
                    assert!(fleet.decide(n % 2, "cold").await);
                    assert_eq!(fleet.calls(), before + 1, "second {second}: cold");
                }
                assert!(fleet.decide(n % 2, "hot").await);
                fleet.clock.advance(1);
            }
        }
        // A rule without tolerance, however hot: one call each.
        let before = fleet.calls();
        for _ in 0..2_000 {
            assert!(fleet.decide(0, "exact").await);
        }
        assert_eq!(fleet.calls(), before + 2_000);
    });
}

/// Per rule: the limit, the burst a span of `per` allows beyond it, `per`,
/// and whether the bound holds over any span (else per aligned window).
const BOUNDED: [(&str, u64, u64, u64, bool); 3] = [
    (
        "{ algorithm: fixed_window, aligned: true, limit: 1000, per: 2s, tolerance: \"5%\" }",
        1_000,
        0,
        2_000,
        false,
    ),
    (
        "{ algorithm: gcra, limit: 1000, per: 2s, burst: 100, tolerance: \"5%\" }",
        1_000,
        100,
        2_000,
        true,
    ),
    (
        "{ algorithm: token_bucket, limit: 1000, per: 2s, burst: 100, tolerance: \"5%\" }",
        1_000,
        100,
        2_000,
        true,
    ),
];

/// Admissions of one key by a fleet of 1 to 4 instances offered four
/// times the limit, in a random interleaving: in every span of `per` (every
/// aligned window for fixed_window) at most `burst + limit × 1.05`, and
/// for fixed_window at most what the store counted in that window.
#[test]
fn a_fleet_never_admits_more_than_the_limit_and_its_tolerance() {
    let steps = prop::collection::vec((0usize..4, 0u64..2), 8_000..10_000);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 8,
        ..ProptestConfig::default()
    });
    for (rule, limit, burst, per, spans) in BOUNDED {
        let yaml = format!("default_plan: p\nplans:\n  p:\n    tenant: [{rule}]\n");
        runner
            .run(&(1usize..=4, steps.clone()), |(n, steps)| {
                runtime().block_on(async {
                    let fleet = Fleet::new(&yaml, n);
                    let mut admitted: Vec<u64> = Vec::new();
                    let mut windows: Vec<(u64, u64)> = Vec::new();
                    for (instance, advance) in &steps {
                        let now = fleet.clock.now_ms();
                        if fleet.decide(instance % n, "t").await {
                            admitted.push(now);
                        }
                        fleet.clock.advance(*advance);
                        if let Some(window) = fixed_window_count(&fleet, &yaml) {
                            match windows.last_mut() {
                                Some(last) if last.0 == window.0 => *last = window,
                                _ => windows.push(window),
                            }
                        }
                    }
                    prop_assert!(
                        fleet.calls() < admitted.len() as u64 / 2,
                        "slices were taken"
                    );
                    let most = burst + limit + limit / 20;
                    let mut start = 0;
                    for (end, &at) in admitted.iter().enumerate() {
                        while spans && admitted[start] + per <= at {
                            start += 1;
                        }
                        let in_span = (end - start + 1) as u64;
                        prop_assert!(
                            !spans || in_span <= most,
                            "{in_span} admitted in {per} ms: {rule}"
                        );
                    }
                    for (window, counted) in windows {
                        let inside = admitted
                            .iter()
                            .filter(|&&at| at >= window && at < window + per)
                            .count() as u64;
                        prop_assert!(
                            inside <= counted && counted <= limit,
                            "window {window}: {inside} admitted, store counted {counted}"
                        );
                    }
                    Ok(())
                })
            })
            .unwrap();
    }
}

/// The store's fixed window for tenant `t`: its start and count.
fn fixed_window_count(fleet: &Fleet, yaml: &str) -> Option<(u64, u64)> {
    window_of(fleet, yaml, "t")
}

const WINDOW: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: fixed_window, aligned: true, limit: 20000, per: 10s, tolerance: "1%" }]
"#;

/// An instance killed holding a slice: the others never admit what it
/// held (the store counted it), and lose at most that slice.
#[test]
fn a_killed_instances_slice_is_lost_never_counted_twice() {
    runtime().block_on(async {
        let mut fleet = Fleet::new(WINDOW, 2);
        // At the start of a window.
        fleet.to_next_window(10_000);
        let mut admitted = 0u64;
        for _ in 0..2_000 {
            for i in 0..2 {
                admitted += u64::from(fleet.decide(i, "t").await);
            }
            fleet.clock.advance(1);
        }
        let held = fleet.instances[1].slices_of("t");
        let held: u64 = held.iter().map(|s| s.units).sum();
        assert!(held > 0, "instance 1 holds a slice");
        assert!(held <= 200, "at most 1% of the limit: {held}");
        drop(fleet.instances.pop());
        while fleet.decide(0, "t").await {
            admitted += 1;
        }
        let counted = fixed_window_count(&fleet, WINDOW).unwrap().1;
        assert_eq!(counted, 20_000, "the store counted the whole limit");
        assert!(
            admitted + held <= 20_000 && admitted + 2 * 200 >= 20_000,
            "admitted {admitted}, the killed instance held {held}"
        );
    });
}

/// An instance that stops gives back what its slices still hold: the
/// store then counts only what was admitted, and nothing is answered from
/// slices any more.
#[test]
fn a_stopping_instance_gives_its_slices_back() {
    runtime().block_on(async {
        let fleet = Fleet::new(WINDOW, 1);
        fleet.to_next_window(10_000);
        let mut admitted = 0u64;
        for _ in 0..2_000 {
            admitted += u64::from(fleet.decide(0, "t").await);
            fleet.clock.advance(1);
        }
        let held: u64 = fleet.instances[0]
            .slices_of("t")
            .iter()
            .map(|s| s.units)
            .sum();
        assert!(held > 0, "a slice is held");
        let (_, before) = fixed_window_count(&fleet, WINDOW).unwrap();
        assert_eq!(before, admitted + held, "the slice was counted when taken");
        assert_eq!(fleet.instances[0].give_back_slices().await, held);
        assert!(fleet.instances[0].slices_of("t").is_empty());
        let (_, after) = fixed_window_count(&fleet, WINDOW).unwrap();
        assert_eq!(
            after, admitted,
            "the store counts what was admitted, no more"
        );
    });
}

/// A reload drops every slice at once: the next decision asks the store.
#[test]
fn a_reload_drops_slices() {
    runtime().block_on(async {
        let fleet = Fleet::new(HOT, 1);
        for _ in 0..3_000 {
            assert!(fleet.decide(0, "hot").await);
            fleet.clock.advance(1);
        }
        assert!(!fleet.instances[0].slices_of("hot").is_empty());
        let lower = HOT.replace("1200000", "600000");
        fleet.instances[0].set_policy(policy(&lower));
        assert!(fleet.instances[0].slices_of("hot").is_empty());
        let before = fleet.calls();
        assert!(fleet.decide(0, "hot").await);
        assert_eq!(fleet.calls(), before + 1);
    });
}

/// Two rules with slices: once the second is spent, requests it denies
/// take nothing from the first's slice (nor from the store).
#[test]
fn a_request_another_rule_denies_takes_nothing_from_a_slice() {
    let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: fixed_window, aligned: true, limit: 1000000, per: 10s, tolerance: "1%" }]
    routes:
      "GET /":
        - { algorithm: fixed_window, aligned: true, limit: 3000, per: 10s, tolerance: "2%" }
"#;
    runtime().block_on(async {
        let mut fleet = Fleet::new(yaml, 0);
        fleet.denial_cache = false;
        fleet.start(yaml);
        fleet.to_next_window(10_000);
        let mut admitted = 0u64;
        for _ in 0..3_000 {
            admitted += u64::from(fleet.decide(0, "t").await);
            fleet.clock.advance(1);
        }
        while fleet.decide(0, "t").await {
            admitted += 1;
        }
        assert_eq!(admitted, 3_000);
        let held = |fleet: &Fleet| -> u64 {
            fleet.instances[0]
                .slices_of("t")
                .iter()
                .filter(|s| s.rule == "tenant-0")
                .map(|s| s.units)
                .sum()
        };
        let tenant_count = |fleet: &Fleet| fixed_window_count(fleet, yaml).unwrap().1;
        let (held_before, counted_before) = (held(&fleet), tenant_count(&fleet));
        assert!(held_before > 0, "the tenant rule holds a slice");
        for _ in 0..1_000 {
            assert!(!fleet.decide(0, "t").await);
        }
        assert_eq!(
            held(&fleet),
            held_before,
            "denied requests took nothing from the slice"
        );
        assert_eq!(tenant_count(&fleet), counted_before, "nor from the store");
    });
}

/// The store down: the units already taken (counted before it went down)
/// are spent for at most a slice's lifetime, then every decision is the
/// failure policy's, as without slices; the first error drops every slice.
#[test]
fn a_store_down_falls_to_the_failure_policy() {
    runtime().block_on(async {
        let fleet = Fleet::new(HOT, 1);
        for _ in 0..3_000 {
            assert!(fleet.decide(0, "hot").await);
            fleet.clock.advance(1);
        }
        assert!(!fleet.instances[0].slices_of("hot").is_empty());
        fleet.down.store(true, Ordering::Relaxed);
        let policy = fleet.instances[0].policy();
        let request = Request::new("hot", "GET /", None, 1).unwrap();
        let mut degraded_after = None;
        for ms in 0..1_000u64 {
            let decision = fleet.instances[0].decide(&policy, &request).await;
            if decision.degraded.is_some() || !decision.allowed {
                assert_eq!(decision.degraded, Some(OnError::Deny));
                assert!(
                    fleet.instances[0].slices_of("hot").is_empty(),
                    "the first error dropped every slice"
                );
                degraded_after.get_or_insert(ms);
            } else {
                assert!(
                    degraded_after.is_none(),
                    "no slice outlives the first error"
                );
            }
            fleet.clock.advance(1);
        }
        let after = degraded_after.expect("the failure policy decides");
        assert!(
            after <= 600,
            "within a slice's lifetime (1% of 1m): {after} ms"
        );
        assert!(fleet.instances[0].slices_of("hot").is_empty());
    });
}

/// The wall clock stepped an hour back, then two forward, while a slice is
/// held: the limiter's clock never goes back and only slews forward, so
/// the slice still expires within its lifetime (600 ms, real time) and is
/// never spent after it.
#[test]
fn clock_steps_cannot_stretch_a_slice() {
    static WALL: AtomicU64 = AtomicU64::new(1_700_000_000_000);
    fn wall() -> u64 {
        WALL.load(Ordering::Relaxed)
    }
    runtime().block_on(async {
        let clock = Arc::new(sluice_store::SystemClock::with_wall(wall));
        let store = Arc::new(MemoryStore::with_clock(1_000, clock.clone()));
        let calls = Arc::new(AtomicU64::new(0));
        let mut options = LimiterOptions::new(OnError::Deny);
        options.clock = clock.clone();
        let remote = Remote {
            calls: calls.clone(),
            ..Remote::new(store)
        };
        let limiter = Limiter::with_options(policy(HOT), remote, options);
        let policy = limiter.policy();
        let request = Request::new("hot", "GET /", None, 1).unwrap();
        // 300 decisions in about 0.3 s: hot.
        for _ in 0..300 {
            assert!(limiter.decide(&policy, &request).await.allowed);
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        assert!(!limiter.slices_of("hot").is_empty(), "a slice is held");
        let taken = std::time::Instant::now();
        for step in [-3_600_000i64, 7_200_000] {
            WALL.store(wall().saturating_add_signed(step), Ordering::Relaxed);
            limiter.sweep(); // resyncs the clock
            assert!(
                !limiter.slices_of("hot").is_empty() || taken.elapsed().as_millis() >= 600,
                "a forward step does not end it early either (slewed, not jumped)"
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
        assert!(
            limiter.slices_of("hot").is_empty(),
            "expired within its lifetime, whatever the wall clock did"
        );
        let before = calls.load(Ordering::Relaxed);
        assert!(limiter.decide(&policy, &request).await.allowed);
        assert_eq!(
            calls.load(Ordering::Relaxed),
            before + 1,
            "asked the store again"
        );
    });
}
