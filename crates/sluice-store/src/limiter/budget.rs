//! One store call within the time budget: the over-limit cache first, the
//! circuit breaker around the call, and what the answer teaches both.

use std::time::Instant;

use sluice_core::Decision;
use sluice_core::policy::Applicable;

use super::Limiter;
use super::denials::DenialCache;
use crate::store::{Batch, Store, StoreError};

impl<S: Store> Limiter<S> {
    /// Decides a batch on the shard it names, the store call ending by
    /// `deadline`.
    pub(super) async fn decide_shard<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
        deadline: Option<tokio::time::Instant>,
    ) -> Decision<'p> {
        if let Some(result) = self.store.decide_in_process(batch) {
            return self.conclude(applicable, batch, result);
        }
        let now = self.options.clock.now_ms();
        if let Some(denials) = &self.denials
            && let Some((index, retry)) = denials.check(batch, now)
        {
            self.options.telemetry.denial_cache_hit();
            return Decision::remembered_denial(applicable, index, retry);
        }
        // Held across the store call: dropped with this future, a probe
        // gives its turn back.
        let Some(attempt) = self.breaker.attempt(now) else {
            return self.fail_over(applicable, batch, None);
        };
        let epoch = self.denials.as_ref().map(DenialCache::epoch);
        let started = Instant::now();
        let result = match (self.options.timeout, deadline) {
            (Some(budget), Some(deadline)) => {
                match tokio::time::timeout_at(deadline, self.store.decide(batch)).await {
                    Ok(result) => result,
                    Err(_) => Err(StoreError::Timeout(budget.as_millis() as u64)),
                }
            }
            _ => self.store.decide(batch).await,
        };
        self.options
            .telemetry
            .store_call(started.elapsed(), result.as_ref().err());
        let ok = !matches!(
            result,
            Err(StoreError::Timeout(_) | StoreError::Unavailable(_) | StoreError::Refused(_))
        );
        let answered = self.options.clock.now_ms();
        if let Some(to) = attempt.finish(answered, ok) {
            self.options.telemetry.breaker_changed(to);
        }
        match result {
            Ok(outcomes) => {
                if let (Some(denials), Some(epoch)) = (&self.denials, epoch) {
                    // Shadow rules that denied do not deny the request.
                    let admitted = batch
                        .rules
                        .iter()
                        .zip(&outcomes)
                        .all(|(r, o)| o.allowed || r.shadow());
                    if admitted {
                        denials.forget(batch, &outcomes);
                        denials.record_guards(epoch, batch, answered);
                    } else {
                        let split = self.store.valve_parts() > 1;
                        denials.record(epoch, batch, &outcomes, answered, split);
                    }
                }
                Decision::from_outcomes(applicable, outcomes, batch.cost, batch.costs)
            }
            Err(error) => self.fail_over(applicable, batch, Some(&error)),
        }
    }
}
