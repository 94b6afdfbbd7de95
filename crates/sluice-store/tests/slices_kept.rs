//! What a policy change or a key going cold does to slices (issue 45 C):
//! slices of rules a reload or an override leaves alone are kept; a slice
//! dropped (its rule changed) or left unspent (the key cooled) gives back
//! what it held, out of band, so the store counts only what was admitted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::policy::TenantOverride;
use sluice_core::{Config, Policy};

mod remote;
use remote::fleet::{Fleet, policy, runtime, window_of};

const TWO: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: hot, algorithm: fixed_window, aligned: true, limit: 200000, per: 10s, tolerance: "1%" }]
  q:
    tenant: [{ name: quiet, limit: 1000, per: 1m }]
tenants:
  other: { plan: q }
"#;

/// Decides `tenant` on instance 0 once a millisecond for `ms`.
async fn hot_for(fleet: &Fleet, tenant: &str, ms: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..ms {
        admitted += u64::from(fleet.decide(0, tenant).await);
        fleet.clock.advance(1);
    }
    admitted
}

fn overridden(yaml: &str, tenant: &str, factor: f64) -> Policy {
    let limits = Config::from_yaml(yaml, "t.yaml").unwrap().limits;
    let by = TenantOverride {
        factor: Some(factor),
        ..TenantOverride::default()
    };
    Policy::compile_overridden(&limits, false, &[(tenant, &by)])
}

/// Overrides of other tenants (on the hot tenant's plan and on another)
/// and a reload that changes only another plan keep the hot tenant's
/// slice: its next decisions cost the store nothing.
#[test]
fn a_change_to_other_rules_keeps_slices() {
    runtime().block_on(async {
        let fleet = Fleet::new(TWO, 1);
        fleet.to_next_window(10_000);
        hot_for(&fleet, "hot", 2_000).await;
        let changes = [
            overridden(TWO, "other", 2.0),
            overridden(TWO, "neighbour", 0.5),
            policy(&TWO.replace("limit: 1000,", "limit: 900,")),
        ];
        for change in changes {
            let held = fleet.held(0, "hot");
            assert!(held > 0, "a slice is held");
            fleet.instances[0].set_policy(change);
            assert_eq!(fleet.held(0, "hot"), held, "kept");
            let before = fleet.calls();
            fleet.clock.advance(1);
            assert!(fleet.decide(0, "hot").await);
            assert_eq!(fleet.calls(), before, "answered from the slice kept");
            hot_for(&fleet, "hot", 200).await;
        }
    });
}

/// A change to the hot tenant's own rule drops its slice at once, and
/// what the slice held is given back: the store counts what was admitted.
#[test]
fn a_dropped_slice_gives_back_what_it_held() {
    runtime().block_on(async {
        let fleet = Fleet::new(TWO, 1);
        fleet.to_next_window(10_000);
        let admitted = hot_for(&fleet, "hot", 2_000).await;
        let held = fleet.held(0, "hot");
        assert!(held > 0, "a slice is held");
        let (_, counted) = window_of(&fleet, TWO, "hot").unwrap();
        assert_eq!(counted, admitted + held);
        let limiter = &fleet.instances[0];
        limiter.set_policy(overridden(TWO, "hot", 0.5));
        assert_eq!(fleet.held(0, "hot"), 0, "dropped at once");
        assert_eq!(limiter.give_back_dropped_slices().await, held);
        let (_, counted) = window_of(&fleet, TWO, "hot").unwrap();
        assert_eq!(counted, admitted, "the store counts what was admitted");
        assert_eq!(limiter.give_back_dropped_slices().await, 0, "once");
    });
}

/// The store failing give-backs: the first failure ends the pass (each
/// would wait out the time budget), and what was not given back is
/// given back by a later pass, once the store answers.
#[test]
fn give_backs_the_store_refuses_wait_for_it_to_answer() {
    runtime().block_on(async {
        let mut fleet = Fleet::new(TWO, 0);
        let left = Arc::new(AtomicU64::new(0));
        fleet.adjusts_left = Some(left.clone());
        fleet.start(TWO);
        fleet.to_next_window(10_000);
        let mut admitted = 0;
        for _ in 0..2_000 {
            for tenant in ["a", "b", "c"] {
                admitted += u64::from(fleet.decide(0, tenant).await);
            }
            fleet.clock.advance(1);
        }
        let limiter = &fleet.instances[0];
        let held: u64 = ["a", "b", "c"].iter().map(|t| fleet.held(0, t)).sum();
        assert!(["a", "b", "c"].iter().all(|t| fleet.held(0, t) > 0));
        limiter.set_policy(policy(&TWO.replace("limit: 200000,", "limit: 100000,")));
        let before = fleet.calls();
        assert_eq!(limiter.give_back_dropped_slices().await, 0);
        assert_eq!(fleet.calls(), before + 1, "one attempt, not one per slice");
        left.store(1_000, Ordering::Relaxed);
        fleet.clock.advance(100);
        let given = limiter.give_back_dropped_slices().await;
        assert!(given >= held, "given back {given} of {held} held");
        let counted: u64 = ["a", "b", "c"]
            .iter()
            .map(|t| window_of(&fleet, TWO, t).unwrap().1)
            .sum();
        assert_eq!(counted, admitted, "the store counts what was admitted");
    });
}

const WINDOW: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: fixed_window, aligned: true, limit: 2400, per: 1m, tolerance: "1%" }]
"#;

/// A key hot for a second, then cold for four, twelve times in one
/// window, asking 2,344 of its 2,400: each time it cools, the slice it
/// holds expires unspent and is given back (as `sluice serve` does every
/// `GIVE_BACK_EVERY`), so nothing is denied, as exactly.
#[test]
fn a_key_that_cools_again_and_again_loses_nothing() {
    runtime().block_on(async {
        let fleet = Fleet::new(WINDOW, 1);
        fleet.to_next_window(60_000);
        let (mut asked, mut denied, mut given) = (0u64, 0u64, 0u64);
        for burst in 0..12 {
            let wanted = if burst == 11 { 144 } else { 200 };
            for ms in 0..1_000u64 {
                if ms % 5 == 0 && ms / 5 < wanted {
                    asked += 1;
                    denied += u64::from(!fleet.decide(0, "t").await);
                }
                fleet.clock.advance(1);
            }
            for _ in 0..40 {
                given += fleet.instances[0].give_back_dropped_slices().await;
                fleet.clock.advance(100);
            }
            let (_, counted) = window_of(&fleet, WINDOW, "t").unwrap();
            assert_eq!(
                counted,
                asked - denied,
                "cold: the store counts what was admitted, nothing stranded"
            );
        }
        assert_eq!(asked, 2_344);
        assert!(given > 0, "slices expired unspent were given back");
        assert_eq!(denied, 0, "{given} units given back");
    });
}
