//! A cell: the ordered rules of one plan and route pattern.
//!
//! What a decision reads of them (classes, largest cost, gates, reserves)
//! is computed once, when the plan is compiled.

use std::borrow::Cow;

use super::class::{Class, ClassId};
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
    /// The rules that count by outcome (`count_if`), out of `rules`: a
    /// decision only asks them; subject rules last, after
    /// `asked_without_subject`.
    pub(super) asked: Box<[BoundRule]>,
    pub(super) asked_without_subject: usize,
    /// The tenant's own rate rules among `rules` (tenant, route and subject
    /// scopes; no valve, gate, guard or lease): what a debit charges.
    /// Subject rules last, after `own_without_subject`.
    pub(super) own: Box<[BoundRule]>,
    pub(super) own_without_subject: usize,
}

impl Cell {
    pub(super) fn new(
        rules: Vec<BoundRule>,
        without_subject: usize,
        reserves: Vec<Reserves>,
        plan: &str,
        route: &str,
    ) -> Cell {
        let class = |rules: &[BoundRule]| Class {
            plan: Cow::Owned(plan.to_owned()),
            route: Cow::Owned(route.to_owned()),
            policy_header: Cow::Owned(
                rules
                    .iter()
                    .filter(|r| r.advertised())
                    .map(BoundRule::policy_item)
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
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
            rules: rules.into(),
            without_subject,
            classes,
            max_cost,
            asked: Box::new([]),
            asked_without_subject: 0,
            own: Box::new([]),
            own_without_subject: 0,
        }
    }

    /// Sorts out the rules a debit charges ([`own`](Self::own)), after
    /// [`split_asked`](Self::split_asked).
    pub(super) fn sort_out(&mut self) {
        self.split_asked();
        let own = |rules: &[BoundRule]| -> Vec<BoundRule> {
            rules
                .iter()
                .filter(|r| {
                    matches!(r.scope(), Scope::Tenant | Scope::Route | Scope::Subject)
                        && !r.rule().is_concurrency()
                })
                .cloned()
                .collect()
        };
        let mut rules = own(&self.rules[..self.without_subject]);
        self.own_without_subject = rules.len();
        rules.extend(own(&self.rules[self.without_subject..]));
        self.own = rules.into();
    }

    /// Moves the rules that count by outcome out of `rules` into `asked`
    /// (before anything indexes the rules by position: they are never
    /// valves, so the reserves' indices, all before the subject rules and
    /// after the tenant and route rules, are counted again). Their capacity
    /// still bounds the cost (the check asks for it).
    fn split_asked(&mut self) {
        if !self.rules.iter().any(|r| r.count_if().is_some()) {
            return;
        }
        let (mut rules, mut asked) = (Vec::new(), Vec::new());
        let (mut without_subject, mut asked_without_subject) = (0, 0);
        for (i, rule) in self.rules.iter().enumerate() {
            let subject = i >= self.without_subject;
            if rule.count_if().is_some() {
                asked.push(rule.clone());
                asked_without_subject += usize::from(!subject);
            } else {
                rules.push(rule.clone());
                without_subject += usize::from(!subject);
            }
        }
        let moved_before = |index: usize| {
            self.rules[..index]
                .iter()
                .filter(|r| r.count_if().is_some())
                .count()
        };
        let mut reserves = self.reserves.to_vec();
        for reserve in &mut reserves {
            reserve.valve -= moved_before(reserve.valve);
        }
        self.reserves = reserves.into();
        self.rules = rules.into();
        self.without_subject = without_subject;
        self.asked = asked.into();
        self.asked_without_subject = asked_without_subject;
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
