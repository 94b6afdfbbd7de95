//! `share:` and `reserve:` on valve rules, and `weight:` on plans.

use std::collections::BTreeMap;

use serde_saphyr::Location;

use super::super::raw::{RawAdaptive, RawRule, S};
use super::super::share::{MAX_WEIGHT, MIN_WEIGHT, Reserve, Share, ValveShare, percent};
use super::Validator;
use crate::config::{PlanSpec, RouteRules};

/// How a valve rule is shared, as written, before the rule itself is read.
struct Written {
    /// `None` when not written: the default for the valve's algorithm.
    share: Option<Share>,
    /// Where `share` was written, when it was.
    share_at: Option<Location>,
    /// `reserve`: each plan's fraction and where it was written.
    reserve: Vec<(Reserve, Location)>,
    reserve_at: Location,
    /// `adaptive`, read once the rule is.
    adaptive: Option<S<RawAdaptive>>,
}

/// Where each reserved plan was named, to be checked once plans are read.
pub(in crate::config) struct Reserved(Vec<(String, Location)>);

impl Validator<'_> {
    /// The `global` table: its rules, and how each valve is shared. `share`
    /// and `reserve` are taken off each raw rule before the rule itself is
    /// read.
    pub(super) fn global_table(
        &mut self,
        mut table: BTreeMap<String, S<Vec<S<RawRule>>>>,
    ) -> (Vec<RouteRules>, Vec<ValveShare>, Reserved) {
        let mut written: Vec<Vec<Written>> = Vec::with_capacity(table.len());
        for rules in table.values_mut() {
            let list = rules
                .value
                .iter_mut()
                .map(|rule| self.written(&mut rule.value))
                .collect();
            written.push(list);
        }
        let rules = self.route_table(table, "global");
        let mut valves = Vec::new();
        let mut reserved = Vec::new();
        for (route, written) in rules.iter().zip(written) {
            // A rule refused above leaves the lists unpaired; the
            // configuration is refused anyway.
            if route.rules.len() != written.len() {
                continue;
            }
            for (rule, written) in route.rules.iter().zip(written) {
                let share = self.valve_share(rule, &written);
                let mut reserve = Vec::with_capacity(written.reserve.len());
                if !written.reserve.is_empty() {
                    let at = written.reserve_at;
                    let algorithm = rule.rule.algorithm();
                    if rule.rule.is_concurrency() {
                        self.push(at, "`reserve` is for valves of a rate, not `concurrency` valves (they are first come)");
                    } else if !algorithm.refills() {
                        self.push(
                            at,
                            format!(
                                "`reserve` needs a fair valve, of `algorithm: gcra` or `token_bucket`; valve `{}` is `{}` (first come): change its algorithm or drop the reserve",
                                rule.name,
                                algorithm.name()
                            ),
                        );
                    } else if written.share == Some(Share::FirstCome) {
                        let at = written.share_at.unwrap_or(at);
                        self.push(
                            at,
                            "`reserve` needs a fair valve: drop `share: first_come` or the reserve",
                        );
                    }
                    let total: f64 = written.reserve.iter().map(|(r, _)| r.fraction).sum();
                    if total >= 1.0 {
                        self.push(
                            at,
                            format!(
                                "the reserves of valve `{}` add up to {}%: together they must stay below 100%",
                                rule.name,
                                crate::number::shown(total * 100.0)
                            ),
                        );
                    }
                    for (part, at) in written.reserve {
                        let units = |v: u64| (v as f64 * part.fraction).floor();
                        if units(rule.rule.limit()) < 1.0 || units(rule.rule.burst()) < 1.0 {
                            self.push(
                                at,
                                format!(
                                    "`reserve.{}` holds less than one unit of valve `{}` (limit {}, burst {}): reserve a larger part or raise the limit",
                                    part.plan,
                                    rule.name,
                                    rule.rule.limit(),
                                    rule.rule.burst()
                                ),
                            );
                        }
                        reserved.push((part.plan.clone(), at));
                        reserve.push(part);
                    }
                }
                let adaptive = written.adaptive.and_then(|a| self.adaptive(rule, a));
                valves.push(ValveShare {
                    pattern: route.pattern.source(),
                    name: rule.name.clone(),
                    share,
                    reserve,
                    adaptive,
                });
            }
        }
        (rules, valves, Reserved(reserved))
    }

    /// Takes `share` and `reserve` off a valve rule (and refuses what a
    /// valve never has: debt, counting by outcome).
    fn written(&mut self, rule: &mut RawRule) -> Written {
        if let Some(debt) = rule.max_debt.take() {
            self.push(
                debt.referenced,
                "`max_debt` is not for valves (rules under `global`): a valve never goes into debt",
            );
        }
        if let Some(count_if) = rule.count_if.take() {
            self.push(
                count_if.referenced,
                "`count_if` is not for valves (rules under `global`): a valve counts every request it admits",
            );
        }
        let share_at = rule.share.as_ref().map(|s| s.referenced);
        let share = match rule.share.take() {
            None => None,
            Some(s) if s.value == "fair" => Some(Share::Fair),
            Some(s) if s.value == "first_come" => Some(Share::FirstCome),
            Some(s) => {
                self.push(
                    s.referenced,
                    format!(
                        "`share` must be `fair` (the default on `gcra` and `token_bucket` valves) or `first_come`, got `{}`",
                        s.value
                    ),
                );
                None
            }
        };
        let raw = rule.reserve.take();
        let reserve_at = raw.as_ref().map_or(Location::UNKNOWN, |r| r.referenced);
        let mut reserve = Vec::new();
        for (plan, written) in raw.map(|r| r.value).unwrap_or_default() {
            match percent(&written.value) {
                Some(fraction) if fraction > 0.0 && fraction < 1.0 => {
                    reserve.push((Reserve { plan, fraction }, written.referenced));
                }
                _ => self.push(
                    written.referenced,
                    format!(
                        "`reserve.{plan}` must be a percent above 0% and below 100%, written like \"20%\", got `{}`",
                        written.value
                    ),
                ),
            }
        }
        Written {
            share,
            share_at,
            reserve,
            reserve_at,
            adaptive: rule.adaptive.take(),
        }
    }

    /// How valve `rule` is shared: as written, or its algorithm's default.
    /// Fair needs a level that refills at the valve's rate (see
    /// [`Algorithm::refills`](crate::Algorithm::refills)): `gcra` and
    /// `token_bucket` valves are fair by default, window and concurrency
    /// valves first come, and `share: fair` on those is refused.
    fn valve_share(&mut self, rule: &crate::config::NamedRule, written: &Written) -> Share {
        let algorithm = rule.rule.algorithm();
        match written.share {
            Some(Share::Fair) if !algorithm.refills() => {
                let at = written.share_at.unwrap_or(Location::UNKNOWN);
                self.push(
                    at,
                    format!(
                        "`share: fair` needs a valve of `algorithm: gcra` or `token_bucket` (its room comes back at its rate); valve `{}` is `{}`, which is first come: drop `share` or change its algorithm",
                        rule.name,
                        algorithm.name()
                    ),
                );
                Share::FirstCome
            }
            Some(share) => share,
            None if algorithm.refills() => Share::Fair,
            None => Share::FirstCome,
        }
    }

    /// Each plan a valve reserves for must be defined.
    pub(super) fn reserved_plans(&mut self, reserved: Reserved, plans: &[PlanSpec]) {
        for (plan, at) in reserved.0 {
            if !plans.iter().any(|p| p.name == plan) {
                let list = plans
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ");
                self.push(
                    at,
                    format!("`reserve` names unknown plan `{plan}`; defined plans: {list}"),
                );
            }
        }
    }

    /// A plan's `weight`: its tenants' share of a saturated valve.
    pub(super) fn weight(&mut self, raw: Option<&S<f64>>) -> f64 {
        match raw {
            None => 1.0,
            Some(w) if (MIN_WEIGHT..=MAX_WEIGHT).contains(&w.value) => w.value,
            Some(w) => {
                self.push(
                    w.referenced,
                    format!(
                        "`weight` must be a number from {MIN_WEIGHT} to {MAX_WEIGHT} (default 1), got {}",
                        crate::number::shown(w.value)
                    ),
                );
                1.0
            }
        }
    }

    /// `share`, `reserve` and `adaptive` are a valve's: refused on a rule
    /// of another scope.
    pub(super) fn no_share(&mut self, rule: &RawRule, scope: &str) {
        if let Some(s) = &rule.share {
            self.push(
                s.referenced,
                format!("`share` is only for valves (rules under `global`), not {scope} rules"),
            );
        }
        if let Some(r) = &rule.reserve {
            self.push(
                r.referenced,
                format!("`reserve` is only for valves (rules under `global`), not {scope} rules"),
            );
        }
        if let Some(a) = &rule.adaptive {
            self.push(
                a.referenced,
                format!("`adaptive` is only for valves (rules under `global`), not {scope} rules"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::config::tests::single_error;

    #[test]
    fn share_is_for_valves_and_weight_has_its_range() {
        let base = "default_plan: p\nplans:\n  p:\n";
        let valve = |share: &str| {
            format!(
                "{base}    weight: 2\nglobal:\n  \"*\": [{{ name: v, limit: 100, per: 1s, share: {share} }}]\n"
            )
        };
        let config = Config::from_yaml(&valve("first_come"), "t.yaml").unwrap();
        assert_eq!(
            config.limits.share_of("*", "v"),
            crate::config::share::Share::FirstCome
        );
        assert_eq!(config.limits.plans[0].weight, 2.0);
        let fair = Config::from_yaml(&valve("fair"), "t.yaml").unwrap();
        assert_eq!(
            fair.limits.share_of("*", "v"),
            crate::config::share::Share::Fair
        );
        assert!(
            single_error(&valve("fifo"))
                .contains("`share` must be `fair` (the default on `gcra` and `token_bucket` valves) or `first_come`, got `fifo`")
        );
        let on_tenant = format!("{base}    tenant: [{{ limit: 10, per: 1s, share: fair }}]\n");
        assert!(
            single_error(&on_tenant).contains("`share` is only for valves"),
            "{on_tenant}"
        );
        for weight in ["0", "-1", "1001", "0.0001"] {
            let yaml = format!("{base}    weight: {weight}\n");
            assert!(
                single_error(&yaml).contains("`weight` must be a number from 0.001 to 1000"),
                "{weight}"
            );
        }
    }

    #[test]
    fn window_and_concurrency_valves_are_first_come_and_refuse_share_fair() {
        use crate::config::share::Share;
        let valve = |algorithm: &str, extra: &str| {
            let per = if algorithm == "concurrency" {
                "lease: 30s"
            } else {
                "per: 1s"
            };
            format!(
                "default_plan: p\nplans:\n  p: {{}}\nglobal:\n  \"*\": [{{ name: v, algorithm: {algorithm}, limit: 100, {per}{extra} }}]\n"
            )
        };
        for algorithm in ["gcra", "token_bucket"] {
            let config = Config::from_yaml(&valve(algorithm, ""), "t.yaml").unwrap();
            assert_eq!(config.limits.share_of("*", "v"), Share::Fair, "{algorithm}");
        }
        for algorithm in [
            "fixed_window",
            "sliding_window",
            "sliding_log",
            "concurrency",
        ] {
            // Unwritten: first come, the whole valve (what it was before fair
            // valves, and what it keeps on upgrade).
            let config = Config::from_yaml(&valve(algorithm, ""), "t.yaml").unwrap();
            assert_eq!(
                config.limits.share_of("*", "v"),
                Share::FirstCome,
                "{algorithm}"
            );
            let written = Config::from_yaml(&valve(algorithm, ", share: first_come"), "t.yaml");
            assert!(written.is_ok(), "{algorithm}");
            let error = single_error(&valve(algorithm, ", share: fair"));
            assert!(
                error.contains(&format!(
                    "`share: fair` needs a valve of `algorithm: gcra` or `token_bucket` (its room comes back at its rate); valve `v` is `{algorithm}`, which is first come: drop `share` or change its algorithm"
                )),
                "{algorithm}: {error}"
            );
        }
        let reserved = valve("sliding_window", ", reserve: { p: \"10%\" }");
        let error = single_error(&reserved);
        assert!(
            error.contains("`reserve` needs a fair valve, of `algorithm: gcra` or `token_bucket`; valve `v` is `sliding_window` (first come)"),
            "{error}"
        );
    }

    #[test]
    fn a_reserve_names_plans_and_leaves_part_of_the_valve() {
        let valve = |extra: &str| {
            format!(
                "default_plan: free\nplans:\n  free: {{}}\n  ent: {{}}\n  gold: {{}}\nglobal:\n  \"/v1/orders\": [{{ name: v, limit: 100, per: 1s{extra} }}]\n"
            )
        };
        let config = Config::from_yaml(
            &valve(", reserve: { ent: \"20%\", gold: \"5.5%\" }"),
            "t.yaml",
        )
        .unwrap();
        let share = config.limits.valve("/v1/orders", "v").unwrap();
        let reserved: Vec<(&str, f64)> = share
            .reserve
            .iter()
            .map(|r| (r.plan.as_str(), r.fraction))
            .collect();
        assert_eq!(reserved, [("ent", 0.2), ("gold", 0.055)]);
        for (extra, said) in [
            (
                ", reserve: { ent: \"20\" }",
                "`reserve.ent` must be a percent above 0% and below 100%, written like \"20%\", got `20`",
            ),
            (
                ", reserve: { ent: \"0%\" }",
                "`reserve.ent` must be a percent above 0% and below 100%",
            ),
            (
                ", reserve: { ent: \"100%\" }",
                "`reserve.ent` must be a percent above 0% and below 100%",
            ),
            (
                ", reserve: { ent: \"60%\", gold: \"40%\" }",
                "the reserves of valve `v` add up to 100%: together they must stay below 100%",
            ),
            (
                ", reserve: { platinum: \"10%\" }",
                "`reserve` names unknown plan `platinum`; defined plans: ent, free, gold",
            ),
            (
                ", reserve: { ent: \"0.5%\" }",
                "`reserve.ent` holds less than one unit of valve `v` (limit 100, burst 100)",
            ),
            (
                ", share: first_come, reserve: { ent: \"10%\" }",
                "`reserve` needs a fair valve",
            ),
        ] {
            let error = single_error(&valve(extra));
            assert!(error.contains(said), "{extra}: {error}");
        }
        let concurrency = "default_plan: free\nplans:\n  free: {}\nglobal:\n  \"*\": [{ name: c, algorithm: concurrency, limit: 100, lease: 30s, reserve: { free: \"10%\" } }]\n";
        assert!(single_error(concurrency).contains("not `concurrency` valves"));
        let on_route = "default_plan: free\nplans:\n  free:\n    routes:\n      \"*\": [{ limit: 10, per: 1s, reserve: { free: \"10%\" } }]\n";
        assert!(
            single_error(on_route)
                .contains("`reserve` is only for valves (rules under `global`), not route rules")
        );
    }
}
