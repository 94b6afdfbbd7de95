//! One descriptor's `rate_limit`, read into sluice rules.

use super::domain::EnvoyLimit;
use super::raw::RawRateLimit;
use super::scalars;
use super::strays::strays;
use super::unit::Unit;
use crate::config::NamedRule;
use crate::config::raw::S;
use crate::config::validate::Validator;
use crate::rule::{Algorithm, Rule};

/// Why a descriptor cannot hold a concurrency rule.
pub(super) const ENVOY_NO_LEASES: &str = "`algorithm: concurrency` cannot apply to Envoy descriptors: Envoy never releases what it asked for; use /v1/acquire or the tower layer";

pub(super) fn rate_limit(
    v: &mut Validator<'_>,
    path: &str,
    raw: S<RawRateLimit>,
) -> Option<EnvoyLimit> {
    let at = raw.referenced;
    let raw = raw.value;
    strays!(
        v,
        "inside `rate_limit` (it belongs on the descriptor)",
        raw,
        [
            domain,
            key,
            value,
            descriptors,
            rate_limit,
            shadow_mode,
            quota_mode,
            detailed_metric,
            value_to_metric,
            share_threshold,
            metadata
        ]
    );
    let unlimited = scalars::flag(v, "unlimited", raw.unlimited.as_ref());
    let unit = raw.unit.as_ref().and_then(|u| Unit::from_name(&u.value));
    if unlimited && unit.is_some() {
        v.push(at, "should not specify rate limit unit when unlimited");
        return None;
    }
    if !unlimited && unit.is_none() {
        let shown = raw.unit.as_ref().map_or("", |u| u.value.as_str());
        let allowed: Vec<_> = Unit::ALL.iter().map(|u| u.name()).collect();
        v.push(
            raw.unit.as_ref().map_or(at, |u| u.referenced),
            format!(
                "invalid rate limit unit '{shown}'; allowed: {}",
                allowed.join(", ")
            ),
        );
        return None;
    }
    let name = raw
        .name
        .as_ref()
        .map(|n| n.value.clone())
        .filter(|n| !n.is_empty());
    let mut replaces = Vec::new();
    for replace in raw.replaces.unwrap_or_default() {
        let r = &replace.value;
        strays!(
            v,
            "in a `replaces` entry (only `name` counts there)",
            r,
            [
                domain,
                key,
                value,
                descriptors,
                rate_limit,
                unit,
                requests_per_unit,
                unlimited,
                replaces,
                shadow_mode,
                quota_mode,
                detailed_metric,
                value_to_metric,
                share_threshold,
                metadata
            ]
        );
        match replace.value.name {
            Some(n) if n.value.is_empty() => {
                v.push(n.referenced, "should not have an empty replaces entry")
            }
            None => v.push(
                replace.referenced,
                "should not have an empty replaces entry",
            ),
            Some(n) if Some(&n.value) == name.as_ref() => v.push(
                n.referenced,
                "replaces should not contain name of same descriptor",
            ),
            Some(n) => replaces.push(n.value),
        }
    }
    let requests_per_unit = scalars::count(v, raw.requests_per_unit.as_ref())?;
    let mut rules = Vec::new();
    if let (false, Some(unit), true) = (unlimited, unit, requests_per_unit > 0) {
        let algorithm = match &raw.algorithm {
            None => Algorithm::FixedWindow,
            Some(a) => match v.algorithm(a)? {
                Algorithm::Concurrency => {
                    v.push(a.referenced, ENVOY_NO_LEASES);
                    return None;
                }
                algorithm => algorithm,
            },
        };
        let aligned = algorithm == Algorithm::FixedWindow;
        let burst = raw.burst.as_ref().map(|b| i128::from(b.value));
        match Rule::new(
            algorithm,
            requests_per_unit.into(),
            unit.ms(),
            burst,
            aligned,
        ) {
            Ok(rule) => rules.push(NamedRule {
                name: policy_name(name.as_deref(), path),
                rule,
                shadow: false,
                count_if: None,
                tolerance: crate::tolerance::Tolerance::EXACT,
                regions: None,
            }),
            Err(e) => {
                v.push(at, e.to_string());
                return None;
            }
        }
    }
    Some(EnvoyLimit {
        unlimited,
        name,
        replaces,
        requests_per_unit,
        unit,
        rules,
        rules_given: false,
    })
}

/// A policy name headers can carry: the limit's `name`, or its descriptor
/// path, with any character outside `[A-Za-z0-9_.-]` replaced by `_`.
fn policy_name(name: Option<&str>, path: &str) -> String {
    name.unwrap_or(path)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}
