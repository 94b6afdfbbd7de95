//! The limiter: request → applicable rules → one store call → decision.
//!
//! This is where a decision gets made. The policy is swapped atomically on
//! reload; a decision holds the policy it started with until it is done.

use std::sync::Arc;

use arc_swap::ArcSwap;
use sluice_core::config::OnError;
use sluice_core::{Decision, Policy, Request};

use crate::store::{Batch, Store, StoreError};

/// Decides requests against the current policy and a store.
#[derive(Debug)]
pub struct Limiter<S> {
    policy: ArcSwap<Policy>,
    store: S,
    on_error: OnError,
}

impl<S: Store> Limiter<S> {
    /// A limiter over `store`; `on_error` applies when the store fails and
    /// the tenant's plan does not say otherwise.
    pub fn new(policy: Policy, store: S, on_error: OnError) -> Limiter<S> {
        Limiter {
            policy: ArcSwap::from_pointee(policy),
            store,
            on_error,
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
        let applicable =
            policy.applicable(request.tenant, request.route, request.subject.is_some());
        if let Some(decision) = Decision::cost_exceeds_capacity(applicable, request.cost) {
            return decision;
        }
        if applicable.rules.is_empty() {
            return Decision::from_outcomes(applicable, Default::default(), request.cost);
        }
        let batch = Batch {
            tenant: request.tenant,
            subject: request.subject,
            shard: 0,
            cost: request.cost,
            rules: applicable.rules,
        };
        match self.store.decide(&batch).await {
            Ok(outcomes) => Decision::from_outcomes(applicable, outcomes, request.cost),
            // A full memory store can only refuse new keys.
            Err(StoreError::Full(_)) => Decision::without_store(applicable, false),
            Err(_) => {
                let on_error = applicable.plan.on_error().unwrap_or(self.on_error);
                Decision::without_store(applicable, on_error == OnError::Allow)
            }
        }
    }
}
