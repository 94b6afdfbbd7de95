//! Scenarios every shared store must pass, run by the standalone and the
//! cluster tests against their own real Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::config::OnError;
use sluice_core::{Config, Policy, Request};
use sluice_store::limiter::Lease;
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
        // 3 for both: "big"'s limit of 3 is below its 4 shards, so it is
        // kept whole (each shard held at least 1: 4 in all).
        let budget = 3;
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

/// Concurrency limits on a shared store: two instances, many tasks each
/// acquiring, holding and releasing, never see more leases in flight than
/// the limits (a tenant's, a sharded tenant's, a global one across
/// tenants); a check takes no slot; a lease not released expires; a
/// release names its lease only (twice, or expired, it frees nothing).
pub async fn leases_never_exceed_their_limits<S>(first: S, second: S)
where
    S: Store + 'static,
{
    let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: rate, algorithm: gcra, limit: 100000, per: 1s }]
    routes:
      "POST /export": [{ name: exports, algorithm: concurrency, limit: 3, lease: 30s }]
      "POST /short": [{ name: short, algorithm: concurrency, limit: 2, lease: 400ms }]
tenants:
  big: { plan: p, shards: 4 }
global:
  "POST /export": [{ name: all-exports, algorithm: concurrency, limit: 5, lease: 30s }]
"#;
    let policy =
        || Policy::compile_for(&Config::from_yaml(yaml, "test.yaml").unwrap().limits, true);
    let instances = [
        Arc::new(Limiter::new(policy(), first, OnError::Deny)),
        Arc::new(Limiter::new(policy(), second, OnError::Deny)),
    ];
    // In flight as the tasks count them: raised after a lease is taken,
    // lowered before it is given back, so never above what the store holds.
    #[derive(Default)]
    struct Flight {
        now: AtomicU64,
        most: AtomicU64,
    }
    impl Flight {
        fn enter(&self) {
            let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(now, Ordering::SeqCst);
        }
        fn leave(&self) {
            self.now.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let tenants = ["acme", "big"];
    let per_tenant: Arc<[Flight; 2]> = Arc::new(Default::default());
    let overall = Arc::new(Flight::default());
    let taken = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for limiter in &instances {
        for task in 0..8 {
            let (limiter, per_tenant, overall, taken) = (
                limiter.clone(),
                per_tenant.clone(),
                overall.clone(),
                taken.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let which = task % 2;
                let policy = limiter.policy();
                let request = Request::new(tenants[which], "POST /export", None, 1).unwrap();
                for _ in 0..20 {
                    let (decision, lease) = limiter.acquire(&policy, &request).await;
                    assert!(decision.degraded.is_none(), "{decision:?}");
                    let Some(lease) = lease else {
                        assert!(!decision.allowed);
                        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                        continue;
                    };
                    taken.fetch_add(1, Ordering::Relaxed);
                    per_tenant[which].enter();
                    overall.enter();
                    tokio::time::sleep(std::time::Duration::from_millis(3)).await;
                    overall.leave();
                    per_tenant[which].leave();
                    let released = limiter.release(tenants[which], None, &lease).await.unwrap();
                    assert!(released, "a lease held is released");
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    for (tenant, flight) in tenants.iter().zip(per_tenant.iter()) {
        let most = flight.most.load(Ordering::SeqCst);
        assert!(most <= 3, "{tenant}: {most} in flight, limit 3");
        assert!(most >= 2, "{tenant}: the tasks did contend ({most})");
    }
    let most = overall.most.load(Ordering::SeqCst);
    assert!(most <= 5, "{most} in flight across tenants, global limit 5");
    assert!(taken.load(Ordering::Relaxed) >= 20, "leases were taken");

    // Nothing leaked: all three slots are free again, and only three.
    let (a, b) = (&instances[0], &instances[1]);
    let (pa, pb) = (a.policy(), b.policy());
    let export = Request::new("acme", "POST /export", None, 1).unwrap();
    // A check takes no slot.
    for _ in 0..10 {
        assert!(a.decide(&pa, &export).await.allowed);
    }
    let mut held = Vec::new();
    for limiter in [a, b, a] {
        let policy = limiter.policy();
        let (d, lease) = limiter.acquire(&policy, &export).await;
        assert!(d.allowed, "{d:?}");
        held.push(lease.unwrap());
    }
    let (full, none) = b.acquire(&pb, &export).await;
    assert!(!full.allowed && none.is_none(), "{full:?}");
    assert!(full.retry_after_ms().is_some_and(|ms| ms <= 30_000));
    assert!(!a.decide(&pa, &export).await.allowed, "the check says full");
    // Released by the other instance: freed once.
    assert!(b.release("acme", None, &held[0]).await.unwrap());
    assert!(!a.release("acme", None, &held[0]).await.unwrap(), "twice");
    let unknown = Lease::rebuilt(42, held[0].held());
    assert!(!a.release("acme", None, &unknown).await.unwrap(), "unknown");
    let (d, again) = a.acquire(&pa, &export).await;
    assert!(d.allowed);
    for lease in held.into_iter().skip(1).chain(again) {
        assert!(a.release("acme", None, &lease).await.unwrap());
    }

    // A holder that never releases loses its slot when the lease ends.
    let short = Request::new("acme", "POST /short", None, 1).unwrap();
    let (_, first) = a.acquire(&pa, &short).await;
    let (_, second) = b.acquire(&pb, &short).await;
    let (d, none) = a.acquire(&pa, &short).await;
    assert!(
        first.is_some() && second.is_some() && none.is_none(),
        "{d:?}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (d, third) = a.acquire(&pa, &short).await;
    assert!(d.allowed, "expired leases free their slots: {d:?}");
    assert!(
        !a.release("acme", None, &first.unwrap()).await.unwrap(),
        "an expired lease is not released"
    );
    assert!(a.release("acme", None, &third.unwrap()).await.unwrap());
}

/// A weighted request on a guarded route: the guard takes one admission
/// per fingerprint whatever the request costs, and the route's rule its
/// cost (before, any cost of 2 or more was refused for good as
/// `cost_exceeds_capacity`, the guard counted as a rule of capacity 1).
pub async fn weighted_requests_pass_a_guarded_route<S>(store: S)
where
    S: Store + 'static,
{
    let yaml = r#"
default_plan: p
plans:
  p:
    routes:
      "POST /pay": [{ name: pay, algorithm: fixed_window, limit: 10, per: 1h }]
    dedupe:
      "POST /pay": { window: 1h }
"#;
    let policy = Policy::compile_for(&Config::from_yaml(yaml, "test.yaml").unwrap().limits, true);
    let limiter = Limiter::new(policy, store, OnError::Deny);
    let policy = limiter.policy();
    fn pay(fingerprint: &str, cost: u64) -> Request<'_> {
        Request::new("acme", "POST /pay", Some("u"), cost)
            .unwrap()
            .with_fingerprint(Some(fingerprint))
            .unwrap()
    }
    let first = limiter.decide(&policy, &pay("f1", 3)).await;
    assert!(first.allowed, "{first:?}");
    assert_eq!(first.remaining(), Some(7), "the route's rule took 3");
    let again = limiter.decide(&policy, &pay("f1", 3)).await;
    assert_eq!(
        again.reason,
        Some(sluice_core::Reason::Duplicate),
        "{again:?}"
    );
    for (fingerprint, remaining) in [("f2", 4), ("f3", 1)] {
        let d = limiter.decide(&policy, &pay(fingerprint, 3)).await;
        assert!(d.allowed, "{fingerprint}: {d:?}");
        assert_eq!(d.remaining(), Some(remaining), "{fingerprint}");
    }
    let over = limiter.decide(&policy, &pay("f4", 3)).await;
    assert_eq!(
        over.reason,
        Some(sluice_core::Reason::RouteLimit),
        "{over:?}"
    );
    // f4 left no fingerprint: one unit still passes under it.
    let last = limiter.decide(&policy, &pay("f4", 1)).await;
    assert!(last.allowed, "{last:?}");
    // What the route's rule can never hold is still said so.
    let never = limiter.decide(&policy, &pay("f5", 11)).await;
    assert_eq!(
        never.reason,
        Some(sluice_core::Reason::CostExceedsCapacity),
        "{never:?}"
    );
}
