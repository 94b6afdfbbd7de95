//! `share:` and `reserve:` on valve rules, and `weight:` on plans.

use std::collections::BTreeMap;

use serde_saphyr::Location;

use super::super::raw::{RawRule, S};
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
                valves.push(ValveShare {
                    pattern: route.pattern.source(),
                    name: rule.name.clone(),
                    share,
                    reserve,
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

    /// `share` and `reserve` are a valve's: refused on a rule of another
    /// scope.
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
    }
}
