//! The doors into the limiter. Each turns what its caller has into one
//! prepared request ([`Limiter::prepare`], `prepared.rs`) and sends it
//! down the one path (`path.rs`); none adds a step of its own, so every
//! door asks the same rules with the same answer (`tests/doors.rs`). What
//! follows a decision is its caller's: the lease it took, the attempt it
//! holds on rules that count by outcome ([`Limiter::attempt`]).
//!
//! - [`Limiter::decide`]: a request, the common door.
//! - [`Limiter::acquire`]: the same, taking a lease of its concurrency
//!   rules (given back by [`Limiter::release`]).
//! - [`Limiter::decide_keyed`]: rules counted where the caller names
//!   (Envoy descriptors and their overrides).
//! - [`Limiter::decide_now`]: the memory store's synchronous door, for
//!   callers that are not async.

use std::future::Future;
use std::pin::Pin;

use sluice_core::policy::Applicable;
use sluice_core::{Decision, Policy, Request};

use super::prepared::Source;
use super::{Keyed, Lease, Limiter};
use crate::memory::MemoryStore;
use crate::store::Store;

impl<S: Store> Limiter<S> {
    /// Decides one request under `policy`. Concurrency rules only check
    /// here (a slot is free or not): [`acquire`](Self::acquire) takes one.
    /// Rules that count by outcome hold the request as an attempt: the
    /// caller takes it ([`attempt`](Self::attempt)) and concludes it
    /// ([`conclude_attempt`](Self::conclude_attempt)), or it counts until
    /// those rules refill (the server and the tower layers do both).
    pub async fn decide<'p>(&self, policy: &'p Policy, request: &Request<'_>) -> Decision<'p> {
        // Decided on the spot by a store in this process; otherwise only
        // the boxed rest is held across the await, so that this future
        // stays small (the locals of a decision held in it made it 192
        // bytes, copied with `memcpy` wherever it moved).
        let rest = match self.begin(policy, request) {
            Ok(decided) => return decided,
            Err(rest) => rest,
        };
        rest.await
    }

    /// [`decide`](Self::decide)'s decision when it needs no waiting, else
    /// the rest of it, boxed.
    #[inline]
    #[allow(clippy::type_complexity)]
    fn begin<'a, 'p: 'a, 'r: 'a>(
        &'a self,
        policy: &'p Policy,
        request: &'a Request<'r>,
    ) -> Result<Decision<'p>, Pin<Box<impl Future<Output = Decision<'p>> + use<'a, 'p, 'r, S>>>>
    {
        let applicable =
            policy.applicable(request.tenant, request.route, request.subject.is_some());
        let prepared = match self.prepare(applicable, Source::Request(request), false) {
            Ok(prepared) => prepared,
            Err(decided) => return Ok(decided),
        };
        match self.at_once(&prepared) {
            Some(decided) => Ok(decided),
            None => Err(Box::pin(self.waiting(prepared))),
        }
    }

    /// Decides one request under `policy` and, when it is admitted, takes a
    /// lease of every concurrency rule that applies: the decision, and the
    /// lease when one was taken (`None` when denied, or when no
    /// concurrency rule applies). Give it back with
    /// [`release`](Self::release), whatever the policy is by then;
    /// unreleased, it expires after the rule's `lease`.
    pub async fn acquire<'p>(
        &self,
        policy: &'p Policy,
        request: &Request<'_>,
    ) -> (Decision<'p>, Option<Lease>) {
        let applicable =
            policy.applicable(request.tenant, request.route, request.subject.is_some());
        let prepared = match self.prepare(applicable, Source::Request(request), true) {
            Ok(prepared) => prepared,
            Err(decided) => return (decided, None),
        };
        let lease = prepared.lease;
        let decision = self.through(prepared).await;
        let lease = lease
            .filter(|_| decision.allowed)
            .map(|id| Lease::taken(id, applicable.rules));
        (decision, lease)
    }

    /// Decides the rules of `applicable` where `keyed` says they count: all
    /// or nothing, on the tenant's shards, within one time budget, as
    /// [`decide`](Self::decide) does.
    pub async fn decide_keyed<'p>(
        &self,
        applicable: Applicable<'p>,
        keyed: &Keyed<'_>,
    ) -> Decision<'p> {
        match self.prepare(applicable, Source::Keyed(keyed), false) {
            Ok(prepared) => self.through(prepared).await,
            Err(decided) => decided,
        }
    }
}

impl Limiter<MemoryStore> {
    /// Decides one request on the memory store, synchronously, as
    /// [`decide`](Limiter::decide) does: for callers that are not async.
    pub fn decide_now<'p>(&self, policy: &'p Policy, request: &Request<'_>) -> Decision<'p> {
        let applicable =
            policy.applicable(request.tenant, request.route, request.subject.is_some());
        match self.prepare(applicable, Source::Request(request), false) {
            Ok(prepared) => self.through_now(&prepared),
            Err(decided) => decided,
        }
    }
}
