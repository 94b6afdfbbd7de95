//! Outcomes combined into decisions, checked rule by rule.

use super::*;
use crate::config::Config;
use crate::policy::{Policy, TenantOverride};

fn policy() -> Policy {
    let yaml = r#"
default_plan: p
near_limit: 0.5
plans:
  p:
    tenant: [{ name: t, limit: 10, per: 1s }]
    routes:
      "*": [{ name: r, limit: 4, per: 1s }]
global:
  "*": [{ name: valve, limit: 100, per: 1s, share: first_come }]
"#;
    Policy::compile(&Config::from_yaml(yaml, "t.yaml").unwrap().limits)
}

fn outcome(allowed: bool, remaining: u32, retry: u64) -> Outcome {
    Outcome {
        allowed,
        remaining,
        reset_after_ms: 500,
        retry_after_ms: if allowed { 0 } else { retry },
    }
}

#[test]
fn denial_reports_the_rule_with_the_longest_wait() {
    let p = policy();
    let a = p.applicable("x", "GET /", false);
    let outcomes = [
        outcome(false, 0, 300),
        outcome(false, 0, 700),
        outcome(true, 50, 0),
    ];
    let d = Decision::from_outcomes(a, outcomes.into_iter().collect(), 1, &[]);
    assert!(!d.allowed);
    assert_eq!(d.reason, Some(Reason::RouteLimit));
    assert_eq!(d.policy().unwrap().name(), "r");
    assert_eq!(d.retry_after_ms(), Some(700));
    assert_eq!(d.violated_policies().collect::<Vec<_>>(), ["t", "r"]);
}

#[test]
fn a_valve_denial_says_global_capacity() {
    let p = policy();
    let a = p.applicable("x", "GET /", false);
    let outcomes = [
        outcome(true, 9, 0),
        outcome(true, 3, 0),
        outcome(false, 0, 10),
    ];
    let d = Decision::from_outcomes(a, outcomes.into_iter().collect(), 1, &[]);
    assert_eq!(d.reason, Some(Reason::GlobalCapacity));
}

#[test]
fn allowed_decision_describes_the_closest_advertised_rule() {
    let p = policy();
    let a = p.applicable("x", "GET /", false);
    // t: 6/10 left, r: 3/4 left, valve: 1/100 left but never shown.
    let outcomes = [
        outcome(true, 6, 0),
        outcome(true, 3, 0),
        outcome(true, 1, 0),
    ];
    let d = Decision::from_outcomes(a, outcomes.into_iter().collect(), 1, &[]);
    assert!(d.allowed);
    assert_eq!(d.policy().unwrap().name(), "t");
    assert_eq!(d.remaining(), Some(6));
    assert!(
        !d.near_limit,
        "40% used of t, 25% of r; the valve does not count"
    );
    let outcomes = [
        outcome(true, 5, 0),
        outcome(true, 3, 0),
        outcome(true, 90, 0),
    ];
    assert!(Decision::from_outcomes(a, outcomes.into_iter().collect(), 1, &[]).near_limit);
}

#[test]
fn rules_with_equal_shares_left_are_described_by_the_first() {
    let p = policy();
    let a = p.applicable("x", "GET /", false);
    // t: 5/10 left, r: 2/4 left: the same share; t comes first.
    let outcomes = [
        outcome(true, 5, 0),
        outcome(true, 2, 0),
        outcome(true, 100, 0),
    ];
    let d = Decision::from_outcomes(a, outcomes.into_iter().collect(), 1, &[]);
    assert_eq!(d.policy().unwrap().name(), "t");
    assert_eq!(d.remaining(), Some(5));
}

#[test]
fn one_rule_decides_as_the_general_combination_does() {
    // Each single-rule applicable set: tenant, route (shadowed by an
    // override), subject, the global valve, a duplicate guard.
    let limits = Config::from_yaml(
        r#"
default_plan: p
plans:
  p:
    tenant: [{ name: t, limit: 10, per: 1s }]
  q:
    routes:
      "*": [{ name: r, limit: 10, per: 1s }]
  s:
    subject:
      "*": [{ name: u, limit: 10, per: 1s }]
  v: {}
  d:
    dedupe:
      "*": { window: 5s }
global:
  "GET /valve": [{ name: valve, limit: 10, per: 1s, share: first_come }]
tenants:
  q: { plan: q }
  shadowed: { plan: q }
  s: { plan: s }
  v: { plan: v }
  d: { plan: d }
"#,
        "one.yaml",
    )
    .unwrap()
    .limits;
    let shadow = TenantOverride {
        shadow: true,
        ..Default::default()
    };
    let p = Policy::compile_overridden(&limits, false, &[("shadowed", &shadow)]);
    let cases = [
        ("t", "GET /", false),
        ("q", "GET /", false),
        ("shadowed", "GET /", false),
        ("s", "GET /", true),
        ("v", "GET /valve", false),
        ("d", "GET /", false),
    ];
    for (tenant, route, subject) in cases {
        let a = p.applicable(tenant, route, subject);
        assert_eq!(a.rules.len(), 1, "{tenant}: one rule");
        for allowed in [true, false] {
            for remaining in [0, 1, 2, 5, 9, 10] {
                let o: Outcomes = smallvec::smallvec![outcome(allowed, remaining, 250)];
                let one = Decision::from_outcomes(a, o.clone(), 1, &[]);
                let general = Decision::combine(a, o, 1, &[]);
                assert_eq!(
                    format!("{one:?}"),
                    format!("{general:?}"),
                    "{tenant} {route}, allowed {allowed}, remaining {remaining}"
                );
            }
        }
    }
}

#[test]
fn cost_above_any_capacity_never_passes() {
    let p = policy();
    let a = p.applicable("x", "GET /", false);
    assert!(Decision::cost_exceeds_capacity(a, 4).is_none());
    let d = Decision::cost_exceeds_capacity(a, 5).unwrap();
    assert_eq!(d.reason, Some(Reason::CostExceedsCapacity));
    assert_eq!(d.policy().unwrap().name(), "r");
    assert_eq!(d.retry_after_ms(), None);
    assert_eq!(d.violated_policies().collect::<Vec<_>>(), ["r"]);
}
#[test]
fn known_says_which_rules_have_an_outcome() {
    let p = policy();
    let a = p.applicable("x", "GET /", false);
    let all = [
        outcome(true, 5, 0),
        outcome(true, 2, 0),
        outcome(true, 9, 0),
    ];
    let decided = Decision::from_outcomes(a, all.into_iter().collect(), 1, &[]);
    assert_eq!(decided.known(), Known::Every);
    assert_eq!(Decision::unlimited().known(), Known::Every, "no rule");
    let remembered = Decision::remembered_denial(a, 1, 300);
    assert_eq!(remembered.known(), Known::Summary);
    assert_eq!(remembered.outcome(1).map(|o| o.retry_after_ms), Some(300));
    assert!(remembered.outcome(0).is_none());
    let without = Decision::without_store(a, OnError::Deny);
    assert_eq!(without.known(), Known::Nothing);
    assert_eq!(without.known_outcomes().count(), 0);
}

/// A decision moves along every path by value: it stays 128 bytes (the
/// first shard's time offset sits in what was padding).
#[test]
fn a_decision_stays_128_bytes() {
    assert!(std::mem::size_of::<Decision<'_>>() <= 128);
}

#[test]
fn the_first_shards_time_is_the_decisions_unless_a_call_of_its_own_said() {
    let d = Decision::unlimited().decided_at(1_000);
    assert_eq!(d.first_shard_decided_ms(), 1_000);
    let d = Decision::unlimited().decided_at_slots(1_000, Some(997));
    assert_eq!((d.decided_ms, d.first_shard_decided_ms()), (1_000, 997));
    let d = Decision::unlimited().decided_at_slots(1_000, None);
    assert_eq!(d.first_shard_decided_ms(), 1_000);
}
