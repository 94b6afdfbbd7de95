//! Leases of concurrency rules: what one holds, and giving it back.
//!
//! An admitted [`acquire`](Limiter::acquire) takes one slot of every
//! concurrency rule that applies, under a random id. The lease remembers
//! those rules (their scope, pattern and name: what names their keys), and
//! is released by them, never by the rules that apply when it comes back:
//! an override or a reload that changes the tenant's rules in between
//! leaves every held lease releasable, where looking the rules up again
//! found none and left the slots taken for the rest of their `lease`.

use sluice_core::config::NamedRule;
use sluice_core::{BoundRule, Policy, Request, Rule, Scope};

use super::Limiter;
use crate::store::{Batch, Store, StoreError};

/// A lease taken of a request's concurrency rules.
#[derive(Debug, Clone)]
pub struct Lease {
    id: u128,
    held: Box<[BoundRule]>,
}

impl Lease {
    /// Lease `id` of the concurrency rules among `rules`.
    pub(super) fn taken(id: u128, rules: &[BoundRule]) -> Lease {
        Lease {
            id,
            held: rules
                .iter()
                .filter(|r| r.rule().is_concurrency())
                .cloned()
                .collect(),
        }
    }

    /// Lease `id` of the rules `held` names by scope, pattern and name (as
    /// [`held`](Self::held) gave them): a lease carried outside the
    /// process, such as the HTTP API's, read back. The rules' limits and
    /// lease times play no part in releasing.
    pub fn rebuilt<'a>(
        id: u128,
        held: impl IntoIterator<Item = (Scope, &'a str, &'a str)>,
    ) -> Lease {
        let rule = Rule::concurrency(1, 1).expect("one slot for 1ms is a valid rule");
        let held = held
            .into_iter()
            .map(|(scope, pattern, name)| {
                let named = NamedRule {
                    name: name.to_owned(),
                    rule,
                    shadow: false,
                    count_if: None,
                    tolerance: sluice_core::tolerance::Tolerance::EXACT,
                    regions: None,
                };
                BoundRule::new(scope, pattern, &named, 1.0)
            })
            .collect();
        Lease { id, held }
    }

    /// Lease `id` of the concurrency rules `policy` applies to `request`:
    /// for a lease that did not say what it holds.
    pub fn under(policy: &Policy, request: &Request<'_>, id: u128) -> Lease {
        let applicable =
            policy.applicable(request.tenant, request.route, request.subject.is_some());
        Lease::taken(id, applicable.rules)
    }

    /// The lease's random id.
    pub fn id(&self) -> u128 {
        self.id
    }

    /// The rules it holds a slot of: scope, pattern and name.
    pub fn held(&self) -> impl ExactSizeIterator<Item = (Scope, &str, &str)> {
        self.held.iter().map(|r| (r.scope(), r.pattern(), r.name()))
    }
}

impl<S: Store> Limiter<S> {
    /// Gives back `lease`, taken for `tenant` (and `subject`): true when
    /// one of its rules still held it, false when it had expired, was
    /// released already or is unknown (releasing twice is harmless).
    /// Whatever the policy is now.
    pub async fn release(
        &self,
        tenant: &str,
        subject: Option<&str>,
        lease: &Lease,
    ) -> Result<bool, StoreError> {
        crate::trace::changed(
            crate::trace::ChangeKind::Release,
            None,
            self.release_untraced(tenant, subject, lease),
            |released| *released,
            StoreError::kind,
        )
        .await
    }

    /// [`release`](Self::release), within its span.
    async fn release_untraced(
        &self,
        tenant: &str,
        subject: Option<&str>,
        lease: &Lease,
    ) -> Result<bool, StoreError> {
        if lease.held.is_empty() {
            return Ok(false);
        }
        let batch = Batch {
            lease: Some(lease.id),
            ..Batch::new(tenant, subject, 1, &lease.held)
        };
        // Taken while the store was unreachable (`on_error: local`), the
        // lease is in the local fallback.
        let local = self.local.release_now(&batch);
        let cut = self
            .options
            .timeout
            .map(|budget| (budget, tokio::time::Instant::now() + budget));
        let call = self.store.release(&batch);
        let remote = self
            .traced_call("release", &batch, self.breaker.state(), cut, call)
            .await?;
        Ok(local || remote)
    }
}

/// A fresh lease id: 128 random bits, so that a lease cannot be guessed
/// (holding its id is what allows releasing it).
pub(super) fn new_lease_id() -> u128 {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // No entropy source: still unique within this process.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        return t ^ (u128::from(n) << 64);
    }
    u128::from_le_bytes(bytes)
}
