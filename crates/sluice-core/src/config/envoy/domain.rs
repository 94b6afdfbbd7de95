//! What a file loads into: a domain, its descriptors and their limits.

use super::unit::Unit;
use crate::config::{ConfigError, NamedRule};
use crate::tolerance::Tolerance;

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
    /// Given as sluice `rules:` rather than `rate_limit`: answers report
    /// the tightest rule itself (its name, limit and period), not a
    /// configured `requests_per_unit` per `unit`.
    pub rules_given: bool,
}

impl EnvoyLimit {
    /// `requests_per_unit: 0`: every request is over the limit.
    pub fn blocks(&self) -> bool {
        !self.unlimited && self.rules.is_empty()
    }
}

impl EnvoyDomain {
    /// Gives every limit of the domain `tolerance` (`envoy.tolerance`),
    /// on the algorithms it can bound ([`Tolerance::applies_to`]), except
    /// quota-mode descriptors (their hits are debits: always exact).
    pub fn with_tolerance(mut self, tolerance: Tolerance) -> EnvoyDomain {
        fn each(descriptors: &mut [EnvoyDescriptor], tolerance: Tolerance) {
            for descriptor in descriptors {
                // Quota-mode hits are debits: always exact.
                let exact = descriptor.quota;
                for named in descriptor.limit.iter_mut().flat_map(|l| &mut l.rules) {
                    if !exact && Tolerance::applies_to(named.rule.algorithm()) {
                        named.tolerance = tolerance;
                    }
                }
                each(&mut descriptor.children, tolerance);
            }
        }
        each(&mut self.descriptors, tolerance);
        self
    }
}
