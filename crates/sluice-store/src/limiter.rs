//! The limiter: request → applicable rules → one store call → decision.
//!
//! This is where a decision gets made. The policy is swapped atomically on
//! reload; a decision holds the policy it started with until it is done.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use sluice_core::config::OnError;
use sluice_core::decision::Outcomes;
use sluice_core::policy::Applicable;
use sluice_core::{Decision, Policy, Request};

use crate::memory::MemoryStore;
use crate::store::{Batch, Store, StoreError};

/// Decides requests against the current policy and a store.
#[derive(Debug)]
pub struct Limiter<S> {
    policy: ArcSwap<Policy>,
    store: S,
    on_error: OnError,
    /// Spreads a sharded tenant's decisions over its shards in turn.
    next_shard: AtomicU64,
}

impl<S: Store> Limiter<S> {
    /// A limiter over `store`; `on_error` applies when the store fails and
    /// the tenant's plan does not say otherwise.
    pub fn new(policy: Policy, store: S, on_error: OnError) -> Limiter<S> {
        Limiter {
            policy: ArcSwap::from_pointee(policy),
            store,
            on_error,
            next_shard: AtomicU64::new(0),
        }
    }

    /// The current policy. Decisions borrow from it, so hold the `Arc` for
    /// as long as the decision is used.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// Replaces the policy; decisions already under way finish on the old one.
    pub fn set_policy(&self, policy: Policy) {
        self.policy.store(Arc::new(policy));
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Decides one request under `policy`.
    pub async fn decide<'p>(&self, policy: &'p Policy, request: &Request<'_>) -> Decision<'p> {
        match prepare(policy, request) {
            Err(decided) => decided,
            Ok((applicable, mut batch)) => {
                batch.shard = self.shard(applicable.shards);
                let result = self.store.decide(&batch).await;
                self.conclude(applicable, result, request.cost)
            }
        }
    }

    /// The shard for a tenant's next decision: round robin over its
    /// shards, so that each holds an even share of its traffic.
    fn shard(&self, shards: u16) -> u16 {
        if shards <= 1 {
            return 0;
        }
        (self.next_shard.fetch_add(1, Ordering::Relaxed) % u64::from(shards)) as u16
    }

    /// Turns the store's answer into a decision, applying the failure
    /// policy when the store failed.
    fn conclude<'p>(
        &self,
        applicable: Applicable<'p>,
        result: Result<Outcomes, StoreError>,
        cost: u64,
    ) -> Decision<'p> {
        match result {
            Ok(outcomes) => Decision::from_outcomes(applicable, outcomes, cost),
            // A full memory store can only refuse new keys.
            Err(StoreError::Full(_)) => Decision::without_store(applicable, false),
            Err(_) => {
                let on_error = applicable.plan.on_error().unwrap_or(self.on_error);
                Decision::without_store(applicable, on_error == OnError::Allow)
            }
        }
    }
}

impl Limiter<MemoryStore> {
    /// Decides one request on the memory store, synchronously: the
    /// in-process path, for callers that are not async.
    pub fn decide_now<'p>(&self, policy: &'p Policy, request: &Request<'_>) -> Decision<'p> {
        match prepare(policy, request) {
            Err(decided) => decided,
            Ok((applicable, batch)) => {
                let result = self.store.decide_now(&batch);
                self.conclude(applicable, result, request.cost)
            }
        }
    }
}

/// Everything decided before the store is asked: the applicable rules, and
/// the answer itself when no store call is needed (no rule applies, or the
/// cost can never pass).
fn prepare<'p, 'r>(
    policy: &'p Policy,
    request: &Request<'r>,
) -> Result<(Applicable<'p>, Batch<'r>), Decision<'p>>
where
    'p: 'r,
{
    let applicable = policy.applicable(request.tenant, request.route, request.subject.is_some());
    if let Some(decision) = Decision::cost_exceeds_capacity(applicable, request.cost) {
        return Err(decision);
    }
    if applicable.rules.is_empty() {
        return Err(Decision::from_outcomes(
            applicable,
            Outcomes::new(),
            request.cost,
        ));
    }
    let batch = Batch {
        tenant: request.tenant,
        subject: request.subject,
        shard: 0,
        cost: request.cost,
        rules: applicable.rules,
    };
    Ok((applicable, batch))
}
