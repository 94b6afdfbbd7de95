//! The slices of hot keys (rules with a `tolerance`): slices taken,
//! decisions answered from them without a store call, the units held
//! here, and each rule's declared bound (`tolerance × limit`, the most
//! the fleet may admit over its limit in one window; for a shadow rule,
//! the over-admission its tolerance would allow once enforced), and what a
//! shadow rule's tolerance would have over-admitted, replayed. Labelled
//! by rule name and scope, which come from the configuration: never a
//! tenant.

use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_core::{BoundRule, Policy};
use sluice_store::limiter::slice::SliceLevel;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    rule: String,
    scope: &'static str,
}

fn labels(rule: &BoundRule) -> RuleLabels {
    RuleLabels {
        rule: rule.name().to_owned(),
        scope: rule.scope().name(),
    }
}

pub(super) struct SliceStats {
    taken: Family<RuleLabels, Counter>,
    taken_units: Family<RuleLabels, Counter>,
    decisions: Counter,
    held: Family<RuleLabels, Gauge>,
    bound: Family<RuleLabels, Gauge>,
    shadow_bound: Family<RuleLabels, Gauge>,
    shadow_over: Family<RuleLabels, Counter>,
    /// The rules `held` was last set for, to zero those no longer held.
    seen: Mutex<Vec<RuleLabels>>,
}

impl SliceStats {
    pub(super) fn register(registry: &mut Registry) -> SliceStats {
        let stats = SliceStats {
            taken: Family::default(),
            taken_units: Family::default(),
            decisions: Counter::default(),
            held: Family::default(),
            bound: Family::default(),
            shadow_bound: Family::default(),
            shadow_over: Family::default(),
            seen: Mutex::new(Vec::new()),
        };
        registry.register(
            "slices_taken",
            "Slices of hot keys' budgets taken from the store, by rule",
            stats.taken.clone(),
        );
        registry.register(
            "slice_units_taken",
            "Units taken from the store in slices, by rule",
            stats.taken_units.clone(),
        );
        registry.register(
            "slice_decisions",
            "Decisions answered from slices (admitted, or denied as the store last said), without any store call for the request",
            stats.decisions.clone(),
        );
        registry.register(
            "slice_units_held",
            "Units of slices held by this instance, unspent, by rule",
            stats.held.clone(),
        );
        registry.register(
            "slice_bound",
            "Declared bound of a rule with a tolerance: the most the fleet may admit over its limit in one window (tolerance × limit)",
            stats.bound.clone(),
        );
        registry.register(
            "slice_shadow_bound",
            "A shadow rule's tolerance × limit: the over-admission it would allow per window once enforced",
            stats.shadow_bound.clone(),
        );
        registry.register(
            "slice_shadow_over_admitted_units",
            "Units a shadow rule's tolerance would have admitted beyond the rule exactly, replayed on this instance's traffic",
            stats.shadow_over.clone(),
        );
        stats
    }

    /// The declared bounds of `policy`'s rules with a tolerance.
    pub(super) fn installed(&self, policy: &Policy) {
        for rule in policy.all_rules() {
            if rule.tolerance().is_exact() {
                continue;
            }
            let bound = rule.tolerance().of(rule.rule().limit());
            let family = if rule.shadow() {
                &self.shadow_bound
            } else {
                &self.bound
            };
            family
                .get_or_create(&labels(rule))
                .set(i64::try_from(bound).unwrap_or(i64::MAX));
        }
    }

    pub(super) fn taken(&self, rule: &BoundRule, units: u64) {
        let labels = labels(rule);
        self.taken.get_or_create(&labels).inc();
        self.taken_units.get_or_create(&labels).inc_by(units);
    }

    pub(super) fn decision(&self) {
        self.decisions.inc();
    }

    pub(super) fn shadow_over(&self, rule: &BoundRule, units: u64) {
        self.shadow_over.get_or_create(&labels(rule)).inc_by(units);
    }

    /// What this instance holds now, per rule.
    pub(super) fn levels(&self, levels: &[SliceLevel]) {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for old in seen.drain(..) {
            self.held.get_or_create(&old).set(0);
        }
        for level in levels {
            let labels = RuleLabels {
                rule: level.rule.clone(),
                scope: level.scope.name(),
            };
            self.held
                .get_or_create(&labels)
                .set(i64::try_from(level.units).unwrap_or(i64::MAX));
            seen.push(labels);
        }
    }
}
