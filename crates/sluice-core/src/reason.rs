//! Why a request was denied: the word every answer, metric and log uses.

/// Why a request was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A tenant-scope rule.
    TenantLimit,
    /// A route-scope rule.
    RouteLimit,
    /// A subject-scope rule.
    SubjectLimit,
    /// A global valve.
    GlobalCapacity,
    /// An Envoy descriptor's limit.
    DescriptorLimit,
    /// The cost is above a rule's capacity: it can never pass.
    CostExceedsCapacity,
    /// The store failed and the failure policy is `deny`.
    StoreUnavailable,
    /// The same submission (tenant, subject, route and fingerprint) was
    /// admitted less than its route's `dedupe.window` ago.
    Duplicate,
}

impl Reason {
    /// The name used in JSON answers and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::TenantLimit => "tenant_limit",
            Reason::RouteLimit => "route_limit",
            Reason::SubjectLimit => "subject_limit",
            Reason::GlobalCapacity => "global_capacity",
            Reason::DescriptorLimit => "descriptor_limit",
            Reason::CostExceedsCapacity => "cost_exceeds_capacity",
            Reason::StoreUnavailable => "store_unavailable",
            Reason::Duplicate => "duplicate",
        }
    }
}
