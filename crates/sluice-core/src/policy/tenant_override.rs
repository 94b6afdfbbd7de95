//! A tenant's runtime override: another plan, scaled limits, own rules, shadow.

use crate::config::{NamedRule, PlanSpec, RouteRules};

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
