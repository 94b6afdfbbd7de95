//! Fuzzing the configuration parsers with property tests: whatever the
//! text, loading never panics, and a refusal points inside the text.
//!
//! Three kinds of input: arbitrary text, the shipped example and an
//! envoyproxy/ratelimit file mutated a few bytes at a time (to reach deep
//! into the validator), and configurations assembled from plausible and
//! absurd field values. A configuration that loads is compiled and asked
//! for decisions' rules.

use proptest::prelude::*;
use sluice_core::config::envoy;
use sluice_core::{Config, Policy};

const EXAMPLE: &str = include_str!("../../../examples/sluice.yaml");

const ENVOY: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    value: "/api/*"
    rate_limit: { unit: minute, requests_per_unit: 5, name: api }
  - key: tenant
    descriptors:
      - key: plan
        value: premium
        rate_limit: { unit: minute, requests_per_unit: 10, replaces: [{ name: api }] }
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1 }
    shadow_mode: true
  - key: bucket
    rules:
      - { name: smooth, algorithm: gcra, limit: 2, per: 1h }
"#;

/// Bytes YAML gives meaning to, and some it should not.
const ALPHABET: &[u8] = b" \n\t:-{}[],'\"#&*!|>%@`0123456789abcxyz.+~\\\x00\xff";

/// `text` with a few bytes replaced, inserted or deleted.
fn mutated(text: &'static str) -> impl Strategy<Value = String> {
    let len = text.len();
    prop::collection::vec((0..len, 0..3u8, prop::sample::select(ALPHABET)), 1..8).prop_map(
        move |edits| {
            let mut bytes = text.as_bytes().to_vec();
            for (at, kind, byte) in edits {
                let at = at.min(bytes.len().saturating_sub(1));
                match kind {
                    0 => bytes[at] = byte,
                    1 => bytes.insert(at, byte),
                    _ => {
                        bytes.remove(at);
                    }
                }
            }
            String::from_utf8_lossy(&bytes).into_owned()
        },
    )
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("0".to_owned()),
        Just("-1".to_owned()),
        Just("1".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("9007199254740993".to_owned()),
        Just("1.5".to_owned()),
        Just("1e400".to_owned()),
        Just("~".to_owned()),
        Just("[]".to_owned()),
        Just("{}".to_owned()),
        Just("\"\"".to_owned()),
        Just("1ms".to_owned()),
        Just("0s".to_owned()),
        Just("7d".to_owned()),
        Just("99999999999d".to_owned()),
        Just("gcra".to_owned()),
        Just("sliding_log".to_owned()),
        Just("true".to_owned()),
        "[a-z0-9 /*]{0,12}".prop_map(|s| format!("\"{s}\"")),
    ]
}

/// Usually a value valid for the field, sometimes any value.
fn field(valid: &'static [&'static str]) -> impl Strategy<Value = String> {
    prop_oneof![
        10 => prop::sample::select(valid).prop_map(str::to_owned),
        1 => value(),
    ]
}

/// A configuration built from random values in every field of a rule, a
/// plan's scopes, a tenant and a valve: mostly valid ones, so that many
/// load and reach the compiler.
fn assembled() -> impl Strategy<Value = String> {
    let limit = &["1", "5", "1000", "1000000000"][..];
    let per = &["1ms", "1s", "1m", "1h", "1d"][..];
    (
        (
            field(&["50ms", "1s", "10s"]),
            field(&["1000", "5000"]),
            field(&["0.8", "0.5", "1"]),
        ),
        (
            field(&[
                "gcra",
                "token_bucket",
                "sliding_log",
                "sliding_window",
                "fixed_window",
            ]),
            field(limit),
            field(per),
            field(&["1", "10", "100"]),
        ),
        (
            field(&["\"POST /x\"", "\"*\"", "\"GET /a/*\""]),
            field(limit),
            field(per),
            field(&["true", "false"]),
        ),
        (field(&["1", "7", "1024"]), field(&["true", "false"])),
    )
        .prop_map(
            |(
                (timeout, entries, near),
                (algorithm, limit, per, burst),
                (route, r_limit, r_per, aligned),
                (shards, shadow),
            )| {
                // `burst` and `aligned` only suit some algorithms: the
                // validator's refusal of the others is part of what is tested.
                format!(
                    r#"
storage: {{ timeout: {timeout}, max_entries: {entries} }}
near_limit: {near}
default_plan: p
plans:
  p:
    tenant: [{{ algorithm: {algorithm}, limit: {limit}, per: {per}, burst: {burst} }}]
    routes:
      {route}: [{{ algorithm: fixed_window, limit: {r_limit}, per: {r_per}, aligned: {aligned} }}]
    subject:
      "*": [{{ limit: {limit}, per: 1s }}]
tenants:
  t: {{ shards: {shards} }}
global:
  "GET /x": [{{ limit: 5, per: 1s, shadow: {shadow} }}]
"#
                )
            },
        )
}

/// Loads `text`; a refusal must point at a line of it (or nowhere), and a
/// success must compile and answer lookups.
fn check(text: &str) -> Result<(), TestCaseError> {
    let lines = text.lines().count() as u64 + 1;
    match Config::from_yaml(text, "fuzz.yaml") {
        Ok(config) => {
            let policy = Policy::compile_for(&config.limits, true);
            for (tenant, route) in [
                ("t", "GET /x"),
                ("acme-corp", "POST /v1/invoices"),
                ("", ""),
            ] {
                let applicable = policy.applicable(tenant, route, true);
                prop_assert!(applicable.shards >= 1);
            }
        }
        Err(errors) => {
            prop_assert!(errors.iter().next().is_some(), "a refusal says why");
            for e in errors.iter() {
                prop_assert!(e.line <= lines, "{e} is beyond the text's {lines} lines");
                prop_assert!(!e.message.is_empty());
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,200}") {
        check(&text)?;
        let _ = envoy::load(&[("fuzz.yaml".to_owned(), text)]);
    }

    #[test]
    fn a_mutated_example_never_panics(text in mutated(EXAMPLE)) {
        check(&text)?;
    }

    #[test]
    fn a_mutated_envoy_file_never_panics(text in mutated(ENVOY)) {
        if let Err(errors) = envoy::load(&[("fuzz.yaml".to_owned(), text.clone())]) {
            let lines = text.lines().count() as u64 + 1;
            for e in errors.iter() {
                prop_assert!(e.line <= lines, "{e}");
            }
        }
    }

    #[test]
    fn assembled_configurations_never_panic(text in assembled()) {
        check(&text)?;
    }
}
