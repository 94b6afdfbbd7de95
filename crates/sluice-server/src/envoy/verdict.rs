//! What a `ShouldRateLimit` request was decided to be, per descriptor,
//! before it becomes an answer (`answer.rs`) and statistics
//! (`stats.rs`): the decision, and how each descriptor answers for it.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
use sluice_core::config::envoy::Unit;
use sluice_core::descriptors::DescriptorLimit;
use sluice_core::{BoundRule, Decision};

use super::units::current_limit;

/// The configured form of a descriptor's limit: requests per unit, unit,
/// name (`None`: its rules answer each for itself).
pub(super) type Configured = Option<(u32, Option<Unit>, Option<String>)>;

/// The form `limit` is answered in: as configured (`rate_limit`, or a
/// `limit` override), or, for sluice `rules:`, by each rule itself.
pub(super) fn configured(limit: &DescriptorLimit) -> Configured {
    (!limit.rules_given).then(|| (limit.requests_per_unit, limit.unit, limit.name.clone()))
}

/// The `current_limit` of a descriptor whose tightest rule is `rule`: its
/// limit as `configured`, named as configured (an unnamed limit has no
/// name, as envoyproxy/ratelimit answers), else the rule's own.
pub(super) fn reported_limit(configured: &Configured, rule: &BoundRule) -> RateLimit {
    match configured {
        Some((rpu, unit, name)) => current_limit(*rpu, *unit, name.as_deref().unwrap_or("")),
        None => current_limit(
            u32::try_from(rule.rule().limit()).unwrap_or(u32::MAX),
            Unit::of_ms(rule.rule().period_ms()),
            rule.name(),
        ),
    }
}

/// How one descriptor of a request is answered.
#[derive(Debug, Default)]
pub(super) struct Answering {
    /// The rules it answers for (indices into the decision's rules).
    pub(super) owned: Vec<usize>,
    /// In quota mode.
    pub(super) quota: bool,
    /// `unlimited: true` matched (answered with the largest remaining, as
    /// envoyproxy/ratelimit answers).
    pub(super) unlimited: bool,
    /// At a zero limit (`requests_per_unit: 0`).
    pub(super) blocked: bool,
    /// In shadow mode.
    pub(super) shadow: bool,
    /// The configured form of its limit, for `current_limit`.
    pub(super) configured: Configured,
    /// On an envoyproxy/ratelimit domain: its limit's key, whether it is in
    /// shadow mode, and its hits, for envoyproxy/ratelimit's stats.
    pub(super) stats: Option<(String, bool, u64)>,
}

/// Everything decided about one request, ready to become an answer.
pub(super) struct Verdict<'p> {
    pub(super) decision: Decision<'p>,
    /// Per descriptor, in the request's order.
    pub(super) descriptors: Vec<Answering>,
    /// The time zero limits reset from.
    pub(super) now_ms: u64,
}

impl<'p> Verdict<'p> {
    /// A decision on the native domain: no quota, unlimited or
    /// envoyproxy/ratelimit stats there.
    pub(super) fn native(
        decision: Decision<'p>,
        descriptors: Vec<Answering>,
        now_ms: u64,
    ) -> Verdict<'p> {
        Verdict {
            decision,
            descriptors,
            now_ms,
        }
    }
}

impl<'p> crate::app::HasDecision<'p> for Verdict<'p> {
    fn decision(&self) -> &Decision<'p> {
        &self.decision
    }
}
