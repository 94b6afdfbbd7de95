//! One store call within the time budget: the over-limit cache first, then
//! the slices of hot keys ([`super::slice`]), the circuit breaker around
//! the call, and what the answer teaches all three. Every store call of
//! the limiter's (decide, adjust, release) goes through
//! [`Limiter::traced_call`]: its span, its deadline.

use std::time::{Duration, Instant};

use sluice_core::Decision;
use sluice_core::policy::Applicable;
use smallvec::SmallVec;

use super::Limiter;
use super::breaker::BreakerState;
use super::denials::{DenialCache, Sharing};
use super::slice::{self, Plan};
use crate::adjust::{Adjusted, Change, Marker, MarkerAnswer};
use crate::store::{Batch, Decided, Store, StoreError};
use crate::trace;

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
        let decision = self.decide_remote(applicable, batch, deadline).await;
        // What a shadow rule's tolerance would do, on what the store
        // admitted (a denial or a failure-policy answer charged nothing).
        self.what_if(batch, decision.allowed && decision.degraded.is_none());
        decision
    }

    /// [`decide_shard`](Self::decide_shard) on a store across the network:
    /// from slices, with a take, or exactly.
    async fn decide_remote<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
        deadline: Option<tokio::time::Instant>,
    ) -> Decision<'p> {
        let mut now = self.options.clock.now_ms();
        let sliced = slice::eligible(batch);
        let mut plan = if sliced {
            self.slices.plan(batch, now)
        } else {
            Plan::Exact
        };
        // The slice is spent and its successor on the way: a store call
        // of our own would take as long as the take, so wait for it (within
        // the budget, and at most WAIT_MS), then ask the store ourselves.
        let mut wait_until = None;
        while let Plan::Wait(landed) = plan {
            let wait_until = *wait_until.get_or_insert_with(|| {
                let most = tokio::time::Instant::now() + Duration::from_millis(slice::WAIT_MS);
                deadline.map_or(most, |deadline| deadline.min(most))
            });
            let landed = tokio::time::timeout_at(wait_until, landed).await.is_ok();
            now = self.options.clock.now_ms();
            plan = match self.slices.plan(batch, now) {
                Plan::Wait(_) if !landed => Plan::Exact,
                plan => plan,
            };
        }
        // Units already taken are spent before remembered denials: the
        // store counted them, and the cache would strand them.
        if let Plan::Local(outcomes, taken_ms) = plan {
            if !batch.asked_before {
                self.options.telemetry.slice_decision();
            }
            // Admitted from units the store counted at the take: a
            // give-back names the take's time.
            return Decision::from_outcomes(applicable, outcomes, batch.cost, batch.costs)
                .decided_at(taken_ms);
        }
        if let Plan::Deny(index, retry) = plan {
            if !batch.asked_before {
                self.options.telemetry.slice_decision();
            }
            return Decision::remembered_denial(applicable, index, retry);
        }
        if let Some(denials) = &self.denials
            && let Some((index, retry)) = denials.check(batch, now)
        {
            if let Plan::Take(..) = plan {
                self.slices.abandon(batch);
            }
            self.options.telemetry.denial_cache_hit();
            self.store.asked(batch);
            return Decision::remembered_denial(applicable, index, retry);
        }
        if let Plan::Take(sizes) = plan
            && let Some(decision) = self.take(applicable, batch, deadline, &sizes, now).await
        {
            return decision;
        }
        match self.call_store(batch, deadline, now).await {
            Ok(decided) => {
                if sliced {
                    self.slices.learn(batch, &decided.outcomes, false, now);
                }
                Decision::from_outcomes(applicable, decided.outcomes, batch.cost, batch.costs)
                    .decided_at_slots(decided.at_ms, decided.first_shard_at_ms)
            }
            Err(error) => self.fail_over(applicable, batch, error.as_ref()),
        }
    }

    /// Takes slices of `sizes` along with the request in one store call;
    /// the decision when the store admitted both or could not answer,
    /// `None` when it denied the take (the exact call follows).
    async fn take<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
        deadline: Option<tokio::time::Instant>,
        sizes: &[u64],
        sent: u64,
    ) -> Option<Decision<'p>> {
        let costs: SmallVec<[u64; 3]> = (0..batch.rules.len())
            .map(|i| batch.cost_of(i) + sizes[i])
            .collect();
        let take = Batch {
            costs: &costs,
            ..*batch
        };
        match self.call_store_raw(&take, deadline, sent).await {
            Ok(Decided {
                outcomes,
                at_ms,
                first_shard_at_ms,
            }) if outcomes.iter().all(|o| o.allowed) => {
                if let Some(denials) = &self.denials {
                    denials.forget(batch, &outcomes);
                }
                for (rule, size) in batch.rules.iter().zip(sizes) {
                    self.options.telemetry.slice_taken(rule, *size);
                }
                let now = self.options.clock.now_ms();
                let outcomes = self
                    .slices
                    .install(batch, sizes, outcomes, (sent, at_ms), now);
                Some(
                    Decision::from_outcomes(applicable, outcomes, batch.cost, batch.costs)
                        .decided_at_slots(at_ms, first_shard_at_ms),
                )
            }
            Ok(Decided { outcomes, .. }) => {
                // Denied with the slices: what remains is learned, and the
                // request alone is decided exactly. Nothing is remembered
                // in the over-limit cache: the denied cost was not the
                // request's.
                self.slices.learn(batch, &outcomes, true, sent);
                None
            }
            Err(error) => {
                self.slices.abandon(batch);
                Some(self.fail_over(applicable, batch, error.as_ref()))
            }
        }
    }

    /// Asks the store, through the breaker and within the budget, and
    /// teaches the over-limit cache what it answered. `Err(None)`: the
    /// breaker is open, no call was made.
    async fn call_store(
        &self,
        batch: &Batch<'_>,
        deadline: Option<tokio::time::Instant>,
        now: u64,
    ) -> Result<Decided, Option<StoreError>> {
        let epoch = self.denials.as_ref().map(DenialCache::epoch);
        let result = self.call_store_raw(batch, deadline, now).await;
        if let (Ok(Decided { outcomes, .. }), Some(denials), Some(epoch)) =
            (&result, &self.denials, epoch)
        {
            let answered = self.options.clock.now_ms();
            // Shadow rules that denied do not deny the request.
            let admitted = batch
                .rules
                .iter()
                .zip(outcomes)
                .all(|(r, o)| o.allowed || r.shadow());
            if admitted {
                denials.forget(batch, outcomes);
                denials.record_guards(epoch, batch, answered);
            } else {
                let sharing = Sharing {
                    split_valves: self.store.valve_parts() > 1,
                    regions_sync_every_ms: self.store.regions_sync_every_ms(),
                };
                denials.record(epoch, batch, outcomes, answered, sharing);
            }
        }
        result
    }

    /// One store call through the breaker, within the budget; `Err(None)`
    /// without calling when the breaker is open.
    async fn call_store_raw(
        &self,
        batch: &Batch<'_>,
        deadline: Option<tokio::time::Instant>,
        now: u64,
    ) -> Result<Decided, Option<StoreError>> {
        // Held across the store call: dropped with this future, a probe
        // gives its turn back.
        let Some(attempt) = self.breaker.attempt(now) else {
            return Err(None);
        };
        let breaker = if attempt.is_probe() {
            BreakerState::HalfOpen
        } else {
            BreakerState::Closed
        };
        let started = Instant::now();
        let cut = self.options.timeout.zip(deadline);
        let result = self
            .traced_call("decide", batch, breaker, cut, self.store.decide(batch))
            .await;
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
        if !ok {
            // The store is in trouble: no slice outlives what it held, and
            // decisions fall to the failure policy as without slices (what
            // they held is given back once the store answers).
            self.slices.clear();
        }
        result.map_err(Some)
    }

    /// `call`, a store call of `op` for `batch`, within its span (when
    /// traced, in a request, on a store across the network), cut at the
    /// deadline of `cut` (with its budget, for the error).
    pub(super) async fn traced_call<T>(
        &self,
        op: &'static str,
        batch: &Batch<'_>,
        breaker: BreakerState,
        cut: Option<(Duration, tokio::time::Instant)>,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let span = if self.store.in_process() {
            tracing::Span::none()
        } else {
            trace::store_call(op, self.store.name(), batch, breaker)
        };
        let call = trace::within(&span, call);
        let result = match cut {
            Some((budget, deadline)) => tokio::time::timeout_at(deadline, call)
                .await
                .unwrap_or(Err(StoreError::Timeout(budget.as_millis() as u64))),
            None => call.await,
        };
        trace::answered(&span, &result);
        result
    }

    /// [`Store::adjust`] within the time budget.
    pub(super) async fn adjust_within_budget(
        &self,
        batch: &Batch<'_>,
        change: Change,
        marker: Option<&Marker>,
    ) -> Result<Adjusted, StoreError> {
        if batch.rules.is_empty() && marker.is_none() {
            return Ok(Adjusted {
                now: self.options.clock.now_ms(),
                marker: MarkerAnswer::Applied,
                outcomes: Default::default(),
                forgiven: 0,
                unfinished: None,
            });
        }
        // A settle's change (with a marker) is not cut short from here:
        // on Redis Cluster it is made once its lead slot applies, and what
        // that call answered must reach the caller (each of its calls is
        // bounded by the store's own response timeout).
        let cut = match (self.options.timeout, marker) {
            (Some(budget), None) => Some((budget, tokio::time::Instant::now() + budget)),
            _ => None,
        };
        let call = self.store.adjust(batch, change, marker);
        self.traced_call("adjust", batch, self.breaker.state(), cut, call)
            .await
    }
}
