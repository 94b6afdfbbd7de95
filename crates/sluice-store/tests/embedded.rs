//! An embedded limiter keeps itself healthy without a server: its sweeper
//! frees the memory store's idle keys, so a full store takes new tenants
//! again once old ones go idle.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::config::OnError;
use sluice_core::{Config, Policy, Reason, Request};
use sluice_store::{Limiter, ManualClock, MemoryStore};

// The memory store runs the scenarios that need one store only.
#[allow(dead_code)]
mod scenarios;

#[test]
fn a_full_memory_store_takes_new_tenants_once_old_ones_are_idle() {
    let yaml =
        "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 1, per: 1s }]\n";
    let policy = Policy::compile(&Config::from_yaml(yaml, "t.yaml").unwrap().limits);
    let clock = Arc::new(ManualClock::new(1_764_460_800_000));
    let limiter = Arc::new(Limiter::new(
        policy,
        MemoryStore::with_clock(5, clock.clone()),
        OnError::Deny,
    ));
    Limiter::keep_healthy(&limiter, Duration::from_millis(20));
    let policy = limiter.policy();
    let decide = |tenant: &str| {
        limiter.decide_now(&policy, &Request::new(tenant, "GET /", None, 1).unwrap())
    };
    for i in 0..5 {
        assert!(decide(&format!("t{i}")).allowed);
    }
    let full = decide("newcomer");
    assert_eq!(
        full.reason,
        Some(Reason::StoreUnavailable),
        "the store is full"
    );
    // Time passes: the five keys are as good as fresh, and the sweeper
    // (not a server) drops them.
    clock.advance(2_000);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !decide("newcomer").allowed {
        assert!(Instant::now() < deadline, "the store stayed full");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(limiter.store().len() <= 5);
}

#[tokio::test]
async fn weighted_requests_pass_a_guarded_route() {
    scenarios::weighted_requests_pass_a_guarded_route(MemoryStore::new(1_000)).await;
}
