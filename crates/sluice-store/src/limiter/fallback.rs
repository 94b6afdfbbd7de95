//! The decision when the store cannot make it: the failure policy
//! (`allow`, `deny`, or `local`: the memory engine enforcing each limit
//! divided by the live instances).

use sluice_core::Decision;
use sluice_core::config::OnError;
use sluice_core::policy::Applicable;

use super::Limiter;
use crate::store::{Batch, Decided, Store, StoreError};

impl<S: Store> Limiter<S> {
    /// The decision from an in-process store's answer.
    #[inline]
    pub(super) fn conclude<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
        result: Result<Decided, StoreError>,
    ) -> Decision<'p> {
        match result {
            Ok(decided) => {
                Decision::from_outcomes(applicable, decided.outcomes, batch.cost, batch.costs)
                    .decided_at_slots(decided.at_ms, decided.first_shard_at_ms)
            }
            Err(error) => {
                self.options.telemetry.store_error(&error);
                self.fail_over(applicable, batch, Some(&error))
            }
        }
    }

    /// The decision when the store could not make it.
    pub(super) fn fail_over<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
        error: Option<&StoreError>,
    ) -> Decision<'p> {
        // A full memory store can only refuse new keys.
        if let Some(StoreError::Full(_) | StoreError::TenantFull(_)) = error {
            return Decision::without_store(applicable, OnError::Deny);
        }
        let policy = applicable.on_error().unwrap_or(self.options.on_error);
        self.options.telemetry.failure_policy(policy);
        let mut decision = self.decide_without_store(applicable, batch, policy);
        decision.maybe_counted = matches!(error, Some(StoreError::Timeout(_)));
        decision
    }

    /// The failure policy's decision.
    fn decide_without_store<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
        policy: OnError,
    ) -> Decision<'p> {
        match policy {
            OnError::Allow | OnError::Deny => Decision::without_store(applicable, policy),
            OnError::Local => match self.local.decide_parts(batch, self.live_instances()) {
                Ok(outcomes) => {
                    let mut decision =
                        Decision::from_outcomes(applicable, outcomes, batch.cost, batch.costs);
                    decision.degraded = Some(OnError::Local);
                    if let Some(denials) = self.denials.as_ref().filter(|_| decision.allowed) {
                        // Known here after the store is back too.
                        let now = self.options.clock.now_ms();
                        denials.record_guards(denials.epoch(), batch, now);
                    }
                    decision
                }
                Err(error) => {
                    // The local fallback store is full.
                    self.options.telemetry.store_error(&error);
                    Decision::without_store(applicable, OnError::Deny)
                }
            },
        }
    }
}
