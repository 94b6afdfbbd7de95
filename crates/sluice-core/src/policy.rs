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

use std::any::Any;
use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use foldhash::fast::RandomState;

pub use crate::bound::BoundRule;
use crate::config::shards::shard_share;
use crate::config::share::Share;
use crate::config::{Limits, NamedRule, OnError, PlanSpec, RoutePattern, RouteRules};
pub use crate::scope::Scope;
use crate::valve::{self, Reserves};

/// The rules of one (plan, route pattern) pair: subject rules last, so the
/// rules of a request without a subject are a prefix.
#[derive(Debug)]
struct Cell {
    rules: Box<[BoundRule]>,
    without_subject: usize,
    /// Without and with subject rules.
    classes: [Class; 2],
    /// The largest cost every rule can hold, without and with subject rules.
    max_cost: [u64; 2],
    /// Whether a fair valve's gate is among the rules (with or without
    /// subject rules alike: gates come before those).
    gated: bool,
    /// The reserves of its fair valves (before subject rules too).
    reserves: Box<[Reserves]>,
}

impl Cell {
    fn new(
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
            handles: OnceLock::new(),
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
        }
    }
}

/// The class of requests a decision belongs to: its plan and the route
/// pattern it matched, with the rules' `RateLimit-Policy` field. Metrics
/// count decisions by class; classes come from the configuration, so their
/// number is bounded (never one per tenant).
#[derive(Debug)]
pub struct Class {
    plan: Cow<'static, str>,
    route: Cow<'static, str>,
    policy_header: Cow<'static, str>,
    handles: OnceLock<Box<dyn Any + Send + Sync>>,
}

/// The class of rules gathered outside a plan (Envoy descriptors): no plan,
/// no route pattern, no `RateLimit-Policy` field.
pub static ADHOC: Class = Class {
    plan: Cow::Borrowed(""),
    route: Cow::Borrowed(""),
    policy_header: Cow::Borrowed(""),
    handles: OnceLock::new(),
};

impl Class {
    /// The plan's name ("" outside a plan).
    pub fn plan(&self) -> &str {
        &self.plan
    }

    /// The route pattern matched (`*` when none did, "" outside a plan).
    pub fn route(&self) -> &str {
        &self.route
    }

    /// The `RateLimit-Policy` field value for the class's rules (empty when
    /// none is advertised).
    pub fn policy_header(&self) -> &str {
        &self.policy_header
    }

    /// Whatever a caller keeps per class (its metrics handles, resolved
    /// once), made by `init` on first use. `None` when a value of another
    /// type is already kept.
    pub fn handles<T: Any + Send + Sync>(&self, init: impl FnOnce() -> T) -> Option<&T> {
        self.handles.get_or_init(|| Box::new(init())).downcast_ref()
    }
}

/// One plan compiled.
#[derive(Debug)]
pub struct Plan {
    name: Box<str>,
    on_error: Option<OnError>,
    weight: f64,
    exact: HashMap<Box<str>, usize, RandomState>,
    /// Longest first.
    prefixes: Box<[(Box<str>, usize)]>,
    fallback: usize,
    cells: Box<[Cell]>,
}

impl Plan {
    fn compile(spec: &crate::config::PlanSpec, limits: &Limits) -> Plan {
        let (global, near_limit) = (&limits.global[..], limits.near_limit);
        let mut patterns: Vec<&RoutePattern> = spec
            .routes
            .iter()
            .chain(&spec.subject)
            .chain(&spec.dedupe)
            .chain(global)
            .map(|r| &r.pattern)
            .collect();
        patterns.sort();
        patterns.dedup();

        let tenant: Vec<BoundRule> = spec
            .tenant
            .iter()
            .map(|r| BoundRule::new(Scope::Tenant, "", r, near_limit))
            .collect();
        let cell_for = |covering: Option<&RoutePattern>| -> Cell {
            let mut rules = tenant.clone();
            let add = |rules: &mut Vec<BoundRule>, scope: Scope, table: &[RouteRules]| {
                if let Some(best) = covering.and_then(|p| most_specific(table, p)) {
                    let source = best.pattern.source();
                    rules.extend(
                        best.rules
                            .iter()
                            .map(|r| BoundRule::new(scope, &source, r, near_limit)),
                    );
                }
            };
            add(&mut rules, Scope::Route, &spec.routes);
            let valves = rules.len();
            add(&mut rules, Scope::Global, global);
            // Each fair valve's gate, right after the valves: the tenant's
            // share of it (see `Scope::Share`). Shares are of a rate: a
            // concurrency valve (leases in flight) is first come.
            let mut gates = Vec::new();
            let mut reserves = Vec::new();
            for (index, valve) in rules.iter_mut().enumerate().skip(valves) {
                let share = limits.valve(valve.pattern(), valve.name());
                if valve.rule().is_concurrency() || share.is_some_and(|s| s.share != Share::Fair) {
                    continue;
                }
                gates.push(BoundRule::gate(valve));
                // The valve's reserves: what is left of it stays in the rules.
                reserves.extend(share.and_then(|s| valve::split(valve, index, s, &spec.name)));
            }
            rules.extend(gates);
            // The duplicate guard applies with or without a subject.
            add(&mut rules, Scope::Dedupe, &spec.dedupe);
            let without_subject = rules.len();
            add(&mut rules, Scope::Subject, &spec.subject);
            let route = covering.map_or_else(|| "*".to_owned(), RoutePattern::source);
            Cell::new(rules, without_subject, reserves, &spec.name, &route)
        };

        let mut cells = Vec::with_capacity(patterns.len() + 1);
        let mut exact = HashMap::with_hasher(RandomState::default());
        let mut prefixes = Vec::new();
        for pattern in patterns {
            let index = cells.len();
            cells.push(cell_for(Some(pattern)));
            match pattern {
                RoutePattern::Exact(route) => {
                    exact.insert(route.as_str().into(), index);
                }
                RoutePattern::Prefix(prefix) => {
                    prefixes.push((Box::<str>::from(prefix.as_str()), index))
                }
            }
        }
        prefixes.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        let fallback = cells.len();
        cells.push(cell_for(None));
        Plan {
            name: spec.name.as_str().into(),
            on_error: spec.on_error,
            weight: spec.weight,
            exact,
            prefixes: prefixes.into(),
            fallback,
            cells: cells.into(),
        }
    }

    /// The plan's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The plan's failure policy, when it overrides the storage default.
    pub fn on_error(&self) -> Option<OnError> {
        self.on_error
    }

    /// The plan's weight at a saturated valve (default 1).
    pub fn weight(&self) -> f64 {
        self.weight
    }

    #[inline]
    fn cell(&self, route: &str) -> &Cell {
        let index = match self.exact.get(route) {
            Some(&index) => index,
            None => self
                .prefixes
                .iter()
                .find(|(prefix, _)| crate::bytes::starts_with(route.as_bytes(), prefix.as_bytes()))
                .map_or(self.fallback, |(_, index)| *index),
        };
        &self.cells[index]
    }
}

/// The largest cost every one of `rules` can hold (a lease is one slot
/// and a duplicate guard one admission whatever the cost, so they hold
/// any).
fn max_cost(rules: &[BoundRule]) -> u64 {
    rules
        .iter()
        .filter(|r| !r.counts_once())
        .map(|r| r.rule().capacity())
        .min()
        .unwrap_or(u64::MAX)
}

/// A tenant's override at runtime (the admin API's): another plan, its
/// plan's limits scaled, rules of its own, shadow mode.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TenantOverride {
    /// The plan instead of the configured one.
    pub plan: Option<String>,
    /// Every limit and burst of the plan multiplied by this.
    pub factor: Option<f64>,
    /// The tenant-scope rules instead of the plan's.
    pub tenant_rules: Option<Vec<NamedRule>>,
    /// The route rules instead of the plan's.
    pub route_rules: Option<Vec<RouteRules>>,
    /// The subject rules instead of the plan's.
    pub subject_rules: Option<Vec<RouteRules>>,
    /// Never deny: every rule decided and counted, none enforced.
    pub shadow: bool,
    /// Only these policies (rule names) in shadow mode.
    pub shadow_policies: Vec<String>,
}

/// The largest `factor` of an override.
pub const MAX_FACTOR: f64 = 1_000.0;

impl TenantOverride {
    /// `base` as this override changes it (the plan itself is chosen by
    /// the caller); an error names the field at fault and what is allowed.
    pub fn apply(&self, base: &PlanSpec) -> Result<PlanSpec, String> {
        let mut spec = base.clone();
        if let Some(rules) = &self.tenant_rules {
            spec.tenant = rules.clone();
        }
        if let Some(rules) = &self.route_rules {
            spec.routes = rules.clone();
        }
        if let Some(rules) = &self.subject_rules {
            spec.subject = rules.clone();
        }
        if let Some(factor) = self.factor {
            if !(factor > 0.0 && factor <= MAX_FACTOR) {
                return Err(format!(
                    "`factor` must be above 0 and at most {MAX_FACTOR}, got {}",
                    crate::number::shown(factor)
                ));
            }
            let scale = |named: &mut NamedRule| -> Result<(), String> {
                named.rule = named.rule.scaled(factor).map_err(|e| {
                    format!("`factor` {factor} makes rule `{}` invalid: {e}", named.name)
                })?;
                Ok(())
            };
            spec.tenant.iter_mut().try_for_each(scale)?;
            for table in [&mut spec.routes, &mut spec.subject] {
                for route in table.iter_mut() {
                    route.rules.iter_mut().try_for_each(scale)?;
                }
            }
        }
        if !self.shadow_policies.is_empty() {
            let mut known = std::collections::BTreeSet::new();
            let mut mark = |named: &mut NamedRule| {
                known.insert(named.name.clone());
                if self.shadow_policies.contains(&named.name) {
                    named.shadow = true;
                }
            };
            spec.tenant.iter_mut().for_each(&mut mark);
            for table in [&mut spec.routes, &mut spec.subject] {
                for route in table.iter_mut() {
                    route.rules.iter_mut().for_each(&mut mark);
                }
            }
            if let Some(unknown) = self.shadow_policies.iter().find(|p| !known.contains(*p)) {
                let names: Vec<&str> = known.iter().map(String::as_str).collect();
                return Err(format!(
                    "`shadow` names policy `{unknown}`, which the tenant's plan does not have; it has: {}",
                    names.join(", ")
                ));
            }
        }
        if self.shadow {
            let shadow = |named: &mut NamedRule| named.shadow = true;
            spec.tenant.iter_mut().for_each(shadow);
            for table in [&mut spec.routes, &mut spec.subject, &mut spec.dedupe] {
                for route in table.iter_mut() {
                    route.rules.iter_mut().for_each(shadow);
                }
            }
        }
        Ok(spec)
    }
}

/// The pattern of `table` that best covers `pattern`: for an exact route,
/// the same route or else the longest prefix of it; for a prefix, the
/// longest prefix of that prefix.
fn most_specific<'t>(table: &'t [RouteRules], pattern: &RoutePattern) -> Option<&'t RouteRules> {
    if matches!(pattern, RoutePattern::Exact(_))
        && let Some(same) = table.iter().find(|r| r.pattern == *pattern)
    {
        return Some(same);
    }
    let text = match pattern {
        RoutePattern::Exact(route) => route.as_str(),
        RoutePattern::Prefix(prefix) => prefix.as_str(),
    };
    table
        .iter()
        .filter_map(|r| match &r.pattern {
            RoutePattern::Prefix(prefix) if text.starts_with(prefix.as_str()) => {
                Some((prefix.len(), r))
            }
            _ => None,
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, r)| r)
}

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
}

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
    /// ([`Scope::Share`]), whose rate the limiter sets per decision.
    pub gated: bool,
    /// The reserves of those fair valves that have some: the limiter
    /// chooses per decision which part a request draws from.
    pub reserves: &'p [Reserves],
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
        }
    }

    /// The failure policy of the plan, if it sets one.
    pub fn on_error(&self) -> Option<OnError> {
        self.plan.and_then(Plan::on_error)
    }
}

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
        }
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
        policy
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
        let (rules, variant) = if with_subject {
            (&cell.rules[..], 1)
        } else {
            (&cell.rules[..cell.without_subject], 0)
        };
        Applicable {
            plan: Some(plan),
            shards: entry.shards,
            rules,
            class: &cell.classes[variant],
            max_cost: cell.max_cost[variant],
            gated: cell.gated,
            reserves: &cell.reserves,
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
mod tests {
    use super::*;
    use crate::config::Config;

    fn policy(yaml: &str) -> Policy {
        Policy::compile(&Config::from_yaml(yaml, "test.yaml").unwrap().limits)
    }

    #[test]
    fn an_override_changes_one_tenant_and_keeps_rule_names() {
        let limits = Config::from_yaml(
            "default_plan: free\nplans:\n  free:\n    tenant: [{ name: t, limit: 10, per: 1m }]\n  pro:\n    tenant: [{ name: t, limit: 100, per: 1m, burst: 150 }]\n",
            "o.yaml",
        )
        .unwrap()
        .limits;
        let doubled = TenantOverride {
            factor: Some(2.5),
            ..Default::default()
        };
        let pro_shadow = TenantOverride {
            plan: Some("pro".into()),
            shadow: true,
            ..Default::default()
        };
        let p = Policy::compile_overridden(&limits, false, &[("a", &doubled), ("b", &pro_shadow)]);
        let rule = |tenant: &str| p.applicable(tenant, "GET /", false).rules[0].clone();
        assert_eq!((rule("a").name(), rule("a").rule().limit()), ("t", 25));
        assert_eq!(rule("a").uid(), rule("c").uid(), "the same bucket");
        assert_eq!(rule("b").rule().burst(), 150);
        assert!(rule("b").shadow() && !rule("c").shadow());
        assert_eq!(
            p.applicable("a", "GET /", false).plan.unwrap().name(),
            "free"
        );
        let bad = TenantOverride {
            factor: Some(1e9),
            ..Default::default()
        };
        assert!(
            bad.apply(&limits.plans[0])
                .unwrap_err()
                .contains("`factor`")
        );
    }

    fn names(a: &Applicable<'_>) -> Vec<String> {
        a.rules
            .iter()
            .map(|r| format!("{}:{}", r.scope().name(), r.name()))
            .collect()
    }

    const YAML: &str = r#"
default_plan: free
plans:
  free:
    tenant: [{ limit: 100, per: 1m }]
    routes:
      "POST /v1/invoices": [{ algorithm: sliding_log, limit: 5, per: 1s }]
      "GET /v1/users/*": [{ name: users, limit: 50, per: 1s }]
      "*": [{ name: other, algorithm: token_bucket, limit: 20, per: 1s, burst: 50 }]
    subject:
      "*": [{ name: per-user, limit: 10, per: 1s }]
  pro:
    tenant: [{ limit: 1000, per: 1m }]
tenants:
  acme: { plan: pro }
global:
  "POST /v1/invoices": [{ name: invoices-valve, limit: 10000, per: 1s }]
  "GET /v1/users/admin*": [{ name: admin-valve, limit: 5, per: 1s }]
"#;

    #[test]
    fn most_specific_pattern_wins_in_every_table() {
        let p = policy(YAML);
        let invoices = p.applicable("t1", "POST /v1/invoices", true);
        assert_eq!(
            names(&invoices),
            [
                "tenant:tenant-0",
                "route:route-0",
                "global:invoices-valve",
                "share:invoices-valve",
                "subject:per-user"
            ]
        );
        assert_eq!(invoices.plan.unwrap().name(), "free");
        let users = p.applicable("t1", "GET /v1/users/42", false);
        assert_eq!(names(&users), ["tenant:tenant-0", "route:users"]);
        let admin = p.applicable("t1", "GET /v1/users/admin/7", false);
        assert_eq!(
            names(&admin),
            [
                "tenant:tenant-0",
                "route:users",
                "global:admin-valve",
                "share:admin-valve"
            ]
        );
        let other = p.applicable("t1", "DELETE /v1/things", false);
        assert_eq!(names(&other), ["tenant:tenant-0", "route:other"]);
    }

    #[test]
    fn listed_tenants_get_their_plan_and_others_the_default() {
        let p = policy(YAML);
        let acme = p.applicable("acme", "DELETE /v1/things", true);
        assert_eq!(acme.plan.unwrap().name(), "pro");
        assert_eq!(names(&acme), ["tenant:tenant-0"]);
        let acme_invoices = p.applicable("acme", "POST /v1/invoices", false);
        assert_eq!(
            names(&acme_invoices),
            [
                "tenant:tenant-0",
                "global:invoices-valve",
                "share:invoices-valve"
            ]
        );
    }

    #[test]
    fn identities_are_stable_and_distinct() {
        let a = policy(YAML);
        let b = policy(YAML);
        let ra = a.applicable("x", "POST /v1/invoices", true).rules;
        let rb = b.applicable("y", "POST /v1/invoices", true).rules;
        for (x, y) in ra.iter().zip(rb) {
            assert_eq!(x.uid(), y.uid());
        }
        let mut uids: Vec<u64> = a.all_rules().map(BoundRule::uid).collect();
        uids.sort();
        uids.dedup();
        // tenant-0 of free, tenant-0 of pro (same identity: same bucket
        // across plans), route-0, users, other, per-user, two valves and
        // their gates.
        assert_eq!(uids.len(), 9);
    }

    #[test]
    fn policy_header_lists_the_applicable_rules_but_not_valves() {
        let p = policy(YAML);
        let a = p.applicable("t", "POST /v1/invoices", false);
        assert_eq!(
            a.class.policy_header(),
            r#""tenant-0";q=100;w=60, "route-0";q=5;w=1"#
        );
    }
}
