//! What the limiter reports about the store, for metrics and logs.
//!
//! The limiter calls these hooks; the server implements them with
//! Prometheus counters resolved once, so the hot path only increments.

use std::time::Duration;

use sluice_core::Policy;
use sluice_core::config::OnError;

use crate::limiter::breaker::BreakerState;
use crate::store::StoreError;

/// Hooks the limiter calls. Every method defaults to doing nothing.
pub trait Telemetry: Send + Sync {
    /// `policy` is about to decide (at start and on every swap): the time
    /// to resolve per-class handles, once per policy (see
    /// [`ClassId`](sluice_core::policy::ClassId)).
    fn policy_installed(&self, policy: &Policy) {
        let _ = policy;
    }

    /// A store call finished (or ran out of time) after `elapsed`.
    fn store_call(&self, elapsed: Duration, error: Option<&StoreError>) {
        let _ = (elapsed, error);
    }

    /// A store could not decide (also reported through `store_call` for
    /// calls across the network; alone for the in-process store, which is
    /// not timed).
    fn store_error(&self, error: &StoreError) {
        let _ = error;
    }

    /// The circuit breaker changed state.
    fn breaker_changed(&self, to: BreakerState) {
        let _ = to;
    }

    /// A decision was made by the failure policy instead of the store.
    fn failure_policy(&self, policy: OnError) {
        let _ = policy;
    }

    /// A denial was answered from the over-limit cache.
    fn denial_cache_hit(&self) {}

    /// A slice of `units` of `rule` was taken for a hot key.
    fn slice_taken(&self, rule: &sluice_core::BoundRule, units: u64) {
        let _ = (rule, units);
    }

    /// A decision was answered from slices (admitted from one, or denied
    /// as the store's last answer made certain), without any store call
    /// for the request.
    fn slice_decision(&self) {}

    /// A shadow rule's tolerance would have admitted `units` more than the
    /// rule exactly, replayed on this instance's traffic
    /// ([`WhatIfs`](crate::limiter::slice::WhatIfs)).
    fn slice_shadow_over(&self, rule: &sluice_core::BoundRule, units: u64) {
        let _ = (rule, units);
    }
}

/// Reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoTelemetry;

impl Telemetry for NoTelemetry {}
