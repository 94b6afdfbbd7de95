//! Plans, tenants and the default plan: what limits a request.

use std::collections::{BTreeMap, HashMap};

use super::{MAX_NAME_BYTES, TOP, Validator};
use crate::config::raw::{RawPlan, RawRule, RawTenant, S};
use crate::config::{Limits, PlanSpec, TenantSpec, defaults};
use crate::request::MAX_TENANT_BYTES;

/// Most shards a tenant may be split over.
const MAX_SHARDS: i64 = 1024;

/// A table of rules by route pattern, as written.
type RouteTable = BTreeMap<String, S<Vec<S<RawRule>>>>;

/// The one (empty) plan of a configuration for Envoy alone.
const ENVOY_ONLY_PLAN: &str = "default";

impl Validator<'_> {
    pub(super) fn limits(
        &mut self,
        envoy_only: bool,
        default_plan: Option<S<String>>,
        near_limit: Option<S<f64>>,
        plans: Option<S<BTreeMap<String, S<RawPlan>>>>,
        tenants: Option<BTreeMap<String, S<RawTenant>>>,
        (global, priorities): (Option<RouteTable>, Option<BTreeMap<String, S<String>>>),
    ) -> Limits {
        let near_limit = match near_limit {
            None => defaults::NEAR_LIMIT,
            Some(n) if n.value > 0.0 && n.value <= 1.0 => n.value,
            Some(n) => {
                self.push(
                    n.referenced,
                    format!(
                        "`near_limit` must be a fraction above 0 and at most 1 (e.g. 0.8), got {}",
                        crate::number::shown(n.value)
                    ),
                );
                defaults::NEAR_LIMIT
            }
        };
        let (global_rules, valves, reserved) = self.global_table(global.unwrap_or_default());
        let global_names: Vec<String> = global_rules
            .iter()
            .flat_map(|r| r.rules.iter().map(|n| n.name.clone()))
            .collect();

        let plans_at = plans.as_ref().map_or(TOP, |p| p.referenced);
        let mut specs = Vec::new();
        for (name, plan) in plans.map(|p| p.value).unwrap_or_default() {
            if name.is_empty() || name.len() > MAX_NAME_BYTES {
                self.push(
                    plan.referenced,
                    format!("plan names must be 1 to {MAX_NAME_BYTES} bytes"),
                );
            }
            specs.push(self.plan(name, plan, &global_names));
        }
        if envoy_only {
            specs.push(PlanSpec {
                name: ENVOY_ONLY_PLAN.to_owned(),
                tenant: Vec::new(),
                routes: Vec::new(),
                subject: Vec::new(),
                dedupe: Vec::new(),
                on_error: None,
                weight: 1.0,
                priority: Default::default(),
            });
        } else if specs.is_empty() {
            self.push(plans_at, "`plans` must define at least one plan");
        }
        self.reserved_plans(reserved, &specs);
        let plan_list = || {
            specs
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let default_plan = match default_plan {
            None if envoy_only => ENVOY_ONLY_PLAN.to_owned(),
            None => {
                self.push(TOP, "`default_plan` is missing: name the plan that tenants not listed under `tenants` get");
                String::new()
            }
            Some(d) => {
                if !specs.is_empty() && !specs.iter().any(|p| p.name == d.value) {
                    let list = plan_list();
                    self.push(
                        d.referenced,
                        format!(
                            "`default_plan` names unknown plan `{}`; defined plans: {list}",
                            d.value
                        ),
                    );
                }
                d.value
            }
        };
        let mut tenant_specs = Vec::new();
        for (id, tenant) in tenants.unwrap_or_default() {
            if id.is_empty() || id.len() > MAX_TENANT_BYTES {
                self.push(
                    tenant.referenced,
                    format!("tenant ids must be 1 to {MAX_TENANT_BYTES} bytes"),
                );
            }
            let plan = match &tenant.value.plan {
                Some(p) => {
                    if !specs.iter().any(|s| s.name == p.value) {
                        let list = plan_list();
                        self.push(
                            p.referenced,
                            format!(
                                "tenant `{id}` has unknown plan `{}`; defined plans: {list}",
                                p.value
                            ),
                        );
                    }
                    p.value.clone()
                }
                None => default_plan.clone(),
            };
            let shards = match &tenant.value.shards {
                None => 1,
                Some(s) if (1..=MAX_SHARDS).contains(&s.value) => s.value as u16,
                Some(s) => {
                    self.push(
                        s.referenced,
                        format!("`shards` must be from 1 to {MAX_SHARDS}, got {}", s.value),
                    );
                    1
                }
            };
            tenant_specs.push(TenantSpec { id, plan, shards });
        }
        Limits {
            default_plan,
            near_limit,
            plans: specs,
            tenants: tenant_specs,
            global: global_rules,
            valves,
            priorities: self.route_priorities(priorities.unwrap_or_default()),
        }
    }

    fn plan(&mut self, name: String, plan: S<RawPlan>, global_names: &[String]) -> PlanSpec {
        let at = plan.referenced;
        let raw = plan.value;
        let tenant = self.rules(raw.tenant.unwrap_or_default(), "tenant");
        let routes = self.route_table(raw.routes.unwrap_or_default(), "route");
        let subject = self.route_table(raw.subject.unwrap_or_default(), "subject");
        let dedupe = self.dedupe(raw.dedupe.unwrap_or_default());
        let on_error = raw.on_error.as_ref().map(|o| self.on_error(o, "on_error"));
        let weight = self.weight(raw.weight.as_ref());
        let priority = self.priority(raw.priority.as_ref());

        // A name must say which rule denied: it may not be shared by two
        // scopes that can apply to the same request.
        let mut owner: HashMap<&str, &str> = HashMap::new();
        let groups = [
            ("tenant", tenant.iter().collect::<Vec<_>>()),
            ("route", routes.iter().flat_map(|r| &r.rules).collect()),
            ("subject", subject.iter().flat_map(|r| &r.rules).collect()),
        ];
        for name in global_names {
            owner.insert(name, "global");
        }
        let mut clashes = Vec::new();
        for (scope, rules) in &groups {
            let mut seen_here: Vec<&str> = Vec::new();
            for rule in rules {
                if seen_here.contains(&rule.name.as_str()) {
                    continue;
                }
                seen_here.push(&rule.name);
                if let Some(other) = owner.insert(&rule.name, scope) {
                    clashes.push(format!(
                        "plan `{name}`: policy name `{}` is used by both {other} and {scope} rules; names must tell scopes apart",
                        rule.name
                    ));
                }
            }
        }
        for clash in clashes {
            self.push(at, clash);
        }
        PlanSpec {
            name,
            tenant,
            routes,
            subject,
            dedupe,
            on_error,
            weight,
            priority,
        }
    }
}
