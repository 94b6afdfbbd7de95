//! The limiter's failure handling and its doors, against a store that
//! always fails and a memory store.

use super::*;
use crate::clock::ManualClock;
use crate::store::{Decided, Peeked, StoreError};
use sluice_core::{Config, Reason, Request};

/// A store that always fails, to exercise the failure handling alone.
struct Broken;

impl Store for Broken {
    async fn decide(&self, _: &Batch<'_>) -> Result<Decided, StoreError> {
        Err(StoreError::Unavailable("down".to_owned()))
    }

    async fn release(&self, _: &Batch<'_>) -> Result<bool, StoreError> {
        Err(StoreError::Unavailable("down".to_owned()))
    }

    async fn adjust(
        &self,
        _: &Batch<'_>,
        _: crate::Change,
        _: Option<&crate::Marker>,
    ) -> Result<crate::Adjusted, StoreError> {
        Err(StoreError::Unavailable("down".to_owned()))
    }

    async fn peek(&self, _: &Batch<'_>) -> Result<Peeked, StoreError> {
        Err(StoreError::Unavailable("down".to_owned()))
    }
}

const PLANS: &str = r#"
default_plan: strict
plans:
  strict:
    on_error: deny
    tenant: [{ limit: 10, per: 1h }]
  lenient:
    on_error: allow
    tenant: [{ limit: 10, per: 1h }]
  careful:
    tenant: [{ limit: 10, per: 1h }]
tenants:
  l: { plan: lenient }
  c: { plan: careful }
"#;

fn limiter() -> Limiter<Broken> {
    let policy = Policy::compile(&Config::from_yaml(PLANS, "t.yaml").unwrap().limits);
    let mut options = LimiterOptions::new(OnError::Local);
    options.clock = Arc::new(ManualClock::new(1_000_000));
    options.breaker.failures = 1_000;
    Limiter::with_options(policy, Broken, options)
}

async fn decide(
    limiter: &Limiter<Broken>,
    tenant: &str,
) -> (bool, Option<Reason>, Option<OnError>) {
    let policy = limiter.policy();
    let d = limiter
        .decide(&policy, &Request::new(tenant, "GET /", None, 1).unwrap())
        .await;
    (d.allowed, d.reason, d.degraded)
}

#[tokio::test]
async fn a_reservation_the_failure_policy_admitted_holds_nothing_in_the_store() {
    let limiter = limiter();
    let policy = limiter.policy();
    let request = Request::new("l", "GET /", None, 7).unwrap();
    let decision = limiter.decide(&policy, &request).await;
    assert_eq!(decision.degraded, Some(OnError::Allow));
    // The store took nothing: a settle charges the whole actual cost.
    let reservation = limiter.reserve(&policy, &request, &decision).unwrap();
    assert_eq!((reservation.estimate, reservation.held), (7, 0));
}

#[tokio::test]
async fn each_plan_fails_over_by_its_own_policy() {
    let limiter = limiter();
    assert_eq!(
        decide(&limiter, "anyone").await,
        (false, Some(Reason::StoreUnavailable), Some(OnError::Deny))
    );
    assert_eq!(
        decide(&limiter, "l").await,
        (true, None, Some(OnError::Allow))
    );
    assert_eq!(
        decide(&limiter, "c").await,
        (true, None, Some(OnError::Local))
    );
}

#[tokio::test]
async fn local_divides_each_limit_by_the_live_instances() {
    let limiter = limiter();
    limiter.set_live_instances(4);
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += u32::from(decide(&limiter, "c").await.0);
    }
    assert_eq!(admitted, 2, "⌊10 / 4⌋ per instance");
}

/// A store told what to do: fail, hang, or admit.
#[derive(Default)]
struct Scripted(std::sync::atomic::AtomicU8);

const FAIL: u8 = 0;
const HANG: u8 = 1;
const ADMIT: u8 = 2;

impl Store for Scripted {
    async fn release(&self, _: &Batch<'_>) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn adjust(
        &self,
        _: &Batch<'_>,
        _: crate::Change,
        _: Option<&crate::Marker>,
    ) -> Result<crate::Adjusted, StoreError> {
        Err(StoreError::Unavailable("not changed here".to_owned()))
    }

    async fn peek(&self, _: &Batch<'_>) -> Result<Peeked, StoreError> {
        Err(StoreError::Unavailable("not read here".to_owned()))
    }

    async fn decide(&self, batch: &Batch<'_>) -> Result<Decided, StoreError> {
        match self.0.load(Ordering::SeqCst) {
            FAIL => Err(StoreError::Unavailable("down".to_owned())),
            HANG => std::future::pending().await,
            _ => Ok(Decided {
                outcomes: batch
                    .rules
                    .iter()
                    .map(|_| sluice_core::Outcome {
                        allowed: true,
                        ..Default::default()
                    })
                    .collect(),
                at_ms: 0,
                first_shard_at_ms: None,
            }),
        }
    }
}

#[tokio::test]
async fn a_probe_dropped_at_its_await_does_not_wedge_the_breaker() {
    let policy = Policy::compile(&Config::from_yaml(PLANS, "t.yaml").unwrap().limits);
    let clock = Arc::new(ManualClock::new(0));
    let mut options = LimiterOptions::new(OnError::Local);
    options.clock = clock.clone();
    options.timeout = Some(Duration::from_secs(60));
    let limiter = Limiter::with_options(policy, Scripted::default(), options);
    let decide = |tenant| {
        let limiter = &limiter;
        async move {
            let policy = limiter.policy();
            let d = limiter
                .decide(&policy, &Request::new(tenant, "GET /", None, 1).unwrap())
                .await;
            d.degraded
        }
    };
    for _ in 0..5 {
        decide("c").await;
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
    // The cool-down passes; the probe's caller goes away mid-call.
    clock.advance(1_000);
    limiter.store().0.store(HANG, Ordering::SeqCst);
    let probe = tokio::time::timeout(Duration::from_millis(20), decide("c")).await;
    assert!(probe.is_err(), "the probe hung and was dropped");
    assert_eq!(limiter.breaker_state(), BreakerState::HalfOpen);
    // The store recovers: the next decisions probe it and close the
    // breaker, instead of using the failure policy forever.
    limiter.store().0.store(ADMIT, Ordering::SeqCst);
    for _ in 0..3 {
        assert_eq!(decide("c").await, None, "decided by the store");
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Closed);
}

#[tokio::test]
async fn the_breaker_opens_and_stops_calling_the_store() {
    let policy = Policy::compile(&Config::from_yaml(PLANS, "t.yaml").unwrap().limits);
    let mut options = LimiterOptions::new(OnError::Local);
    options.clock = Arc::new(ManualClock::new(0));
    let limiter = Limiter::with_options(policy, Broken, options);
    for _ in 0..5 {
        decide(&limiter, "c").await;
    }
    assert_eq!(limiter.breaker_state(), BreakerState::Open);
}

#[tokio::test]
async fn a_full_memory_store_denies_new_keys_whatever_the_number_of_rules() {
    // One rule takes the single-rule path, two rules the general one;
    // the synchronous and the async decision alike.
    for tenant_rules in [
        "[{ limit: 10, per: 1h }]",
        "[{ limit: 10, per: 1h }, { limit: 20, per: 1d }]",
    ] {
        let yaml = format!("default_plan: p\nplans:\n  p:\n    tenant: {tenant_rules}\n");
        let policy = Policy::compile(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits);
        let rules = policy.applicable("a", "GET /", false).rules.len();
        let limiter = Limiter::new(policy, MemoryStore::new(2 * rules), OnError::Allow);
        let policy = limiter.policy();
        let request = |t: &'static str| Request::new(t, "GET /", None, 1).unwrap();
        assert!(limiter.decide_now(&policy, &request("a")).allowed);
        assert!(limiter.decide(&policy, &request("b")).await.allowed);
        for denied in [
            limiter.decide_now(&policy, &request("c")),
            limiter.decide(&policy, &request("c")).await,
        ] {
            assert!(!denied.allowed, "{rules} rules: a new key on a full store");
            assert_eq!(denied.reason, Some(Reason::StoreUnavailable));
            assert_eq!(denied.degraded, Some(OnError::Deny), "not the plan's allow");
        }
        assert!(
            limiter.decide_now(&policy, &request("a")).allowed,
            "held keys work"
        );
        assert!(limiter.decide(&policy, &request("b")).await.allowed);
    }
}

/// `decide`'s future holds across its await only the boxed rest of a
/// decision: with the decision's locals in it, it was 192 bytes,
/// copied (`memcpy`) wherever the future moved; in an axum handler or
/// the tower layer it is part of every request's future.
#[test]
fn the_decide_future_stays_small() {
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 10, per: 1h }]\n";
    let policy = Policy::compile(&Config::from_yaml(yaml, "t.yaml").unwrap().limits);
    let limiter = Limiter::new(policy, MemoryStore::new(10), OnError::Allow);
    let policy = limiter.policy();
    let request = Request::new("a", "GET /", None, 1).unwrap();
    let future = limiter.decide(&policy, &request);
    let size = std::mem::size_of_val(&future);
    assert!(size <= 64, "the decide future is {size} bytes");
}
