//! `adaptive:` on valve rules and `priority:` on plans (appendix I).

use super::super::raw::{RawAdaptive, S};
use super::Validator;
use crate::adaptive::{Adaptive, Priority};
use crate::config::NamedRule;

/// `min` when not written: the least limit at which every priority's part
/// holds a unit (a quarter of 4).
const MIN: u64 = 4;

/// The shortest and longest latency target (ms).
const TARGET_MS: std::ops::RangeInclusive<u64> = 1..=60_000;

impl Validator<'_> {
    /// The `adaptive` terms of valve `rule`, when written and valid.
    pub(super) fn adaptive(&mut self, rule: &NamedRule, raw: S<RawAdaptive>) -> Option<Adaptive> {
        let at = raw.referenced;
        let raw = raw.value;
        let field = format!("`adaptive` of valve `{}`", rule.name);
        let algorithm = rule.rule.algorithm();
        if algorithm.has_burst() {
            // One refill state for every priority: a low request's look at
            // it, at its part of the rate, would spend the others' room.
            self.push(
                at,
                format!(
                    "{field}: `adaptive` is for `concurrency`, `fixed_window`, `sliding_window` and `sliding_log` valves, not `{}` (its refill is one state for every priority): make it a window",
                    algorithm.name()
                ),
            );
            return None;
        }
        let Some(target) = raw.latency_target.as_ref() else {
            self.push(
                at,
                format!("{field} needs `latency_target`: the downstream latency to steer to, such as 250ms"),
            );
            return None;
        };
        let latency_target_ms =
            self.duration_in(Some(target), "adaptive.latency_target", 1, TARGET_MS);
        let limit = rule.rule.limit();
        // By default each priority keeps a part of at least one unit.
        let min = self.integer_in(raw.min.as_ref(), "adaptive.min", MIN.min(limit), 1..=limit);
        Some(Adaptive {
            latency_target_ms,
            min,
        })
    }

    /// A plan's `priority` at adaptive valves (default normal).
    pub(super) fn priority(&mut self, raw: Option<&S<String>>) -> Priority {
        let Some(raw) = raw else {
            return Priority::default();
        };
        Priority::parse(&raw.value).unwrap_or_else(|| {
            self.push(
                raw.referenced,
                format!(
                    "`priority` must be `critical`, `high`, `normal` (the default) or `low`, got `{}`",
                    raw.value
                ),
            );
            Priority::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::adaptive::{Adaptive, Priority};
    use crate::config::Config;
    use crate::config::tests::single_error;

    const BASE: &str = "default_plan: p\nplans:\n  p:\n    priority: critical\n    tenant: [{ name: t, limit: 10, per: 1s }]\n  f:\n    tenant: [{ name: t, limit: 10, per: 1s }]\n";

    fn with_valve(valve: &str) -> String {
        format!("{BASE}global:\n  \"POST /v1/search\": [{valve}]\n")
    }

    #[test]
    fn adaptive_valves_and_priorities_parse() {
        let yaml = with_valve(
            "{ name: db, algorithm: concurrency, limit: 400, lease: 30s, adaptive: { latency_target: 250ms, min: 10 } }",
        );
        let config = Config::from_yaml(&yaml, "a.yaml").unwrap();
        let valve = config.limits.valve("POST /v1/search", "db").unwrap();
        assert_eq!(
            valve.adaptive,
            Some(Adaptive {
                latency_target_ms: 250,
                min: 10
            })
        );
        let plan = |name: &str| config.limits.plans.iter().find(|p| p.name == name).unwrap();
        assert_eq!(plan("p").priority, Priority::Critical);
        assert_eq!(plan("f").priority, Priority::Normal);
        // min defaults to 4.
        let yaml = with_valve(
            "{ name: db, algorithm: sliding_window, limit: 100, per: 1s, adaptive: { latency_target: 1s } }",
        );
        let config = Config::from_yaml(&yaml, "a.yaml").unwrap();
        let valve = config.limits.valve("POST /v1/search", "db").unwrap();
        assert_eq!(valve.adaptive.unwrap().min, 4);
    }

    #[test]
    fn a_routes_priority_wins_over_its_plans() {
        let yaml = format!(
            "{}priorities:\n  \"POST /v1/pay\": critical\n  \"GET /v1/reports/*\": low\n",
            with_valve(
                "{ name: db, algorithm: concurrency, limit: 40, lease: 30s, adaptive: { latency_target: 100ms } }"
            )
        );
        let config = Config::from_yaml(&yaml, "a.yaml").unwrap();
        let policy = crate::Policy::compile(&config.limits);
        // Plan `f` is normal; its payments are critical, its reports low.
        let of = |route: &str| policy.applicable("someone", route, false).priority;
        let f_yaml = yaml.replace("default_plan: p", "default_plan: f");
        let f_config = Config::from_yaml(&f_yaml, "a.yaml").unwrap();
        let f_policy = crate::Policy::compile(&f_config.limits);
        let of_f = |route: &str| f_policy.applicable("anyone", route, false).priority;
        assert_eq!(of_f("POST /v1/pay"), Priority::Critical);
        assert_eq!(of_f("GET /v1/reports/7"), Priority::Low);
        assert_eq!(of_f("POST /v1/search"), Priority::Normal);
        // Plan `p` is critical; its reports are low all the same.
        assert_eq!(of("GET /v1/reports/7"), Priority::Low);
        assert_eq!(of("POST /v1/search"), Priority::Critical);
        let bad = format!("{}priorities:\n  \"POST /v1/pay\": urgent\n", BASE);
        assert!(
            single_error(&bad).contains(
                "`priorities.\"POST /v1/pay\"` must be `critical`, `high`, `normal` or `low`, got `urgent`"
            ),
            "{}",
            single_error(&bad)
        );
    }

    #[test]
    fn adaptive_and_priority_errors_name_the_field_and_range() {
        let cases = [
            (
                with_valve("{ name: db, algorithm: fixed_window, limit: 100, per: 1s, adaptive: { min: 10 } }"),
                "`adaptive` of valve `db` needs `latency_target`",
            ),
            (
                with_valve("{ name: db, algorithm: gcra, limit: 100, per: 1s, adaptive: { latency_target: 1s } }"),
                "`adaptive` is for `concurrency`, `fixed_window`, `sliding_window` and `sliding_log` valves, not `gcra`",
            ),
            (
                with_valve("{ name: db, algorithm: fixed_window, limit: 100, per: 1s, adaptive: { latency_target: 2m } }"),
                "`adaptive.latency_target` must be",
            ),
            (
                with_valve("{ name: db, algorithm: fixed_window, limit: 100, per: 1s, adaptive: { latency_target: 1s, min: 101 } }"),
                "`adaptive.min` must be",
            ),
            (
                with_valve("{ name: db, algorithm: fixed_window, limit: 100, per: 1s, adaptive: { latency_target: 1s, floor: 3 } }"),
                "unknown field `floor`",
            ),
            (
                BASE.replace("priority: critical", "priority: urgent"),
                "`priority` must be `critical`, `high`, `normal` (the default) or `low`, got `urgent`",
            ),
            (
                BASE.replace(
                    "tenant: [{ name: t, limit: 10, per: 1s }]\n  f:",
                    "tenant: [{ name: t, limit: 10, per: 1s, adaptive: { latency_target: 1s } }]\n  f:",
                ),
                "`adaptive` is only for valves (rules under `global`), not tenant rules",
            ),
        ];
        for (yaml, said) in cases {
            let error = single_error(&yaml);
            assert!(error.contains(said), "{said}\n  got: {error}");
        }
    }
}
