//! The embedded cases, shared by `benches/decision.rs` (time) and
//! `examples/embedded_instructions.rs` (instructions), so that both measure
//! the same thing: 10,000 tenants, limits every request passes.

use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use sluice_core::{Config, Policy};
use sluice_store::{Limiter, MemoryStore};

/// Tenants cycled through.
pub const TENANTS: usize = 10_000;

/// One gcra rule per tenant.
pub const SINGLE: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 1000000, per: 1s }]
"#;

/// Tenant, route and subject rules, decided atomically.
pub const THREE: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 1000000, per: 1s }]
    routes:
      "*": [{ algorithm: token_bucket, limit: 1000000, per: 1s }]
    subject:
      "*": [{ algorithm: sliding_window, limit: 1000000, per: 1s }]
"#;

/// A tenant rule and a global valve (fair, the default), every request
/// admitted: what a fair valve's gate costs while the valve has room.
pub const VALVE_FAIR: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 1000000, per: 1s }]
global:
  "*": [{ algorithm: gcra, limit: 1000000000, per: 1s }]
"#;

/// The same valve first come (no gate).
pub const VALVE_FIRST_COME: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 1000000, per: 1s }]
global:
  "*": [{ algorithm: gcra, limit: 1000000000, per: 1s, share: first_come }]
"#;

/// The tenants' ids.
pub fn tenants() -> Vec<String> {
    (0..TENANTS).map(|i| format!("tenant-{i:05}")).collect()
}

/// The memory store answers without waiting: poll once.
pub fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("the memory store never waits"),
    }
}

/// A limiter on the memory store with the plans of `yaml`.
pub fn limiter(yaml: &str) -> Limiter<MemoryStore> {
    let config = Config::from_yaml(yaml, "bench.yaml").unwrap();
    Limiter::new(
        Policy::compile(&config.limits),
        MemoryStore::new(1_000_000),
        config.storage.on_error,
    )
}
