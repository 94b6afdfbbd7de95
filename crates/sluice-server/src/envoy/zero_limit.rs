//! A limit of zero (`requests_per_unit: 0`, or a `limit` override of 0):
//! every request over it, answered as envoyproxy/ratelimit answers it.
//! [`decide`] also answers a request with more hits than one of its
//! limits can ever hold: over too, whatever the store holds.
//!
//! envoyproxy/ratelimit counts such a descriptor like any other and finds it over the
//! limit: its status names the limit, has nothing remaining and resets
//! when the limit's calendar unit ends; in shadow mode it is OK. The other
//! descriptors of the request are answered each on its own. sluice
//! consumes nothing for a request over the limit, so their standing is
//! read from the store (as a `hits_addend: 0` check reads it), not counted.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use sluice_core::config::envoy::Unit;
use sluice_core::decision::Outcomes;
use sluice_core::descriptors::DescriptorLimit;
use sluice_core::policy::Applicable;
use sluice_core::{BoundRule, Decision, Outcome, Rule, State};
use sluice_store::{Keyed, Limiter};

use super::units::current_limit;
use crate::backend::Backend;

/// The time zero limits reset from: the memory store's clock, else this
/// machine's (a reset is in whole seconds; Redis is not asked for its
/// time only for this).
pub(super) fn now_ms(store: &Backend) -> u64 {
    match store.memory() {
        Some(memory) => memory.clock().now_ms(),
        None => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    }
}

/// The status of a descriptor at a zero limit: over (OK in shadow mode),
/// its limit as configured (none for sluice `rules:`), nothing remaining,
/// reset when the limit's `unit` ends.
pub(super) fn status(
    limit: Option<&DescriptorLimit>,
    shadow: bool,
    now_ms: u64,
) -> DescriptorStatus {
    let configured = limit.filter(|l| !l.rules_given);
    let unit = configured.and_then(|l| l.unit);
    DescriptorStatus {
        code: if shadow { Code::Ok } else { Code::OverLimit } as i32,
        current_limit: configured
            .map(|l| current_limit(l.requests_per_unit, l.unit, l.name.as_deref().unwrap_or(""))),
        limit_remaining: 0,
        duration_until_reset: unit.map(|unit| ProtoDuration {
            seconds: calendar_reset_ms(unit, now_ms).div_ceil(1_000) as i64,
            nanos: 0,
        }),
        ..Default::default()
    }
}

/// Milliseconds until `unit`'s calendar window (aligned to the Unix epoch,
/// as envoyproxy/ratelimit aligns it) ends: from 1 to the unit's length.
fn calendar_reset_ms(unit: Unit, now_ms: u64) -> u64 {
    unit.ms() - now_ms % unit.ms()
}

/// The decision for a request a zero limit (or hits above a limit's
/// capacity) denies: over the limit,
/// nothing counted, with the standing of its other rules (`applicable`,
/// counting where `keyed` says) read through `limiter`. When the store
/// does not answer within [`CHECK_ONLY_BUDGET`](super::CHECK_ONLY_BUDGET),
/// their standing is unknown, but a rule that can never hold the request
/// is still named (its descriptor answers over).
pub(super) async fn decide<'p>(
    limiter: &Limiter<Backend>,
    applicable: Applicable<'p>,
    keyed: &Keyed<'_>,
) -> Decision<'p> {
    if applicable.rules.is_empty() {
        return Decision::blocked();
    }
    let peek = limiter.peek_keyed(applicable.rules, keyed);
    let Ok(Ok(peeked)) = tokio::time::timeout(super::CHECK_ONLY_BUDGET, peek).await else {
        return match first_never_fitting(applicable.rules, keyed) {
            Some(index) => Decision::cost_exceeds_capacity_at(applicable, index),
            None => Decision::blocked(),
        };
    };
    let costs: Vec<u64> = (0..applicable.rules.len())
        .map(|i| keyed.cost_of(i))
        .collect();
    let outcomes: Outcomes = peeked
        .rows
        .iter()
        .zip(&costs)
        .map(|(read, cost)| standing(&read.enforced, &read.state, peeked.now, *cost))
        .collect();
    Decision::blocked_among(applicable, outcomes, 1, &costs)
}

/// Whether an enforced rule of `rules` is asked for more than it can ever
/// hold (its cost where `keyed` counts it): such a request is over, as at
/// a zero limit, whatever the store holds ([`decide`] says which rule).
/// Shadow rules never deny (the Envoy domains count at most their
/// capacity in them).
pub(super) fn never_fits(rules: &[BoundRule], keyed: &Keyed<'_>) -> bool {
    first_never_fitting(rules, keyed).is_some()
}

/// The first rule [`never_fits`] finds.
fn first_never_fitting(rules: &[BoundRule], keyed: &Keyed<'_>) -> Option<usize> {
    (0..rules.len()).find(|&i| {
        let rule = &rules[i];
        !rule.shadow() && rule.units(keyed.cost_of(i)) > rule.rule().capacity()
    })
}

/// What `rule` would answer a request of `cost` now, from `state`.
fn standing(rule: &Rule, state: &State, now: u64, cost: u64) -> Outcome {
    let capacity = rule.capacity().max(1);
    let (mut outcome, _) = rule.decide(state, now, cost.clamp(1, capacity));
    // A cost above the capacity never passes.
    outcome.allowed &= rule.units(cost) <= capacity;
    outcome
}
