//! A gate's rule for one decision (a token bucket: see the parent
//! module's "Gates"), and what its denials say and how long one may be
//! remembered.

use sluice_core::rule::{MAX_LIMIT, MAX_PERIOD_MS, MAX_SCALED};
use sluice_core::{Algorithm, BoundRule, Decision, Rule, Scope};
use smallvec::SmallVec;

use super::{PRECISION, TOLERANCE, drain_ms, rate_per_ms, valve_of};

/// The least a tenant past its share of a fair valve is told to wait.
const MIN_RETRY_MS: u64 = 1_000;

/// Makes the wait a fair-share denial gives at least a second (appendix
/// E): the gate's own wait is the time until the tenant's use falls under
/// its share at the rate of this decision, which can be a few ms, and the
/// share moves with the valve.
pub(crate) fn at_least_a_second(decision: &mut Decision<'_>) {
    use sluice_core::decision::Known;
    if decision.allowed {
        return;
    }
    // Every outcome, or the one a remembered denial names.
    let rules: SmallVec<[&BoundRule; 8]> = match decision.known() {
        Known::Every => decision.rules.iter().collect(),
        Known::Summary => decision.policy().into_iter().collect(),
        Known::Nothing => return,
    };
    for (rule, outcome) in rules.into_iter().zip(decision.outcomes.iter_mut()) {
        if rule.scope() == Scope::Share && !outcome.allowed {
            outcome.retry_after_ms = outcome.retry_after_ms.max(MIN_RETRY_MS);
        }
    }
}

/// The longest a denial of a gate is remembered (by the over-limit
/// cache), as a share of `θ`.
const REMEMBERED: f64 = 0.05;

/// How long the over-limit cache may remember a denial of gate `gate` of
/// `valve` (among `rules`, the batch's) that the store said to retry in
/// `retry_ms`: that wait, at most a twentieth of `θ`; 0 for the open gate
/// or a gate whose valve is not among the rules.
///
/// A gate's wait is at most one request's worth at its rate (its tokens
/// refill at the rate of each decision), and the rate can only rise after
/// it, with the level: `α` by at most `e^(K·t/θ)` in a time `t` from the
/// level alone, 1.8 times in `θ/20` (and more when the reference weight
/// falls, which takes the tenants saturating the valve changing). So a
/// tenant past its share, denied locally, waits at most that fraction
/// longer than its gate would have had it asked the store, within `θ/20`;
/// a tenant under its share is not denied by its gate, and is not
/// remembered. Saturated, the noisy tenants' denials are then mostly
/// answered here (measured: a 100/s valve, three tenants at 150/s beside
/// one at 10/s: 0.42 store calls per decision, from 0.99, shares as they
/// were).
pub(crate) fn remembered_wait(gate: &BoundRule, rules: &[BoundRule], retry_ms: u64) -> u64 {
    let valve = rules.iter().find(|r| valve_of(gate, r));
    match valve {
        Some(valve) if gate.rule().limit() < MAX_LIMIT => {
            retry_ms.min((REMEMBERED * drain_ms(valve.rule())) as u64)
        }
        _ => 0,
    }
}

/// A gate refilling at `rate` units per ms, holding what `saved` units per
/// ms save in a quarter of `θ` (at least `cost` units): a token bucket of
/// the valve's [`gate_per`], so that its tokens are units whatever the rate
/// (see "Gates"). A rate no request reaches (a valve not saturated, or a
/// tenant whose share is beyond what a rule of that `per` holds, many
/// times the valve's rate) is the open gate.
pub(super) fn gate_rule(rate: f64, saved: f64, cost: u64, valve: &Rule) -> Rule {
    let open = || {
        Rule::new(
            Algorithm::TokenBucket,
            i128::from(MAX_LIMIT),
            1,
            Some(i128::from(MAX_LIMIT)),
            false,
        )
        .and_then(|rule| rule.with_max_debt(0))
        .expect("the open gate is a valid rule")
    };
    let per = gate_per(valve);
    let limit = (rate * per).round().max(1.0);
    if !limit.is_finite() || limit > MAX_LIMIT as f64 || limit * per > MAX_SCALED as f64 {
        return open();
    }
    let burst = (saved.max(rate) * TOLERANCE * drain_ms(valve))
        .ceil()
        .max(cost as f64)
        .max(1.0);
    // Beyond what a rule can hold (a costly request at a tiny rate), the
    // gate lets it through rather than hold it for ever.
    let most = (MAX_SCALED as f64 / per).floor().min(MAX_LIMIT as f64);
    if burst > most {
        return open();
    }
    Rule::new(
        Algorithm::TokenBucket,
        limit as i128,
        per as u64,
        Some(burst as i128),
        false,
    )
    .and_then(|rule| rule.with_max_debt(0))
    .unwrap_or_else(|_| open())
}

/// The `per` of every gate of `valve`: the time in which the valve's rate
/// makes [`PRECISION`] units, so that a gate's `limit` (its rate times
/// this) holds a share of a ten-thousandth of the valve to about one in
/// two, of the whole valve to one in ten thousand.
pub(super) fn gate_per(valve: &Rule) -> f64 {
    (PRECISION / rate_per_ms(valve))
        .round()
        .clamp(1.0, MAX_PERIOD_MS as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valve of 100/s (θ one second).
    fn valve() -> Rule {
        Rule::new(Algorithm::Gcra, 100, 1_000, None, false).unwrap()
    }

    #[test]
    fn a_gate_refills_at_its_rate_and_keeps_what_it_saves() {
        let valve = valve();
        // One per valve: the same `per` whatever the rate, so a token is a
        // unit at any rate.
        let per = gate_rule(0.05, 0.05, 1, &valve).period_ms();
        assert_eq!(per, 100_000);
        for rate in [0.001, 0.003, 0.03, 0.1, 0.4, 25.0] {
            let rule = gate_rule(rate, rate, 1, &valve);
            assert_eq!(rule.algorithm(), Algorithm::TokenBucket);
            assert_eq!(rule.period_ms(), per);
            let admits = rule.limit() as f64 / per as f64;
            assert!((admits - rate).abs() <= rate * 1e-3, "{rate}: {rule:?}");
            // A quarter of θ at its rate.
            assert_eq!(rule.burst(), (rate * 250.0).ceil().max(1.0) as u64);
        }
        // A ten-thousandth of the valve, to about one in two.
        let tiny = gate_rule(1e-5, 1e-5, 1, &valve);
        assert_eq!(tiny.limit(), 1);
        // What it saves is read at the held level: a burst the valve
        // absorbs leaves a tenant what it had saved.
        assert_eq!(gate_rule(0.001, 0.03, 1, &valve).burst(), 8);
        // A costly request passes a gate with nothing owed.
        assert_eq!(gate_rule(0.03, 0.03, 50, &valve).burst(), 50);
        // Not saturated, or a share far beyond the valve: open.
        for open in [
            gate_rule(f64::INFINITY, f64::INFINITY, 1_000_000, &valve),
            gate_rule(1e5, 1e5, 1, &valve),
        ] {
            assert_eq!(open.limit(), MAX_LIMIT);
            assert_eq!(open.period_ms(), 1);
        }
    }

    #[test]
    fn a_gate_denial_is_remembered_for_at_most_a_twentieth_of_the_valves_period() {
        use sluice_core::{Config, Policy};
        let yaml = "default_plan: p\nplans:\n  p: {}\nglobal:\n  \"*\": [{ name: v, limit: 100, per: 1s }]\n";
        let policy = Policy::compile(&Config::from_yaml(yaml, "t").unwrap().limits);
        let rules = policy.applicable("a", "GET /", false).rules;
        let gate = rules.iter().find(|r| r.scope() == Scope::Share).unwrap();
        // 40/s: its own wait (25 ms), or 50 ms.
        let at = |rate: f64| gate.with_rule(gate_rule(rate, rate, 1, &valve()));
        assert_eq!(remembered_wait(&at(0.04), rules, 25), 25);
        assert_eq!(remembered_wait(&at(0.04), rules, 800), 50);
        // Whatever it had saved.
        let saved = gate.with_rule(gate_rule(0.001, 0.3, 1, &valve()));
        assert_eq!(remembered_wait(&saved, rules, 800), 50);
        // The open gate: not remembered at all.
        assert_eq!(remembered_wait(&at(f64::INFINITY), rules, 5), 0);
    }
}
