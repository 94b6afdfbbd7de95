//! The metrics' class table across policy swaps, and each reason's counter.

use sluice_core::{Config, Request};
use sluice_store::{Limiter, LimiterOptions, MemoryStore};

use super::*;

fn policy(plan: &str) -> Policy {
    let yaml = format!(
        "default_plan: {plan}\nplans:\n  {plan}:\n    tenant: [{{ limit: 100, per: 1m }}]\n"
    );
    Policy::compile(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits)
}

/// `sluice_decisions_total` of `plan`'s allowed decisions.
fn allowed(metrics: &Metrics, plan: &str) -> u64 {
    let prefix =
        format!("sluice_decisions_total{{outcome=\"allowed\",reason=\"none\",plan=\"{plan}\"");
    metrics
        .encode()
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn every_reason_has_its_own_counter() {
    for (i, reason) in REASONS.iter().enumerate() {
        assert_eq!(reason_index(*reason), i, "{reason:?}");
    }
}

#[tokio::test]
async fn decisions_count_by_the_class_of_the_policy_they_were_made_under() {
    let metrics = Arc::new(Metrics::new());
    let mut options = LimiterOptions::new(OnError::Deny);
    options.telemetry = metrics.clone();
    let limiter = Limiter::with_options(policy("free"), MemoryStore::new(100), options);
    let request = Request::new("acme", "GET /", None, 1).unwrap();
    let old = limiter.policy();
    for _ in 0..3 {
        let decision = limiter.decide(&old, &request).await;
        metrics.decision(&decision, Duration::ZERO, None);
    }
    assert_eq!(allowed(&metrics, "free"), 3);
    // A reload installs another policy, whose first class has the same
    // index: a decision still made under the old one counts as the old
    // one's class, the new policy's under its own.
    limiter.set_policy(policy("pro"));
    let decision = limiter.decide(&old, &request).await;
    metrics.decision(&decision, Duration::ZERO, None);
    let new = limiter.policy();
    for _ in 0..2 {
        let decision = limiter.decide(&new, &request).await;
        metrics.decision(&decision, Duration::ZERO, None);
    }
    assert_eq!(allowed(&metrics, "free"), 4);
    assert_eq!(allowed(&metrics, "pro"), 2);
}
