//! A domain and its tree of descriptors.

use std::collections::BTreeSet;

use serde_saphyr::Location;

use super::domain::{EnvoyDescriptor, EnvoyDomain, EnvoyLimit};
use super::rate_limit::{ENVOY_NO_LEASES, rate_limit};
use super::raw::{RawDescriptor, RawRoot};
use super::scalars;
use super::strays::strays;
use super::unit::Unit;
use crate::config::raw::S;
use crate::config::validate::Validator;

pub(super) fn envoy_domain(v: &mut Validator<'_>, raw: RawRoot) -> Option<EnvoyDomain> {
    let domain = match raw.domain {
        Some(d) if !d.value.is_empty() => d.value,
        Some(d) => {
            v.push(d.referenced, "config file cannot have empty domain");
            return None;
        }
        None => {
            v.push(Location::UNKNOWN, "config file cannot have empty domain");
            return None;
        }
    };
    strays!(
        v,
        "at the top of a file",
        raw,
        [
            key,
            value,
            rate_limit,
            unit,
            requests_per_unit,
            unlimited,
            name,
            replaces,
            shadow_mode,
            quota_mode,
            detailed_metric,
            value_to_metric,
            share_threshold,
            metadata
        ]
    );
    let descriptors = descriptors(v, &domain, raw.descriptors.unwrap_or_default());
    Some(EnvoyDomain {
        domain,
        descriptors,
        notes: Vec::new(),
    })
}

fn descriptors(
    v: &mut Validator<'_>,
    parent: &str,
    raw: Vec<S<RawDescriptor>>,
) -> Vec<EnvoyDescriptor> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::with_capacity(raw.len());
    for descriptor in raw {
        let at = descriptor.referenced;
        let raw = descriptor.value;
        strays!(
            v,
            "on a descriptor (it belongs in `rate_limit`)",
            raw,
            [domain, unit, requests_per_unit, unlimited, name, replaces]
        );
        let key = match raw.key {
            Some(k) if !k.value.is_empty() => k.value,
            _ => {
                v.push(at, "descriptor has empty key");
                continue;
            }
        };
        let value = raw.value.map(|s| s.value).filter(|s| !s.is_empty());
        let composite = match &value {
            Some(value) => format!("{key}_{value}"),
            None => key.clone(),
        };
        let path = format!("{parent}.{composite}");
        if !seen.insert(composite.clone()) {
            v.push(at, format!("duplicate descriptor composite key '{path}'"));
            continue;
        }
        let mut share_threshold = scalars::flag(v, "share_threshold", raw.share_threshold.as_ref());
        if share_threshold && !composite.contains('*') {
            v.push(
                raw.share_threshold.as_ref().map_or(at, |s| s.referenced),
                format!("share_threshold can only be used with wildcard values (containing '*'), but found key '{composite}'"),
            );
            share_threshold = false;
        }
        let limit = match (raw.rate_limit, raw.rules) {
            (Some(_), Some(rules)) => {
                v.push(
                    rules.first().map_or(at, |r| r.referenced),
                    "use either `rate_limit` or `rules` on a descriptor, not both",
                );
                None
            }
            (Some(limit), None) => rate_limit(v, &path, limit),
            (None, Some(rules)) => {
                let at = rules.first().map_or(at, |r| r.referenced);
                let named = v.rules(rules, "descriptor");
                if named.iter().any(|r| r.rule.is_concurrency()) {
                    v.push(at, ENVOY_NO_LEASES);
                }
                Some(EnvoyLimit {
                    unlimited: false,
                    name: None,
                    replaces: Vec::new(),
                    requests_per_unit: named.first().map_or(0, |r| r.rule.limit() as u32),
                    unit: named.first().and_then(|r| Unit::of_ms(r.rule.period_ms())),
                    rules: named,
                    rules_given: true,
                })
            }
            (None, None) => None,
        };
        let children = descriptors(v, &path, raw.descriptors.unwrap_or_default());
        out.push(EnvoyDescriptor {
            key,
            value,
            limit,
            shadow: scalars::flag(v, "shadow_mode", raw.shadow_mode.as_ref()),
            quota: scalars::flag(v, "quota_mode", raw.quota_mode.as_ref()),
            share_threshold,
            detailed_metric: scalars::flag(v, "detailed_metric", raw.detailed_metric.as_ref()),
            value_to_metric: scalars::flag(v, "value_to_metric", raw.value_to_metric.as_ref()),
            children,
        });
    }
    out
}
