//! Usage known after the fact: the doors that change budgets once a cost
//! is known (attempts, on rules that count by outcome: `attempt`).
//!
//! - [`Limiter::reserve`] turns an admitted decision into a
//!   [`Reservation`]: the cost it admitted is an estimate.
//! - [`Limiter::settle`] replaces the estimate with the actual cost: the
//!   difference is given back, or the excess taken even past the limit
//!   (debt), once per reservation (a settle marker, kept with the change).
//! - [`Limiter::report`] records a cost that already happened: always
//!   counted, debt included, never denied.
//!
//! Debits charge the tenant's own rate rules only
//! ([`Policy::own_rules`]): a valve never goes into debt, and keeps what an
//! estimate took (it refills at its rate).

use sluice_core::policy::Applicable;
use sluice_core::{Decision, Policy, Request};

use super::Limiter;
use crate::adjust::{Change, Marker, MarkerAnswer};
use crate::store::{Batch, Store, StoreError};
use crate::trace;

/// What a settle marker's value starts with: settles that keep a marker
/// in every slot they change. An identical settle of an earlier version
/// (the value alone, one marker) answers as another settle: refused, never
/// applied twice.
pub(super) const SETTLED: &str = "2:";

/// What an admitted decision holds as an estimate until it is settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reservation {
    /// Random, unguessable.
    pub id: [u8; 16],
    /// Whose budgets hold it.
    pub tenant: String,
    /// The route it was decided on.
    pub route: String,
    /// The subject, if the request named one.
    pub subject: Option<String>,
    /// The cost admitted.
    pub estimate: u64,
    /// What the shared store holds of it: the estimate, or 0 when the
    /// failure policy admitted it without the store (a settle then charges
    /// the whole actual cost).
    pub held: u64,
    /// When it was admitted (ms, the limiter's clock): when it expires and
    /// which minute of the usage ledger it goes into.
    pub at_ms: u64,
    /// When the store admitted it, on the store's clock: what a give-back
    /// names (`sliding_log` finds its entries by it, windows their window).
    pub admitted_ms: u64,
    /// When the store admitted it in the slot of the rules a sharded
    /// tenant keeps whole on shard 0, on that node's clock (Redis
    /// Cluster, [`Decided::first_shard_at_ms`]); elsewhere `admitted_ms`.
    ///
    /// [`Decided::first_shard_at_ms`]: crate::Decided::first_shard_at_ms
    pub first_shard_admitted_ms: u64,
    /// The tenant's shard that holds it.
    pub shard: u16,
    /// Per rule a settle changes ([`Policy::own_rules`]), in order: when
    /// what it took would have refilled had nothing else happened, ms
    /// after `admitted_ms` (0: not known). A give-back returns only what
    /// is still missing of it ([`Batch::whole_at`]); empty: none known.
    pub whole_after_ms: Vec<u64>,
    /// The identities of the rules `whole_after_ms` was read for
    /// (a digest of their uids): a reload that changed them since makes them not
    /// known.
    pub rules_print: u64,
    /// An attempt ([`Limiter::attempt`]): it holds the rules that count
    /// by outcome, concluded by the response's status; else a
    /// reservation of the own rules, settled at a cost.
    pub attempt: bool,
    /// Per rule it holds (bit `i`: the `i`th, the first 64), whether the
    /// admission took nothing there: a shadow rule that would have denied
    /// it. A give-back returns nothing to those.
    pub untaken: u64,
}

/// Whether `held`'s admission took nothing from its `i`th rule.
pub(super) fn took_nothing(held: &Reservation, i: usize) -> bool {
    i < 64 && held.untaken & (1 << i) != 0
}

/// A digest of `rules`' identities, in order, and, for a tenant of
/// several `shards`, of how many and where each rule is kept (whole on
/// shard 0, or divided): a reload that changed any of them makes what a
/// reservation or an attempt holds not known, and nothing is given back
/// (a give-back elsewhere than the key that took would erase others'
/// usage). A tenant of one shard has its digest of before shards were
/// part of it, so that its ids of an earlier version stay known. With
/// `storage.regions`, the region that decided is part of it: a
/// reservation or an attempt settled in another region gives nothing back
/// (its store never took it).
pub(super) fn rules_print(
    rules: &[sluice_core::BoundRule],
    shards: u16,
    region: Option<&str>,
) -> u64 {
    let step = |print: u64, n: u64| (print ^ n).wrapping_mul(0x0100_0000_01b3);
    let start = match region {
        None => 0xcbf2_9ce4_8422_2325,
        Some(name) => name
            .bytes()
            .fold(step(0xcbf2_9ce4_8422_2325, 0x5245_4749_4f4e), |print, b| {
                step(print, u64::from(b))
            }),
    };
    if shards <= 1 {
        return rules
            .iter()
            .fold(start, |print, rule| step(print, rule.uid()));
    }
    rules
        .iter()
        .fold(step(start, u64::from(shards)), |print, rule| {
            step(print, rule.uid() ^ u64::from(rule.on_first_shard()))
        })
}

/// What a settle or a report left: the rules' state after it, as a
/// decision of one unit would read it.
#[derive(Debug)]
pub struct Adjustment<'p> {
    /// The rules changed (or asked), as a request of one unit would find
    /// them now.
    pub decision: Decision<'p>,
    /// Units owed beyond the rules' `max_debt`, forgiven.
    pub forgiven: u64,
    /// Whether the change applied ([`MarkerAnswer::Applied`]), had applied
    /// before (an identical settle), or another settle had.
    pub marker: MarkerAnswer,
    /// A settle applied under its lead marker that the store failed to
    /// finish on every slot or shard: made, and finished by a retry
    /// ([`Adjusted::unfinished`](crate::Adjusted::unfinished)).
    pub unfinished: Option<StoreError>,
}

impl<'p> Adjustment<'p> {
    /// Whether this change applied now (not found made before, nor taken
    /// by another).
    pub fn applied(&self) -> bool {
        self.marker == MarkerAnswer::Applied
    }

    /// What `adjusted` left of `rules` (of `applicable`'s cell), as a
    /// request of one unit would find them.
    pub(super) fn of(
        applicable: Applicable<'p>,
        rules: &'p [sluice_core::BoundRule],
        adjusted: crate::adjust::Adjusted,
    ) -> Adjustment<'p> {
        Adjustment {
            decision: Decision::from_outcomes(
                Applicable {
                    rules,
                    ..applicable
                },
                adjusted.outcomes,
                1,
                &[],
            ),
            forgiven: adjusted.forgiven,
            marker: adjusted.marker,
            unfinished: adjusted.unfinished,
        }
    }
}

/// Why a report or a settle changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AfterError {
    /// A report on a route whose rules count by outcome: the check held
    /// the attempt, which its conclusion counts or gives back.
    #[error(
        "`attempt` is required: this route has rules that count by outcome (`count_if`); the check held the request as an attempt, conclude it with the attempt /v1/check answered and the response's `status`"
    )]
    AttemptNeeded,
    /// The store could not change it.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A report split over a tenant's shards was recorded on some of them
    /// (`recorded` units of its divided rules, the rules kept whole on
    /// shard 0 in full) before the store failed on the next.
    #[error("{recorded} units were recorded before the store failed: {error}")]
    Partly {
        /// Units of the divided rules recorded.
        recorded: u64,
        /// Units owed beyond `max_debt` on the shards that recorded,
        /// forgiven.
        forgiven: u64,
        /// Why the rest was not.
        error: StoreError,
    },
}

impl AfterError {
    /// The error's kind, as traces label it: `attempt_needed`, or the
    /// store's ([`StoreError::kind`]).
    pub fn kind(&self) -> &'static str {
        match self {
            AfterError::AttemptNeeded => "attempt_needed",
            AfterError::Store(error) | AfterError::Partly { error, .. } => error.kind(),
        }
    }
}

impl<S: Store> Limiter<S> {
    /// The reservation of an admitted `decision` of `request` (`None` when
    /// it was denied): its cost is held as an estimate until settled.
    pub fn reserve(
        &self,
        policy: &Policy,
        request: &Request<'_>,
        decision: &Decision<'_>,
    ) -> Option<Reservation> {
        let own = policy.own_rules(request.tenant, request.route, request.subject.is_some());
        let shards = policy
            .applicable(request.tenant, request.route, request.subject.is_some())
            .shards;
        self.held(request, decision, own, shards, false)
    }

    /// What an admitted `decision` of `request` holds of `rules`.
    pub(super) fn held(
        &self,
        request: &Request<'_>,
        decision: &Decision<'_>,
        rules: &[sluice_core::BoundRule],
        shards: u16,
        attempt: bool,
    ) -> Option<Reservation> {
        let at_ms = self.options.clock.now_ms();
        // Where each rule's outcome says it would be whole again.
        let whole_after_ms = if decision.decided_ms == 0 {
            Vec::new()
        } else {
            rules
                .iter()
                .map(|rule| {
                    decision
                        .known_outcomes()
                        .find(|(r, _)| r.uid() == rule.uid())
                        .map_or(0, |(_, o)| o.reset_after_ms)
                })
                .collect()
        };
        // A shadow rule that would have denied consumed nothing.
        let untaken = rules
            .iter()
            .take(64)
            .enumerate()
            .filter(|(_, rule)| {
                rule.shadow()
                    && decision
                        .known_outcomes()
                        .any(|(r, o)| r.uid() == rule.uid() && !o.allowed)
            })
            .fold(0u64, |mask, (i, _)| mask | 1 << i);
        decision.allowed.then(|| Reservation {
            id: super::lease::new_lease_id().to_le_bytes(),
            tenant: request.tenant.to_owned(),
            route: request.route.to_owned(),
            subject: request.subject.map(str::to_owned),
            estimate: request.cost,
            // Admitted by the failure policy, the shared store holds
            // nothing of a reservation (a settle charges it all). An
            // attempt is taken as held when the store's answer timed out
            // (it may have taken it, and a success must never stay
            // counted; a failure then counts nothing more, see
            // `conclude_attempt`); an unreachable store took nothing.
            held: match decision.degraded {
                Some(_) if !attempt || !decision.maybe_counted => 0,
                _ => request.cost,
            },
            at_ms,
            admitted_ms: if decision.decided_ms == 0 {
                at_ms
            } else {
                decision.decided_ms
            },
            first_shard_admitted_ms: if decision.decided_ms == 0 {
                at_ms
            } else {
                decision.first_shard_decided_ms()
            },
            shard: decision.shard,
            whole_after_ms,
            rules_print: rules_print(rules, shards, self.store.region()),
            attempt,
            untaken,
        })
    }

    /// Per rule of `rules`, when what `held` took of it would have
    /// refilled (empty: not known, as after a reload that changed them).
    pub(super) fn whole_at(
        &self,
        held: &Reservation,
        rules: &[sluice_core::BoundRule],
        shards: u16,
    ) -> Vec<u64> {
        if held.whole_after_ms.len() != rules.len()
            || held.rules_print != rules_print(rules, shards, self.store.region())
        {
            return Vec::new();
        }
        // From when each rule's own slot admitted it.
        rules
            .iter()
            .zip(&held.whole_after_ms)
            .map(|(rule, after)| match after {
                0 => 0,
                after if rule.on_first_shard() => {
                    held.first_shard_admitted_ms.saturating_add(*after)
                }
                after => held.admitted_ms.saturating_add(*after),
            })
            .collect()
    }

    /// Replaces what the store holds of `reservation` with `actual`: gives
    /// the difference back, or takes the excess even past the limit (debt),
    /// once: the change is kept with a marker living `marker_ttl_ms`, and
    /// an identical settle finds it ([`MarkerAnswer::Again`], nothing
    /// changed), another one finds it taken ([`MarkerAnswer::Conflict`]).
    pub async fn settle<'p>(
        &self,
        policy: &'p Policy,
        reservation: &Reservation,
        actual: u64,
        marker_ttl_ms: u64,
    ) -> Result<Adjustment<'p>, StoreError> {
        trace::changed(
            trace::ChangeKind::Settle,
            Some(actual),
            self.settle_untraced(policy, reservation, actual, marker_ttl_ms),
            Adjustment::applied,
            StoreError::kind,
        )
        .await
    }

    /// [`settle`](Self::settle), within its span.
    async fn settle_untraced<'p>(
        &self,
        policy: &'p Policy,
        reservation: &Reservation,
        actual: u64,
        marker_ttl_ms: u64,
    ) -> Result<Adjustment<'p>, StoreError> {
        let subject = reservation.subject.as_deref();
        let applicable =
            policy.applicable(&reservation.tenant, &reservation.route, subject.is_some());
        let own = policy.own_rules(&reservation.tenant, &reservation.route, subject.is_some());
        let (change, units) = match actual.cmp(&reservation.held) {
            std::cmp::Ordering::Less => (
                Change::GiveBack {
                    at: reservation.admitted_ms,
                    first_shard_at: reservation.first_shard_admitted_ms,
                },
                reservation.held - actual,
            ),
            std::cmp::Ordering::Greater => (Change::Debit, actual - reservation.held),
            std::cmp::Ordering::Equal => (Change::Nothing, 0),
        };
        // What the estimate holds is known while the rules, and where the
        // tenant's shards keep them, are those it was admitted under;
        // after a reload that changed them nothing is given back (a
        // give-back to a key that did not take would erase others' usage).
        let known =
            reservation.rules_print == rules_print(own, applicable.shards, self.store.region());
        let change = match change {
            Change::GiveBack { .. } if !known => Change::Nothing,
            change => change,
        };
        let marker = Marker {
            id: reservation.id,
            value: format!("{SETTLED}{actual}"),
            ttl_ms: marker_ttl_ms,
            shard: reservation.shard,
        };
        // Per rule, when what the estimate took would have refilled.
        let whole_at = self.whole_at(reservation, own, applicable.shards);
        // A reload may have lowered the tenant's shards since: an excess
        // goes to the shard that now holds the one that admitted.
        let shards = applicable.shards.max(1);
        let shard = reservation.shard % shards;
        let adjusted = if change == Change::Debit && shards > 1 {
            // An excess is spent already: charged over the tenant's
            // shards as a report's cost is (each holds its share of the
            // limit), from the one that admitted, each with its marker.
            let spread = Spread {
                tenant: &reservation.tenant,
                subject,
                rules: own,
                costs: &[],
                units,
                shards,
                first: shard,
            };
            match self.debit_spread(&spread, Some(&marker)).await {
                Ok(adjusted) => adjusted,
                Err(AfterError::Store(error) | AfterError::Partly { error, .. }) => {
                    return Err(error);
                }
                Err(AfterError::AttemptNeeded) => unreachable!("a settle charges own rules"),
            }
        } else {
            // Nothing goes back to a rule the admission took nothing from.
            let costs: Vec<u64> = match change {
                Change::GiveBack { .. } if reservation.untaken != 0 && known => (0..own.len())
                    .map(|i| {
                        if took_nothing(reservation, i) {
                            0
                        } else {
                            units
                        }
                    })
                    .collect(),
                _ => Vec::new(),
            };
            let batch = Batch {
                shard,
                costs: &costs,
                whole_at: &whole_at,
                ..Batch::new(&reservation.tenant, subject, units, own)
            };
            self.adjust_within_budget(&batch, change, Some(&marker))
                .await?
        };
        Ok(Adjustment::of(applicable, own, adjusted))
    }

    /// Claims `reservation`'s settle marker as expired (kept
    /// `marker_ttl_ms`): true when no settle had claimed it, so its
    /// estimate stands; false when one had. Changes no budget.
    pub async fn expire(
        &self,
        reservation: &Reservation,
        marker_ttl_ms: u64,
    ) -> Result<bool, StoreError> {
        let marker = Marker {
            id: reservation.id,
            value: "expired".to_owned(),
            ttl_ms: marker_ttl_ms,
            shard: reservation.shard,
        };
        let batch = Batch {
            shard: reservation.shard,
            ..Batch::new(&reservation.tenant, None, 0, &[])
        };
        let adjusted = self
            .adjust_within_budget(&batch, Change::Nothing, Some(&marker))
            .await?;
        // Again: this instance's own claim, made by a call whose answer
        // was lost (only the instance that reserved claims an expiry).
        Ok(adjusted.marker != MarkerAnswer::Conflict)
    }

    /// Records `request.cost` as spent: it counts whatever the tenant's own
    /// rate rules hold, debt included. A route whose rules count by
    /// outcome is refused ([`AfterError::AttemptNeeded`]): its check held
    /// the request as an attempt, which [`conclude_attempt`](Self::conclude_attempt)
    /// counts. A tenant spread over
    /// several shards has the cost of each divided rule split evenly over
    /// them (each holds its share of the limit, and of `max_debt`), a rule
    /// kept whole on shard 0 charged once: one store call per shard that
    /// has something to charge, the answer the last one's.
    pub async fn report<'p>(
        &self,
        policy: &'p Policy,
        request: &Request<'_>,
    ) -> Result<Adjustment<'p>, AfterError> {
        trace::changed(
            trace::ChangeKind::Report,
            Some(request.cost),
            self.report_untraced(policy, request),
            Adjustment::applied,
            AfterError::kind,
        )
        .await
    }

    /// [`report`](Self::report), within its span.
    async fn report_untraced<'p>(
        &self,
        policy: &'p Policy,
        request: &Request<'_>,
    ) -> Result<Adjustment<'p>, AfterError> {
        let with_subject = request.subject.is_some();
        let applicable = policy.applicable(request.tenant, request.route, with_subject);
        if !applicable.by_outcome.is_empty() {
            return Err(AfterError::AttemptNeeded);
        }
        let rules = policy.own_rules(request.tenant, request.route, with_subject);
        let spread = Spread {
            tenant: request.tenant,
            subject: request.subject,
            rules,
            costs: &[],
            units: request.cost,
            shards: applicable.shards.max(1),
            first: self.turns.first(applicable.shards.max(1)),
        };
        let adjusted = self.debit_spread(&spread, None).await?;
        Ok(Adjustment::of(applicable, rules, adjusted))
    }

    /// Debits `spread.units` over the tenant's shards, from
    /// `spread.first`: each divided rule's cost split evenly (the first
    /// shards a unit more while the remainder lasts: each holds its share
    /// of the limit, and of `max_debt`), a rule kept whole on shard 0
    /// charged once, in full. One store call per shard that has something
    /// to charge; the answer the last one's, with what was forgiven
    /// summed. With a settle's `marker`, each call keeps it in its own
    /// shard's slot: the first shard's answer decides (another settle or
    /// the expiry there: nothing more is charged), and a retry of a settle
    /// cut short finishes on the shards it had not reached.
    async fn debit_spread(
        &self,
        spread: &Spread<'_>,
        marker: Option<&Marker>,
    ) -> Result<crate::adjust::Adjusted, AfterError> {
        let shards = u64::from(spread.shards);
        let full = |j: usize| spread.costs.get(j).copied().unwrap_or(spread.units);
        let mut forgiven = 0;
        let mut recorded = 0;
        let mut answer = None;
        let mut unfinished = None;
        let mut last = None;
        for k in 0..shards {
            let shared: Vec<u64> = spread
                .rules
                .iter()
                .enumerate()
                .map(|(j, rule)| match (rule.on_first_shard(), k) {
                    (true, 0) => full(j),
                    (true, _) => 0,
                    (false, _) => full(j) / shards + u64::from(k < full(j) % shards),
                })
                .collect();
            let units = spread.units / shards + u64::from(k < spread.units % shards);
            if k > 0 && shared.iter().all(|&c| c == 0) {
                continue;
            }
            let shard = ((u64::from(spread.first) + k) % shards) as u16;
            let batch = Batch {
                costs: &shared,
                shard,
                ..Batch::new(spread.tenant, spread.subject, units, spread.rules)
            };
            // The lead marker stays in the slot of the shard that admitted
            // (where the expiry claims it), whatever the shards are now.
            let marker = marker.map(|m| match k {
                0 => m.clone(),
                _ => Marker { shard, ..m.clone() },
            });
            let adjusted = match self
                .adjust_within_budget(&batch, Change::Debit, marker.as_ref())
                .await
            {
                Ok(adjusted) => adjusted,
                // A settle whose lead marker applied is made: the rest is
                // a retry's to finish.
                Err(error) if answer == Some(MarkerAnswer::Applied) && marker.is_some() => {
                    let last = last.expect("the lead shard answered");
                    return Ok(crate::adjust::Adjusted {
                        forgiven,
                        marker: MarkerAnswer::Applied,
                        unfinished: Some(error),
                        ..last
                    });
                }
                Err(error) if recorded > 0 => {
                    return Err(AfterError::Partly {
                        recorded,
                        forgiven,
                        error,
                    });
                }
                Err(error) => return Err(error.into()),
            };
            // The lead shard's answer is the settle's: another settle's
            // or the expiry's marker there charges nothing more, and a
            // retry that finishes the other shards is the same settle.
            let lead = *answer.get_or_insert(adjusted.marker);
            if lead == MarkerAnswer::Conflict {
                return Ok(adjusted);
            }
            if adjusted.marker == MarkerAnswer::Applied {
                recorded += units;
            }
            forgiven += adjusted.forgiven;
            // A shard a Redis Cluster call did not finish: the settle is
            // unfinished, whatever the later shards answer.
            unfinished = unfinished.or(adjusted.unfinished.clone());
            last = Some(adjusted);
        }
        Ok(crate::adjust::Adjusted {
            forgiven,
            marker: answer.unwrap_or(MarkerAnswer::Applied),
            unfinished,
            ..last.expect("a tenant has at least one shard")
        })
    }
}

/// A debit spread over a tenant's shards ([`Limiter::debit_spread`]).
struct Spread<'a> {
    tenant: &'a str,
    subject: Option<&'a str>,
    rules: &'a [sluice_core::BoundRule],
    /// Per rule, its cost in full; empty: `units` for every rule.
    costs: &'a [u64],
    units: u64,
    shards: u16,
    /// The shard charged first.
    first: u16,
}
