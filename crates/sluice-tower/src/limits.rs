//! Limits declared next to the handler, the way annotation-based limiters
//! let a team write `@RateLimiter(rules = {10/1m, 20/2m}, limitType = IP,
//! preventDuplicate = true)` on a controller method:
//!
//! ```
//! use axum::{Router, routing::post};
//! use sluice_store::MemoryStore;
//! use sluice_tower::limits::{By, Limits};
//!
//! let payments = Limits::route("POST /v1/payments")
//!     .rule("10/1m")
//!     .rule("20/2m")
//!     .concurrent(2, "30s")
//!     .by(By::ClientIp(vec!["10.0.0.0/8".parse().unwrap()]))
//!     .prevent_duplicate("5s")
//!     .layer(MemoryStore::new(100_000))
//!     .unwrap();
//! let app: Router = Router::new().route(
//!     "/v1/payments",
//!     post(|| async { "paid" }).route_layer(payments),
//! );
//! ```
//!
//! The declaration becomes the same policy model as a YAML file (docs/
//! CONFIG.md): rules of the route's pattern, per subject when `by` names
//! one (else across all callers, as a global valve), and the route's
//! duplicate guard; the same names (`subject-0`, `global-0`, …), headers
//! and stores. A declaration that does not compile says which part is
//! wrong, as the configuration would.

use std::sync::Arc;

use http::HeaderName;
use sluice_core::config::OnError;
use sluice_core::{Config, Policy};
use sluice_store::{Limiter, Store};

use crate::extract::FromHeaders;
use crate::layer::RateLimitLayer;

/// Who a declared limit counts per.
#[derive(Debug, Clone)]
pub enum By {
    /// Every caller of the route together (a global valve per route).
    Route,
    /// The client's IP address, behind these trusted proxies, which
    /// write it in `X-Forwarded-For` ([`crate::client_ip`]).
    ClientIp(Vec<ipnet::IpNet>),
    /// The value of a header (a user id, an API key).
    Header(HeaderName),
}

/// The limits of one route, declared in code; see the module
/// documentation.
#[derive(Debug, Clone)]
pub struct Limits {
    route: String,
    rules: Vec<Declared>,
    by: By,
    dedupe: Option<String>,
    tenant: Option<HeaderName>,
}

/// One declared rule.
#[derive(Debug, Clone)]
enum Declared {
    /// `LIMIT/PER`.
    Rate(String),
    /// At most `limit` in flight, each lease lasting at most `lease`.
    Concurrent(u64, String),
}

/// A declaration that does not compile, with the configuration's own
/// message (`field` and what is allowed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("limits of `{route}`: {message}")]
pub struct LimitsError {
    /// The route the limits were declared for.
    pub route: String,
    /// What is wrong.
    pub message: String,
}

impl Limits {
    /// Limits for `route` (`METHOD /path`, as route patterns are written).
    pub fn route(route: &str) -> Limits {
        Limits {
            route: sluice_core::route::normalize(route).into_owned(),
            rules: Vec::new(),
            by: By::Route,
            dedupe: None,
            tenant: None,
        }
    }

    /// A rule, `LIMIT/PER` (`10/1m`, `500/1s`): a `gcra` rule of `LIMIT`
    /// per `PER`. Every rule must pass.
    pub fn rule(mut self, rule: &str) -> Limits {
        self.rules.push(Declared::Rate(rule.to_owned()));
        self
    }

    /// At most `limit` requests in flight at once (a `concurrency` rule):
    /// each holds a slot from before the handler runs until its response
    /// body ends or is dropped, and at most `lease` (`30s`) if it is
    /// never given back.
    pub fn concurrent(mut self, limit: u64, lease: &str) -> Limits {
        self.rules
            .push(Declared::Concurrent(limit, lease.to_owned()));
        self
    }

    /// Who the rules count per (default: [`By::Route`]).
    pub fn by(mut self, by: By) -> Limits {
        self.by = by;
        self
    }

    /// Refuse a second identical submission within `window` (`5s`): 409,
    /// as a plan's `dedupe` does; the fingerprint is the `Idempotency-Key`
    /// header, and without one, one request per window per subject.
    pub fn prevent_duplicate(mut self, window: &str) -> Limits {
        self.dedupe = Some(window.to_owned());
        self
    }

    /// Count per tenant too, read from `header` (the rules then apply to
    /// each tenant on its own).
    pub fn tenant(mut self, header: HeaderName) -> Limits {
        self.tenant = Some(header);
        self
    }

    /// The declaration as a sluice configuration (YAML).
    fn yaml(&self) -> Result<String, LimitsError> {
        let error = |message: String| LimitsError {
            route: self.route.clone(),
            message,
        };
        let mut rules = Vec::new();
        for declared in &self.rules {
            let rule = match declared {
                Declared::Concurrent(limit, lease) => {
                    rules.push(format!(
                        "{{ algorithm: concurrency, limit: {limit}, lease: {} }}",
                        serde_json::to_string(lease.trim()).expect("strings serialise")
                    ));
                    continue;
                }
                Declared::Rate(rule) => rule,
            };
            let (limit, per) = rule.split_once('/').ok_or_else(|| {
                error(format!(
                    "a rule is `LIMIT/PER` such as `10/1m`, got `{rule}`"
                ))
            })?;
            let limit: u64 = limit
                .trim()
                .parse()
                .map_err(|_| error(format!("a rule's LIMIT is a whole number, got `{rule}`")))?;
            rules.push(format!(
                "{{ algorithm: gcra, limit: {limit}, per: {} }}",
                serde_json::to_string(per.trim()).expect("strings serialise")
            ));
        }
        let route = serde_json::to_string(&self.route).expect("strings serialise");
        let table = format!("      {route}: [{}]\n", rules.join(", "));
        let mut plan = String::new();
        let per_caller = !matches!(self.by, By::Route);
        if !rules.is_empty() && per_caller {
            plan.push_str("    subject:\n");
            plan.push_str(&table);
        }
        if let Some(window) = &self.dedupe {
            plan.push_str(&format!(
                "    dedupe:\n      {route}: {{ window: {} }}\n",
                serde_json::to_string(window).expect("strings serialise")
            ));
        }
        let mut yaml = if plan.is_empty() {
            String::from("default_plan: declared\nplans:\n  declared: {}\n")
        } else {
            format!("default_plan: declared\nplans:\n  declared:\n{plan}")
        };
        if !rules.is_empty() && !per_caller {
            yaml.push_str(&format!("global:\n  {route}: [{}]\n", rules.join(", ")));
        }
        Ok(yaml)
    }

    /// The declaration compiled into a policy, with errors as the
    /// configuration reports them.
    pub fn policy(&self) -> Result<Policy, LimitsError> {
        let yaml = self.yaml()?;
        let config = Config::from_yaml(&yaml, "limits").map_err(|errors| LimitsError {
            route: self.route.clone(),
            message: errors
                .0
                .iter()
                .map(|e| e.message.clone())
                .collect::<Vec<_>>()
                .join("; "),
        })?;
        Ok(Policy::compile(&config.limits))
    }

    /// A layer enforcing these limits with `store` (its own limiter, kept
    /// healthy like any other): attach it with `route_layer`.
    pub fn layer<S: Store + 'static>(
        self,
        store: S,
    ) -> Result<RateLimitLayer<S, FromHeaders>, LimitsError> {
        let policy = self.policy()?;
        let limiter = Arc::new(Limiter::new(policy, store, OnError::Local));
        Ok(RateLimitLayer::new(limiter, self.keys()))
    }

    /// How requests are read: the tenant from its header (else one tenant
    /// for everybody), the subject as `by` says.
    fn keys(&self) -> FromHeaders {
        let keys = FromHeaders::optional_tenant(self.tenant.clone());
        match &self.by {
            By::Route => keys,
            By::ClientIp(trusted) => keys.client_ip(trusted.clone()),
            By::Header(name) => keys.subject(name.clone()),
        }
    }
}
