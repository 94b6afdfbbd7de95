//! Everything decided before the store is asked, the same for every door
//! ([`Limiter::prepare`]): the rules that apply (those that count by
//! outcome among them, held as attempts), a cost no rule can ever hold,
//! adaptive valves at their limit for this request's priority, fair
//! valves' gates set for this request's share, where duplicate guards
//! and named buckets count and what each rule consumes, and the lease an
//! admission takes of concurrency rules. A door adds nothing of its own:
//! the next step of every decision belongs here or on the path
//! (`path.rs`).

use sluice_core::policy::Applicable;
use sluice_core::{BoundRule, Decision, Request};
use smallvec::SmallVec;

use super::dedupe::partition_text;
use super::{Limiter, fair, lease};
use crate::store::{Batch, Partition, Store};

/// Where a prepared request's rules count, beyond their scope.
pub(super) enum Counted<'r> {
    /// Every rule by its scope: no duplicate guard.
    ByScope,
    /// The duplicate guards in the request's (subject, fingerprint): see
    /// [`Prepared::guard_text`].
    Guarded(Option<&'r str>),
    /// Where the caller names (Envoy descriptors): see [`super::Keyed`].
    Keyed(&'r super::Keyed<'r>),
}

/// A request made ready for the store.
pub(super) struct Prepared<'p, 'r> {
    /// The rules that apply.
    pub(super) applicable: Applicable<'p>,
    pub(super) tenant: &'r str,
    pub(super) subject: Option<&'r str>,
    pub(super) cost: u64,
    /// The rules with fair valves' gates set for this request, and the
    /// gates to learn from the answer; `None`: the policy's own rules.
    /// Boxed: a prepared request moves, and most have no gate.
    pub(super) gated: Option<Box<(SmallVec<[BoundRule; 6]>, fair::Gates)>>,
    /// The rules with adaptive valves' limits set for this request's
    /// priority (and no gate); `None`: no adaptive valve, or gated.
    pub(super) retuned: Option<Box<SmallVec<[BoundRule; 6]>>>,
    pub(super) counted: Counted<'r>,
    /// The lease an admission takes of concurrency rules.
    pub(super) lease: Option<u128>,
}

/// Per rule, where it counts and what it consumes (empty: by scope, and
/// the request's cost).
pub(super) type Parts<'a> = (SmallVec<[Partition<'a>; 4]>, SmallVec<[u64; 4]>);

/// What a door brings to [`Limiter::prepare`].
pub(super) enum Source<'a, 'r> {
    /// A request: its own rules, where their scopes say.
    Request(&'a Request<'r>),
    /// Rules counted where `Keyed` names (Envoy descriptors).
    Keyed(&'r super::Keyed<'r>),
}

impl<'p, 'r> Prepared<'p, 'r> {
    /// The rules the store decides.
    #[inline]
    pub(super) fn rules(&self) -> &[BoundRule] {
        match (&self.gated, &self.retuned) {
            (Some(gated), _) => &gated.0,
            (None, Some(retuned)) => retuned,
            (None, None) => self.applicable.rules,
        }
    }

    /// The text a duplicate guard counts under, when the rules hold one
    /// (what [`parts`](Self::parts) places it in).
    pub(super) fn guard_text(&self) -> Option<String> {
        match self.counted {
            Counted::Guarded(fingerprint) => Some(partition_text(self.subject, fingerprint)),
            _ => None,
        }
    }

    /// Per rule, where it counts and what it consumes, the guard's text
    /// (if any) given by [`guard_text`](Self::guard_text).
    pub(super) fn parts<'a>(&'a self, guard: Option<&'a str>) -> Parts<'a> {
        match (&self.counted, guard) {
            (Counted::Guarded(_), Some(text)) => {
                let probe = Batch::new(self.tenant, self.subject, self.cost, self.rules());
                let partitions = self
                    .rules()
                    .iter()
                    .enumerate()
                    .map(|(i, rule)| match rule.scope() {
                        sluice_core::Scope::Dedupe => Partition::Subject(self.tenant, text),
                        _ => probe.partition(i, rule),
                    })
                    .collect();
                (partitions, SmallVec::new())
            }
            (Counted::Keyed(keyed), _) => keyed.parts(self.rules()),
            _ => (SmallVec::new(), SmallVec::new()),
        }
    }

    /// `f` of the batch for the store (its parts built only where rules
    /// count elsewhere than their scope says).
    #[inline]
    pub(super) fn with_batch<R>(&self, f: impl FnOnce(&Batch<'_>) -> R) -> R {
        match &self.counted {
            Counted::ByScope => f(&Batch {
                lease: self.lease,
                valve_turn: self.gated.as_ref().map(|gated| gated.1.turn),
                ..Batch::new(self.tenant, self.subject, self.cost, self.rules())
            }),
            _ => {
                let guard = self.guard_text();
                let parts = self.parts(guard.as_deref());
                f(&self.batch(&parts))
            }
        }
    }

    /// The batch for the store, its parts given by [`parts`](Self::parts).
    #[inline]
    pub(super) fn batch<'a, 'b: 'a>(&'a self, parts: &'a Parts<'b>) -> Batch<'a> {
        Batch {
            partitions: &parts.0,
            costs: &parts.1,
            lease: self.lease,
            valve_turn: self.gated.as_ref().map(|gated| gated.1.turn),
            ..Batch::new(self.tenant, self.subject, self.cost, self.rules())
        }
    }
}

impl<S: Store> Limiter<S> {
    /// `source` made ready for the store under `applicable`, or the answer
    /// itself when no store call is needed (no rule applies, or a cost no
    /// rule can ever hold). `leasing`: an admission takes a lease of
    /// every concurrency rule.
    // The error is the decision itself, handed straight back to the
    // caller: boxing it would cost an allocation where it is the answer.
    #[allow(clippy::result_large_err)]
    #[inline]
    pub(super) fn prepare<'p, 'r>(
        &self,
        applicable: Applicable<'p>,
        source: Source<'_, 'r>,
        leasing: bool,
    ) -> Result<Prepared<'p, 'r>, Decision<'p>> {
        let (tenant, subject, cost, counted) = match source {
            Source::Request(request) => {
                if let Some(decision) = Decision::cost_exceeds_capacity(applicable, request.cost) {
                    return Err(decision);
                }
                let guarded = applicable
                    .rules
                    .iter()
                    .any(|r| r.scope() == sluice_core::Scope::Dedupe);
                let counted = match guarded {
                    true => Counted::Guarded(request.fingerprint),
                    false => Counted::ByScope,
                };
                (request.tenant, request.subject, request.cost, counted)
            }
            Source::Keyed(keyed) => {
                let (tenant, subject, cost) = keyed.who();
                let (_, costs) = keyed.parts(applicable.rules);
                let probe = Batch {
                    costs: &costs,
                    ..Batch::new(tenant, subject, cost, applicable.rules)
                };
                if let Some(index) = super::cost_exceeds_capacity(&probe) {
                    return Err(Decision::cost_exceeds_capacity_at(applicable, index));
                }
                (tenant, subject, cost, Counted::Keyed(keyed))
            }
        };
        if applicable.rules.is_empty() {
            return Err(Decision::from_outcomes(
                applicable,
                Default::default(),
                cost,
                &[],
            ));
        }
        // Adaptive valves at their limit for this request, then gates.
        let retuned = match applicable.adaptive {
            [] => None,
            _ => {
                let now = self.options.clock.now_ms();
                self.adaptive.retuned(&applicable, applicable.rules, now)
            }
        };
        let gated = applicable.gated.then(|| {
            let now = self.options.clock.now_ms();
            let rules = retuned.as_deref().unwrap_or(applicable.rules);
            Box::new(self.fair.gate(&applicable, rules, cost, now))
        });
        let retuned = retuned.filter(|_| gated.is_none()).map(Box::new);
        let lease = (leasing && applicable.rules.iter().any(|r| r.rule().is_concurrency()))
            .then(lease::new_lease_id);
        Ok(Prepared {
            applicable,
            tenant,
            subject,
            cost,
            gated,
            retuned,
            counted,
            lease,
        })
    }
}
