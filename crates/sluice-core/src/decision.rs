//! One decision from the outcomes of every applicable rule.
//!
//! A request passes only if every rule passes; stores commit all rules or
//! none, so a denial consumes nothing. This module only summarises: which
//! rule the answer is about, why, and how long to wait.

use smallvec::SmallVec;

use crate::algorithm::Outcome;
use crate::bound::BoundRule;
use crate::config::OnError;
use crate::policy::{ADHOC, Applicable, Class};
pub use crate::reason::Reason;

/// How long a caller denied because the store is unavailable is asked to
/// wait.
pub const STORE_RETRY_MS: u64 = 1_000;

/// Per-rule outcomes, in the order of the rules they answer. Three fit
/// inline (tenant, route, subject); a fourth spills to the heap.
pub type Outcomes = SmallVec<[Outcome; 3]>;

/// Which rules of a decision have an outcome (see [`Decision::known`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// Every rule's: the store decided the request (or no rule applies).
    Every,
    /// Only the rule the summary describes
    /// ([`policy`](Decision::policy)): a denial the over-limit cache
    /// remembered.
    Summary,
    /// No rule's: the store was not asked.
    Nothing,
}

/// A decision about one request.
///
/// Kept to a few words (the summary fields are derived on demand from the
/// rule they describe) so that handing a decision back through an `async`
/// call costs a few register moves rather than a `memcpy`.
#[derive(Debug, Clone)]
pub struct Decision<'p> {
    /// Whether the request may proceed.
    pub allowed: bool,
    /// Why not, when denied.
    pub reason: Option<Reason>,
    /// Some advertised rule is at or past the soft-limit threshold.
    pub near_limit: bool,
    /// Set when the store could not decide and this failure policy did.
    pub degraded: Option<OnError>,
    /// With `degraded`: the store's answer never came in time, so it may
    /// have counted the request all the same (a timeout, where an
    /// unreachable store or an open breaker certainly did not).
    pub maybe_counted: bool,
    /// Some shadow rule would have denied this request (it was not
    /// enforced).
    pub shadow_denied: bool,
    /// Index into `rules` of the rule the summary describes.
    summary: Option<u8>,
    /// The tenant's shard the store decided on (0 for a tenant of one).
    pub shard: u16,
    /// Where the rules a sharded tenant keeps whole on shard 0 were
    /// decided by another call (Redis Cluster, another slot): its time,
    /// less `decided_ms` ([`first_shard_decided_ms`]). An `i32` in what
    /// was padding: the decision stays 128 bytes.
    ///
    /// [`first_shard_decided_ms`]: Self::first_shard_decided_ms
    first_shard_offset_ms: i32,
    /// When the store decided, on its clock (ms since the epoch); 0 when
    /// no store did. A give-back of what it admitted names this time.
    pub decided_ms: u64,
    /// Every applicable rule.
    pub rules: &'p [BoundRule],
    /// Their outcomes: one per rule after a store call; only the denying
    /// rule's for a denial the over-limit cache remembered; none when the
    /// store was not asked. [`known_outcomes`](Self::known_outcomes) pairs
    /// them with their rules.
    pub outcomes: Outcomes,
    /// The class of the request: its plan, route pattern and the
    /// `RateLimit-Policy` field value for [`rules`](Self::rules).
    pub class: &'p Class,
}

impl<'p> Decision<'p> {
    #[inline]
    fn new(
        applicable: Applicable<'p>,
        allowed: bool,
        reason: Option<Reason>,
        summary: Option<usize>,
    ) -> Decision<'p> {
        Decision {
            allowed,
            reason,
            near_limit: false,
            degraded: None,
            maybe_counted: false,
            shadow_denied: false,
            summary: summary.and_then(|i| u8::try_from(i).ok()),
            shard: 0,
            first_shard_offset_ms: 0,
            decided_ms: 0,
            rules: applicable.rules,
            outcomes: Outcomes::new(),
            class: applicable.class,
        }
    }

    /// Admits a request no rule applies to.
    pub fn unlimited() -> Decision<'static> {
        Decision {
            allowed: true,
            reason: None,
            near_limit: false,
            degraded: None,
            maybe_counted: false,
            shadow_denied: false,
            summary: None,
            shard: 0,
            first_shard_offset_ms: 0,
            decided_ms: 0,
            rules: &[],
            outcomes: Outcomes::new(),
            class: &ADHOC,
        }
    }

    /// A denial by a limit of zero (envoyproxy/ratelimit's
    /// `requests_per_unit: 0`): nothing is counted, the request is over the
    /// limit.
    pub fn blocked() -> Decision<'static> {
        Decision {
            allowed: false,
            reason: Some(Reason::DescriptorLimit),
            near_limit: true,
            ..Decision::unlimited()
        }
    }

    /// [`blocked`](Self::blocked), with the standing of the request's
    /// other `rules`: `outcomes` as if it had been admitted (read, nothing
    /// counted), given their costs back as a denial gives them back
    /// ([`from_outcomes`](Self::from_outcomes)).
    pub fn blocked_among(
        applicable: Applicable<'p>,
        mut outcomes: Outcomes,
        cost: u64,
        costs: &[u64],
    ) -> Decision<'p> {
        let rules = applicable.rules;
        debug_assert_eq!(rules.len(), outcomes.len());
        give_back(rules, &mut outcomes, cost, costs);
        Decision {
            near_limit: true,
            outcomes,
            ..Decision::new(applicable, false, Some(Reason::DescriptorLimit), None)
        }
    }

    /// The decision for a request whose `cost` is above some rule's capacity,
    /// or `None` when every rule can hold it. Checked before the store is
    /// asked: such a request can never pass, so waiting would be a lie.
    #[inline]
    pub fn cost_exceeds_capacity(applicable: Applicable<'p>, cost: u64) -> Option<Decision<'p>> {
        if cost <= applicable.max_cost {
            return None;
        }
        let index = applicable
            .rules
            .iter()
            .position(|r| r.units(cost) > r.rule().capacity())?;
        Some(Decision::new(
            applicable,
            false,
            Some(Reason::CostExceedsCapacity),
            Some(index),
        ))
    }

    /// The decision for a request that rule `index` can never hold (its
    /// cost is above the rule's capacity).
    pub fn cost_exceeds_capacity_at(applicable: Applicable<'p>, index: usize) -> Decision<'p> {
        Decision::new(
            applicable,
            false,
            Some(Reason::CostExceedsCapacity),
            Some(index),
        )
    }

    /// A decision made without the store by failure policy `allow` or
    /// `deny`. A denial asks the caller to retry after [`STORE_RETRY_MS`].
    pub fn without_store(applicable: Applicable<'p>, policy: OnError) -> Decision<'p> {
        let allowed = policy == OnError::Allow;
        let reason = (!allowed).then_some(Reason::StoreUnavailable);
        Decision {
            degraded: Some(policy),
            ..Decision::new(applicable, allowed, reason, None)
        }
    }

    /// A denial the over-limit cache remembered: rule `index` denies this
    /// request for `retry_after_ms` more, known without asking the store.
    pub fn remembered_denial(
        applicable: Applicable<'p>,
        index: usize,
        retry_after_ms: u64,
    ) -> Decision<'p> {
        let outcome = Outcome {
            allowed: false,
            remaining: 0,
            reset_after_ms: retry_after_ms,
            retry_after_ms: retry_after_ms.max(1),
        };
        let reason = applicable.rules.get(index).map(|r| r.scope().reason());
        Decision {
            near_limit: true,
            outcomes: smallvec::smallvec![outcome],
            ..Decision::new(applicable, false, reason, Some(index))
        }
    }

    /// The same decision, made by the store at `decided_ms` on its clock.
    #[inline]
    pub fn decided_at(self, decided_ms: u64) -> Decision<'p> {
        Decision { decided_ms, ..self }
    }

    /// The same decision, made by the store at `decided_ms`, and the rules
    /// a sharded tenant keeps whole on shard 0 at `first_shard_ms` when a
    /// call of their own decided them (Redis Cluster).
    #[inline]
    pub fn decided_at_slots(self, decided_ms: u64, first_shard_ms: Option<u64>) -> Decision<'p> {
        let offset = first_shard_ms.map_or(0, |ms| {
            let offset = i128::from(ms) - i128::from(decided_ms);
            i32::try_from(offset).unwrap_or(if offset < 0 { i32::MIN } else { i32::MAX })
        });
        Decision {
            decided_ms,
            first_shard_offset_ms: offset,
            ..self
        }
    }

    /// When the store decided the rules a sharded tenant keeps whole on
    /// shard 0 (`decided_ms` unless a call of their own did, on Redis
    /// Cluster): what a give-back of them names.
    pub fn first_shard_decided_ms(&self) -> u64 {
        self.decided_ms
            .saturating_add_signed(i64::from(self.first_shard_offset_ms))
    }

    /// The same decision, made on the tenant's shard `shard`.
    #[inline]
    pub fn on_shard(self, shard: u16) -> Decision<'p> {
        Decision { shard, ..self }
    }

    /// Which rules have an outcome in [`outcomes`](Self::outcomes).
    #[inline]
    pub fn known(&self) -> Known {
        if self.outcomes.len() == self.rules.len() {
            Known::Every
        } else if self.outcomes.is_empty() {
            Known::Nothing
        } else {
            Known::Summary
        }
    }

    /// The outcome of rule `index`, when known.
    pub fn outcome(&self, index: usize) -> Option<&Outcome> {
        if self.known() == Known::Every {
            self.outcomes.get(index)
        } else if self.summary.map(usize::from) == Some(index) {
            self.outcomes.first()
        } else {
            None
        }
    }

    /// Every rule whose outcome is known, with that outcome.
    pub fn known_outcomes(&self) -> impl Iterator<Item = (&'p BoundRule, &Outcome)> {
        let rules = self.rules;
        let all = self.known() == Known::Every;
        let only = if all { None } else { self.policy() };
        let (paired, single) = if all {
            (Some(rules.iter().zip(self.outcomes.iter())), None)
        } else {
            (None, only.zip(self.outcomes.first()))
        };
        paired.into_iter().flatten().chain(single)
    }

    /// Combines one outcome per rule of a request of `cost` units (or
    /// `costs[i]` for rule `i` when `costs` is not empty).
    ///
    /// Shadow rules never deny: their denials only set
    /// [`shadow_denied`](Self::shadow_denied). When the request is denied
    /// nothing was consumed, so the rules that would have admitted it report
    /// what they had before it: `remaining` goes back up by their cost
    /// (exact for every algorithm), and `reset_after_ms` stays the
    /// post-admission figure, an upper bound.
    #[inline]
    pub fn from_outcomes(
        applicable: Applicable<'p>,
        outcomes: Outcomes,
        cost: u64,
        costs: &[u64],
    ) -> Decision<'p> {
        let rules = applicable.rules;
        debug_assert_eq!(rules.len(), outcomes.len());
        if let [outcome] = outcomes[..]
            && rules.len() == 1
        {
            return Decision::from_outcome(applicable, outcome);
        }
        Decision::combine(applicable, outcomes, cost, costs)
    }

    /// [`from_outcomes`](Self::from_outcomes) when exactly one rule
    /// applies, the embedded path's common case: what the general
    /// combination comes to for one rule, without its passes over the rules
    /// (a test holds the two equal). A lone denied rule consumed nothing
    /// already, so nothing is given back.
    #[inline]
    pub fn from_outcome(applicable: Applicable<'p>, outcome: Outcome) -> Decision<'p> {
        debug_assert_eq!(applicable.rules.len(), 1);
        let rule = &applicable.rules[0];
        let allowed = outcome.allowed || rule.shadow();
        // Written out rather than through `Decision::new`: built in place,
        // where the update syntax built a second one and copied it.
        Decision {
            allowed,
            reason: (!allowed).then(|| rule.scope().reason()),
            near_limit: !allowed || (rule.advertised() && rule.is_near(outcome.remaining.into())),
            degraded: None,
            maybe_counted: false,
            shadow_denied: !outcome.allowed && allowed,
            summary: (!allowed || rule.advertised()).then_some(0),
            shard: 0,
            first_shard_offset_ms: 0,
            decided_ms: 0,
            rules: applicable.rules,
            outcomes: smallvec::smallvec![outcome],
            class: applicable.class,
        }
    }

    /// [`from_outcomes`](Self::from_outcomes) for any number of rules.
    fn combine(
        applicable: Applicable<'p>,
        mut outcomes: Outcomes,
        cost: u64,
        costs: &[u64],
    ) -> Decision<'p> {
        let rules = applicable.rules;
        let enforced = |i: usize| !rules[i].shadow();
        let (mut allowed, mut shadow_denied) = (true, false);
        for (rule, outcome) in rules.iter().zip(&outcomes) {
            if !outcome.allowed {
                if rule.shadow() {
                    shadow_denied = true;
                } else {
                    allowed = false;
                }
            }
        }
        if !allowed {
            give_back(rules, &mut outcomes, cost, costs);
        }
        let pairs = || rules.iter().zip(outcomes.iter()).enumerate();
        let mut near_limit = !allowed;
        let summary = if allowed {
            // The advertised rule with the smallest share of its capacity
            // left (valves are not shown: see `BoundRule::advertised`), the
            // first on ties; and whether any advertised rule is near its
            // limit, in the same pass.
            let mut tightest: Option<(usize, u64, u64)> = None;
            for (i, (rule, outcome)) in pairs() {
                if !rule.advertised() {
                    continue;
                }
                near_limit |= rule.is_near(outcome.remaining.into());
                let (remaining, capacity) = (u64::from(outcome.remaining), rule.rule().capacity());
                let tighter = tightest.is_none_or(|(_, left, of)| {
                    u128::from(remaining) * u128::from(of) < u128::from(left) * u128::from(capacity)
                });
                if tighter {
                    tightest = Some((i, remaining, capacity));
                }
            }
            tightest.map(|(i, _, _)| i)
        } else {
            // A duplicate is answered as one (409), whatever else denied.
            // Otherwise, of the enforced rules that denied, the one that
            // makes the caller wait longest: only then does every rule pass.
            // First one on ties.
            let duplicate = pairs().find(|(i, (r, o))| {
                !o.allowed && enforced(*i) && r.scope() == crate::policy::Scope::Dedupe
            });
            duplicate.map(|(i, _)| i).or_else(|| {
                pairs()
                    .filter(|(i, (_, o))| !o.allowed && enforced(*i))
                    .fold(None::<(usize, u64)>, |best, (i, (_, o))| match best {
                        Some((_, wait)) if wait >= o.retry_after_ms => best,
                        _ => Some((i, o.retry_after_ms)),
                    })
                    .map(|(i, _)| i)
            })
        };
        let reason = if allowed {
            None
        } else {
            summary.map(|i| rules[i].scope().reason())
        };
        Decision {
            near_limit,
            shadow_denied,
            outcomes,
            ..Decision::new(applicable, allowed, reason, summary)
        }
    }

    /// The rule the summary fields describe: the one that denied (the
    /// longest wait when several did), or the advertised one closest to its
    /// limit.
    #[inline]
    pub fn policy(&self) -> Option<&'p BoundRule> {
        self.summary.map(|i| &self.rules[usize::from(i)])
    }

    #[inline]
    fn summary_outcome(&self) -> Option<&Outcome> {
        let index = usize::from(self.summary?);
        if self.known() == Known::Every {
            self.outcomes.get(index)
        } else {
            self.outcomes.first()
        }
    }

    /// The capacity of [`policy`](Self::policy), if any.
    pub fn limit(&self) -> Option<u64> {
        self.policy().map(|r| r.rule().capacity())
    }

    /// Units left under [`policy`](Self::policy) (0 when it was not asked).
    #[inline]
    pub fn remaining(&self) -> Option<u64> {
        self.policy()
            .map(|_| self.summary_outcome().map_or(0, |o| u64::from(o.remaining)))
    }

    /// Milliseconds until [`policy`](Self::policy) is back to full capacity.
    pub fn reset_after_ms(&self) -> u64 {
        self.summary_outcome().map_or(0, |o| o.reset_after_ms)
    }

    /// When denied: milliseconds until the request would pass (rounded up);
    /// `None` when allowed, and when it can never pass.
    pub fn retry_after_ms(&self) -> Option<u64> {
        match (self.allowed, self.reason) {
            (true, _) | (false, Some(Reason::CostExceedsCapacity)) => None,
            (false, Some(Reason::StoreUnavailable)) => Some(STORE_RETRY_MS),
            (false, _) => self.summary_outcome().map(|o| o.retry_after_ms),
        }
    }

    /// The `RateLimit-Policy` field value ("" when no rule is advertised).
    pub fn policy_header(&self) -> &'p str {
        self.class.policy_header()
    }

    /// The fair valves whose share this request went past: each one whose
    /// gate ([`Scope::Share`](crate::policy::Scope::Share)) denied it,
    /// enforced or in shadow mode.
    pub fn fair_share_denials(&self) -> impl Iterator<Item = &'p BoundRule> {
        self.known_outcomes()
            .filter(|(r, o)| !o.allowed && r.scope() == crate::policy::Scope::Share)
            .map(|(r, _)| r)
    }

    /// Names of the rules that denied (for problem details).
    pub fn violated_policies(&self) -> impl Iterator<Item = &str> {
        let from_outcomes = self
            .known_outcomes()
            .filter(|(r, o)| !o.allowed && !r.shadow())
            .map(|(r, _)| r.name());
        let without_outcomes = self
            .policy()
            .filter(|_| self.known() == Known::Nothing && !self.allowed)
            .map(BoundRule::name);
        from_outcomes.chain(without_outcomes)
    }
}

/// What a denied request's enforced `rules` that would have admitted it
/// report: their `outcomes` with the units of their cost (`costs[i]`, else
/// `cost`) back, since nothing was consumed.
fn give_back(rules: &[BoundRule], outcomes: &mut Outcomes, cost: u64, costs: &[u64]) {
    for (i, (rule, outcome)) in rules.iter().zip(outcomes.iter_mut()).enumerate() {
        if outcome.allowed && !rule.shadow() {
            let units = rule.units(costs.get(i).copied().unwrap_or(cost));
            outcome.remaining = outcome
                .remaining
                .saturating_add(u32::try_from(units).unwrap_or(u32::MAX));
        }
    }
}

#[cfg(test)]
mod tests;
