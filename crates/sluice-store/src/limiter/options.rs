//! How a limiter copes with its store: time budget, breaker, denial cache,
//! the local fallback's size, telemetry and clock.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::config::OnError;

use super::breaker::BreakerConfig;
use crate::clock::{Clock, SystemClock};
use crate::telemetry::{NoTelemetry, Telemetry};

/// How a limiter copes with its store.
#[derive(Clone)]
pub struct LimiterOptions {
    /// The failure policy of plans that do not set their own.
    pub on_error: OnError,
    /// Budget for one store call; `None` for a store that cannot be slow
    /// (the memory store).
    pub timeout: Option<Duration>,
    /// When the circuit breaker opens and closes.
    pub breaker: BreakerConfig,
    /// Whether to remember denials (worth it for remote stores only).
    pub denial_cache: bool,
    /// Live instances assumed for `local` until heartbeats tell.
    pub fallback_instances: u64,
    /// Most keys the local fallback store holds.
    pub local_max_entries: usize,
    /// Most keys one tenant holds in it.
    pub local_tenant_share: usize,
    /// Where store events are reported.
    pub telemetry: Arc<dyn Telemetry>,
    /// The clock the breaker, the caches and the local fallback use.
    pub clock: Arc<dyn Clock>,
}

impl LimiterOptions {
    /// Defaults for a store that never fails (the memory store).
    pub fn new(on_error: OnError) -> LimiterOptions {
        LimiterOptions {
            on_error,
            timeout: None,
            breaker: BreakerConfig::default(),
            denial_cache: false,
            fallback_instances: 1,
            local_max_entries: 100_000,
            local_tenant_share: 100_000,
            telemetry: Arc::new(NoTelemetry),
            clock: Arc::new(SystemClock::default()),
        }
    }
}

impl std::fmt::Debug for LimiterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterOptions")
            .field("on_error", &self.on_error)
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .field("denial_cache", &self.denial_cache)
            .finish_non_exhaustive()
    }
}
