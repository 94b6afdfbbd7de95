//! The rules that apply to one request, as a decision reads them.

use super::cell::max_cost;
use super::class::{ADHOC, Class};
use super::plan::Plan;
use crate::adaptive::{AdaptiveValve, Priority};
use crate::bound::BoundRule;
use crate::config::OnError;
use crate::valve::Reserves;

/// The rules that apply to one request.
#[derive(Debug, Clone, Copy)]
pub struct Applicable<'p> {
    /// The tenant's plan (`None` for an ad-hoc set of rules).
    pub plan: Option<&'p Plan>,
    /// How many shards the tenant's keys are spread over.
    pub shards: u16,
    /// Every rule to check, in scope order (tenant, route, global, subject).
    pub rules: &'p [BoundRule],
    /// The class of the request (plan, route pattern, `RateLimit-Policy`).
    pub class: &'p Class,
    /// The largest cost every one of these rules can hold.
    pub max_cost: u64,
    /// Whether some of these rules are fair valves' gates
    /// ([`Scope::Share`](crate::scope::Scope::Share)), whose rate the limiter sets per decision.
    pub gated: bool,
    /// The reserves of those fair valves that have some: the limiter
    /// chooses per decision which part a request draws from.
    pub reserves: &'p [Reserves],
    /// The adaptive valves among `rules`: the limiter sets each one's
    /// effective limit, for the request's `priority`, per decision.
    pub adaptive: &'p [AdaptiveValve],
    /// The request's priority at adaptive valves: its route's
    /// (`priorities:`), else its plan's.
    pub priority: Priority,
    /// The rules that count by outcome (`count_if`), also among `rules`:
    /// a decision holds the request's cost there as an attempt, given back
    /// unless the response's status matches (`Limiter::attempt`).
    pub by_outcome: &'p [BoundRule],
}

impl<'p> Applicable<'p> {
    /// Rules gathered outside a plan (Envoy descriptors): no plan, one
    /// shard, no `RateLimit-Policy` field.
    pub fn adhoc(rules: &'p [BoundRule]) -> Applicable<'p> {
        Applicable {
            plan: None,
            shards: 1,
            rules,
            class: &ADHOC,
            max_cost: max_cost(rules),
            gated: false,
            reserves: &[],
            adaptive: &[],
            priority: Priority::Normal,
            by_outcome: &[],
        }
    }

    /// The failure policy of the plan, if it sets one.
    pub fn on_error(&self) -> Option<OnError> {
        self.plan.and_then(Plan::on_error)
    }
}
