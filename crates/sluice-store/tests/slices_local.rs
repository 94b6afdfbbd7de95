//! What a hot key's slices decide without the store (issue 45 C3): a
//! denial the store's last answer makes certain is answered here, and only
//! decisions that sent nothing to the store are counted as local.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::Request;
use sluice_core::config::OnError;
use sluice_store::{Limiter, LimiterOptions, ManualClock, MemoryStore, Telemetry};

mod remote;
use remote::Remote;
use remote::fleet::{Fleet, policy, runtime};

/// 100 a second, a burst of 100, and 1% (60 units) of a minute's 6,000.
const OVER: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 6000, per: 1m, burst: 100, tolerance: "1%" }]
"#;

/// Five times its limit for ten seconds, on one instance: what it admits
/// and the store calls it costs.
async fn five_times_over(yaml: &str) -> (u64, u64, u64) {
    let fleet = Fleet::new(yaml, 1);
    // Past the burst first.
    for _ in 0..1_000 {
        fleet.decide(0, "t").await;
        fleet.clock.advance(2);
    }
    let (before, mut admitted, mut decisions) = (fleet.calls(), 0, 0);
    for _ in 0..5_000 {
        admitted += u64::from(fleet.decide(0, "t").await);
        decisions += 1;
        fleet.clock.advance(2);
    }
    (decisions, admitted, fleet.calls() - before)
}

/// `gcra` five times over its limit: the denials the store's last answer
/// makes certain are decided here, so the store sees about one call per
/// admission (not one per admission and one per denial after it), and
/// the key is admitted what it is exactly.
#[test]
fn denials_past_the_limit_are_decided_here() {
    runtime().block_on(async {
        let (decisions, admitted, calls) = five_times_over(OVER).await;
        let (_, exactly, exact_calls) = five_times_over(&OVER.replace("1%", "0%")).await;
        assert!(
            calls * 4 <= decisions,
            "{calls} store calls for {decisions} decisions (exactly: {exact_calls})"
        );
        assert!(
            admitted.abs_diff(exactly) <= 2,
            "admitted {admitted}, exactly {exactly}"
        );
    });
}

#[derive(Default)]
struct Local(AtomicU64);

impl Telemetry for Local {
    fn slice_decision(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// A hot tenant whose requests also meet a `count_if` rule: each decision
/// holds its attempt in the store, so none is decided from a slice or
/// counted as answered without a store call.
#[test]
fn a_decision_that_holds_an_attempt_is_not_local() {
    let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ limit: 1200000, per: 1m, tolerance: "1%" }]
    routes:
      "GET /": [{ name: failures, algorithm: fixed_window, limit: 5, per: 15m, count_if: { status: [401] } }]
"#;
    runtime().block_on(async {
        let clock = Arc::new(ManualClock::new(1_700_000_000_000));
        let local = Arc::new(Local::default());
        let mut options = LimiterOptions::new(OnError::Deny);
        options.clock = clock.clone();
        options.telemetry = local.clone();
        let remote = Remote::new(MemoryStore::with_clock(1_000, clock.clone()));
        let calls = remote.calls.clone();
        let limiter = Limiter::with_options(policy(yaml), remote, options);
        let policy = limiter.policy();
        let request = Request::new("t", "GET /", None, 1).unwrap();
        for _ in 0..3_000 {
            let decision = limiter.decide(&policy, &request).await;
            assert!(decision.allowed);
            let attempt = limiter.attempt(&policy, &request, &decision).unwrap();
            let concluded = limiter.conclude_attempt(&policy, &attempt, Some(200), 60_000);
            concluded.await.unwrap();
            clock.advance(1);
        }
        let calls = calls.load(Ordering::Relaxed);
        // A decision and a conclusion each: no take, no local decision.
        assert_eq!(calls, 6_000, "every decision from the store");
        assert_eq!(local.0.load(Ordering::Relaxed), 0, "none counted as local");
    });
}

/// Every denial one instance answers without a store call (from its
/// slices' knowledge, or remembered) is one the store would give: for
/// random costs and gaps past the limit, on each algorithm that takes a
/// tolerance, the store's state at that moment denies the request too.
#[test]
fn a_denial_decided_here_is_one_the_store_would_give() {
    use proptest::prelude::*;
    use sluice_core::Request;
    use sluice_store::{Batch, Clock};
    let rules = [
        "{ algorithm: gcra, limit: 600, per: 1s, burst: 50, tolerance: \"10%\" }",
        "{ algorithm: token_bucket, limit: 600, per: 1s, burst: 50, tolerance: \"10%\" }",
        "{ algorithm: fixed_window, limit: 600, per: 1s, tolerance: \"10%\" }",
    ];
    let steps = prop::collection::vec((1u64..4, 0u64..4), 3_000..4_000);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 6,
        ..ProptestConfig::default()
    });
    for rule in rules {
        let yaml = format!("default_plan: p\nplans:\n  p:\n    tenant: [{rule}]\n");
        runner
            .run(&steps, |steps| {
                runtime().block_on(async {
                    let fleet = Fleet::new(&yaml, 1);
                    let limiter = &fleet.instances[0];
                    let policy = limiter.policy();
                    let mut local_denials = 0;
                    for (cost, gap) in &steps {
                        let request = Request::new("t", "GET /", None, *cost).unwrap();
                        let before = fleet.calls();
                        let decision = limiter.decide(&policy, &request).await;
                        if !decision.allowed && fleet.calls() == before {
                            local_denials += 1;
                            let rules = policy.applicable("t", "GET /", false).rules;
                            let batch = Batch::new("t", None, *cost, rules);
                            let state = fleet.store.peek_rule(&batch, 0);
                            let (outcome, _) =
                                rules[0].rule().decide(&state, fleet.clock.now_ms(), *cost);
                            prop_assert!(
                                !outcome.allowed,
                                "{rule}: denied here, the store would admit {cost}"
                            );
                        }
                        fleet.clock.advance(*gap);
                    }
                    prop_assert!(local_denials > 0, "{rule}: no local denial");
                    Ok(())
                })
            })
            .unwrap();
    }
}
