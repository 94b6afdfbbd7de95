//! A fair valve's reserves (appendix E's `reserve`), compiled: the valve's
//! limit split into a part held for each reserved plan and the rest, each
//! part a bucket of its own. Which part a request draws from is the
//! limiter's choice, per decision (see the store crate's `limiter::fair`).

use crate::bound::BoundRule;
use crate::config::share::ValveShare;
use crate::rule::Rule;

/// The reserves of one valve among a request's rules. The valve's rule
/// there is what is left of it once every reserve is taken out.
#[derive(Debug, Clone)]
pub struct Reserves {
    /// Where the valve is among the rules.
    pub valve: usize,
    /// Each reserved plan's part, in the order the reserves are written.
    pub parts: Box<[BoundRule]>,
    /// The part held for the request's plan, if it has one.
    pub own: Option<usize>,
}

/// Splits `valve` (a fair valve of a cell of plan `plan`) by its reserves:
/// `valve` becomes what is left, and the parts are returned. `None` (and
/// `valve` unchanged) when it reserves nothing.
pub(crate) fn split(
    valve: &mut BoundRule,
    index: usize,
    share: &ValveShare,
    plan: &str,
) -> Option<Reserves> {
    if share.reserve.is_empty() {
        return None;
    }
    let whole = *valve.rule();
    let mut parts = Vec::with_capacity(share.reserve.len());
    let (mut limit, mut burst) = (whole.limit(), whole.burst());
    for reserve in &share.reserve {
        // Validated: each part holds at least a unit, all below the whole.
        let rule = whole.scaled(reserve.fraction).ok()?;
        limit = limit.checked_sub(rule.limit())?;
        burst = burst.checked_sub(rule.burst())?;
        parts.push(BoundRule::reserve_part(valve, &reserve.plan, rule));
    }
    let rest = Rule::new(
        whole.algorithm(),
        i128::from(limit),
        whole.period_ms(),
        whole.algorithm().has_burst().then_some(i128::from(burst)),
        whole.aligned(),
    )
    .ok()?;
    *valve = valve.with_rule(rest);
    Some(Reserves {
        valve: index,
        own: share.reserve.iter().position(|r| r.plan == plan),
        parts: parts.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NamedRule;
    use crate::config::share::{Reserve, Share};
    use crate::rule::Algorithm;
    use crate::scope::Scope;

    fn valve(limit: i128, burst: i128) -> BoundRule {
        let rule = Rule::new(Algorithm::TokenBucket, limit, 1_000, Some(burst), false).unwrap();
        let named = NamedRule {
            name: "v".into(),
            rule,
            shadow: false,
            count_if: None,
            tolerance: crate::tolerance::Tolerance::EXACT,
            regions: None,
        };
        BoundRule::new(Scope::Global, "/v1/orders", &named, 0.8)
    }

    fn share(reserve: &[(&str, f64)]) -> ValveShare {
        ValveShare {
            pattern: "/v1/orders".into(),
            name: "v".into(),
            share: Share::Fair,
            reserve: reserve
                .iter()
                .map(|&(plan, fraction)| Reserve {
                    plan: plan.into(),
                    fraction,
                })
                .collect(),
            adaptive: None,
        }
    }

    #[test]
    fn the_parts_add_up_to_the_valve_and_each_has_its_own_state() {
        let mut rest = valve(101, 150);
        let whole = rest.clone();
        let reserves =
            split(&mut rest, 3, &share(&[("gold", 0.2), ("ent", 0.05)]), "ent").expect("reserves");
        assert_eq!(reserves.valve, 3);
        assert_eq!(reserves.own, Some(1));
        let limits: Vec<u64> = reserves.parts.iter().map(|p| p.rule().limit()).collect();
        let bursts: Vec<u64> = reserves.parts.iter().map(|p| p.rule().burst()).collect();
        assert_eq!(limits, [20, 5]);
        assert_eq!(bursts, [30, 7]);
        assert_eq!(rest.rule().limit(), 101 - 25);
        assert_eq!(rest.rule().burst(), 150 - 37);
        // What is left keeps the valve's state; each part has its own.
        assert_eq!(rest.identity(), whole.identity());
        for part in reserves.parts.iter() {
            assert_ne!(part.identity(), whole.identity());
            assert_eq!(part.name(), "v", "a part's denial names the valve");
            assert_eq!(part.scope(), Scope::Global);
        }
        assert_ne!(reserves.parts[0].uid(), reserves.parts[1].uid());
        // Another plan's cell: the same parts, none its own.
        let mut other = valve(101, 150);
        let theirs = split(
            &mut other,
            3,
            &share(&[("gold", 0.2), ("ent", 0.05)]),
            "free",
        )
        .unwrap();
        assert_eq!(theirs.own, None);
        assert_eq!(theirs.parts[0].identity(), reserves.parts[0].identity());
        // No reserve: the valve as it was.
        let mut plain = valve(101, 150);
        assert!(split(&mut plain, 3, &share(&[]), "ent").is_none());
        assert_eq!(plain.rule().limit(), 101);
    }
}
