//! What a `ShouldRateLimit` request was decided to be, per descriptor,
//! before it becomes an answer (`answer.rs`) and statistics
//! (`stats.rs`): the decision, and how each descriptor answers for it.

use std::borrow::Cow;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
use sluice_core::descriptors::DescriptorLimit;
use sluice_core::{BoundRule, Decision};

use super::units::current_limit;

/// The `current_limit` of a descriptor whose tightest rule is `rule`: its
/// limit as configured (`rate_limit`, or a `limit` override), named as
/// configured (an unnamed limit has no name, as envoyproxy/ratelimit
/// answers); for sluice `rules:` or a plan's rules, the rule's own.
pub(super) fn reported_limit(limit: Option<&DescriptorLimit>, rule: &BoundRule) -> RateLimit {
    match limit.filter(|l| !l.rules_given) {
        Some(l) => current_limit(l.requests_per_unit, l.unit, l.name.as_deref().unwrap_or("")),
        None => current_limit(
            u32::try_from(rule.rule().limit()).unwrap_or(u32::MAX),
            sluice_core::config::envoy::Unit::of_ms(rule.rule().period_ms()),
            rule.name(),
        ),
    }
}

/// How one descriptor of a request answers: its limit, compiled at load
/// (a `limit` override's per request), and the rules it answers for.
#[derive(Debug, Default)]
pub(super) struct Answering<'p> {
    /// The rules it answers for (indices into the decision's rules).
    pub(super) owned: Vec<usize>,
    /// Its limit, when one applies (none replaced it); `None` for a
    /// native descriptor answering for its plan's rules.
    pub(super) limit: Option<&'p DescriptorLimit>,
    /// On an envoyproxy/ratelimit domain: the key its stats count under,
    /// and its hits.
    pub(super) stats: Option<(&'p str, u64)>,
}

impl Answering<'_> {
    /// In quota mode.
    pub(super) fn quota(&self) -> bool {
        self.limit.is_some_and(|l| l.quota)
    }

    /// `unlimited: true` matched (answered with the largest remaining, as
    /// envoyproxy/ratelimit answers).
    pub(super) fn unlimited(&self) -> bool {
        self.limit.is_some_and(|l| l.unlimited)
    }

    /// At a zero limit (`requests_per_unit: 0`).
    pub(super) fn blocked(&self) -> bool {
        self.limit.is_some_and(|l| l.blocks && !l.unlimited)
    }

    /// In shadow mode.
    pub(super) fn shadow(&self) -> bool {
        self.limit.is_some_and(|l| l.shadow)
    }
}

/// Everything decided about one request, ready to become an answer.
pub(super) struct Verdict<'p> {
    pub(super) decision: Decision<'p>,
    /// Per descriptor, in the request's order.
    pub(super) descriptors: Vec<Answering<'p>>,
    /// Its `RateLimit-Policy`: the plan's, compiled, or the descriptors'
    /// limits', each compiled, joined when several answer.
    pub(super) policy: Cow<'p, str>,
    /// The time zero limits reset from.
    pub(super) now_ms: u64,
}

impl<'p> Verdict<'p> {
    pub(super) fn new(
        decision: Decision<'p>,
        descriptors: Vec<Answering<'p>>,
        now_ms: u64,
    ) -> Verdict<'p> {
        let policy = policy_of(decision.policy_header(), &descriptors);
        Verdict {
            decision,
            descriptors,
            policy,
            now_ms,
        }
    }
}

/// The plan's compiled `RateLimit-Policy` when it has one, else the items
/// of the descriptors' limits that count (borrowed when one does).
fn policy_of<'p>(plan: &'p str, descriptors: &[Answering<'p>]) -> Cow<'p, str> {
    if !plan.is_empty() {
        return Cow::Borrowed(plan);
    }
    let mut counting = descriptors
        .iter()
        .filter(|d| !d.owned.is_empty())
        .filter_map(|d| d.limit)
        .map(|l| l.policy_header.as_str())
        .filter(|h| !h.is_empty());
    match (counting.next(), counting.clone().next()) {
        (None, _) => Cow::Borrowed(""),
        (Some(one), None) => Cow::Borrowed(one),
        (Some(first), Some(_)) => Cow::Owned(
            std::iter::once(first)
                .chain(counting)
                .collect::<Vec<_>>()
                .join(", "),
        ),
    }
}

impl<'p> crate::app::HasDecision<'p> for Verdict<'p> {
    fn decision(&self) -> &Decision<'p> {
        &self.decision
    }
}
