//! Fair valves: a saturated global valve shared max-min fairly between the
//! tenants that want it, each weighted by its plan's `weight`.
//!
//! # The mechanism
//!
//! A valve stays what it was: a bucket all tenants draw from, exact. What
//! is added is a *gate* per tenant and valve ([`Scope::Share`]): a `gcra`
//! rule in the tenant's own partition (so in the tenant's slot on Redis
//! Cluster, decided in the same call as the tenant's other rules), whose
//! rate this module sets for each decision to
//!
//! ```text
//! ρᵢ = wᵢ · α / shardsᵢ        (units per millisecond)
//! ```
//!
//! where `wᵢ` is the tenant's plan weight, `shardsᵢ` its number of shards
//! (its decisions are spread over them, so a sharded tenant counts as one)
//! and `α` the valve's *fair-share level*, kept per valve by each instance.
//! A tenant sending less than `wᵢ · α` never meets its gate's limit; one
//! sending more is held to it. The gate is decided with every other rule,
//! all or nothing: a request the gate (or anything else) denies consumes
//! nothing, and the gate's state is the tenant's, never the valve's (the
//! valve keeps no per-tenant state at all).
//!
//! # The fair-share level
//!
//! Max-min fairness asks for the `α` at which `Σ min(dᵢ, wᵢ·α) = C`, the
//! valve's rate, given each tenant's demand `dᵢ`. Nobody knows the `dᵢ`
//! without per-tenant state at the valve, so `α` is found by feedback
//! instead (as approximate fair dropping does with a queue's length): the
//! signal is the valve's own fill level `ℓ` (its `remaining` over its
//! capacity, in `[0, 1]`, returned by every decision that asks it). A
//! saturated valve drains when the gates admit more than `C` and refills
//! when they admit less, so holding `ℓ` at a set point `T = ½` holds the
//! admitted total at `C`. With time measured in `θ`, the time the valve
//! takes to drain at its own rate (`capacity × per / limit`: one second
//! for `limit: N, per: 1s` with the default burst), `α` follows a
//! proportional-integral law on `e = ℓ − T`:
//!
//! ```text
//! ln α = I + K_P · e,        dI/d(t/θ) = K_I · e
//! ```
//!
//! Linearised around the fair point, `dℓ/d(t/θ) = −a · δ(ln α)` where
//! `a ≤ 1` is the share of the valve's rate going to gated tenants, so
//! `e'' + a·K_P·e' + a·K_I·e = 0`: with `K_I = 16` and `K_P = 8` the loop
//! is critically damped at `a = 1` (ω = 4/θ) and stays damped below
//! (ζ = 0.71 at `a = ½`), settling within about one `θ`. The half of the
//! valve below the set point is the room a tenant under its share draws
//! on while the level moves; the valve denies it only when that room is
//! gone, which a converged level keeps from happening.
//!
//! - **Work-conserving**: gates engage only once the level falls below
//!   `T`, starting from `α = C` (one tenant may have the whole valve), and
//!   disengage once the valve is nearly full (`ℓ ≥ 0.9`) with `α ≥ C`.
//!   A tenant alone is held at `α = C`: the whole valve.
//! - **Adapting**: tenants joining or leaving move the level, and `α`
//!   follows within about one `θ` (bounded below by the rate decisions come
//!   in: the level is read from their answers). An instance that hears
//!   nothing from the valve for one `θ` lets `α` rise as if the valve were
//!   full, and forgets it after four: a gate never starves a tenant
//!   because the decisions that would have raised `α` were all denied.
//! - **Bounded**: the valve's own limit is never exceeded (its bucket is
//!   still exact); fairness only chooses who gets its units.
//! - **Several instances**: each keeps its own `α`, fed by the same shared
//!   level, so they follow the same law on the same signal.
//! - **Sharded valves** (Redis Cluster's `global_shards`): the level is
//!   that of the shard a decision used, over that shard's capacity; the
//!   shards are used in turn, so one `α` per valve (not per shard) follows
//!   them all.
//!
//! A gate's tolerance is a tenth of `θ` at its rate (at least the
//! request's cost, so a costly request passes a gate with nothing owed),
//! and its state is repaired like any `gcra` state when the rate rises.
//! A gate whose valve is not saturated runs at a rate no request reaches.

use std::sync::Arc;

use sluice_core::policy::Applicable;
use sluice_core::rule::{MAX_LIMIT, MAX_PERIOD_MS};
use sluice_core::{Algorithm, BoundRule, Decision, Rule, Scope};
use smallvec::SmallVec;

/// The fill level the law holds a saturated valve at.
const SET_POINT: f64 = 0.5;
/// The integral gain, per `θ`.
const K_I: f64 = 16.0;
/// The proportional gain.
const K_P: f64 = 8.0;
/// The level above which a valve with `α ≥ C` is no longer saturated.
const RELEASE_LEVEL: f64 = 0.9;
/// `α` stays within these multiples of the valve's rate.
const LOWEST: f64 = 1e-6;
const HIGHEST: f64 = 4.0;
/// A gate's tolerance, as a share of `θ`.
const TOLERANCE: f64 = 0.1;
/// Rates (units per ms) at which a gate is written with a precision of
/// about one in this many.
const PRECISION: f64 = 10_000.0;

/// Each fair valve's level, as this instance knows it.
#[derive(Default)]
pub(crate) struct FairShares {
    valves: papaya::HashMap<u64, parking_lot::Mutex<Level>>,
}

/// What the metrics show of one valve.
#[derive(Debug, Clone)]
pub struct ValveLevel {
    /// The valve rule's name.
    pub valve: Arc<str>,
    /// Whether its gates are engaged (the valve is saturated).
    pub saturated: bool,
    /// The fair-share level `α`, in units per second per unit of weight
    /// (infinite while not saturated).
    pub level_per_second: f64,
}

/// One valve's law.
#[derive(Debug)]
struct Level {
    name: Arc<str>,
    engaged: bool,
    /// `I`, the integral part of `ln α` (`α` in units per ms).
    integral: f64,
    /// The latest level seen.
    level: f64,
    /// When the latest level was seen.
    seen_ms: u64,
}

/// Where a request's gates and their valves are among its rules.
pub(crate) struct Gates {
    /// (gate index, valve index) per fair valve.
    pairs: SmallVec<[(usize, usize); 2]>,
}

impl FairShares {
    /// `rules` (those of `applicable`, perhaps with more after them) with
    /// each gate at the rate its valve's level gives this request's
    /// tenant, and where the gates are.
    pub(crate) fn gate(
        &self,
        applicable: &Applicable<'_>,
        rules: &[BoundRule],
        cost: u64,
        now_ms: u64,
    ) -> (SmallVec<[BoundRule; 6]>, Gates) {
        let weight = applicable.plan.map_or(1.0, |p| p.weight());
        let shards = f64::from(applicable.shards.max(1));
        let mut gated: SmallVec<[BoundRule; 6]> = rules.iter().cloned().collect();
        let mut pairs = SmallVec::new();
        let valves = self.valves.pin();
        for (g, gate) in rules.iter().enumerate() {
            if gate.scope() != Scope::Share {
                continue;
            }
            let Some(v) = rules.iter().position(|r| {
                r.scope() == Scope::Global
                    && r.name() == gate.name()
                    && r.pattern() == gate.pattern()
            }) else {
                continue;
            };
            pairs.push((g, v));
            let valve = &rules[v];
            let alpha = valves.get(&gate.uid()).map_or(f64::INFINITY, |level| {
                level.lock().alpha(valve.rule(), now_ms)
            });
            let rate = alpha * weight / shards;
            gated[g] = gate.with_rule(gate_rule(rate, cost, TOLERANCE * drain_ms(valve.rule())));
        }
        (gated, Gates { pairs })
    }

    /// Learns each fair valve's level from `decision`, when it is known: a
    /// decision the store made in full (admitted, or denied by the valve
    /// itself; a request another rule denied may not have reached the
    /// valve). `valve_parts` is how many keys each valve is split over.
    pub(crate) fn observe(
        &self,
        gates: &Gates,
        decision: &Decision<'_>,
        valve_parts: u64,
        now_ms: u64,
    ) {
        if decision.degraded.is_some() || decision.outcomes.len() != decision.rules.len() {
            return;
        }
        let valves = self.valves.pin();
        for &(g, v) in &gates.pairs {
            let outcome = &decision.outcomes[v];
            if !decision.allowed && outcome.allowed {
                continue;
            }
            let valve = &decision.rules[v];
            let enforced = valve.rule().share(valve.rule().shares(valve_parts));
            let level = (f64::from(outcome.remaining) / enforced.capacity() as f64).clamp(0.0, 1.0);
            let gate = &decision.rules[g];
            let entry = valves.get_or_insert_with(gate.uid(), || {
                parking_lot::Mutex::new(Level::new(gate.name().into()))
            });
            entry.lock().observe(valve.rule(), level, now_ms);
        }
    }

    /// Every valve this instance has seen, for the metrics.
    pub(crate) fn levels(&self) -> Vec<ValveLevel> {
        self.valves
            .pin()
            .values()
            .map(|level| {
                let level = level.lock();
                ValveLevel {
                    valve: level.name.clone(),
                    saturated: level.engaged,
                    level_per_second: if level.engaged {
                        level.integral.exp() * 1_000.0
                    } else {
                        f64::INFINITY
                    },
                }
            })
            .collect()
    }
}

impl Level {
    fn new(name: Arc<str>) -> Level {
        Level {
            name,
            engaged: false,
            integral: 0.0,
            level: 1.0,
            seen_ms: 0,
        }
    }

    /// Moves the law on to a level seen at `now_ms`.
    fn observe(&mut self, valve: &Rule, level: f64, now_ms: u64) {
        let theta = drain_ms(valve);
        let rate = rate_per_ms(valve);
        let elapsed = now_ms.saturating_sub(self.seen_ms) as f64;
        if !self.engaged {
            if level <= SET_POINT {
                self.engaged = true;
                self.integral = rate.ln();
            }
        } else if elapsed > 4.0 * theta {
            // Nothing heard for long: start again from the valve's rate.
            self.integral = rate.ln();
        } else {
            // A clock that stepped back moves nothing.
            self.integral += K_I * (level - SET_POINT) * elapsed.min(theta) / theta;
        }
        self.integral = self
            .integral
            .clamp((rate * LOWEST).ln(), (rate * HIGHEST).ln());
        if self.engaged && level >= RELEASE_LEVEL && self.integral >= rate.ln() {
            self.engaged = false;
        }
        self.level = level;
        self.seen_ms = now_ms;
    }

    /// `α` now, in units per ms per unit of weight (infinite while the
    /// valve is not saturated).
    fn alpha(&mut self, valve: &Rule, now_ms: u64) -> f64 {
        if !self.engaged {
            return f64::INFINITY;
        }
        let theta = drain_ms(valve);
        let silent = now_ms.saturating_sub(self.seen_ms) as f64;
        if silent > 4.0 * theta {
            self.engaged = false;
            return f64::INFINITY;
        }
        if silent > theta {
            // Every decision since was denied before it reached the valve
            // (by its gate, most likely): rise as if the valve were full,
            // so that no gate stays shut for want of news.
            let rate = rate_per_ms(valve);
            self.integral = (self.integral + K_I * (1.0 - SET_POINT) * (silent - theta) / theta)
                .min((rate * HIGHEST).ln());
            self.seen_ms = now_ms - theta as u64;
        }
        (self.integral + K_P * (self.level - SET_POINT)).exp()
    }
}

/// The valve's rate, in units per ms.
fn rate_per_ms(valve: &Rule) -> f64 {
    valve.limit() as f64 / valve.period_ms().max(1) as f64
}

/// `θ`: how long the valve takes to drain its capacity at its own rate, in
/// ms (at least 1).
fn drain_ms(valve: &Rule) -> f64 {
    (valve.capacity() as f64 / rate_per_ms(valve)).max(1.0)
}

/// A gate admitting `rate` units per ms with a tolerance of `tolerance_ms`
/// (at least `cost` units). A rate no request reaches (a valve not
/// saturated) is a gate of the largest limit per millisecond.
fn gate_rule(rate: f64, cost: u64, tolerance_ms: f64) -> Rule {
    let open = || {
        Rule::new(
            Algorithm::Gcra,
            i128::from(MAX_LIMIT),
            1,
            Some(i128::from(MAX_LIMIT)),
            false,
        )
        .expect("the open gate is a valid rule")
    };
    if !rate.is_finite() || rate * 1.0 >= MAX_LIMIT as f64 / 2.0 {
        return open();
    }
    let per = (PRECISION / rate).round().clamp(1.0, MAX_PERIOD_MS as f64);
    let limit = (rate * per).round().clamp(1.0, MAX_LIMIT as f64);
    let burst = (rate * tolerance_ms).ceil().max(cost as f64).max(1.0);
    // Beyond what a rule can hold (a costly request at a tiny rate), the
    // gate lets it through rather than hold it for ever.
    Rule::new(
        Algorithm::Gcra,
        limit as i128,
        per as u64,
        Some(burst.min(MAX_LIMIT as f64) as i128),
        false,
    )
    .unwrap_or_else(|_| open())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valve() -> Rule {
        Rule::new(Algorithm::Gcra, 100, 1_000, None, false).unwrap()
    }

    #[test]
    fn a_gate_admits_its_rate_within_a_thousandth() {
        for rate in [1e-6, 1e-5, 0.003, 0.03, 1.0, 250.0, 40_000.0] {
            let rule = gate_rule(rate, 1, 100.0);
            let admits = rule.limit() as f64 / rule.period_ms() as f64;
            assert!((admits - rate).abs() <= rate * 1e-3, "{rate}: {rule:?}");
            assert!(rule.burst() >= 1);
        }
        // Slower than a unit in 366 days' thousandth: the period is the
        // longest a rule has, within a few percent.
        let rule = gate_rule(1e-9, 1, 100.0);
        let admits = rule.limit() as f64 / rule.period_ms() as f64;
        assert!((admits - 1e-9).abs() <= 1e-9 * 0.05, "{rule:?}");
        // A costly request passes a gate with nothing owed.
        assert_eq!(gate_rule(0.03, 50, 100.0).burst(), 50);
        // Not saturated: no request reaches the gate's limit.
        let open = gate_rule(f64::INFINITY, 1_000_000, 100.0);
        assert_eq!(open.limit(), MAX_LIMIT);
        assert_eq!(open.period_ms(), 1);
    }

    #[test]
    fn the_law_engages_below_the_set_point_at_the_valves_rate_and_lets_go_when_full() {
        let valve = valve();
        let mut level = Level::new("v".into());
        level.observe(&valve, 0.8, 1_000);
        assert!(level.alpha(&valve, 1_000).is_infinite(), "not saturated");
        level.observe(&valve, 0.5, 1_010);
        assert!(level.engaged);
        // At the set point, α is the valve's rate: one tenant may have it all.
        let alpha = level.alpha(&valve, 1_010);
        assert!((alpha - 0.1).abs() < 1e-9, "{alpha}");
        // Draining: α falls at once (the proportional part) and keeps
        // falling (the integral).
        level.observe(&valve, 0.2, 1_110);
        let lower = level.alpha(&valve, 1_110);
        assert!(lower < 0.1 * (-8.0f64 * 0.3).exp() * 1.001, "{lower}");
        level.observe(&valve, 0.2, 1_210);
        assert!(level.alpha(&valve, 1_210) < lower);
        // Full again for long enough: released.
        for t in 0..40 {
            level.observe(&valve, 1.0, 1_300 + t * 100);
        }
        assert!(!level.engaged);
        assert!(level.alpha(&valve, 5_300).is_infinite());
    }

    #[test]
    fn a_clock_stepping_back_moves_nothing() {
        let valve = valve();
        let mut level = Level::new("v".into());
        level.observe(&valve, 0.3, 10_000);
        let before = level.integral;
        level.observe(&valve, 0.3, 5_000);
        assert_eq!(level.integral, before);
        assert!(level.alpha(&valve, 5_000).is_finite());
    }

    #[test]
    fn silence_lets_the_gates_open_and_then_forgets() {
        let valve = valve();
        let mut level = Level::new("v".into());
        level.observe(&valve, 0.0, 1_000);
        for t in 1..20 {
            level.observe(&valve, 0.0, 1_000 + t * 100);
        }
        let shut = level.alpha(&valve, 2_900);
        // No news for 2 θ: α rises as if the valve had been full.
        let opening = level.alpha(&valve, 4_900);
        assert!(opening > shut * 100.0, "{shut} → {opening}");
        // No news for over 4 θ: not saturated any more.
        assert!(level.alpha(&valve, 9_000).is_infinite());
    }
}
