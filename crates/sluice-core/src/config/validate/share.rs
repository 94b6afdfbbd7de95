//! `share:` on valve rules and `weight:` on plans.

use std::collections::BTreeMap;

use super::super::raw::{RawRule, S};
use super::super::share::{MAX_WEIGHT, MIN_WEIGHT, Share, ValveShare};
use super::Validator;
use crate::config::RouteRules;

impl Validator<'_> {
    /// The `global` table: its rules, and how each valve is shared. `share`
    /// is taken off each raw rule before the rule itself is read.
    pub(super) fn global_table(
        &mut self,
        mut table: BTreeMap<String, S<Vec<S<RawRule>>>>,
    ) -> (Vec<RouteRules>, Vec<ValveShare>) {
        let mut shares: Vec<Vec<Share>> = Vec::with_capacity(table.len());
        for rules in table.values_mut() {
            let list = rules
                .value
                .iter_mut()
                .map(|rule| match rule.value.share.take() {
                    None => Share::Fair,
                    Some(s) if s.value == "fair" => Share::Fair,
                    Some(s) if s.value == "first_come" => Share::FirstCome,
                    Some(s) => {
                        self.push(
                            s.referenced,
                            format!(
                                "`share` must be `fair` (the default) or `first_come`, got `{}`",
                                s.value
                            ),
                        );
                        Share::Fair
                    }
                })
                .collect();
            shares.push(list);
        }
        let rules = self.route_table(table, "global");
        let valves = rules
            .iter()
            .zip(shares)
            .flat_map(|(route, shares)| {
                // A rule refused above leaves the lists unpaired; the
                // configuration is refused anyway.
                let paired = route.rules.len() == shares.len();
                route
                    .rules
                    .iter()
                    .zip(shares)
                    .filter(move |_| paired)
                    .map(|(rule, share)| ValveShare {
                        pattern: route.pattern.source(),
                        name: rule.name.clone(),
                        share,
                    })
            })
            .collect();
        (rules, valves)
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

    /// `share` is a valve's: refused on a rule of another scope.
    pub(super) fn no_share(&mut self, rule: &RawRule, scope: &str) {
        if let Some(s) = &rule.share {
            self.push(
                s.referenced,
                format!("`share` is only for valves (rules under `global`), not {scope} rules"),
            );
        }
    }
}
