//! The configuration compiled into a lookup structure.
//!
//! For each plan, every route pattern that appears anywhere (plan routes,
//! subject rules, global valves) gets a *cell*: the complete, ordered list of
//! rules that apply to a request whose most specific matching pattern is that
//! one. A request then costs one tenant lookup, one exact route lookup (or a
//! scan of prefix patterns, longest first) and no allocation.
//!
//! Why one union of patterns is enough: if a route's most specific match in
//! the union is `p`, then its most specific match in any one table is that
//! table's most specific pattern covering `p` — for prefixes, every table
//! prefix that matches the route and is no longer than `p` is a prefix of
//! `p`. So the per-table answers can be computed once per union pattern.
//!
//! [`Plan`] compiles one plan into its cells (`cell.rs`); a [`Class`] names the
//! requests of one cell; [`TenantOverride`] changes one tenant's plan at
//! runtime; [`Applicable`] is what one request gets.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use foldhash::fast::RandomState;

pub use crate::bound::BoundRule;
use crate::config::Limits;
use crate::config::shards::shard_share;
pub use crate::scope::Scope;

mod applicable;
mod by_uid;
mod cell;
mod class;
mod plan;
mod tenant_override;

pub use applicable::Applicable;
pub use by_uid::RulesByUid;
pub use class::{ADHOC, Class, ClassId};
pub use plan::Plan;
pub use tenant_override::{MAX_FACTOR, TenantOverride};

#[derive(Debug, Clone, Copy)]
struct TenantEntry {
    plan: usize,
    shards: u16,
}

/// Everything a decision looks up, compiled from [`Limits`].
#[derive(Debug)]
pub struct Policy {
    plans: Box<[Plan]>,
    default_plan: usize,
    tenants: HashMap<Box<str>, TenantEntry, RandomState>,
    near_limit: f64,
    /// The envoyproxy/ratelimit domains compiled from the same
    /// configuration: one snapshot, swapped as one.
    descriptors: Arc<crate::descriptors::DescriptorPolicy>,
    /// This compiled policy's number (see [`ClassId`]).
    id: u64,
}

/// The number of the next compiled policy (0 is no policy's: [`ADHOC`]).
static POLICIES: AtomicU64 = AtomicU64::new(1);

impl Policy {
    /// Compiles validated limits for a store that keeps one bucket per
    /// tenant (the memory store): `shards` are ignored.
    pub fn compile(limits: &Limits) -> Policy {
        Policy::compile_for(limits, false)
    }

    /// Compiles validated limits. With `sharded` (the Redis backends), a
    /// tenant with `shards: N` gets its plan with every tenant, route and
    /// subject rule cut to its share — `⌊limit/N⌋` and `⌊burst/N⌋`, or
    /// kept whole on shard 0 when below N (see `config::shards`) — since
    /// each decision lands on one of N shards.
    pub fn compile_for(limits: &Limits, sharded: bool) -> Policy {
        let mut plans: Vec<Plan> = limits
            .plans
            .iter()
            .map(|spec| Plan::compile(spec, limits))
            .collect();
        let index_of = |name: &str| {
            limits
                .plans
                .iter()
                .position(|p| p.name == name)
                .unwrap_or(0)
        };
        let default_plan = index_of(&limits.default_plan);
        let mut variants: HashMap<(usize, u16), usize> = HashMap::default();
        let mut tenants = HashMap::with_hasher(RandomState::default());
        for tenant in &limits.tenants {
            let base = index_of(&tenant.plan);
            let shards = if sharded { tenant.shards } else { 1 };
            let plan = if shards > 1 {
                *variants.entry((base, shards)).or_insert_with(|| {
                    let spec = shard_share(&limits.plans[base], shards);
                    plans.push(Plan::compile(&spec, limits));
                    plans.len() - 1
                })
            } else {
                base
            };
            tenants.insert(tenant.id.as_str().into(), TenantEntry { plan, shards });
        }
        Policy {
            plans: plans.into(),
            default_plan,
            tenants,
            near_limit: limits.near_limit,
            descriptors: Default::default(),
            id: 0,
        }
        .numbered()
    }

    /// This policy with a number of its own and its classes numbered in
    /// order (see [`ClassId`]).
    fn numbered(mut self) -> Policy {
        self.id = POLICIES.fetch_add(1, Ordering::Relaxed);
        let mut index = 0;
        for plan in self.plans.iter_mut() {
            for cell in plan.cells.iter_mut() {
                for class in cell.classes.iter_mut() {
                    class.id = ClassId {
                        policy: self.id,
                        index,
                    };
                    index += 1;
                }
            }
        }
        self
    }

    /// This compiled policy's number, unique in the process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Every class of the policy, in the order of their [`ClassId`]
    /// indices (`0..n`).
    pub fn classes(&self) -> impl Iterator<Item = &Class> {
        self.plans
            .iter()
            .flat_map(|p| p.cells.iter().flat_map(|c| c.classes.iter()))
    }

    /// [`compile_for`](Self::compile_for), with each tenant of `overrides`
    /// on its override's plan (see [`TenantOverride::apply`]). The
    /// overridden plans keep their base plan's name, so metrics stay
    /// labelled by configured plans, and their rules' names, so a scaled
    /// limit keeps the budget already used.
    pub fn compile_overridden(
        limits: &Limits,
        sharded: bool,
        overrides: &[(&str, &TenantOverride)],
    ) -> Policy {
        let mut policy = Policy::compile_for(limits, sharded);
        if overrides.is_empty() {
            return policy;
        }
        let mut plans: Vec<Plan> = std::mem::take(&mut policy.plans).into_vec();
        for (tenant, tenant_override) in overrides {
            let listed = limits.tenants.iter().find(|t| t.id == *tenant);
            let base_name = tenant_override
                .plan
                .as_deref()
                .or(listed.map(|t| t.plan.as_str()))
                .unwrap_or(&limits.default_plan);
            let Some(base) = limits.plans.iter().find(|p| p.name == base_name) else {
                continue;
            };
            let Ok(spec) = tenant_override.apply(base) else {
                continue;
            };
            let shards = if sharded {
                listed.map_or(1, |t| t.shards)
            } else {
                1
            };
            let spec = if shards > 1 {
                shard_share(&spec, shards)
            } else {
                spec
            };
            plans.push(Plan::compile(&spec, limits));
            policy.tenants.insert(
                (*tenant).into(),
                TenantEntry {
                    plan: plans.len() - 1,
                    shards,
                },
            );
        }
        policy.plans = plans.into();
        policy.numbered()
    }

    /// This policy with the envoyproxy/ratelimit domains of `other` (one
    /// snapshot shared, not copied).
    pub fn sharing_descriptors(mut self, other: &Policy) -> Policy {
        self.descriptors = other.descriptors.clone();
        self
    }

    /// The rules for a request. `with_subject` says whether the request
    /// names a subject (subject rules apply only then).
    #[inline]
    pub fn applicable(&self, tenant: &str, route: &str, with_subject: bool) -> Applicable<'_> {
        let entry = self.tenants.get(tenant).copied().unwrap_or(TenantEntry {
            plan: self.default_plan,
            shards: 1,
        });
        let plan = &self.plans[entry.plan];
        let cell = plan.cell(route);
        let (rules, by_outcome, variant) = if with_subject {
            (&cell.rules[..], &cell.by_outcome[..], 1)
        } else {
            (
                &cell.rules[..cell.without_subject],
                &cell.by_outcome[..cell.by_outcome_without_subject],
                0,
            )
        };
        Applicable {
            plan: Some(plan),
            shards: entry.shards,
            rules,
            class: &cell.classes[variant],
            max_cost: cell.max_cost[variant],
            gated: cell.gated,
            reserves: &cell.reserves,
            adaptive: &cell.adaptive,
            priority: cell.priority,
            by_outcome,
        }
    }

    /// The rules a debit of a request charges: the tenant's own rate rules
    /// (tenant, route and subject scopes) of [`applicable`](Self::applicable)'s
    /// cell, without the valves, gates, duplicate guards, leases and the
    /// rules that count by outcome.
    pub fn own_rules(&self, tenant: &str, route: &str, with_subject: bool) -> &[BoundRule] {
        let entry = self.tenants.get(tenant).copied().unwrap_or(TenantEntry {
            plan: self.default_plan,
            shards: 1,
        });
        let cell = self.plans[entry.plan].cell(route);
        if with_subject {
            &cell.own
        } else {
            &cell.own[..cell.own_without_subject]
        }
    }

    /// The same policy with the envoyproxy/ratelimit domains compiled
    /// from the same configuration, so that a reload swaps both at once.
    pub fn with_descriptors(mut self, descriptors: crate::descriptors::DescriptorPolicy) -> Policy {
        self.descriptors = Arc::new(descriptors);
        self
    }

    /// The envoyproxy/ratelimit domains (empty when none are configured).
    pub fn descriptors(&self) -> &crate::descriptors::DescriptorPolicy {
        &self.descriptors
    }

    /// The plan `tenant` is decided under, by its index in
    /// [`plans`](Self::plans).
    fn plan_index(&self, tenant: &str) -> usize {
        self.tenants
            .get(tenant)
            .map_or(self.default_plan, |entry| entry.plan)
    }

    /// Compiled plans.
    pub fn plans(&self) -> &[Plan] {
        &self.plans
    }

    /// The `near_limit` fraction.
    pub fn near_limit(&self) -> f64 {
        self.near_limit
    }

    /// Every distinct rule of the policy (for tooling such as `inspect`).
    pub fn all_rules(&self) -> impl Iterator<Item = &BoundRule> {
        self.plans
            .iter()
            .flat_map(|p| p.cells.iter().flat_map(|c| c.rules.iter()))
    }
}

#[cfg(test)]
mod tests;
