//! What one descriptor counts in: its bucket (the domain and its entries),
//! and the limit its `limit` override makes.

use sluice_core::config::NamedRule;
use sluice_core::descriptors::DescriptorLimit;
use sluice_core::{Algorithm, BoundRule, Rule, Scope};

use super::request::Descriptor;

/// Where the bucket of a request descriptor lives: the domain and every
/// entry, length-prefixed (the store hashes it; it is never stored plain).
pub(super) fn descriptor_partition(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut key = String::with_capacity(domain.len() + 16 * entries.len());
    for part in std::iter::once(domain).chain(entries.iter().flat_map(|(k, v)| [*k, *v])) {
        key.push_str(&part.len().to_string());
        key.push(':');
        key.push_str(part);
    }
    key
}

/// A limit built from a descriptor's `limit` override: a calendar-aligned
/// fixed window, as envoyproxy/ratelimit enforces overrides.
pub(super) fn override_limit(
    domain: &str,
    d: &Descriptor<'_>,
    near_limit: f64,
    shards: u16,
) -> DescriptorLimit {
    let (requests_per_unit, unit) = d.limit_override.expect("an override");
    let path = format!("{domain}.override.{}", descriptor_partition("", &d.entries));
    // A sharded tenant's override is spread over its shards like its
    // plan's rules: each shard holds its share (an override below the
    // shard count is kept whole on shard 0, exact).
    let rules: Box<[BoundRule]> = match Rule::new(
        Algorithm::FixedWindow,
        requests_per_unit.into(),
        unit.ms(),
        None,
        true,
    )
    .map(|rule| rule.for_shards(u64::from(shards.max(1))))
    {
        Ok(rule) => Box::new([BoundRule::new(
            Scope::Descriptor,
            &path,
            &NamedRule {
                name: "override".to_owned(),
                rule,
                shadow: false,
                count_if: None,
                tolerance: sluice_core::tolerance::Tolerance::EXACT,
                regions: None,
            },
            near_limit,
        )]),
        Err(_) => Box::new([]),
    };
    DescriptorLimit {
        key: path,
        policy_header: sluice_core::headers::policy_header(&rules),
        blocks: rules.is_empty(),
        rules,
        unlimited: false,
        shadow: false,
        quota: false,
        name: None,
        replaces: Vec::new(),
        requests_per_unit,
        unit: Some(unit),
        rules_given: false,
    }
}

/// A descriptor's entries as its bucket counts them: values matched by a
/// `share_threshold` wildcard are replaced by the pattern.
pub(super) fn counted_entries<'e>(
    entries: &[(&'e str, &'e str)],
    shared: &[(usize, &'e str)],
) -> Vec<(&'e str, &'e str)> {
    let mut counted = entries.to_vec();
    for &(i, pattern) in shared {
        if let Some(entry) = counted.get_mut(i) {
            entry.1 = pattern;
        }
    }
    counted
}
