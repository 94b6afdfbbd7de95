//! Shard choice for tenants spread over several shards.
//!
//! A tenant with `shards: N` has N sets of buckets (on Redis Cluster, N hash
//! tags on N slots), each enforcing `⌊limit / N⌋` of every rule. Decisions
//! take the shards in turn, starting where the previous decision of this
//! instance left off; a decision that a shard denies on the tenant's own
//! rules tries the next shard, until one admits or every shard has denied
//! (shards whose denial is remembered cost no store call). So however
//! tenants interleave, and however unevenly costs fall on the shards, a
//! sharded tenant is refused only when no shard can hold the request: it
//! gets its full `N · ⌊limit / N⌋` per window. When every shard denies, the
//! answer is the one that passes soonest (the request passes as soon as any
//! shard can hold it).

use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::policy::Applicable;
use sluice_core::{Decision, Reason};

use super::{Limiter, cost_exceeds_capacity};
use crate::store::{Batch, Store};

/// Where the next sharded decision starts.
#[derive(Debug, Default)]
pub(crate) struct Turns(AtomicU64);

impl Turns {
    /// The first shard to try, of `shards`.
    pub(crate) fn first(&self, shards: u16) -> u16 {
        (self.0.fetch_add(1, Ordering::Relaxed) % u64::from(shards)) as u16
    }
}

/// Whether another shard may admit what this one denied: a denial by the
/// tenant's own (sharded) rules, made by the store. A valve's denial, a
/// cost no rule can hold and a failure-policy answer are the same on every
/// shard.
pub(crate) fn worth_another(decision: &Decision<'_>) -> bool {
    !decision.allowed
        && decision.degraded.is_none()
        && matches!(
            decision.reason,
            Some(
                Reason::TenantLimit
                    | Reason::RouteLimit
                    | Reason::SubjectLimit
                    | Reason::DescriptorLimit
            )
        )
}

/// Of two denials, the one that passes sooner.
pub(crate) fn sooner<'p>(best: Option<Decision<'p>>, next: Decision<'p>) -> Decision<'p> {
    match best {
        Some(best) if best.retry_after_ms() <= next.retry_after_ms() => best,
        _ => next,
    }
}

impl<S: Store> Limiter<S> {
    /// [`decide_batch`](Self::decide_batch) through the store's wait, the
    /// time budget and the tenant's shards.
    pub(super) async fn decide_batch_waiting<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
    ) -> Decision<'p> {
        if let Some(index) = cost_exceeds_capacity(batch) {
            return Decision::cost_exceeds_capacity_at(applicable, index);
        }
        let deadline = self
            .options
            .timeout
            .map(|budget| tokio::time::Instant::now() + budget);
        let shards = applicable.shards;
        if shards <= 1 {
            return self.decide_shard(applicable, batch, deadline).await;
        }
        let first = self.turns.first(shards);
        let mut best = None;
        for k in 0..shards {
            let on = Batch {
                shard: (first + k) % shards,
                // Another shard was tried: it may have called the store.
                asked_before: batch.asked_before || k > 0,
                ..*batch
            };
            let decision = self
                .decide_shard(applicable, &on, deadline)
                .await
                .on_shard(on.shard);
            if !worth_another(&decision) {
                return decision;
            }
            best = Some(sooner(best, decision));
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                break;
            }
        }
        best.expect("a tenant has at least one shard")
    }
}
