//! Files read as envoyproxy/ratelimit reads them, with sluice's extensions.

use super::*;
use crate::rule::Algorithm;

/// `line:column: message` of each error `text` gets, or what it loads.
pub(super) fn load_one(text: &str) -> Result<Vec<EnvoyDomain>, Vec<String>> {
    load(&[("rl.yaml".to_owned(), text.to_owned())]).map_err(|e| {
        e.iter()
            .map(|e| format!("{}:{}: {}", e.line, e.column, e.message))
            .collect()
    })
}

#[test]
fn reads_the_envoyproxy_example() {
    let domains = load_one(
        "domain: mongo_cps\ndescriptors:\n  - key: database\n    value: users\n    rate_limit:\n      unit: second\n      requests_per_unit: 500\n  - key: database\n    value: default\n    rate_limit:\n      unit: SECOND\n      requests_per_unit: 500\n    descriptors:\n      - key: remote_address\n        rate_limit: { unit: minute, requests_per_unit: 10 }\n        shadow_mode: true\n",
    )
    .unwrap();
    let d = &domains[0];
    assert_eq!(d.domain, "mongo_cps");
    assert_eq!(d.descriptors.len(), 2);
    let users = d.descriptors[0].limit.as_ref().unwrap();
    assert_eq!(users.rules[0].rule.algorithm(), Algorithm::FixedWindow);
    assert!(users.rules[0].rule.aligned());
    assert_eq!(users.rules[0].rule.limit(), 500);
    assert_eq!(users.rules[0].name, "mongo_cps.database_users");
    let nested = &d.descriptors[1].children[0];
    assert!(nested.shadow);
    assert_eq!(nested.limit.as_ref().unwrap().unit, Some(Unit::Minute));
}

#[test]
fn refuses_what_envoyproxy_refuses() {
    let cases = [
        ("descriptors: []\n", "config file cannot have empty domain"),
        (
            "domain: d\ndescriptors:\n  - value: x\n",
            "descriptor has empty key",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n  - key: a\n",
            "duplicate descriptor composite key 'd.a'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
            "invalid rate limit unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, unlimited: true }\n",
            "should not specify rate limit unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, name: n, replaces: [{ name: n }] }\n",
            "replaces should not contain name of same descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, replaces: [{ name: '' }] }\n",
            "should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    ratelimit: {}\n",
            "ratelimit",
        ),
    ];
    assert_refused(&cases);
}

/// Each text is refused with an error containing its expected words.
fn assert_refused(cases: &[(&str, &str)]) {
    for (text, expected) in cases {
        let errors = load_one(text).expect_err(text);
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "{text}: {errors:?}"
        );
    }
}

#[test]
fn upstream_keys_out_of_place_are_noted_or_refused_never_silently_dropped() {
    // Accepted as envoyproxy/ratelimit accepts them, each with a note where it is.
    let domains = load_one(
        "domain: d\nshadow_mode: true\ndescriptors:\n  - key: a\n    name: marked\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      shadow_mode: true\n      quota_mode: true\n      metadata: { any: [shape] }\n      replaces: [{ name: b, shadow_mode: true }]\n",
    )
    .unwrap();
    let d = &domains[0];
    let notes: Vec<_> = d
        .notes
        .iter()
        .map(|n| (n.line, n.message.split(' ').next().unwrap().to_owned()))
        .collect();
    assert_eq!(
        notes,
        [
            (2, "`shadow_mode`".to_owned()),
            (5, "`name`".to_owned()),
            (9, "`shadow_mode`".to_owned()),
            (10, "`quota_mode`".to_owned()),
            (11, "`metadata`".to_owned()),
            (12, "`shadow_mode`".to_owned()),
        ]
    );
    // The same decisions as envoyproxy/ratelimit: the marks out of place do nothing.
    let a = &d.descriptors[0];
    assert!(!a.shadow && !a.quota);
    assert_eq!(a.limit.as_ref().unwrap().replaces, ["b"]);
    // A key that would carry a limit out of place is refused, with where.
    let cases = [
        (
            "domain: d\nrate_limit: { unit: second, requests_per_unit: 1 }\n",
            "2:13: `rate_limit` has no effect at the top of a file",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    requests_per_unit: 5\n",
            "4:24: `requests_per_unit` has no effect on a descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    unlimited: true\n",
            "4:16: `unlimited` has no effect",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      descriptors: [{ key: b }]\n",
            "7:20: `descriptors` has no effect inside `rate_limit`",
        ),
    ];
    assert_refused(&cases);
}

#[test]
fn duplicate_domains_across_files_are_refused() {
    let file = |n: &str| {
        (
            format!("{n}.yaml"),
            "domain: d\ndescriptors: []\n".to_owned(),
        )
    };
    let errors = load(&[file("a"), file("b")]).unwrap_err();
    assert!(
        errors.to_string().contains("duplicate domain 'd'"),
        "{errors}"
    );
}

#[test]
fn sluice_extensions_pick_algorithms_and_rules() {
    let domains = load_one(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 10, algorithm: gcra, burst: 20 }\n  - key: b\n    rules:\n      - { name: fast, algorithm: token_bucket, limit: 5, per: 1s }\n      - { name: hourly, algorithm: sliding_window, limit: 100, per: 1h }\n  - key: c\n    rate_limit: { unit: second, requests_per_unit: 0 }\n",
    )
    .unwrap();
    let d = &domains[0].descriptors;
    let a = &d[0].limit.as_ref().unwrap().rules[0].rule;
    assert_eq!((a.algorithm(), a.burst()), (Algorithm::Gcra, 20));
    let b = &d[1].limit.as_ref().unwrap().rules;
    assert_eq!(
        b.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        ["fast", "hourly"]
    );
    assert!(d[2].limit.as_ref().unwrap().blocks());
}

#[test]
fn envoy_tolerance_leaves_quota_mode_limits_exact() {
    let domains = load_one(
        "domain: d\ndescriptors:\n  - key: tokens\n    quota_mode: true\n    rate_limit: { unit: minute, requests_per_unit: 500 }\n",
    )
    .unwrap();
    let tolerance = crate::tolerance::Tolerance::from_ppm(20_000);
    let domain = domains[0].clone().with_tolerance(tolerance);
    let rule = &domain.descriptors[0].limit.as_ref().unwrap().rules[0];
    assert!(rule.tolerance.is_exact(), "quota hits are debits");
}

#[test]
fn envoy_tolerance_leaves_limits_too_small_to_slice_exact() {
    let domains = load_one(
        "domain: d\ndescriptors:\n  - key: small\n    rate_limit: { unit: minute, requests_per_unit: 99 }\n  - key: large\n    rate_limit: { unit: minute, requests_per_unit: 100 }\n",
    )
    .unwrap();
    let tolerance = crate::tolerance::Tolerance::from_ppm(20_000);
    let domain = domains[0].clone().with_tolerance(tolerance);
    let tolerance_of = |i: usize| domain.descriptors[i].limit.as_ref().unwrap().rules[0].tolerance;
    assert!(tolerance_of(0).is_exact(), "2% of 99 is 1 unit: no slice");
    assert_eq!(tolerance_of(1), tolerance, "2% of 100 is 2 units");
}

#[test]
fn envoy_tolerance_reaches_every_limit_it_can_bound() {
    let domains = load_one(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 500 }\n    descriptors:\n      - key: b\n        rate_limit: { unit: minute, requests_per_unit: 10, algorithm: sliding_window }\n",
    )
    .unwrap();
    let tolerance = crate::tolerance::Tolerance::from_ppm(20_000);
    let domain = domains[0].clone().with_tolerance(tolerance);
    let a = &domain.descriptors[0];
    assert_eq!(a.limit.as_ref().unwrap().rules[0].tolerance, tolerance);
    let b = &a.children[0];
    assert!(
        b.limit.as_ref().unwrap().rules[0].tolerance.is_exact(),
        "sliding_window stays exact"
    );
    let config = crate::Config::from_yaml(
        "envoy:\n  tolerance: \"2%\"\ndefault_plan: p\nplans:\n  p: {}\n",
        "t.yaml",
    )
    .unwrap();
    assert_eq!(config.envoy.tolerance, tolerance);
    let bad = crate::Config::from_yaml(
        "envoy:\n  tolerance: \"20%\"\ndefault_plan: p\nplans:\n  p: {}\n",
        "t.yaml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        bad.contains("`envoy.tolerance` must be a percent from 0% to 10%"),
        "{bad}"
    );
}
