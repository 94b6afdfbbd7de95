//! The synchronous door of a limiter on the memory store: the in-process
//! path, for callers that are not async.

use sluice_core::policy::Applicable;
use sluice_core::{Decision, Policy, Request};

use super::{Limiter, dedupe, prepare, shard};
use crate::memory::MemoryStore;
use crate::store::Batch;

impl Limiter<MemoryStore> {
    /// Decides one request on the memory store, synchronously: the
    /// in-process path, for callers that are not async.
    pub fn decide_now<'p>(&self, policy: &'p Policy, request: &Request<'_>) -> Decision<'p> {
        let applicable = match prepare(policy, request) {
            Err(decided) => return decided,
            Ok(applicable) => applicable,
        };
        if applicable.gated {
            let now = self.options.clock.now_ms();
            let (rules, gates) = self
                .fair
                .gate(&applicable, applicable.rules, request.cost, now);
            let batch = Batch::new(request.tenant, request.subject, request.cost, &rules);
            let mut decision = self.decide_now_sharded(applicable, batch, request);
            self.learn(&gates, &mut decision, request.cost);
            return decision;
        }
        let batch = Batch::new(
            request.tenant,
            request.subject,
            request.cost,
            applicable.rules,
        );
        let guarded = dedupe::Guarded::of(&batch, request);
        if applicable.shards <= 1 && !guarded.any() {
            // The common case: one shard, no duplicate guard; most often
            // one rule.
            if let [_] = batch.rules {
                return match self.store.decided_one(&batch) {
                    Ok((outcome, at_ms)) => {
                        Decision::from_outcome(applicable, outcome).decided_at(at_ms)
                    }
                    Err(error) => self.conclude(applicable, &batch, Err(error)),
                };
            }
            let result = self.store.decided(&batch);
            return self.conclude(applicable, &batch, result);
        }
        self.decide_now_sharded(applicable, batch, request)
    }

    /// [`decide_now`](Self::decide_now) through duplicate guards and the
    /// tenant's shards.
    fn decide_now_sharded<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: Batch<'_>,
        request: &Request<'_>,
    ) -> Decision<'p> {
        let guarded = dedupe::Guarded::of(&batch, request);
        let partitions = guarded.partitions(&batch);
        let batch = Batch {
            partitions: &partitions,
            ..batch
        };
        let shards = applicable.shards.max(1);
        let first = if shards > 1 {
            self.turns.first(shards)
        } else {
            0
        };
        let mut best = None;
        for k in 0..shards {
            let on = Batch {
                shard: (first + k) % shards,
                ..batch
            };
            let result = self.store.decided(&on);
            let decision = self.conclude(applicable, &on, result).on_shard(on.shard);
            if !shard::worth_another(&decision) {
                return decision;
            }
            best = Some(shard::sooner(best, decision));
        }
        best.expect("a tenant has at least one shard")
    }
}
