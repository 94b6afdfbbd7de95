//! The over-limit cache against the store it stands in for: whenever the
//! limiter answers a request from the cache, the store asked the same
//! question at the same instant denies it too, and the cached wait is the
//! store's wait for the rule it names (never earlier), for random costs,
//! routes, subjects and times over a mix of algorithms.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use sluice_core::config::OnError;

use sluice_core::{Config, Policy, Request};
use sluice_store::{Batch, Limiter, LimiterOptions, ManualClock, MemoryStore, Telemetry};

mod remote;
use remote::Remote;

#[derive(Default)]
struct Hits(AtomicU64);

impl Telemetry for Hits {
    fn denial_cache_hit(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

const CONFIG: &str = r#"
default_plan: p
plans:
  p:
    tenant:
      - { algorithm: gcra, limit: 12, per: 1s, burst: 4 }
    routes:
      "GET /a":
        - { algorithm: fixed_window, limit: 5, per: 1s }
        - { algorithm: sliding_log, limit: 6, per: 2s }
      "GET /b":
        - { algorithm: token_bucket, limit: 4, per: 1s, burst: 6 }
      "*":
        - { algorithm: sliding_window, limit: 5, per: 1s }
    subject:
      "*":
        - { algorithm: gcra, limit: 3, per: 1s }
"#;

const ROUTES: [&str; 3] = ["GET /a", "GET /b", "GET /c"];
const SUBJECTS: [Option<&str>; 3] = [None, Some("u1"), Some("u2")];

#[test]
fn a_cached_denial_is_what_the_store_would_answer() {
    let cached = AtomicU64::new(0);
    let steps = prop::collection::vec((0u64..250, 0usize..3, 0usize..3, 1u64..=3), 1..150);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    });
    let result = runner.run(&steps, |steps| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let store = Arc::new(MemoryStore::with_clock(10_000, clock.clone()));
        let hits = Arc::new(Hits::default());
        let mut options = LimiterOptions::new(OnError::Deny);
        options.denial_cache = true;
        options.clock = clock.clone();
        options.telemetry = hits.clone();
        let policy = Policy::compile(&Config::from_yaml(CONFIG, "t.yaml").unwrap().limits);
        let limiter = Limiter::with_options(policy, Remote::new(store.clone()), options);
        let policy = limiter.policy();
        for (advance, route, subject, cost) in steps {
            clock.advance(advance);
            let request = Request::new("t", ROUTES[route], SUBJECTS[subject], cost).unwrap();
            let before = hits.0.load(Ordering::Relaxed);
            let decision = runtime.block_on(limiter.decide(&policy, &request));
            if hits.0.load(Ordering::Relaxed) == before {
                continue;
            }
            cached.fetch_add(1, Ordering::Relaxed);
            prop_assert!(!decision.allowed);
            // The same question to the store, at the same instant: a denial
            // consumes nothing, so asking changes nothing.
            let applicable = policy.applicable("t", ROUTES[route], SUBJECTS[subject].is_some());
            let batch = Batch::new("t", SUBJECTS[subject], cost, applicable.rules);
            let truth = store.decide_now(&batch).unwrap();
            prop_assert!(
                truth
                    .iter()
                    .zip(applicable.rules)
                    .any(|(o, r)| !o.allowed && !r.shadow()),
                "the cache denied what the store admits"
            );
            let named = decision.policy().expect("a cached denial names its rule");
            let index = applicable
                .rules
                .iter()
                .position(|r| std::ptr::eq(r, named))
                .unwrap();
            prop_assert!(!truth[index].allowed, "the named rule admits in the store");
            prop_assert_eq!(
                decision.retry_after_ms(),
                Some(truth[index].retry_after_ms.max(1)),
                "the cached wait is the store's wait for the rule it names"
            );
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    assert!(
        cached.load(Ordering::Relaxed) > 100,
        "the sequences exercise the cache"
    );
}

/// The scenario the property found first, kept as a plain test: a cheap
/// request consumes a bucket that denied a dear one, after which the dear
/// one's remembered wait would be too short.
#[tokio::test]
async fn a_cheaper_admission_forgets_a_dearer_denial() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = Arc::new(MemoryStore::with_clock(100, clock.clone()));
    let mut options = LimiterOptions::new(OnError::Deny);
    options.denial_cache = true;
    options.clock = clock.clone();
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 10, per: 1s, burst: 3 }]\n";
    let policy = Policy::compile(&Config::from_yaml(yaml, "t.yaml").unwrap().limits);
    let limiter = Limiter::with_options(policy, Remote::new(store.clone()), options);
    let policy = limiter.policy();
    let decide = |cost| {
        let (limiter, policy) = (&limiter, &policy);
        async move {
            let d = limiter
                .decide(policy, &Request::new("t", "GET /", None, cost).unwrap())
                .await;
            (d.allowed, d.retry_after_ms())
        }
    };
    assert!(decide(2).await.0);
    let (allowed, first_wait) = decide(2).await;
    assert!(!allowed, "one unit left: a cost of 2 waits");
    assert!(decide(1).await.0, "a cost of 1 still fits");
    let (allowed, wait) = decide(2).await;
    assert!(!allowed);
    assert!(
        wait > first_wait,
        "the cost-1 admission pushed the wait later: {wait:?} vs {first_wait:?}"
    );
}
