//! envoyproxy/ratelimit's configuration format, read as that project reads
//! it, into sluice rules.
//!
//! Each file holds one `domain` and a tree of `descriptors`: `key`, optional
//! `value` (each `*` in it matches any run of characters), optional
//! `rate_limit` (`unit`, `requests_per_unit`, `unlimited`, `name`,
//! `replaces`), `shadow_mode`, `quota_mode`, `share_threshold` (wildcard
//! values only), `detailed_metric`, `value_to_metric`, `metadata` (any
//! shape) and nested `descriptors`. A limit is a
//! fixed window aligned to the calendar, as envoyproxy/ratelimit counts.
//!
//! Two sluice extensions, documented in docs/ENVOY.md:
//!
//! - `rate_limit.algorithm` (and `rate_limit.burst`) picks another
//!   algorithm for the same `requests_per_unit` per `unit`;
//! - `rules: [...]` on a descriptor gives it any number of sluice rules
//!   (`{name?, algorithm, limit, per, burst?}`) instead of `rate_limit`.
//!
//! Files are refused as envoyproxy/ratelimit refuses them (empty domain,
//! duplicate domain, empty key, duplicate descriptor, bad unit, unit with
//! `unlimited`, bad `replaces`, unknown keys), with `file:line:column`.
//!
//! envoyproxy/ratelimit accepts any of its keys at any level and ignores
//! the ones out of place. sluice accepts them too, so that a directory
//! upstream loads still loads, but never silently: a misplaced key that
//! only names or marks (`shadow_mode` inside `rate_limit`, `name` on a
//! descriptor) becomes a [note](EnvoyDomain::notes) that `validate` prints
//! and `serve` logs; a misplaced key that would carry a limit (`unit` on a
//! descriptor, `descriptors` inside `rate_limit`) is refused, since
//! upstream would load a limit that never applies.

use std::collections::BTreeSet;

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_saphyr::Location;

use super::raw::{RawRule, S};
use super::validate::Validator;
use super::{ConfigError, ConfigErrors, NamedRule};
use crate::rule::{Algorithm, Rule};

mod scalars;

use scalars::Scalar;

/// A `unit` of envoyproxy/ratelimit, with its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3600 s.
    Hour,
    /// 86400 s.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as envoyproxy/ratelimit counts a month.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit's name in configuration files (case-insensitive there).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The unit's length in milliseconds.
    pub fn ms(self) -> u64 {
        const DAY: u64 = 86_400_000;
        match self {
            Unit::Second => 1_000,
            Unit::Minute => 60_000,
            Unit::Hour => 3_600_000,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        }
    }

    /// The unit whose length is exactly `ms`, if any.
    pub fn of_ms(ms: u64) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.ms() == ms)
    }

    /// Parses a unit name, ignoring case.
    pub fn from_name(name: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(name))
    }
}

/// One domain: the descriptors of one file.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyDomain {
    /// The domain requests name.
    pub domain: String,
    /// Its top-level descriptors, in file order.
    pub descriptors: Vec<EnvoyDescriptor>,
    /// Keys accepted but without effect, as envoyproxy/ratelimit ignores
    /// them, each with its place.
    pub notes: Vec<ConfigError>,
}

/// A descriptor node.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyDescriptor {
    /// The entry key.
    pub key: String,
    /// The entry value; `None` matches any value, a trailing `*` a prefix.
    pub value: Option<String>,
    /// The limit of requests whose descriptor ends here.
    pub limit: Option<EnvoyLimit>,
    /// Shadow mode: counted, never enforced.
    pub shadow: bool,
    /// Quota mode: over the limit, its status says so, but the request is
    /// over only when every quota descriptor of it is.
    pub quota: bool,
    /// `share_threshold`: every value the wildcard matches shares one
    /// counter.
    pub share_threshold: bool,
    /// `detailed_metric`: stats name the request's values.
    pub detailed_metric: bool,
    /// `value_to_metric`: stats name the value where a wildcard or a
    /// key-only node matched it.
    pub value_to_metric: bool,
    /// Nested descriptors.
    pub children: Vec<EnvoyDescriptor>,
}

impl EnvoyDescriptor {
    /// `key` or `key_value`, as envoyproxy/ratelimit names a node.
    pub fn composite_key(&self) -> String {
        match &self.value {
            Some(value) => format!("{}_{}", self.key, value),
            None => self.key.clone(),
        }
    }
}

/// A descriptor's limit.
#[derive(Debug, Clone, PartialEq)]
pub struct EnvoyLimit {
    /// `unlimited: true`: never limited, never counted.
    pub unlimited: bool,
    /// `name`, which `replaces` refers to.
    pub name: Option<String>,
    /// Names of limits this one replaces when both apply.
    pub replaces: Vec<String>,
    /// The envoyproxy/ratelimit form, for `current_limit` in answers.
    pub requests_per_unit: u32,
    /// Its unit (`None` when unlimited or given as sluice rules).
    pub unit: Option<Unit>,
    /// The rules enforced (empty when unlimited, or when
    /// `requests_per_unit` is 0: such a limit denies every request).
    pub rules: Vec<NamedRule>,
}

impl EnvoyLimit {
    /// `requests_per_unit: 0`: every request is over the limit.
    pub fn blocks(&self) -> bool {
        !self.unlimited && self.rules.is_empty()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoot {
    domain: Option<S<String>>,
    descriptors: Option<Vec<S<RawDescriptor>>>,
    // Upstream's keys that have no effect here.
    key: Stray,
    value: Stray,
    rate_limit: Stray,
    unit: Stray,
    requests_per_unit: Stray,
    unlimited: Stray,
    name: Stray,
    replaces: Stray,
    shadow_mode: Stray,
    quota_mode: Stray,
    detailed_metric: Stray,
    value_to_metric: Stray,
    share_threshold: Stray,
    metadata: Stray,
}

/// One of envoyproxy/ratelimit's keys where it has no effect.
type Stray = Option<S<IgnoredAny>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDescriptor {
    key: Option<S<String>>,
    value: Option<S<String>>,
    rate_limit: Option<S<RawRateLimit>>,
    descriptors: Option<Vec<S<RawDescriptor>>>,
    shadow_mode: Option<S<Scalar>>,
    quota_mode: Option<S<Scalar>>,
    detailed_metric: Option<S<Scalar>>,
    value_to_metric: Option<S<Scalar>>,
    share_threshold: Option<S<Scalar>>,
    /// Passed to Envoy by envoyproxy/ratelimit as response metadata; any
    /// shape, no effect on decisions.
    #[allow(dead_code)]
    metadata: Option<IgnoredAny>,
    rules: Option<Vec<S<RawRule>>>,
    // Upstream's keys that have no effect here.
    domain: Stray,
    unit: Stray,
    requests_per_unit: Stray,
    unlimited: Stray,
    name: Stray,
    replaces: Stray,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRateLimit {
    requests_per_unit: Option<S<Scalar>>,
    unit: Option<S<String>>,
    unlimited: Option<S<Scalar>>,
    name: Option<S<String>>,
    replaces: Option<Vec<S<RawReplace>>>,
    algorithm: Option<S<String>>,
    burst: Option<S<i64>>,
    // Upstream's keys that have no effect here.
    domain: Stray,
    key: Stray,
    value: Stray,
    descriptors: Stray,
    rate_limit: Stray,
    shadow_mode: Stray,
    quota_mode: Stray,
    detailed_metric: Stray,
    value_to_metric: Stray,
    share_threshold: Stray,
    metadata: Stray,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplace {
    name: Option<S<String>>,
    // Upstream's keys that have no effect here.
    domain: Stray,
    key: Stray,
    value: Stray,
    descriptors: Stray,
    rate_limit: Stray,
    unit: Stray,
    requests_per_unit: Stray,
    unlimited: Stray,
    replaces: Stray,
    shadow_mode: Stray,
    quota_mode: Stray,
    detailed_metric: Stray,
    value_to_metric: Stray,
    share_threshold: Stray,
    metadata: Stray,
}

/// Keys that would carry a limit: out of place, upstream loads a limit
/// that never applies, so sluice refuses them.
const CARRY_LIMITS: [&str; 7] = [
    "rate_limit",
    "descriptors",
    "unit",
    "requests_per_unit",
    "unlimited",
    "replaces",
    "rules",
];

/// [`strays`] over the named fields of `raw`.
macro_rules! strays {
    ($v:expr, $place:expr, $raw:expr, [$($key:ident),* $(,)?]) => {
        strays($v, $place, &[$((stringify!($key), &$raw.$key)),*])
    };
}

/// Refuses or notes each of upstream's keys found out of `place`.
fn strays(v: &mut Validator<'_>, place: &str, keys: &[(&str, &Stray)]) {
    for (key, stray) in keys {
        let Some(stray) = stray else { continue };
        if CARRY_LIMITS.contains(key) {
            v.push(
                stray.referenced,
                format!("`{key}` has no effect {place}: envoyproxy/ratelimit would load it and never apply it, so sluice refuses it; move it where it belongs"),
            );
        } else {
            v.note(
                stray.referenced,
                format!("`{key}` has no effect {place}, as in envoyproxy/ratelimit; ignored"),
            );
        }
    }
}

/// Why a descriptor cannot hold a concurrency rule.
const ENVOY_NO_LEASES: &str = "`algorithm: concurrency` cannot apply to Envoy descriptors: Envoy never releases what it asked for; use /v1/acquire or the tower layer";

/// Reads envoyproxy/ratelimit configuration files, each `(origin, text)`;
/// every problem of every file is reported. A domain in two files is
/// refused.
pub fn load(files: &[(String, String)]) -> Result<Vec<EnvoyDomain>, ConfigErrors> {
    load_with(files, false)
}

/// [`load`], with domains split over several files merged when `merge` is
/// set (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`): their descriptors
/// join, a descriptor defined twice at the top level is still refused.
pub fn load_with(
    files: &[(String, String)],
    merge: bool,
) -> Result<Vec<EnvoyDomain>, ConfigErrors> {
    let mut errors = Vec::new();
    let mut domains: Vec<(EnvoyDomain, String)> = Vec::new();
    for (origin, text) in files {
        let mut v = Validator::new(origin);
        for (at, refused) in scalars::refused_leaves(text) {
            v.push(at, refused);
        }
        let raw: Option<RawRoot> =
            match serde_saphyr::from_str_with_options(text, scalars::options()) {
                Ok(raw) => Some(raw),
                Err(e) => {
                    v.push(
                        e.location().unwrap_or(Location::UNKNOWN),
                        super::validate::yaml_message(
                            &e,
                            text,
                            e.location().unwrap_or(Location::UNKNOWN),
                        ),
                    );
                    None
                }
            };
        if let Some(mut domain) = raw.and_then(|raw| envoy_domain(&mut v, raw)) {
            domain.notes = v.take_notes();
            match domains.iter_mut().find(|(d, _)| d.domain == domain.domain) {
                Some((existing, _)) if merge => {
                    existing.notes.append(&mut domain.notes);
                    for descriptor in domain.descriptors {
                        let key = descriptor.composite_key();
                        if existing
                            .descriptors
                            .iter()
                            .any(|d| d.composite_key() == key)
                        {
                            v.push(
                                Location::UNKNOWN,
                                format!(
                                    "duplicate descriptor composite key '{}.{key}'",
                                    existing.domain
                                ),
                            );
                        } else {
                            existing.descriptors.push(descriptor);
                        }
                    }
                }
                Some((_, first)) => v.push(
                    Location::UNKNOWN,
                    format!(
                        "duplicate domain '{}' in config file (also in {first})",
                        domain.domain
                    ),
                ),
                None => domains.push((domain, origin.clone())),
            }
        }
        errors.extend(v.into_errors());
    }
    if errors.is_empty() {
        Ok(domains.into_iter().map(|(d, _)| d).collect())
    } else {
        Err(ConfigErrors(errors))
    }
}

fn envoy_domain(v: &mut Validator<'_>, raw: RawRoot) -> Option<EnvoyDomain> {
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

fn rate_limit(v: &mut Validator<'_>, path: &str, raw: S<RawRateLimit>) -> Option<EnvoyLimit> {
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
            Some(a) => match Algorithm::from_name(&a.value) {
                Some(Algorithm::Concurrency) => {
                    v.push(a.referenced, ENVOY_NO_LEASES);
                    return None;
                }
                Some(algorithm) => algorithm,
                None => {
                    let allowed: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                    v.push(
                        a.referenced,
                        format!(
                            "unknown `algorithm` `{}`; allowed: {}",
                            a.value,
                            allowed.join(", ")
                        ),
                    );
                    return None;
                }
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

#[cfg(test)]
mod tests {
    use super::*;

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
        // Accepted as upstream accepts them, each with a note where it is.
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
        // The same decisions as upstream: the marks out of place do nothing.
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
}
