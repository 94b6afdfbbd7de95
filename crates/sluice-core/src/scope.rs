//! The scopes a rule applies in.

use crate::reason::Reason;

/// The scope a rule applies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// One budget per tenant across its routes.
    Tenant,
    /// Per tenant per route pattern.
    Route,
    /// Per subject within tenant and route pattern.
    Subject,
    /// Per route pattern across all tenants.
    Global,
    /// Per Envoy rate-limit descriptor (envoyproxy/ratelimit configuration
    /// and descriptor limit overrides).
    Descriptor,
    /// The duplicate guard of a route pattern: one admission per window for
    /// each tenant, subject and fingerprint.
    Dedupe,
    /// A tenant's share of a fair valve: a `gcra` gate in the tenant's own
    /// partition whose rate the limiter sets per decision from the valve's
    /// fair-share level (see `sluice-store`'s `limiter::fair`). Its denials
    /// are the valve's (`global_capacity`, named by the valve).
    Share,
}

impl Scope {
    /// The scope's name.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Tenant => "tenant",
            Scope::Route => "route",
            Scope::Subject => "subject",
            Scope::Global => "global",
            Scope::Descriptor => "descriptor",
            Scope::Dedupe => "dedupe",
            Scope::Share => "share",
        }
    }

    /// The denial reason this scope gives.
    pub fn reason(self) -> Reason {
        match self {
            Scope::Tenant => Reason::TenantLimit,
            Scope::Route => Reason::RouteLimit,
            Scope::Subject => Reason::SubjectLimit,
            Scope::Global | Scope::Share => Reason::GlobalCapacity,
            Scope::Descriptor => Reason::DescriptorLimit,
            Scope::Dedupe => Reason::Duplicate,
        }
    }
}
