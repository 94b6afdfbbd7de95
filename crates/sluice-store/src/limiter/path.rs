//! The one way through, for every door (`door.rs`): a request prepared
//! (`prepared.rs`) is decided on the spot by a store in this process
//! ([`Limiter::at_once`], the only such shortcut), or else over the
//! tenant's shards within one time budget (`shard.rs`, each shard's call
//! through the over-limit cache, slices and the breaker: `budget.rs`);
//! fair valves' gates learn from the answer either way. The synchronous
//! door takes the same steps without waiting ([`Limiter::through_now`]).

use sluice_core::Decision;
use sluice_core::policy::Applicable;

use super::Limiter;
use super::prepared::Prepared;
use super::shard::Walk;
use crate::memory::MemoryStore;
use crate::store::{Batch, Store};

impl<S: Store> Limiter<S> {
    /// Decides `prepared`.
    pub(super) async fn through<'p>(&self, prepared: Prepared<'p, '_>) -> Decision<'p> {
        if let Some(decision) = self.at_once(&prepared) {
            return decision;
        }
        // Boxed, so that a door's future stays small for the in-process
        // path (moving a large future costs more than the decision itself).
        Box::pin(self.waiting(prepared)).await
    }

    /// The decision of `prepared` when the store is in this process and
    /// the tenant has one shard: made on the spot, without entering the
    /// remote path's state machine.
    #[inline]
    pub(super) fn at_once<'p>(&self, prepared: &Prepared<'p, '_>) -> Option<Decision<'p>> {
        let applicable = prepared.applicable;
        if applicable.shards > 1 {
            return None;
        }
        let mut decision = prepared.with_batch(|batch| self.in_process(applicable, batch))?;
        self.learned(prepared, &mut decision);
        Some(decision)
    }

    /// The decision of `batch` by a store in this process, `None` for a
    /// store across the network.
    #[inline]
    fn in_process<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
    ) -> Option<Decision<'p>> {
        // One rule, most often: its outcome alone, no vector of one (a
        // store without that shortcut decides it as several).
        if let [_] = batch.rules {
            return Some(match self.store.decide_one_in_process(batch)? {
                Ok((outcome, at_ms)) => {
                    Decision::from_outcome(applicable, outcome).decided_at(at_ms)
                }
                Err(error) => self.conclude(applicable, batch, Err(error)),
            });
        }
        let result = self.store.decide_in_process(batch)?;
        Some(self.conclude(applicable, batch, result))
    }

    /// The rest of [`through`](Self::through): the tenant's shards within
    /// one time budget.
    pub(super) async fn waiting<'p>(&self, prepared: Prepared<'p, '_>) -> Decision<'p> {
        let guard = prepared.guard_text();
        let parts = prepared.parts(guard.as_deref());
        let batch = prepared.batch(&parts);
        let mut decision = self.on_shards(prepared.applicable, &batch).await;
        self.learned(&prepared, &mut decision);
        decision
    }

    /// Lets `prepared`'s adaptive valves and fair valves' gates learn
    /// from `decision`.
    #[inline]
    fn learned(&self, prepared: &Prepared<'_, '_>, decision: &mut Decision<'_>) {
        if !prepared.applicable.adaptive.is_empty() {
            self.adaptive.learn(&prepared.applicable, decision);
        }
        if let Some(gated) = &prepared.gated {
            self.learn(&gated.1, decision, prepared.cost);
        }
    }
}

impl Limiter<MemoryStore> {
    /// Decides `prepared` on the memory store, without waiting: the same
    /// steps as [`through`](Limiter::through).
    #[inline]
    pub(super) fn through_now<'p>(&self, prepared: &Prepared<'p, '_>) -> Decision<'p> {
        if let Some(decision) = self.at_once(prepared) {
            return decision;
        }
        self.on_shards_now(prepared)
    }

    /// [`through_now`](Self::through_now) over the tenant's shards.
    fn on_shards_now<'p>(&self, prepared: &Prepared<'p, '_>) -> Decision<'p> {
        let guard = prepared.guard_text();
        let parts = prepared.parts(guard.as_deref());
        let batch = prepared.batch(&parts);
        let applicable = prepared.applicable;
        let mut walk = Walk::new(&self.turns, applicable.shards);
        let mut decision = loop {
            let Some(shard) = walk.next_shard() else {
                break walk.finish();
            };
            let on = Batch { shard, ..batch };
            let result = self.store.decided(&on);
            let decision = self.conclude(applicable, &on, result).on_shard(shard);
            if let Some(decision) = walk.offer(decision) {
                break decision;
            }
        };
        self.learned(prepared, &mut decision);
        decision
    }
}
