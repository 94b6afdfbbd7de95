//! The class of a request: plan and route pattern, for metrics and headers.

use std::borrow::Cow;

/// The class of requests a decision belongs to: its plan and the route
/// pattern it matched, with the rules' `RateLimit-Policy` field. Metrics
/// count decisions by class; classes come from the configuration, so their
/// number is bounded (never one per tenant).
#[derive(Debug)]
pub struct Class {
    pub(super) plan: Cow<'static, str>,
    pub(super) route: Cow<'static, str>,
    pub(super) policy_header: Cow<'static, str>,
    pub(super) id: ClassId,
}

/// Which class of which policy: dense within a policy (`0..n`, see
/// [`Policy::classes`](super::Policy::classes)), so that a caller keeps
/// per-class handles (metrics counters) in a table indexed by it, built
/// when the policy is installed; a decision made under another policy
/// (one still under way across a reload) is told apart by `policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClassId {
    /// The policy's number ([`Policy::id`](super::Policy::id)); 0 for
    /// [`ADHOC`], which belongs to no policy.
    pub policy: u64,
    /// The class's index among the policy's classes.
    pub index: u32,
}

/// The class of rules gathered outside a plan (Envoy descriptors): no plan,
/// no route pattern, no `RateLimit-Policy` field.
pub static ADHOC: Class = Class {
    plan: Cow::Borrowed(""),
    route: Cow::Borrowed(""),
    policy_header: Cow::Borrowed(""),
    id: ClassId {
        policy: 0,
        index: 0,
    },
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

    /// Which class of which policy it is.
    pub fn id(&self) -> ClassId {
        self.id
    }
}
