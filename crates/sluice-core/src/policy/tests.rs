//! Policies compiled from YAML: which rules each request gets.

use super::*;
use crate::config::Config;

fn policy(yaml: &str) -> Policy {
    Policy::compile(&Config::from_yaml(yaml, "test.yaml").unwrap().limits)
}

#[test]
fn an_override_changes_one_tenant_and_keeps_rule_names() {
    let limits = Config::from_yaml(
        "default_plan: free\nplans:\n  free:\n    tenant: [{ name: t, limit: 10, per: 1m }]\n  pro:\n    tenant: [{ name: t, limit: 100, per: 1m, burst: 150 }]\n",
        "o.yaml",
    )
    .unwrap()
    .limits;
    let doubled = TenantOverride {
        factor: Some(2.5),
        ..Default::default()
    };
    let pro_shadow = TenantOverride {
        plan: Some("pro".into()),
        shadow: true,
        ..Default::default()
    };
    let p = Policy::compile_overridden(&limits, false, &[("a", &doubled), ("b", &pro_shadow)]);
    let rule = |tenant: &str| p.applicable(tenant, "GET /", false).rules[0].clone();
    assert_eq!((rule("a").name(), rule("a").rule().limit()), ("t", 25));
    assert_eq!(rule("a").uid(), rule("c").uid(), "the same bucket");
    assert_eq!(rule("b").rule().burst(), 150);
    assert!(rule("b").shadow() && !rule("c").shadow());
    assert_eq!(
        p.applicable("a", "GET /", false).plan.unwrap().name(),
        "free"
    );
    let bad = TenantOverride {
        factor: Some(1e9),
        ..Default::default()
    };
    assert!(
        bad.apply(&limits.plans[0])
            .unwrap_err()
            .contains("`factor`")
    );
}

fn names(a: &Applicable<'_>) -> Vec<String> {
    a.rules
        .iter()
        .map(|r| format!("{}:{}", r.scope().name(), r.name()))
        .collect()
}

const YAML: &str = r#"
default_plan: free
plans:
  free:
    tenant: [{ limit: 100, per: 1m }]
    routes:
      "POST /v1/invoices": [{ algorithm: sliding_log, limit: 5, per: 1s }]
      "GET /v1/users/*": [{ name: users, limit: 50, per: 1s }]
      "*": [{ name: other, algorithm: token_bucket, limit: 20, per: 1s, burst: 50 }]
    subject:
      "*": [{ name: per-user, limit: 10, per: 1s }]
  pro:
    tenant: [{ limit: 1000, per: 1m }]
tenants:
  acme: { plan: pro }
global:
  "POST /v1/invoices": [{ name: invoices-valve, limit: 10000, per: 1s }]
  "GET /v1/users/admin*": [{ name: admin-valve, limit: 5, per: 1s }]
"#;

#[test]
fn most_specific_pattern_wins_in_every_table() {
    let p = policy(YAML);
    let invoices = p.applicable("t1", "POST /v1/invoices", true);
    assert_eq!(
        names(&invoices),
        [
            "tenant:tenant-0",
            "route:route-0",
            "global:invoices-valve",
            "share:invoices-valve",
            "subject:per-user"
        ]
    );
    assert_eq!(invoices.plan.unwrap().name(), "free");
    let users = p.applicable("t1", "GET /v1/users/42", false);
    assert_eq!(names(&users), ["tenant:tenant-0", "route:users"]);
    let admin = p.applicable("t1", "GET /v1/users/admin/7", false);
    assert_eq!(
        names(&admin),
        [
            "tenant:tenant-0",
            "route:users",
            "global:admin-valve",
            "share:admin-valve"
        ]
    );
    let other = p.applicable("t1", "DELETE /v1/things", false);
    assert_eq!(names(&other), ["tenant:tenant-0", "route:other"]);
}

#[test]
fn listed_tenants_get_their_plan_and_others_the_default() {
    let p = policy(YAML);
    let acme = p.applicable("acme", "DELETE /v1/things", true);
    assert_eq!(acme.plan.unwrap().name(), "pro");
    assert_eq!(names(&acme), ["tenant:tenant-0"]);
    let acme_invoices = p.applicable("acme", "POST /v1/invoices", false);
    assert_eq!(
        names(&acme_invoices),
        [
            "tenant:tenant-0",
            "global:invoices-valve",
            "share:invoices-valve"
        ]
    );
}

#[test]
fn identities_are_stable_and_distinct() {
    let a = policy(YAML);
    let b = policy(YAML);
    let ra = a.applicable("x", "POST /v1/invoices", true).rules;
    let rb = b.applicable("y", "POST /v1/invoices", true).rules;
    for (x, y) in ra.iter().zip(rb) {
        assert_eq!(x.uid(), y.uid());
    }
    let mut uids: Vec<u64> = a.all_rules().map(BoundRule::uid).collect();
    uids.sort();
    uids.dedup();
    // tenant-0 of free, tenant-0 of pro (same identity: same bucket
    // across plans), route-0, users, other, per-user, two valves and
    // their gates.
    assert_eq!(uids.len(), 9);
}

#[test]
fn policy_header_lists_the_applicable_rules_but_not_valves() {
    let p = policy(YAML);
    let a = p.applicable("t", "POST /v1/invoices", false);
    assert_eq!(
        a.class.policy_header(),
        r#""tenant-0";q=100;w=60, "route-0";q=5;w=1"#
    );
}

#[test]
fn only_a_valve_that_refills_at_its_rate_gets_gates() {
    let yaml = "default_plan: p\nplans:\n  p: {}\nglobal:\n  \"*\": [{ name: v, algorithm: gcra, limit: 100, per: 1s }]\n";
    let mut limits = Config::from_yaml(yaml, "g.yaml").unwrap().limits;
    assert!(
        Policy::compile(&limits)
            .applicable("a", "GET /", false)
            .gated
    );
    // Limits built without the validator (its list of valves saying fair):
    // a window valve still gets no gate, whatever the list says.
    let valve = &mut limits.global[0].rules[0];
    valve.rule =
        crate::Rule::new(crate::Algorithm::SlidingWindow, 100, 1_000, None, false).unwrap();
    let policy = Policy::compile(&limits);
    let applicable = policy.applicable("a", "GET /", false);
    assert!(!applicable.gated, "{:?}", applicable.rules);
}
