//! Envoy rate-limit descriptors matched against an envoyproxy/ratelimit
//! configuration, with that project's matching rules.
//!
//! A request descriptor is a list of `(key, value)` entries. Walking the
//! tree one entry at a time, each level is tried in this order:
//!
//! 1. the node named `key_value` exactly;
//! 2. a node whose value holds `*` (anywhere, any number of them: each
//!    matches any run of characters) and whose `key_value` pattern matches
//!    (first in file order);
//! 3. the node named `key` alone (any value).
//!
//! A wildcard node with `share_threshold` counts every value it matches in
//! one bucket (its pattern stands for the value in the bucket's name);
//! without it each value counts on its own.
//!
//! The limit applies only if the node matched for the *last* entry has one:
//! a descriptor with more entries than the tree is deep matches nothing.
//! Buckets are per request descriptor: every distinct set of entries
//! counts on its own (so a `key`-only node limits each value separately).

use std::collections::HashMap;

use crate::bound::BoundRule;
use crate::config::NamedRule;
use crate::config::envoy::{EnvoyDescriptor, EnvoyDomain, Unit};
use crate::scope::Scope;

/// A limit found for a descriptor.
#[derive(Debug, Clone)]
pub struct DescriptorLimit {
    /// Where it sits: `domain.key_value.key…`, as envoyproxy/ratelimit
    /// names it.
    pub key: String,
    /// The rules enforced (empty when unlimited or blocking).
    pub rules: Box<[BoundRule]>,
    /// Never limited, never counted.
    pub unlimited: bool,
    /// `requests_per_unit: 0`: every request is over.
    pub blocks: bool,
    /// Shadow mode: counted, never enforced.
    pub shadow: bool,
    /// Quota mode: its rules never block alone (they are decided as shadow
    /// rules); the request is over when every quota descriptor is.
    pub quota: bool,
    /// The limit's name, for `replaces`.
    pub name: Option<String>,
    /// Names this limit replaces.
    pub replaces: Vec<String>,
    /// As configured, for `current_limit`.
    pub requests_per_unit: u32,
    /// As configured, for `current_limit`.
    pub unit: Option<Unit>,
    /// Given as sluice `rules:`: `current_limit` reports the tightest
    /// rule itself, not `requests_per_unit`, `unit` and `name`.
    pub rules_given: bool,
    /// Its rules' `RateLimit-Policy` items ([`crate::bound::policy_header`]).
    pub policy_header: String,
}

#[derive(Debug, Default)]
struct Node {
    children: HashMap<String, Node>,
    /// `(pattern split on '*', composite key of the child)`, file order.
    wildcards: Vec<(Vec<String>, String)>,
    limit: Option<DescriptorLimit>,
    /// `share_threshold` on this (wildcard) node.
    share_threshold: bool,
    /// `value_to_metric`: stats name the request's value where this node
    /// matched it by wildcard or by key alone.
    value_to_metric: bool,
    /// `detailed_metric` (on a node with a limit): stats name every value.
    detailed_metric: bool,
}

/// A descriptor's limit, with the entries a `share_threshold` wildcard
/// matched: `(index, value pattern)`, to count under the pattern.
#[derive(Debug, Clone)]
pub struct Found<'p> {
    /// The limit.
    pub limit: &'p DescriptorLimit,
    /// Entries counted under their wildcard pattern instead of their value.
    pub shared: Vec<(usize, &'p str)>,
    /// The key its stats count under, as envoyproxy/ratelimit names them:
    /// the limit's configured key, with request values only where
    /// `detailed_metric` or `value_to_metric` ask for them.
    pub stats_key: String,
}

/// Whether `text` matches `parts` (a pattern split on `*`): it starts with
/// the first part, ends with the last, and holds the others in order in
/// between.
fn wildcard_match(parts: &[String], text: &str) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return false;
    };
    if parts.len() == 1 {
        return first == text;
    }
    let fixed: usize = parts.iter().map(String::len).sum();
    if text.len() < fixed || !text.starts_with(first.as_str()) || !text.ends_with(last.as_str()) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

/// Compiled envoyproxy/ratelimit domains.
#[derive(Debug, Default)]
pub struct DescriptorPolicy {
    domains: HashMap<String, Node>,
}

impl DescriptorPolicy {
    /// Compiles domains read by [`crate::config::envoy::load`].
    pub fn compile(domains: &[EnvoyDomain], near_limit: f64) -> DescriptorPolicy {
        let domains = domains
            .iter()
            .map(|d| {
                let mut root = Node::default();
                for descriptor in &d.descriptors {
                    insert(&mut root, &d.domain, descriptor, near_limit);
                }
                (d.domain.clone(), root)
            })
            .collect();
        DescriptorPolicy { domains }
    }

    /// Whether `domain` is configured here.
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// Configured domains.
    pub fn domains(&self) -> impl Iterator<Item = &str> {
        self.domains.keys().map(String::as_str)
    }

    /// Every limit, one line each and sorted, as envoyproxy/ratelimit's
    /// `/rlconfig` prints them: `key: unit=… requests_per_unit=…,
    /// shadow_mode: …, quota_mode: …`.
    pub fn dump(&self) -> String {
        fn walk(node: &Node, lines: &mut Vec<String>) {
            if let Some(l) = &node.limit {
                let unit = l
                    .unit
                    .map_or("UNKNOWN".to_owned(), |u| u.name().to_uppercase());
                lines.push(format!(
                    "{}: unit={unit} requests_per_unit={}, shadow_mode: {}, quota_mode: {}",
                    l.key, l.requests_per_unit, l.shadow, l.quota
                ));
            }
            for child in node.children.values() {
                walk(child, lines);
            }
        }
        let mut lines = Vec::new();
        for root in self.domains.values() {
            walk(root, &mut lines);
        }
        lines.sort();
        lines.into_iter().map(|l| l + "\n").collect()
    }

    /// Every rule of every limit, in no particular order.
    pub fn rules(&self) -> Vec<&BoundRule> {
        fn walk<'n>(node: &'n Node, rules: &mut Vec<&'n BoundRule>) {
            if let Some(limit) = &node.limit {
                rules.extend(limit.rules.iter());
            }
            for child in node.children.values() {
                walk(child, rules);
            }
        }
        let mut rules = Vec::new();
        for root in self.domains.values() {
            walk(root, &mut rules);
        }
        rules
    }

    /// The limit for one request descriptor, if any.
    pub fn lookup<'k>(
        &self,
        domain: &str,
        entries: &[(&'k str, &'k str)],
    ) -> Option<&DescriptorLimit> {
        self.find(domain, entries).map(|found| found.limit)
    }

    /// The limit for one request descriptor, with the entries that count
    /// under a shared wildcard.
    pub fn find<'k>(&self, domain: &str, entries: &[(&'k str, &'k str)]) -> Option<Found<'_>> {
        let mut node = self.domains.get(domain)?;
        let mut found = None;
        let mut shared = Vec::new();
        let mut composite = String::new();
        // The stats key as configured, with values where value_to_metric
        // asks, and fully detailed (share_threshold patterns kept).
        let mut stats = String::from(domain);
        let mut detailed = String::from(domain);
        for (i, (key, value)) in entries.iter().enumerate() {
            composite.clear();
            composite.push_str(key);
            composite.push('_');
            composite.push_str(value);
            let (next, named) = match node.children.get(&composite) {
                Some(next) => (next, composite.clone()),
                None => match node
                    .wildcards
                    .iter()
                    .find(|(parts, _)| wildcard_match(parts, &composite))
                {
                    Some((_, pattern)) => {
                        let next = node.children.get(pattern)?;
                        if next.share_threshold {
                            let value = pattern
                                .strip_prefix(*key)
                                .and_then(|p| p.strip_prefix('_'))
                                .unwrap_or(pattern);
                            shared.push((i, value));
                        }
                        let named = if next.value_to_metric && !next.share_threshold {
                            composite.clone()
                        } else {
                            pattern.clone()
                        };
                        (next, named)
                    }
                    None => {
                        let next = node.children.get(*key)?;
                        let named = if next.value_to_metric {
                            composite.clone()
                        } else {
                            (*key).to_owned()
                        };
                        (next, named)
                    }
                },
            };
            stats.push('.');
            stats.push_str(&named);
            detailed.push('.');
            match shared.last() {
                Some((at, pattern)) if *at == i => {
                    detailed.push_str(key);
                    detailed.push('_');
                    detailed.push_str(pattern);
                }
                _ => detailed.push_str(&composite),
            }
            if i + 1 == entries.len() {
                found = next.limit.as_ref().map(|l| (l, next.detailed_metric));
            }
            if next.children.is_empty() {
                break;
            }
            node = next;
        }
        found.map(|(limit, detailed_metric)| Found {
            limit,
            shared,
            stats_key: if detailed_metric { detailed } else { stats },
        })
    }
}

fn insert(parent: &mut Node, path: &str, descriptor: &EnvoyDescriptor, near_limit: f64) {
    let composite = descriptor.composite_key();
    let path = format!("{path}.{composite}");
    let mut node = Node {
        share_threshold: descriptor.share_threshold,
        value_to_metric: descriptor.value_to_metric,
        detailed_metric: descriptor.detailed_metric,
        ..Node::default()
    };
    if let Some(limit) = &descriptor.limit {
        let rules = limit
            .rules
            .iter()
            .map(|named| {
                let named = NamedRule {
                    shadow: named.shadow || descriptor.shadow || descriptor.quota,
                    ..named.clone()
                };
                BoundRule::new(Scope::Descriptor, &path, &named, near_limit)
            })
            .collect();
        let rules: Box<[BoundRule]> = rules;
        node.limit = Some(DescriptorLimit {
            key: path.clone(),
            policy_header: crate::bound::policy_header(&rules),
            rules,
            unlimited: limit.unlimited,
            blocks: limit.blocks(),
            shadow: descriptor.shadow,
            quota: descriptor.quota,
            name: limit.name.clone(),
            replaces: limit.replaces.clone(),
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit,
            rules_given: limit.rules_given,
        });
    }
    for child in &descriptor.children {
        insert(&mut node, &path, child, near_limit);
    }
    if composite.contains('*') {
        let parts = composite.split('*').map(str::to_owned).collect();
        parent.wildcards.push((parts, composite.clone()));
    }
    parent.children.insert(composite, node);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::envoy::load;

    fn policy(text: &str) -> DescriptorPolicy {
        let domains = load(&[("t.yaml".to_owned(), text.to_owned())]).unwrap();
        DescriptorPolicy::compile(&domains, 0.8)
    }

    const CONFIG: &str = r#"
domain: d
descriptors:
  - key: database
    value: users
    rate_limit: { unit: second, requests_per_unit: 500 }
  - key: database
    rate_limit: { unit: second, requests_per_unit: 100 }
    descriptors:
      - key: remote_address
        rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: path
    value: "/api/*"
    rate_limit: { unit: second, requests_per_unit: 7 }
  - key: path
    value: "/api/health"
    rate_limit: { unlimited: true }
"#;

    fn rpu(p: &DescriptorPolicy, entries: &[(&str, &str)]) -> Option<u32> {
        p.lookup("d", entries).map(|l| l.requests_per_unit)
    }

    #[test]
    fn exact_then_wildcard_then_key_only() {
        let p = policy(CONFIG);
        assert_eq!(rpu(&p, &[("database", "users")]), Some(500));
        assert_eq!(rpu(&p, &[("database", "orders")]), Some(100));
        assert_eq!(rpu(&p, &[("path", "/api/v1/x")]), Some(7));
        assert!(p.lookup("d", &[("path", "/api/health")]).unwrap().unlimited);
        assert_eq!(rpu(&p, &[("path", "/web")]), None);
    }

    #[test]
    fn a_star_matches_anywhere_and_more_than_once() {
        let p = policy(
            r#"
domain: d
descriptors:
  - key: path
    value: "/v1/*/invoices/*"
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: path
    value: "*.pdf"
    rate_limit: { unit: second, requests_per_unit: 2 }
  - key: path
    value: "/files/*"
    share_threshold: true
    rate_limit: { unit: second, requests_per_unit: 3 }
"#,
        );
        assert_eq!(rpu(&p, &[("path", "/v1/acme/invoices/7")]), Some(1));
        assert_eq!(rpu(&p, &[("path", "/v1/acme/invoices/")]), Some(1));
        assert_eq!(rpu(&p, &[("path", "/v1/acme/bills/7")]), None);
        assert_eq!(rpu(&p, &[("path", "/a/b.pdf")]), Some(2));
        assert_eq!(rpu(&p, &[("path", "/a/b.pdfx")]), None);
        let found = p.find("d", &[("path", "/files/a.csv")]).unwrap();
        assert_eq!(found.limit.requests_per_unit, 3);
        assert_eq!(found.shared, vec![(0, "/files/*")]);
        assert_eq!(found.stats_key, "d.path_/files/*");
        assert!(
            p.find("d", &[("path", "/a/b.pdf")])
                .unwrap()
                .shared
                .is_empty()
        );
    }

    #[test]
    fn stats_keys_name_values_only_where_asked() {
        let p = policy(
            r#"
domain: d
descriptors:
  - key: user
    value_to_metric: true
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: path
    value: "/a/*"
    detailed_metric: true
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: ip
    rate_limit: { unit: second, requests_per_unit: 1 }
"#,
        );
        let key = |k: &str, v: &str| p.find("d", &[(k, v)]).unwrap().stats_key;
        assert_eq!(key("user", "alice"), "d.user_alice");
        assert_eq!(key("path", "/a/b"), "d.path_/a/b");
        assert_eq!(key("ip", "10.0.0.1"), "d.ip");
    }

    #[test]
    fn the_limit_of_the_last_entry_applies_and_extra_depth_matches_nothing() {
        let p = policy(CONFIG);
        assert_eq!(
            rpu(
                &p,
                &[("database", "orders"), ("remote_address", "10.0.0.1")]
            ),
            Some(10)
        );
        assert_eq!(
            rpu(&p, &[("database", "users"), ("remote_address", "10.0.0.1")]),
            None
        );
        assert_eq!(rpu(&p, &[("path", "/api/x"), ("more", "y")]), None);
        assert!(p.lookup("other-domain", &[("database", "users")]).is_none());
    }
}
