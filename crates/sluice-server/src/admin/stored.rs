//! An override as an operator asked for it (stored, listed), and the
//! [`TenantOverride`] it compiles to over the configuration's limits.

use serde::{Deserialize, Serialize};
use sluice_core::Config;
use sluice_core::config::Limits;
use sluice_core::policy::TenantOverride;

/// `shadow`: the whole tenant, or some of its policies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    untagged,
    expecting = "`shadow` takes true, false or a list of policy names"
)]
pub enum Shadow {
    /// `true`: every rule; `false`: none.
    All(bool),
    /// Only the rules of these names.
    Policies(Vec<String>),
}

/// What an operator asked for, as stored and listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stored {
    /// The tenant.
    pub tenant: String,
    /// The plan instead of the configured one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// Limits and bursts multiplied by this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub factor: Option<f64>,
    /// Rules of the tenant's own (`tenant`, `routes`, `subject`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules: Option<serde_json::Value>,
    /// Never deny this tenant (`true`), or only under these policies.
    pub shadow: Shadow,
    /// When it stops applying (ms since the Unix epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<u64>,
    /// Its version: `If-Match` names it to change it safely.
    pub version: u64,
}

impl Stored {
    /// The override the policy applies, checked against `limits`: an error
    /// names the field at fault and what is allowed.
    pub fn compile(&self, limits: &Limits) -> Result<TenantOverride, (String, String)> {
        if let Some(plan) = &self.plan
            && !limits.plans.iter().any(|p| &p.name == plan)
        {
            let known: Vec<&str> = limits.plans.iter().map(|p| p.name.as_str()).collect();
            return Err((
                "plan".into(),
                format!("no plan `{plan}`; configured: {}", known.join(", ")),
            ));
        }
        let mut out = TenantOverride {
            plan: self.plan.clone(),
            factor: self.factor,
            shadow: self.shadow == Shadow::All(true),
            shadow_policies: match &self.shadow {
                Shadow::Policies(names) => names.clone(),
                Shadow::All(_) => Vec::new(),
            },
            ..Default::default()
        };
        if let Some(rules) = &self.rules {
            let parts = rules_of(rules)?;
            out.tenant_rules = parts.0;
            out.route_rules = parts.1;
            out.subject_rules = parts.2;
        }
        let base = self
            .plan
            .as_deref()
            .or_else(|| {
                limits
                    .tenants
                    .iter()
                    .find(|t| t.id == self.tenant)
                    .map(|t| t.plan.as_str())
            })
            .unwrap_or(&limits.default_plan);
        if let Some(base) = limits.plans.iter().find(|p| p.name == base) {
            out.apply(base).map_err(|e| {
                let field = if e.starts_with("`factor`") {
                    "factor"
                } else if e.starts_with("`shadow`") {
                    "shadow"
                } else {
                    "rules"
                };
                (field.to_owned(), e)
            })?;
        }
        Ok(out)
    }
}

type Parts = (
    Option<Vec<sluice_core::config::NamedRule>>,
    Option<Vec<sluice_core::config::RouteRules>>,
    Option<Vec<sluice_core::config::RouteRules>>,
);

/// `{"tenant": [...], "routes": {...}, "subject": {...}}` read as the
/// configuration reads a plan's rules (JSON is YAML), with its errors.
fn rules_of(rules: &serde_json::Value) -> Result<Parts, (String, String)> {
    let object = rules.as_object().ok_or_else(|| {
        (
            "rules".to_owned(),
            "`rules` is an object of `tenant`, `routes` and `subject`".to_owned(),
        )
    })?;
    if let Some(other) = object
        .keys()
        .find(|k| !matches!(k.as_str(), "tenant" | "routes" | "subject"))
    {
        return Err((
            format!("rules.{other}"),
            format!("unknown `rules.{other}`; allowed: tenant, routes, subject"),
        ));
    }
    // One line per part, after three of preamble: an error's line says
    // which part it is about.
    let mut yaml = String::from("default_plan: o\nplans:\n  o:\n");
    let mut given = Vec::new();
    for part in ["tenant", "routes", "subject"] {
        if let Some(value) = object.get(part) {
            yaml.push_str(&format!("    {part}: {value}\n"));
            given.push(part);
        }
    }
    let config = Config::from_yaml(&yaml, "rules").map_err(|errors| {
        let part = errors.iter().next().and_then(|e| {
            let line = usize::try_from(e.line).ok()?;
            given.get(line.checked_sub(4)?)
        });
        let message: Vec<String> = errors.iter().map(|e| e.message.clone()).collect();
        let field = part.map_or_else(|| "rules".to_owned(), |part| format!("rules.{part}"));
        (field, message.join("; "))
    })?;
    let plan = config
        .limits
        .plans
        .into_iter()
        .next()
        .expect("one plan was given");
    Ok((
        object.contains_key("tenant").then_some(plan.tenant),
        object.contains_key("routes").then_some(plan.routes),
        object.contains_key("subject").then_some(plan.subject),
    ))
}
