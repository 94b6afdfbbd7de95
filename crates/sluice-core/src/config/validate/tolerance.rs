//! `tolerance:` on a rule (see [`crate::tolerance`]).

use super::Validator;
use crate::config::raw::S;
use crate::config::share::percent;
use crate::rule::Rule;
use crate::tolerance::{MAX_PPM, Tolerance};

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
    /// error naming the field: a percent from 0% to 10%, never on valves,
    /// only on the algorithms it can bound.
    pub(super) fn tolerance(
        &mut self,
        written: Option<&S<String>>,
        rule: &Rule,
        scope: &str,
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
        tolerance
    }
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
        let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 5, per: 1s, tolerance: \"1%\" }]\n";
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
}
