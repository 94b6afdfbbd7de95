//! `tolerance:` on a rule (see [`crate::tolerance`]).

use super::Validator;
use crate::config::raw::S;
use crate::config::share::percent;
use crate::rule::Rule;
use crate::tolerance::{MAX_PPM, MIN_SLICE, Tolerance};

impl Validator<'_> {
    /// `envoy.tolerance`: a percent from 0% to 10% (applied to the limits
    /// whose algorithm it can bound).
    pub(super) fn envoy_tolerance(&mut self, written: Option<&S<String>>) -> Tolerance {
        let Some(written) = written else {
            return Tolerance::EXACT;
        };
        self.percent(written, "envoy.tolerance")
            .unwrap_or(Tolerance::EXACT)
    }

    fn percent(&mut self, written: &S<String>, field: &str) -> Option<Tolerance> {
        let max = f64::from(MAX_PPM) / 1e4;
        let tolerance = percent(&written.value).and_then(Tolerance::from_fraction);
        if tolerance.is_none() {
            self.push(
                written.referenced,
                format!(
                    "`{field}` must be a percent from 0% to {max}%, such as \"1%\", got `{}`",
                    written.value
                ),
            );
        }
        tolerance
    }

    /// The tolerance written on a rule of `scope` (`None`: exact), or an
    /// error naming the field: a percent from 0% to 10%, never on valves
    /// nor on rules that count by outcome (`counts_outcomes`), only on the
    /// algorithms it can bound, and large enough to make a slice.
    pub(super) fn tolerance(
        &mut self,
        written: Option<&S<String>>,
        rule: &Rule,
        scope: &str,
        counts_outcomes: bool,
    ) -> Tolerance {
        let Some(written) = written else {
            return Tolerance::EXACT;
        };
        let Some(tolerance) = self.percent(written, "tolerance") else {
            return Tolerance::EXACT;
        };
        if tolerance.is_exact() {
            return tolerance;
        }
        if scope == "global" {
            self.push(
                written.referenced,
                "`tolerance` is not for valves (rules under `global`): they are fair and exact",
            );
            return Tolerance::EXACT;
        }
        if !Tolerance::applies_to(rule.algorithm()) {
            self.push(
                written.referenced,
                format!(
                    "`tolerance` is only for gcra, token_bucket and fixed_window rules; {} decisions stay exact",
                    rule.algorithm()
                ),
            );
            return Tolerance::EXACT;
        }
        if counts_outcomes {
            self.push(
                written.referenced,
                "`tolerance` is not for rules with `count_if`: each check holds an attempt there until its outcome is known, which no slice can hold; remove one of them",
            );
            return Tolerance::EXACT;
        }
        if !tolerance.can_slice(rule.limit()) {
            self.push(written.referenced, too_small(tolerance, rule.limit()));
            return Tolerance::EXACT;
        }
        tolerance
    }
}

/// Why `tolerance` of `limit` would never make a slice, and what would.
fn too_small(tolerance: Tolerance, limit: u64) -> String {
    let max = u64::from(MAX_PPM);
    let least = (MIN_SLICE * 1_000_000).div_ceil(limit);
    if least > max {
        let smallest = (MIN_SLICE * 1_000_000).div_ceil(max);
        return format!(
            "`tolerance` needs a `limit` of at least {smallest} ({}% of it is {MIN_SLICE} units, the smallest slice); this rule's `limit` is {limit}: remove `tolerance`",
            max / 10_000
        );
    }
    // In hundredths of a percent, rounded up: the smallest that works.
    let least = least.div_ceil(100);
    format!(
        "`tolerance` × `limit` is {} unit{} ({tolerance} of {limit}), below the smallest slice ({MIN_SLICE} units), so it would never apply: `tolerance` must be from {}% to {}% for this `limit`, or removed",
        tolerance.of(limit),
        if tolerance.of(limit) == 1 { "" } else { "s" },
        crate::number::shown(least as f64 / 100.0),
        max / 10_000,
    )
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    fn errors(rule: &str, under: &str) -> String {
        let yaml = match under {
            "global" => format!(
                "default_plan: p\nplans:\n  p:\n    tenant: [{{ limit: 5, per: 1s }}]\nglobal:\n  \"*\": [{rule}]\n"
            ),
            _ => format!("default_plan: p\nplans:\n  p:\n    tenant: [{rule}]\n"),
        };
        match Config::from_yaml(&yaml, "t.yaml") {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_tolerance_is_read_onto_its_rule() {
        let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 500, per: 1s, tolerance: \"1%\" }]\n";
        let config = Config::from_yaml(yaml, "t.yaml").unwrap();
        let policy = crate::Policy::compile(&config.limits);
        let rules = policy.applicable("a", "GET /", false).rules;
        assert_eq!(rules[0].tolerance().ppm(), 10_000);
    }

    #[test]
    fn a_tolerance_names_its_field_when_refused() {
        let bad = errors("{ limit: 5, per: 1s, tolerance: \"11%\" }", "tenant");
        assert!(
            bad.contains("t.yaml:4:")
                && bad.contains("`tolerance` must be a percent from 0% to 10%"),
            "{bad}"
        );
        let bad = errors("{ limit: 5, per: 1s, tolerance: \"1\" }", "tenant");
        assert!(bad.contains("`tolerance` must be a percent"), "{bad}");
        let bad = errors("{ limit: 5, per: 1s, tolerance: \"1%\" }", "global");
        assert!(bad.contains("`tolerance` is not for valves"), "{bad}");
        let bad = errors(
            "{ algorithm: sliding_log, limit: 5, per: 1s, tolerance: \"1%\" }",
            "tenant",
        );
        assert!(
            bad.contains("`tolerance` is only for gcra, token_bucket and fixed_window"),
            "{bad}"
        );
        assert_eq!(
            errors("{ limit: 5, per: 1s, tolerance: \"0%\" }", "global"),
            ""
        );
    }

    /// A tolerance that could never take effect is refused, naming the
    /// field and what would work: on a rule that counts by outcome, or
    /// one whose `tolerance × limit` is below the smallest slice (two
    /// units: a slice holds at least two requests).
    #[test]
    fn a_tolerance_that_never_applies_is_refused() {
        let bad = errors(
            "{ limit: 500, per: 1m, tolerance: \"1%\", count_if: { status: [401] } }",
            "tenant",
        );
        assert!(
            bad.contains("t.yaml:4:")
                && bad.contains("`tolerance` is not for rules with `count_if`"),
            "{bad}"
        );
        let bad = errors("{ limit: 150, per: 1m, tolerance: \"1%\" }", "tenant");
        assert!(
            bad.contains("`tolerance` × `limit` is 1 unit") && bad.contains("from 1.34% to 10%"),
            "{bad}"
        );
        let bad = errors("{ limit: 19, per: 1m, tolerance: \"10%\" }", "tenant");
        assert!(
            bad.contains("`tolerance` needs a `limit` of at least 20"),
            "{bad}"
        );
        assert_eq!(
            errors("{ limit: 200, per: 1m, tolerance: \"1%\" }", "tenant"),
            ""
        );
        assert_eq!(
            errors("{ limit: 20, per: 1m, tolerance: \"10%\" }", "tenant"),
            ""
        );
    }
}
