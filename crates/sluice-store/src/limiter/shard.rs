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

/// The order a decision tries a tenant's shards in, and the answer: the
/// first shard that admits (or whose denial another shard cannot change),
/// else the denial that passes soonest. The synchronous and the waiting
/// paths walk it alike.
pub(crate) struct Walk<'p> {
    first: u16,
    shards: u16,
    tried: u16,
    best: Option<Decision<'p>>,
}

impl<'p> Walk<'p> {
    /// A walk over `shards` shards, from where `turns` says.
    pub(crate) fn new(turns: &Turns, shards: u16) -> Walk<'p> {
        let shards = shards.max(1);
        Walk {
            first: if shards > 1 { turns.first(shards) } else { 0 },
            shards,
            tried: 0,
            best: None,
        }
    }

    /// The next shard to try, if any is left.
    pub(crate) fn next_shard(&mut self) -> Option<u16> {
        (self.tried < self.shards).then(|| {
            self.tried += 1;
            (self.first + self.tried - 1) % self.shards
        })
    }

    /// Whether a shard was tried before the current one.
    pub(crate) fn tried_another(&self) -> bool {
        self.tried > 1
    }

    /// The current shard's decision: `Some` when it is the answer.
    pub(crate) fn offer(&mut self, decision: Decision<'p>) -> Option<Decision<'p>> {
        if !worth_another(&decision) {
            return Some(decision);
        }
        self.best = Some(sooner(self.best.take(), decision));
        None
    }

    /// The answer once no shard admitted.
    pub(crate) fn finish(self) -> Decision<'p> {
        self.best.expect("a tenant has at least one shard")
    }
}

impl<S: Store> Limiter<S> {
    /// A batch decided over the tenant's shards (`batch.shard` is chosen
    /// here), every shard's call within one time budget.
    pub(super) async fn on_shards<'p>(
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
        if applicable.shards <= 1 {
            return self.decide_shard(applicable, batch, deadline).await;
        }
        let mut walk = Walk::new(&self.turns, applicable.shards);
        while let Some(shard) = walk.next_shard() {
            let on = Batch {
                shard,
                // Another shard was tried: it may have called the store.
                asked_before: batch.asked_before || walk.tried_another(),
                ..*batch
            };
            let decision = self
                .decide_shard(applicable, &on, deadline)
                .await
                .on_shard(shard);
            if let Some(decision) = walk.offer(decision) {
                return decision;
            }
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                break;
            }
        }
        walk.finish()
    }
}
