//! Route tables (`routes`, `subject`, `global`, `dedupe`) and their patterns.

use std::collections::BTreeMap;

use serde_saphyr::Location;

use super::Validator;
use crate::config::raw::{RawDedupe, RawRule, S};
use crate::config::{NamedRule, RoutePattern, RouteRules};
use crate::request::MAX_ROUTE_BYTES;
use crate::rule::{Algorithm, Rule};

impl Validator<'_> {
    pub(super) fn route_table(
        &mut self,
        table: BTreeMap<String, S<Vec<S<RawRule>>>>,
        scope: &str,
    ) -> Vec<RouteRules> {
        let mut seen = Vec::with_capacity(table.len());
        table
            .into_iter()
            .map(|(pattern, rules)| {
                let at = rules.referenced;
                let pattern = self.distinct_pattern(&mut seen, pattern, at);
                RouteRules {
                    pattern,
                    rules: self.rules(rules.value, scope),
                }
            })
            .collect()
    }

    /// `priorities: { "ROUTE PATTERN": critical }`: a route's priority at
    /// adaptive valves, over its plan's.
    pub(super) fn route_priorities(
        &mut self,
        raw: BTreeMap<String, S<String>>,
    ) -> Vec<crate::config::RoutePriority> {
        let mut seen = Vec::with_capacity(raw.len());
        raw.into_iter()
            .map(|(text, priority)| {
                let pattern = self.distinct_pattern(&mut seen, text.clone(), priority.referenced);
                let priority = crate::adaptive::Priority::parse(&priority.value)
                    .unwrap_or_else(|| {
                        self.push(
                            priority.referenced,
                            format!(
                                "`priorities.\"{text}\"` must be `critical`, `high`, `normal` or `low`, got `{}`",
                                priority.value
                            ),
                        );
                        Default::default()
                    });
                crate::config::RoutePriority { pattern, priority }
            })
            .collect()
    }

    /// `dedupe: { "ROUTE PATTERN": { window: 5s } }`: one rule each, a
    /// `fixed_window` of 1 per window (opened by the first admission).
    pub(super) fn dedupe(&mut self, raw: BTreeMap<String, S<RawDedupe>>) -> Vec<RouteRules> {
        let mut seen = Vec::with_capacity(raw.len());
        raw.into_iter()
            .map(|(pattern, entry)| {
                let at = entry.referenced;
                let pattern = self.distinct_pattern(&mut seen, pattern, at);
                let window = match &entry.value.window {
                    Some(w) => self.duration_in(Some(w), "dedupe.window", 1_000, 10..=86_400_000),
                    None => {
                        self.push(
                            at,
                            "`dedupe` entries need a `window`, e.g. `{ window: 5s }`",
                        );
                        1_000
                    }
                };
                let rule = Rule::new(Algorithm::FixedWindow, 1, window, None, false)
                    .expect("a window of 1 within bounds is a valid rule");
                RouteRules {
                    pattern,
                    rules: vec![NamedRule {
                        name: "dedupe".to_owned(),
                        rule,
                        shadow: false,
                        count_if: None,
                        tolerance: crate::tolerance::Tolerance::EXACT,
                        regions: None,
                    }],
                }
            })
            .collect()
    }

    /// `text` as a pattern of a table whose patterns so far are `seen`
    /// (each with its spelling): two spellings of one route (`GET /a/b`,
    /// `get /a/b/`) are refused, since requests are normalised before they
    /// are matched and only one of their lists could ever apply.
    fn distinct_pattern(
        &mut self,
        seen: &mut Vec<(RoutePattern, String)>,
        text: String,
        at: Location,
    ) -> RoutePattern {
        let pattern = self.pattern(&text, at);
        if let Some((_, other)) = seen.iter().find(|(p, _)| *p == pattern) {
            self.push(
                at,
                format!(
                    "route pattern `{text}` is the same route as `{other}` (both `{}` once normalised): give their rules in one list",
                    pattern.source()
                ),
            );
        }
        seen.push((pattern.clone(), text));
        pattern
    }

    fn pattern(&mut self, text: &str, at: Location) -> RoutePattern {
        if text.is_empty() || text.len() > MAX_ROUTE_BYTES {
            self.push(
                at,
                format!("route patterns must be 1 to {MAX_ROUTE_BYTES} bytes"),
            );
        }
        // Patterns are matched against normalised routes, so they are
        // normalised too (a prefix keeps its trailing slash: `GET /v1/users/*`
        // covers `/v1/users/42`, not `/v1/users-admin`).
        match text.find('*') {
            None => RoutePattern::Exact(crate::route::normalize(text).into_owned()),
            Some(star) if star + 1 == text.len() => {
                let prefix = &text[..star];
                let mut normal = crate::route::normalize(prefix).into_owned();
                if prefix.ends_with('/') && !normal.ends_with('/') {
                    normal.push('/');
                }
                RoutePattern::Prefix(normal)
            }
            Some(_) => {
                self.push(
                    at,
                    format!("route pattern `{text}`: `*` may only end a pattern (`GET /v1/users/*`) or stand alone (`*`)"),
                );
                RoutePattern::Exact(text.to_owned())
            }
        }
    }
}
