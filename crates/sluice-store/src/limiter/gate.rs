//! A decision through fair valves' gates: each gated valve's rule set for
//! this request's share before the store call, and what the answer tells
//! of the valve's level learned after it (see `fair`).

use sluice_core::policy::Applicable;
use sluice_core::{Decision, Policy, Request};

use super::{Limiter, fair};
use crate::store::{Batch, Store};

impl<S: Store> Limiter<S> {
    /// [`decide`](Self::decide) of a request with fair valves' gates.
    pub(super) async fn decide_gated<'p>(
        &self,
        policy: &'p Policy,
        request: &Request<'_>,
    ) -> Decision<'p> {
        self.decide_leasing(policy, request, false).await.0
    }

    /// What `decision`, of a request of `cost`, tells of its fair valves'
    /// levels.
    /// It also makes the wait a tenant past its share is given at least a
    /// second (see `fair::at_least_a_second`).
    pub(super) fn learn(&self, gates: &fair::Gates, decision: &mut Decision<'_>, cost: u64) {
        let now = self.options.clock.now_ms();
        self.fair
            .observe(gates, decision, cost, self.store.valve_parts(), now);
        fair::at_least_a_second(decision);
    }

    /// [`decide_batch`](Self::decide_batch) of a batch with fair valves'
    /// gates, their rates set for this request.
    pub(super) async fn decide_batch_gated<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
    ) -> Decision<'p> {
        let now = self.options.clock.now_ms();
        let (rules, gates) = self.fair.gate(&applicable, batch.rules, batch.cost, now);
        let batch = Batch {
            rules: &rules,
            valve_turn: Some(gates.turn),
            ..*batch
        };
        let mut decision = self.decide_batch_waiting(applicable, &batch).await;
        self.learn(&gates, &mut decision, batch.cost);
        decision
    }
}
