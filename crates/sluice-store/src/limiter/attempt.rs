//! Attempts: a check on rules that count by outcome (`count_if`) holds
//! its cost there as any rule holds it, so that no more attempts than a
//! rule's limit are ever in flight or counted, however many run at once;
//! once the response's status is known the rules it matches keep it and
//! the others are given it back ([`Limiter::conclude_attempt`]). An
//! attempt is a [`Reservation`] of those rules (`attempt: true`), sealed
//! and concluded once as a settle is.

use sluice_core::{Decision, Policy, Request};

use super::Limiter;
use super::after::{Adjustment, Reservation, SETTLED, rules_print, took_nothing};
use crate::adjust::{Change, Marker};
use crate::store::{Batch, Store, StoreError};

impl<S: Store> Limiter<S> {
    /// The attempt an admitted `decision` of `request` holds on the rules
    /// that count by outcome (`None` when it was denied, or when none
    /// applies): conclude it with the response's status
    /// ([`conclude_attempt`](Self::conclude_attempt)); until then it counts, so that no
    /// more attempts than a rule's limit run at once. One never concluded
    /// keeps counting: the server concludes those of its checks after
    /// `attempt_ttl`, giving them back.
    pub fn attempt(
        &self,
        policy: &Policy,
        request: &Request<'_>,
        decision: &Decision<'_>,
    ) -> Option<Reservation> {
        let applicable =
            policy.applicable(request.tenant, request.route, request.subject.is_some());
        // A check of nothing (Envoy's `hits_addend: 0`) holds nothing.
        if applicable.by_outcome.is_empty() || request.cost == 0 {
            return None;
        }
        self.held(
            request,
            decision,
            applicable.by_outcome,
            applicable.shards,
            true,
        )
    }

    /// Concludes `attempt` once its response's `status` is known: the
    /// rules whose `count_if` matches keep what it holds, the others are
    /// given it back (an attempt the failure policy admitted is concluded
    /// as if the store held it: a success gives back a unit the store may
    /// never have taken, a failure is not counted if it was not); `None` (not known: the call failed, or
    /// the attempt expired) gives everything back. Once, as a settle: an
    /// identical conclusion finds it made ([`MarkerAnswer::Again`]),
    /// another (or the expiry) finds it taken ([`MarkerAnswer::Conflict`]).
    pub async fn conclude_attempt<'p>(
        &self,
        policy: &'p Policy,
        attempt: &Reservation,
        status: Option<u16>,
        marker_ttl_ms: u64,
    ) -> Result<Adjustment<'p>, StoreError> {
        crate::trace::changed(
            crate::trace::ChangeKind::Conclude,
            None,
            self.conclude_untraced(policy, attempt, status, marker_ttl_ms),
            Adjustment::applied,
            StoreError::kind,
        )
        .await
    }

    /// [`conclude_attempt`](Self::conclude_attempt), within its span.
    async fn conclude_untraced<'p>(
        &self,
        policy: &'p Policy,
        attempt: &Reservation,
        status: Option<u16>,
        marker_ttl_ms: u64,
    ) -> Result<Adjustment<'p>, StoreError> {
        let subject = attempt.subject.as_deref();
        let applicable = policy.applicable(&attempt.tenant, &attempt.route, subject.is_some());
        let rules = applicable.by_outcome;
        let counts = |rule: &sluice_core::BoundRule| status.is_some_and(|s| rule.counts(s));
        // What does not count is given back, but to a rule the admission
        // took nothing from, and unless a reload changed the rules, or the
        // tenant's shards, since (what each held, and where, is then not
        // known: nothing is given back).
        let unchanged =
            attempt.rules_print == rules_print(rules, applicable.shards, self.store.region());
        let costs: Vec<u64> = rules
            .iter()
            .enumerate()
            .map(|(i, r)| {
                if !unchanged || counts(r) || took_nothing(attempt, i) {
                    0
                } else {
                    attempt.held
                }
            })
            .collect();
        let change = if costs.iter().all(|&c| c == 0) {
            Change::Nothing
        } else {
            Change::GiveBack {
                at: attempt.admitted_ms,
                first_shard_at: attempt.first_shard_admitted_ms,
            }
        };
        let marker = Marker {
            id: attempt.id,
            value: match status {
                Some(status) => format!("{SETTLED}status {status}"),
                None => "expired".to_owned(),
            },
            ttl_ms: marker_ttl_ms,
            shard: attempt.shard,
        };
        let whole_at = self.whole_at(attempt, rules, applicable.shards);
        let shards = applicable.shards.max(1);
        let batch = Batch {
            shard: attempt.shard % shards,
            costs: &costs,
            whole_at: &whole_at,
            ..Batch::new(&attempt.tenant, subject, attempt.held, rules)
        };
        let adjusted = self
            .adjust_within_budget(&batch, change, Some(&marker))
            .await?;
        Ok(Adjustment::of(applicable, rules, adjusted))
    }
}
