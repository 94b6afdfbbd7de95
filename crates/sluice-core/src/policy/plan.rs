//! One plan compiled: a cell per route pattern, by exact route or prefix.

use std::collections::HashMap;

use foldhash::fast::RandomState;

use super::cell::Cell;
use crate::adaptive::{AdaptiveValve, Priority};
use crate::bound::BoundRule;
use crate::config::share::Share;
use crate::config::{Limits, OnError, RoutePattern, RouteRules};
use crate::scope::Scope;
use crate::valve;

/// One plan compiled.
#[derive(Debug)]
pub struct Plan {
    name: Box<str>,
    on_error: Option<OnError>,
    weight: f64,
    priority: Priority,
    exact: HashMap<Box<str>, usize, RandomState>,
    /// Longest first.
    prefixes: Box<[(Box<str>, usize)]>,
    fallback: usize,
    pub(super) cells: Box<[Cell]>,
}

impl Plan {
    pub(super) fn compile(spec: &crate::config::PlanSpec, limits: &Limits) -> Plan {
        let (global, near_limit) = (&limits.global[..], limits.near_limit);
        let mut patterns: Vec<&RoutePattern> = spec
            .routes
            .iter()
            .chain(&spec.subject)
            .chain(&spec.dedupe)
            .chain(global)
            .map(|r| &r.pattern)
            .chain(limits.priorities.iter().map(|p| &p.pattern))
            .collect();
        patterns.sort();
        patterns.dedup();

        let tenant: Vec<BoundRule> = spec
            .tenant
            .iter()
            .map(|r| BoundRule::new(Scope::Tenant, "", r, near_limit))
            .collect();
        let cell_for = |covering: Option<&RoutePattern>| -> Cell {
            let mut rules = tenant.clone();
            let add = |rules: &mut Vec<BoundRule>, scope: Scope, table: &[RouteRules]| {
                if let Some(best) = covering.and_then(|p| most_specific(table, p, |r| &r.pattern)) {
                    let source = best.pattern.source();
                    rules.extend(
                        best.rules
                            .iter()
                            .map(|r| BoundRule::new(scope, &source, r, near_limit)),
                    );
                }
            };
            add(&mut rules, Scope::Route, &spec.routes);
            // A route's priority wins over its plan's.
            let priority = covering
                .and_then(|p| most_specific(&limits.priorities, p, |r| &r.pattern))
                .map_or(spec.priority, |r| r.priority);
            let valves = rules.len();
            add(&mut rules, Scope::Global, global);
            // Each fair valve's gate, right after the valves: the tenant's
            // share of it (see `Scope::Share`). Shares are read off a level
            // that refills at the valve's rate: a window valve (whose room
            // comes back when the window moves on) and a concurrency valve
            // (leases in flight) are first come.
            let mut gates = Vec::new();
            let mut reserves = Vec::new();
            let mut adaptive = Vec::new();
            for (index, valve) in rules.iter_mut().enumerate().skip(valves) {
                let share = limits.valve(valve.pattern(), valve.name());
                if let Some(terms) = share.and_then(|s| s.adaptive) {
                    *valve = valve.clone().made_adaptive();
                    adaptive.push(AdaptiveValve { index, terms });
                }
                if !valve.rule().algorithm().refills()
                    || share.is_some_and(|s| s.share != Share::Fair)
                {
                    continue;
                }
                gates.push(BoundRule::gate(valve));
                // The valve's reserves: what is left of it stays in the rules.
                reserves.extend(share.and_then(|s| valve::split(valve, index, s, &spec.name)));
            }
            rules.extend(gates);
            // The duplicate guard applies with or without a subject.
            add(&mut rules, Scope::Dedupe, &spec.dedupe);
            let without_subject = rules.len();
            add(&mut rules, Scope::Subject, &spec.subject);
            let route = covering.map_or_else(|| "*".to_owned(), RoutePattern::source);
            let mut cell = Cell::new(
                rules,
                without_subject,
                (reserves, adaptive),
                &spec.name,
                &route,
            );
            cell.priority = priority;
            cell.sort_out();
            cell
        };

        let mut cells = Vec::with_capacity(patterns.len() + 1);
        let mut exact = HashMap::with_hasher(RandomState::default());
        let mut prefixes = Vec::new();
        for pattern in patterns {
            let index = cells.len();
            cells.push(cell_for(Some(pattern)));
            match pattern {
                RoutePattern::Exact(route) => {
                    exact.insert(route.as_str().into(), index);
                }
                RoutePattern::Prefix(prefix) => {
                    prefixes.push((Box::<str>::from(prefix.as_str()), index))
                }
            }
        }
        prefixes.sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        let fallback = cells.len();
        cells.push(cell_for(None));
        Plan {
            name: spec.name.as_str().into(),
            on_error: spec.on_error,
            weight: spec.weight,
            priority: spec.priority,
            exact,
            prefixes: prefixes.into(),
            fallback,
            cells: cells.into(),
        }
    }

    /// The plan's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The plan's failure policy, when it overrides the storage default.
    pub fn on_error(&self) -> Option<OnError> {
        self.on_error
    }

    /// Its requests' priority at adaptive valves (default normal).
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// The plan's weight at a saturated valve (default 1).
    pub fn weight(&self) -> f64 {
        self.weight
    }

    #[inline]
    pub(super) fn cell(&self, route: &str) -> &Cell {
        let index = match self.exact.get(route) {
            Some(&index) => index,
            None => self
                .prefixes
                .iter()
                .find(|(prefix, _)| crate::bytes::starts_with(route.as_bytes(), prefix.as_bytes()))
                .map_or(self.fallback, |(_, index)| *index),
        };
        &self.cells[index]
    }
}

/// The pattern of `table` that best covers `pattern`: for an exact route,
/// the same route or else the longest prefix of it; for a prefix, the
/// longest prefix of that prefix.
fn most_specific<'t, T>(
    table: &'t [T],
    pattern: &RoutePattern,
    of: impl Fn(&T) -> &RoutePattern,
) -> Option<&'t T> {
    if matches!(pattern, RoutePattern::Exact(_))
        && let Some(same) = table.iter().find(|r| of(r) == pattern)
    {
        return Some(same);
    }
    let text = match pattern {
        RoutePattern::Exact(route) => route.as_str(),
        RoutePattern::Prefix(prefix) => prefix.as_str(),
    };
    table
        .iter()
        .filter_map(|r| match of(r) {
            RoutePattern::Prefix(prefix) if text.starts_with(prefix.as_str()) => {
                Some((prefix.len(), r))
            }
            _ => None,
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, r)| r)
}
