//! A cell: the ordered rules of one plan and route pattern.
//!
//! What a decision reads of them (classes, largest cost, gates, reserves)
//! is computed once, when the plan is compiled.

use std::borrow::Cow;

use super::class::{Class, ClassId};
use crate::adaptive::{AdaptiveValve, Priority};
use crate::bound::BoundRule;
use crate::scope::Scope;
use crate::valve::Reserves;

/// The rules of one (plan, route pattern) pair: subject rules last, so the
/// rules of a request without a subject are a prefix.
#[derive(Debug)]
pub(super) struct Cell {
    pub(super) rules: Box<[BoundRule]>,
    pub(super) without_subject: usize,
    /// Without and with subject rules.
    pub(super) classes: [Class; 2],
    /// The largest cost every rule can hold, without and with subject rules.
    pub(super) max_cost: [u64; 2],
    /// Whether a fair valve's gate is among the rules (with or without
    /// subject rules alike: gates come before those).
    pub(super) gated: bool,
    /// The reserves of its fair valves (before subject rules too).
    pub(super) reserves: Box<[Reserves]>,
    /// Its adaptive valves (before subject rules too).
    pub(super) adaptive: Box<[AdaptiveValve]>,
    /// Its requests' priority at them: the route's, else the plan's.
    pub(super) priority: Priority,
    /// The rules that count by outcome (`count_if`), among `rules`: a
    /// decision holds the request's cost there like any rule's, as an
    /// attempt given back unless its response's status matches; subject
    /// rules last, after `by_outcome_without_subject`.
    pub(super) by_outcome: Box<[BoundRule]>,
    pub(super) by_outcome_without_subject: usize,
    /// The tenant's own rate rules among `rules` (tenant, route and subject
    /// scopes; no valve, gate, guard, lease or rule that counts by
    /// outcome): what a debit charges. Subject rules last, after
    /// `own_without_subject`.
    pub(super) own: Box<[BoundRule]>,
    pub(super) own_without_subject: usize,
}

impl Cell {
    pub(super) fn new(
        rules: Vec<BoundRule>,
        without_subject: usize,
        (reserves, adaptive): (Vec<Reserves>, Vec<AdaptiveValve>),
        plan: &str,
        route: &str,
    ) -> Cell {
        let class = |rules: &[BoundRule]| Class {
            plan: Cow::Owned(plan.to_owned()),
            route: Cow::Owned(route.to_owned()),
            policy_header: Cow::Owned(crate::bound::policy_header(rules)),
            // Numbered when the policy is complete (`Policy::numbered`).
            id: ClassId {
                policy: 0,
                index: 0,
            },
        };
        let classes = [class(&rules[..without_subject]), class(&rules)];
        let max_cost = [max_cost(&rules[..without_subject]), max_cost(&rules)];
        Cell {
            gated: rules.iter().any(|r| r.scope() == Scope::Share),
            reserves: reserves.into(),
            adaptive: adaptive.into(),
            priority: Priority::default(),
            rules: rules.into(),
            without_subject,
            classes,
            max_cost,
            by_outcome: Box::new([]),
            by_outcome_without_subject: 0,
            own: Box::new([]),
            own_without_subject: 0,
        }
    }

    /// Sorts out the rules a debit charges ([`own`](Self::own)) and those
    /// that count by outcome ([`by_outcome`](Self::by_outcome)).
    pub(super) fn sort_out(&mut self) {
        (self.own, self.own_without_subject) = self.picked(|r| {
            matches!(r.scope(), Scope::Tenant | Scope::Route | Scope::Subject)
                && !r.rule().is_concurrency()
                && r.count_if().is_none()
        });
        (self.by_outcome, self.by_outcome_without_subject) =
            self.picked(|r| r.count_if().is_some());
    }

    /// The rules `keep` keeps, in order (subject rules last), and how
    /// many come before the subject rules.
    fn picked(&self, keep: impl Fn(&BoundRule) -> bool) -> (Box<[BoundRule]>, usize) {
        let mut rules: Vec<BoundRule> = self.rules[..self.without_subject]
            .iter()
            .filter(|r| keep(r))
            .cloned()
            .collect();
        let without_subject = rules.len();
        rules.extend(
            self.rules[self.without_subject..]
                .iter()
                .filter(|r| keep(r))
                .cloned(),
        );
        (rules.into(), without_subject)
    }
}

/// The largest cost every one of `rules` can hold (a lease is one slot
/// and a duplicate guard one admission whatever the cost, so they hold
/// any).
pub(super) fn max_cost(rules: &[BoundRule]) -> u64 {
    rules
        .iter()
        .filter(|r| !r.counts_once())
        .map(|r| r.rule().capacity())
        .min()
        .unwrap_or(u64::MAX)
}
