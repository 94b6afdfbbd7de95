//! A policy's rules found by tenant and [`BoundRule::uid`]: what a rule
//! that state was kept for has become under a new policy (the slices of
//! hot keys keep theirs across a reload or an override that leaves their
//! rule alone).

use std::collections::HashMap;

use foldhash::fast::RandomState;

use super::{BoundRule, Policy};

/// Every rule of a policy by the plan it sits in and its uid, and every
/// envoyproxy/ratelimit rule by its uid; built once per policy, one or
/// two lookups per question.
#[derive(Debug)]
pub struct RulesByUid<'p> {
    policy: &'p Policy,
    in_plans: HashMap<(usize, u64), &'p BoundRule, RandomState>,
    descriptors: HashMap<u64, &'p BoundRule, RandomState>,
}

impl Policy {
    /// This policy's rules by tenant and uid (see [`RulesByUid`]).
    pub fn rules_by_uid(&self) -> RulesByUid<'_> {
        let mut in_plans = HashMap::with_hasher(RandomState::default());
        for (index, plan) in self.plans.iter().enumerate() {
            for rule in plan.cells.iter().flat_map(|c| c.rules.iter()) {
                in_plans.entry((index, rule.uid())).or_insert(rule);
            }
        }
        let descriptors = self
            .descriptors
            .rules()
            .into_iter()
            .map(|rule| (rule.uid(), rule))
            .collect();
        RulesByUid {
            policy: self,
            in_plans,
            descriptors,
        }
    }
}

impl<'p> RulesByUid<'p> {
    /// The rule of uid `uid` that `tenant`'s requests meet under this
    /// policy (an envoyproxy/ratelimit limit's whatever the tenant), if
    /// any.
    pub fn find(&self, tenant: &str, uid: u64) -> Option<&'p BoundRule> {
        let plan = self.policy.plan_index(tenant);
        self.in_plans
            .get(&(plan, uid))
            .or_else(|| self.descriptors.get(&uid))
            .copied()
    }
}
