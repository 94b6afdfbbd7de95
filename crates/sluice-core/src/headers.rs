//! The `RateLimit-Policy` and `RateLimit` fields of
//! draft-ietf-httpapi-ratelimit-headers-10, and `Retry-After`.
//!
//! Both fields are Structured Field Lists of Items whose value is the policy
//! name as an sf-string:
//!
//! ```text
//! RateLimit-Policy: "burst";q=50;w=3, "hourly";q=20000;w=3600
//! RateLimit: "burst";r=12;t=1, "hourly";r=19873;t=3600
//! ```
//!
//! `q` is the rule's capacity (its `burst` for gcra and token_bucket, else
//! its `limit`) and `w` the time it takes to refill it, in seconds rounded
//! up: its `per`, or `burst × per / limit` for gcra and token_bucket, so
//! that a client pacing itself to `q` per `w` never outruns the rule's
//! rate (`limit: 20, per: 1s, burst: 50` is `q=50;w=3`, not 50 a second).
//! `r` is what is left and `t` the seconds until the policy is back to
//! full, rounded up.
//! Policy names are restricted by the configuration to characters that need
//! no escaping inside an sf-string. Global valves are left out of both
//! fields: their remaining capacity would reveal other tenants' traffic.

pub use crate::bound::{policy_header, policy_item};
use crate::decision::Decision;
use crate::duration::seconds_rounded_up;

/// Writes the `RateLimit` field value for a decision into `out`; nothing
/// when the decision has no per-rule outcomes.
pub fn write_ratelimit(decision: &Decision<'_>, out: &mut String) {
    let advertised = decision
        .known_outcomes()
        .filter(|(rule, _)| rule.advertised());
    // Written piece by piece: through `write!` the field cost 1.7
    // thousand instructions per request, 1.6 of them formatting.
    let mut digits = itoa::Buffer::new();
    for (i, (rule, outcome)) in advertised.enumerate() {
        // `, "NAME";r=R;t=T`, each number at most 20 digits: one
        // allocation rather than one per piece that outgrows the string.
        out.reserve(rule.name().len() + 50);
        if i > 0 {
            out.push_str(", ");
        }
        out.push('"');
        out.push_str(rule.name());
        out.push_str("\";r=");
        out.push_str(digits.format(outcome.remaining));
        out.push_str(";t=");
        out.push_str(digits.format(seconds_rounded_up(outcome.reset_after_ms)));
    }
}

/// `Retry-After` in whole seconds, rounded up so that a client that waits
/// exactly that long is never early; at least 1.
pub fn retry_after_seconds(retry_after_ms: u64) -> u64 {
    seconds_rounded_up(retry_after_ms).max(1)
}

/// The header fields of a decision, as every door answers them (HTTP,
/// forward-auth and tower set them as headers, Envoy asks for them in
/// `response_headers_to_add`).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fields<'a> {
    /// `RateLimit-Policy`; empty: none.
    pub policy: &'a str,
    /// `RateLimit`; empty: none.
    pub ratelimit: String,
    /// `Retry-After`, in seconds, when refused.
    pub retry_after: Option<u64>,
}

impl<'a> Fields<'a> {
    /// The fields of `decision`, refused when it is not allowed.
    pub fn of(decision: &Decision<'a>) -> Fields<'a> {
        Fields::with_policy(decision, decision.policy_header(), !decision.allowed)
    }

    /// The fields of `decision` under `policy` (compiled for rules the
    /// decision was made for by hand: Envoy descriptors), `refused` as the
    /// door answers (Envoy's quota descriptors refuse together).
    pub fn with_policy(decision: &Decision<'_>, policy: &'a str, refused: bool) -> Fields<'a> {
        let mut ratelimit = String::new();
        if !decision.outcomes.is_empty() {
            ratelimit.reserve(32 * decision.outcomes.len());
            write_ratelimit(decision, &mut ratelimit);
        }
        Fields {
            policy,
            ratelimit,
            retry_after: refused
                .then(|| decision.retry_after_ms().map(retry_after_seconds))
                .flatten(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Outcome;
    use crate::config::Config;
    use crate::decision::Outcomes;
    use crate::policy::Policy;
    use sfv::{BareItem, FieldType, ListEntry, Parser};

    fn policy() -> Policy {
        let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: burst, limit: 20, per: 1s, burst: 50 }]
    routes:
      "*": [{ name: hourly, algorithm: sliding_window, limit: 20000, per: 1h },
            { algorithm: fixed_window, limit: 3, per: 500ms }]
"#;
        Policy::compile(&Config::from_yaml(yaml, "t.yaml").unwrap().limits)
    }

    /// Parses a field as an sf-list and returns (name, params) per item.
    fn parse(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
        let list = Parser::new(value)
            .parse::<sfv::List>()
            .expect("valid sf-list");
        list.into_iter()
            .map(|entry| match entry {
                ListEntry::Item(item) => {
                    let BareItem::String(name) = item.bare_item else {
                        panic!("policy name must be an sf-string")
                    };
                    let params = item
                        .params
                        .iter()
                        .map(|(k, v)| {
                            (
                                k.as_str().to_owned(),
                                v.as_integer().expect("integer").into(),
                            )
                        })
                        .collect();
                    (name.as_str().to_owned(), params)
                }
                ListEntry::InnerList(_) => panic!("no inner lists"),
            })
            .collect()
    }

    /// `q` per `w` is never above what the rule lets a client keep up:
    /// a bucket's window is the time it takes to refill, rounded up.
    #[test]
    fn a_bucket_advertises_the_time_it_takes_to_refill() {
        let item = |rule: &str| {
            let yaml = format!("default_plan: p\nplans:\n  p:\n    tenant: [{rule}]\n");
            let p = Policy::compile(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits);
            p.applicable("t", "GET /", false)
                .class
                .policy_header()
                .to_owned()
        };
        let cases = [
            // burst = limit: its per.
            ("{ name: a, limit: 20, per: 1s }", r#""a";q=20;w=1"#),
            // burst above the limit: 500 at 100 a second, 5 s.
            (
                "{ name: a, algorithm: token_bucket, limit: 100, per: 1s, burst: 500 }",
                r#""a";q=500;w=5"#,
            ),
            // burst below the limit: 10 at 100 a minute, 6 s (not 10 a minute).
            (
                "{ name: a, limit: 100, per: 1m, burst: 10 }",
                r#""a";q=10;w=6"#,
            ),
            // a refill under a second: one second, the least `w` says.
            (
                "{ name: a, limit: 100, per: 1s, burst: 10 }",
                r#""a";q=10;w=1"#,
            ),
            // windows refill at their end.
            (
                "{ name: a, algorithm: fixed_window, limit: 7, per: 1h }",
                r#""a";q=7;w=3600"#,
            ),
            // at the bound of burst × per: no overflow.
            (
                "{ name: a, limit: 1, per: 366d, burst: 142418 }",
                r#""a";q=142418;w=4503598963200"#,
            ),
        ];
        for (rule, expected) in cases {
            assert_eq!(item(rule), expected, "{rule}");
        }
    }

    #[test]
    fn policy_field_is_a_valid_structured_list() {
        let p = policy();
        let a = p.applicable("t", "GET /x", false);
        let items = parse(a.class.policy_header());
        assert_eq!(
            items,
            vec![
                // 50 at a refill of 20 a second: 2.5 s, rounded up.
                ("burst".into(), vec![("q".into(), 50), ("w".into(), 3)]),
                (
                    "hourly".into(),
                    vec![("q".into(), 20000), ("w".into(), 3600)]
                ),
                ("route-1".into(), vec![("q".into(), 3), ("w".into(), 1)]),
            ]
        );
        // And it round-trips through sfv's serializer unchanged.
        let list = Parser::new(a.class.policy_header())
            .parse::<sfv::List>()
            .unwrap();
        assert_eq!(
            list.serialize().unwrap().replace(", ", ","),
            a.class.policy_header().replace(", ", ",")
        );
    }

    #[test]
    fn ratelimit_field_reports_remaining_and_reset_rounded_up() {
        let p = policy();
        let a = p.applicable("t", "GET /x", false);
        let outcomes: Outcomes = [
            Outcome {
                allowed: true,
                remaining: 49,
                reset_after_ms: 50,
                retry_after_ms: 0,
            },
            Outcome {
                allowed: true,
                remaining: 19_999,
                reset_after_ms: 7_200_000,
                retry_after_ms: 0,
            },
            Outcome {
                allowed: true,
                remaining: 2,
                reset_after_ms: 1_001,
                retry_after_ms: 0,
            },
        ]
        .into_iter()
        .collect();
        let decision = Decision::from_outcomes(a, outcomes, 1, &[]);
        let mut field = String::new();
        write_ratelimit(&decision, &mut field);
        assert_eq!(
            field,
            r#""burst";r=49;t=1, "hourly";r=19999;t=7200, "route-1";r=2;t=2"#
        );
        assert_eq!(
            parse(&field),
            vec![
                ("burst".into(), vec![("r".into(), 49), ("t".into(), 1)]),
                (
                    "hourly".into(),
                    vec![("r".into(), 19_999), ("t".into(), 7_200)]
                ),
                ("route-1".into(), vec![("r".into(), 2), ("t".into(), 2)]),
            ]
        );
    }

    #[test]
    fn retry_after_never_rounds_down() {
        assert_eq!(retry_after_seconds(1), 1);
        assert_eq!(retry_after_seconds(1_000), 1);
        assert_eq!(retry_after_seconds(1_001), 2);
        assert_eq!(retry_after_seconds(0), 1);
    }
}
