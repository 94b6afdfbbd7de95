//! The class of a request: plan and route pattern, for metrics and headers.

use std::any::Any;
use std::borrow::Cow;
use std::sync::OnceLock;

/// The class of requests a decision belongs to: its plan and the route
/// pattern it matched, with the rules' `RateLimit-Policy` field. Metrics
/// count decisions by class; classes come from the configuration, so their
/// number is bounded (never one per tenant).
#[derive(Debug)]
pub struct Class {
    pub(super) plan: Cow<'static, str>,
    pub(super) route: Cow<'static, str>,
    pub(super) policy_header: Cow<'static, str>,
    pub(super) handles: OnceLock<Box<dyn Any + Send + Sync>>,
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
