//! Fair valves: a saturated global valve shared max-min fairly between the
//! tenants that want it, each weighted by its plan's `weight`.
//!
//! # The mechanism
//!
//! A valve stays what it was: a bucket all tenants draw from, exact. What
//! is added is a *gate* per tenant and valve ([`Scope::Share`]): a
//! `token_bucket` rule in the tenant's own partition (so in the tenant's slot on Redis
//! Cluster, decided in the same call as the tenant's other rules), whose
//! rate this module sets for each decision to
//!
//! ```text
//! ρᵢ = wᵢ · α / shardsᵢ        (units per millisecond)
//! ```
//!
//! where `wᵢ` is the tenant's plan weight, `shardsᵢ` its number of shards
//! (its decisions are spread over them, so a sharded tenant counts as one)
//! and `α` the valve's *fair-share level* per unit of weight, kept per
//! valve by each instance (the law below gives it per unit of a reference
//! weight: see "Weights").
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
//! capacity, in `[0, 1]`, as every decision that asks it finds it). A
//! valve drains while the gates let through more than `C` and refills
//! while they let through less. `α` is a fixed function of the level:
//!
//! ```text
//! α(ℓ) = C · e^(K·(ℓ − T)),        K = 12,  T = 0.6
//! ```
//!
//! With time measured in `θ`, the time the valve takes to drain at its own
//! rate (`capacity × per / limit`: one second for `limit: N, per: 1s` and
//! the default burst), the level moves as `dℓ/d(t/θ) = 1 − A(α(ℓ))/C`,
//! where `A(α) = Σ min(dᵢ, wᵢ·α)` is what the gates let through. `A`
//! grows with `α` and `α` with `ℓ`, so the level settles where `A = C`,
//! at `ℓ* = T + ln(α*/C)/K` for the fair level `α*`, and returns there
//! after any change at the rate `a·K` per `θ` (`a ≤ 1`, the share of the
//! valve's rate going to gated tenants): within a twelfth of `θ` when all
//! of it is gated, within about `θ` in any case that matters. The level
//! used is the one the latest decision found (before its own units: on a
//! valve split into small keys one unit is much of a key), refilled at the
//! valve's rate for the time since.
//!
//! The level mixes two things, a rate above `C` (saturation, which it is
//! read for) and a burst the valve absorbs (what a valve's burst is for).
//! A herd of tenants asking in step (a cron job on each) takes much of the
//! valve in one millisecond and is gone; the level then says saturated
//! for as long as the valve takes to refill, and a gate's rate falls to a
//! fraction of its share, though nobody asks more than its share
//! (measured: 80 tenants at 1/s in step beside one at 10/s on a 100/s
//! valve, 30% of the polite one's requests denied). What a tenant had
//! saved is what carries it through: see "Gates".
//!
//! What is between `ℓ*` and empty is the room a tenant under its share
//! draws on: the valve denies it only when that room is gone. The room
//! shrinks with the number of saturating tenants (`n` equal ones:
//! `α* = C/n`, `ℓ* = 0.6 − ln(n)/12`): 0.5 of the valve for 3, 0.22 for
//! 100, none left past about 1,300, where the valve is first come again
//! among them (and a tenant under its share may be denied while the level
//! touches empty).
//!
//! Why no integral term, which would hold `ℓ` at `T` whatever `n`: every
//! instance keeps its own `α`, read off the same shared level. A fixed
//! function of the level gives every instance the same `α` from the same
//! valve; integrals would each sum their own samples of it, and with
//! nothing to pull them together, drift apart (measured: one instance's
//! gates shut while another's opened).
//!
//! - **Work-conserving**: at `ℓ ≥ T`, `α ≥ C` and no gate holds anyone
//!   back; a tenant alone is held at `α = C`, the whole valve, at `ℓ = T`.
//! - **Adapting**: tenants joining or leaving move the level, and `α` with
//!   it, within about one `θ` (bounded below by the rate decisions come
//!   in: the level is read from their answers). An instance that hears
//!   nothing from a valve counts it as refilling at its rate: a gate never
//!   stays shut because the decisions that would have told were denied.
//! - **Bounded**: the valve's own limit is never exceeded (its bucket is
//!   still exact); fairness only chooses who gets its units.
//! - **Sharded valves** (Redis Cluster's `global_shards`): the limiter
//!   chooses the key each decision uses (as if at random: see
//!   [`scatter`](crate::store::scatter)) and keeps the level last found on
//!   each; the valve's level is their mean, so one `α` per valve (not per
//!   key) is read off the whole valve.
//!
//! # Weights
//!
//! The law reads `α̂`, a rate per unit of a *reference weight* `w_ref`,
//! off the level, and the gates admit `α = α̂ / w_ref` per unit of
//! weight: `ρᵢ = (wᵢ / w_ref) · α̂`. The reference is the heaviest weight
//! among the tenants whose gates held them back (and nothing of their
//! own: a tenant its own limit holds does not saturate the valve) over
//! the last half to whole `θ`: the saturating ones. While nobody is held
//! back it is the heaviest among those that asked; while nobody asks, as
//! last known (1 at first). Each instance keeps it per valve beside the
//! level.
//!
//! Why: the level spans a fixed range of `α̂` (`C·e^−7.2` at empty to the
//! `4C` that opens every gate), and weights span a million (0.001 to
//! 1000). Read per unit of weight 1, weights all ×1000 put every gate
//! 1000 times above its share (the valve, emptied, first come: a polite
//! tenant denied 0–99%), all ×0.01 held every gate under `4C·0.01` (60–71%
//! denied), and a mix left the light ones' share out of reach. Per unit of
//! the heaviest saturating weight, every weight ×k changes nothing, and
//! `α̂* = (C − what the others take) / Σ_saturating (wᵢ/w_ref) ≤ C`
//! (the heaviest counts 1): the fair level is always where the level can
//! settle, at `ℓ* ≤ T`, whatever the mix; the room argued above is that of
//! `n` saturating tenants of the reference's weight, and more room with
//! lighter ones beside them. A tenant lighter than the reference by far
//! has, rightly, a share lighter by as much.
//!
//! It corrects itself. A reference too heavy (the heavy tenant stopped)
//! holds the light ones back, and they become it within a `θ`. A
//! reference too light (a heavy tenant starts saturating) leaves heavy
//! gates loose, and the valve drains: up to about 200 times the
//! reference (`e^(K·ℓ*)`), the level falls until the heavy gates hold
//! and the heavy tenants become the reference; beyond, not even an empty
//! valve's `α̂` holds them, so a valve that stays empty (5% full or less)
//! for two `θ` (longer than a heavy tenant's own burst drains it) raises
//! the reference to the heaviest that asked (measured: light tenants of
//! weight 0.001 saturating, two of weight 1000 join at 4 s and a polite
//! one of 1000 beside them; the reference is theirs at 6.5 s, the polite
//! one spared from then on). Meanwhile the valve is first come between
//! those heavy tenants, and exact. Instances agree as long as each sees
//! the tenants that saturate (as a load balancer spreading each tenant's
//! requests gives); an instance that sees none of them keeps its own,
//! heavier or lighter, until it does.
//!
//! # Reserves
//!
//! A valve may hold a part of itself for a plan (`reserve: { plan: "n%" }`,
//! compiled in [`sluice_core::valve`]): each reserve is a bucket of its own
//! (`n%` of the limit and burst), the valve's rule what is left. Each part
//! has its own level and `α`, found as above. A request of a reserved plan
//! draws on its reserve while this instance knows it to have room for the
//! request, else on the rest; its gate admits `wᵢ · (α_rest + α_reserve)`,
//! so its plan's tenants share their reserve fairly between them and the
//! rest with everyone. Anyone draws on a reserve at least [`BORROW`] full
//! (and fuller than the rest): a reserve its plan leaves idle fills, and
//! is then used by others, who keep it from falling under `BORROW`, while
//! the plan's gates stay open above about `ℓ = 0.72` (`α ≥ 4C`): borrowers
//! never hold the plan back. So the plan's tenants together get at least
//! `min(demand, reserve)`, the others at least the rest, and nothing is
//! left unused while someone wants it. The valve's limit holds: the parts
//! add up to it.
//!
//! # Gates
//!
//! A gate is a token bucket: it refills at `ρᵢ` and holds what `ρᵢ`
//! saves in a quarter of `θ` (at least the request's cost, so a costly
//! request passes a gate with nothing owed). A gate whose valve is not
//! saturated is open (a rate no request reaches). Every gate of a valve
//! has the same `per` ([`bucket::gate_per`]: the time the valve makes 10,000 units
//! in), so that its tokens, stored as `tokens × per`, are units whatever
//! the rate: a gate's rate changes with every decision, and what it
//! holds must mean the same at the next one.
//!
//! - **A gate never owes.** Its state is the units the tenant has left,
//!   refilled at the rate of the decision that reads it. A `gcra` gate
//!   kept a `TAT`, a time: a unit taken while the valve was nearly empty
//!   (`α` down to `C·e^−7.2`, 0.075/s of a 100/s valve) put it seconds
//!   ahead, and read at the rate of a moment later, when the valve had
//!   refilled, that distance was debt (measured: a tenant asking 1/s of a
//!   33/s share, 7 of 15 denied, told to wait 6.5 s). A token spent at any
//!   rate is one unit, refilled at the next rate: a tenant under its share
//!   is back within one of its units at that rate.
//! - **The rate is read off the level now; what a gate may hold, off the
//!   level before a burst.** A burst takes the valve's units at once, and
//!   saturation at what the gates let through beyond `C`, a small multiple
//!   of `C` at most. So the highest level found, less what the valve's own
//!   rate would have drained of it since ([`Level::held`](level)), is the
//!   level before a burst until the refilling valve passes it, and within
//!   the last fluctuation of the level now under saturation. A gate's
//!   burst is a quarter of `θ` at the `α` of that held level, at most
//!   `α(T) = C` per unit of the reference: a tenant that had saved its
//!   units (one asking under its share) keeps them through a herd's dip and
//!   spends them there, while one that spends its units as they come (one
//!   past its share) is refilled at the rate of the level now and held to
//!   it. (Reading the rate itself off the held level held the gates open
//!   while one tenant sent in clumps: the valve emptied, a polite tenant
//!   was denied 3.5–5% under wall-clock load and another 4 of 4.)
//! - A gate's `limit` (its rate × `per`) holds a share down to a
//!   ten-thousandth of the valve to about one in two, and up to many times
//!   the valve (past what a rule holds, the gate is open: no share that
//!   large binds).

use std::hash::BuildHasherDefault;
use std::sync::Arc;

use sluice_core::policy::Applicable;
use sluice_core::valve::Reserves;
use sluice_core::{BoundRule, Decision, Rule, Scope};
use smallvec::SmallVec;

use crate::bucket::PassThrough;

mod bucket;
mod level;
use bucket::gate_rule;
pub(crate) use bucket::{at_least_a_second, remembered_wait};
use level::Level;

/// The level at which `α` is the valve's rate.
const SET_POINT: f64 = 0.6;
/// How steeply `α` follows the level.
const K: f64 = 12.0;
/// `α` at or above this multiple of the valve's rate holds nobody back.
const OPEN: f64 = 4.0;
/// A gate's tolerance, as a share of `θ`.
pub(super) const TOLERANCE: f64 = 0.25;
/// How many units a gate's `limit` counts for the valve's whole rate (see
/// [`bucket::gate_per`]).
pub(super) const PRECISION: f64 = 10_000.0;

/// Each fair valve's level, as this instance knows it.
#[derive(Default)]
pub(crate) struct FairShares {
    /// By the valve's uid: a digest already, passed through unhashed.
    valves: papaya::HashMap<u64, parking_lot::Mutex<Level>, BuildHasherDefault<PassThrough>>,
    /// Numbers decisions, for their valve turns.
    decisions: std::sync::atomic::AtomicU64,
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

/// Where a request's gates and their valves are among its rules, and
/// which key of each split valve it uses.
pub(crate) struct Gates {
    /// (gate index, valve index) per fair valve.
    pairs: SmallVec<[(usize, usize); 2]>,
    /// Per fair valve, the reserve part the request draws from instead of
    /// the valve's rest (see [`sluice_core::valve`]).
    parts: SmallVec<[Option<BoundRule>; 2]>,
    /// The decision's [`Batch::valve_turn`](crate::Batch::valve_turn).
    pub(crate) turn: u64,
    /// The tenant's plan weight.
    weight: f64,
}

impl FairShares {
    /// `rules` (those of `applicable`, perhaps with more after them) with
    /// each gate at the rate its valve's level gives this request's
    /// tenant, each valve with reserves as the part the request draws
    /// from, and where the gates are.
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
        let mut parts = SmallVec::new();
        let valves = self.valves.pin();
        let n = self
            .decisions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut turn = crate::store::scatter(n ^ self.seed());
        let mut first = true;
        let level = |rule: &BoundRule| {
            valves
                .get(&rule.uid())
                .map_or(1.0, |l| l.lock().now(rule.rule(), now_ms))
        };
        // (α now, α a gate may have saved) per part of a valve.
        let alpha = |rule: &BoundRule| {
            valves
                .get(&rule.uid())
                .map_or((f64::INFINITY, f64::INFINITY), |l| {
                    let l = l.lock();
                    (
                        l.alpha(rule.rule(), now_ms),
                        l.alpha_saved(rule.rule(), now_ms),
                    )
                })
        };
        for (g, gate) in rules.iter().enumerate() {
            if gate.scope() != Scope::Share {
                continue;
            }
            let Some(v) = rules.iter().position(|r| valve_of(gate, r)) else {
                continue;
            };
            let valve = &rules[v];
            let (mut share, mut saved) = alpha(valve);
            let mut part = None;
            if let Some(reserves) = applicable.reserves.iter().find(|r| r.valve == v) {
                part = choose(reserves, valve, cost, level).cloned();
                // A reserved plan's tenants share their part as well as
                // the rest of the valve.
                if let Some(own) = reserves.own {
                    let (own_share, own_saved) = alpha(&reserves.parts[own]);
                    share += own_share;
                    saved += own_saved;
                }
            }
            let drawn = part.as_ref().unwrap_or(valve);
            if std::mem::take(&mut first)
                && let Some(level) = valves.get(&drawn.uid())
            {
                turn = level.lock().fullest(drawn.rule(), now_ms, turn);
            }
            let rate = share * weight / shards;
            let saved = saved * weight / shards;
            gated[g] = gate.with_rule(gate_rule(rate, saved, cost, valve.rule()));
            if let Some(part) = &part {
                gated[v] = part.clone();
            }
            pairs.push((g, v));
            parts.push(part);
        }
        (
            gated,
            Gates {
                pairs,
                parts,
                turn,
                weight,
            },
        )
    }

    /// Learns each fair valve's level from `decision`, when it is known: a
    /// decision the store made in full (admitted, or denied by the valve
    /// itself; a request another rule denied may not have reached the
    /// valve). `valve_parts` is how many keys each valve is split over.
    pub(crate) fn observe(
        &self,
        gates: &Gates,
        decision: &Decision<'_>,
        cost: u64,
        valve_parts: u64,
        now_ms: u64,
    ) {
        if decision.degraded.is_some() || decision.known() != sluice_core::decision::Known::Every {
            return;
        }
        let valves = self.valves.pin();
        let own_rules_allow =
            decision
                .rules
                .iter()
                .zip(decision.outcomes.iter())
                .all(|(rule, outcome)| {
                    outcome.allowed || matches!(rule.scope(), Scope::Global | Scope::Share)
                });
        for (&(g, v), part) in gates.pairs.iter().zip(&gates.parts) {
            let valve = part.as_ref().unwrap_or(&decision.rules[v]);
            let entry = valves.get_or_insert_with(valve.uid(), || {
                parking_lot::Mutex::new(Level::new(valve.name().into(), part.is_some()))
            });
            // Held back by its gate, and by nothing of its own (a tenant
            // its own limit holds does not saturate the valve).
            let held_back = !decision.outcomes[g].allowed && own_rules_allow;
            entry
                .lock()
                .asked(valve.rule(), gates.weight, held_back, now_ms);
            let outcome = &decision.outcomes[v];
            if !decision.allowed && outcome.allowed {
                continue;
            }
            let keys = valve.rule().shares(valve_parts);
            let enforced = valve.rule().share(keys);
            // The level the request found: what it took counts as still
            // there (on a valve split into small keys, one unit is much of
            // a key, and every sight after an admission would read low).
            let found = u64::from(outcome.remaining) + if outcome.allowed { cost } else { 0 };
            let level = (found as f64 / enforced.capacity() as f64).clamp(0.0, 1.0);
            let key = (gates.turn % keys) as usize;
            entry
                .lock()
                .observe(valve.rule(), key, keys as usize, level, now_ms);
        }
    }

    /// What makes this instance's turns its own.
    fn seed(&self) -> u64 {
        std::ptr::from_ref(self) as u64 ^ u64::from(std::process::id()).rotate_left(32)
    }

    /// Every valve this instance has seen, for the metrics.
    pub(crate) fn levels(&self, now_ms: u64) -> Vec<ValveLevel> {
        self.valves
            .pin()
            .values()
            .map(|level| level.lock())
            .filter(|level| !level.reserve)
            .map(|level| {
                let alpha = level.alpha(&level.valve, now_ms);

                ValveLevel {
                    valve: level.name.clone(),
                    saturated: alpha.is_finite(),
                    level_per_second: alpha * 1_000.0,
                }
            })
            .collect()
    }
}

/// A reserve part at least this full is idle enough for others to draw
/// on: above the level at which its own plan's gates open (`α ≥ 4C` from
/// `ℓ ≈ 0.72`), so borrowers never hold the plan back.
const BORROW: f64 = 0.8;

/// The part of a valve with reserves that a request draws from, `None`
/// for the valve's rest: its plan's own part while that has room for it;
/// else another plan's part that is idle (at least [`BORROW`] full, and
/// fuller than the rest), so that idle reserves serve everyone; else the
/// rest. `level` is a part's fill level as this instance knows it.
fn choose<'r>(
    reserves: &'r Reserves,
    rest: &BoundRule,
    cost: u64,
    level: impl Fn(&BoundRule) -> f64,
) -> Option<&'r BoundRule> {
    if let Some(own) = reserves.own.map(|i| &reserves.parts[i])
        && level(own) * own.rule().capacity() as f64 >= cost as f64
    {
        return Some(own);
    }
    let floor = level(rest).max(BORROW);
    reserves
        .parts
        .iter()
        .enumerate()
        .filter(|&(i, _)| Some(i) != reserves.own)
        .map(|(_, part)| (level(part), part))
        .filter(|&(l, _)| l >= floor)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, part)| part)
}

/// Whether `rule` is the valve `gate` is the gate of.
pub(super) fn valve_of(gate: &BoundRule, rule: &BoundRule) -> bool {
    rule.scope() == Scope::Global && rule.name() == gate.name() && rule.pattern() == gate.pattern()
}

/// The valve's rate, in units per ms.
pub(super) fn rate_per_ms(valve: &Rule) -> f64 {
    valve.limit() as f64 / valve.period_ms().max(1) as f64
}

/// `θ`: how long the valve takes to drain its capacity at its own rate, in
/// ms (at least 1).
pub(super) fn drain_ms(valve: &Rule) -> f64 {
    (valve.capacity() as f64 / rate_per_ms(valve)).max(1.0)
}
