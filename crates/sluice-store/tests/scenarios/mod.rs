//! Scenarios every shared store must pass, run by the standalone and the
//! cluster tests against their own real Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::config::OnError;
use sluice_core::{Config, Policy, Request};
use sluice_store::{Limiter, Store};

/// Route "POST /a" allows 40 an hour; the tenant allows 100 an hour across
/// routes. Four instances (the first four `stores`) with eight tasks each
/// hammer "POST /a": exactly 40 pass, and the 1,000-odd denials leave the
/// tenant budget at 60 for other routes (counted through the fifth store).
pub async fn concurrent_instances_never_over_admit_and_denials_consume_nothing<S>(stores: Vec<S>)
where
    S: Store + 'static,
{
    let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: t, algorithm: token_bucket, limit: 100, per: 1h }]
    routes:
      "POST /a": [{ name: a, algorithm: sliding_log, limit: 40, per: 1h },
                  { name: a2, algorithm: gcra, limit: 45, per: 1h }]
      "POST /b": [{ name: b, algorithm: fixed_window, limit: 1000, per: 1h }]
"#;
    let policy =
        || Policy::compile_for(&Config::from_yaml(yaml, "test.yaml").unwrap().limits, true);
    assert_eq!(stores.len(), 5, "four instances and one to count with");
    let mut stores = stores.into_iter();
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for store in stores.by_ref().take(4) {
        let limiter = Arc::new(Limiter::new(policy(), store, OnError::Deny));
        for _ in 0..8 {
            let (limiter, admitted) = (limiter.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                let policy = limiter.policy();
                let request = Request::new("acme", "POST /a", None, 1).unwrap();
                for _ in 0..40 {
                    let decision = limiter.decide(&policy, &request).await;
                    assert!(
                        decision.degraded.is_none(),
                        "the store decided: {decision:?}"
                    );
                    if decision.allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(admitted.load(Ordering::Relaxed), 40);

    let limiter = Limiter::new(policy(), stores.next().unwrap(), OnError::Deny);
    let policy = limiter.policy();
    let other = Request::new("acme", "POST /b", None, 1).unwrap();
    let mut passed = 0;
    while limiter.decide(&policy, &other).await.allowed {
        passed += 1;
        assert!(passed <= 100);
    }
    assert_eq!(passed, 60, "the tenant budget shows only the 40 admitted");
}

/// The duplicate guard on a shared store: two instances see one
/// submission once, across a sharded tenant's shards too; a duplicate
/// consumes nothing; a request another rule denies leaves no fingerprint.
pub async fn one_submission_is_admitted_once<S>(first: S, second: S)
where
    S: Store + 'static,
{
    let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: t, algorithm: fixed_window, limit: 3, per: 1h }]
    dedupe:
      "POST /pay": { window: 1h }
tenants:
  big: { plan: p, shards: 4 }
"#;
    let policy =
        || Policy::compile_for(&Config::from_yaml(yaml, "test.yaml").unwrap().limits, true);
    let a = Limiter::new(policy(), first, OnError::Deny);
    let b = Limiter::new(policy(), second, OnError::Deny);
    for tenant in ["small", "big"] {
        let (pa, pb) = (a.policy(), b.policy());
        fn pay<'a>(tenant: &'a str, fingerprint: &'a str) -> Request<'a> {
            Request::new(tenant, "POST /pay", Some("u"), 1)
                .unwrap()
                .with_fingerprint(Some(fingerprint))
                .unwrap()
        }
        let d = a.decide(&pa, &pay(tenant, "f1")).await;
        assert!(d.allowed, "{tenant}: {d:?}");
        for _ in 0..4 {
            // The other instance, and (for "big") other shards in turn.
            let d = b.decide(&pb, &pay(tenant, "f1")).await;
            assert_eq!(
                d.reason,
                Some(sluice_core::Reason::Duplicate),
                "{tenant}: {d:?}"
            );
        }
        assert!(b.decide(&pb, &pay(tenant, "f2")).await.allowed, "{tenant}");
        // "big" has 4 shards of ⌊3/4⌋ → 1 each: 4 in all; "small" 3.
        let budget = if tenant == "big" { 4 } else { 3 };
        let mut fingerprints = 3;
        while a
            .decide(&pa, &pay(tenant, &format!("f{fingerprints}")))
            .await
            .allowed
        {
            fingerprints += 1;
            assert!(fingerprints < 10);
        }
        assert_eq!(
            fingerprints - 1,
            budget,
            "{tenant}: duplicates consumed no budget"
        );
        // The one the budget refused left no fingerprint: it is refused for
        // the budget again, not as a duplicate.
        let last = format!("f{fingerprints}");
        let d = b.decide(&pb, &pay(tenant, &last)).await;
        assert_eq!(
            d.reason,
            Some(sluice_core::Reason::TenantLimit),
            "{tenant}: {d:?}"
        );
    }
}
