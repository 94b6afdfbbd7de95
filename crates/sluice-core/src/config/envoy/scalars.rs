//! Scalars read as envoyproxy/ratelimit reads them.
//!
//! Upstream reads its files with a YAML 1.1 reader (Go's `yaml.v2`) and
//! checks them in two steps, which sluice follows:
//!
//! 1. every value outside `metadata` must be text, a whole number up to
//!    2^63 - 1, a boolean or null: a floating-point number (`1.5`, `1e3`,
//!    `.inf`) is refused wherever it stands, `value: 1.5` included
//!    ([`refused_leaves`]);
//! 2. each field is then read as its type: `requests_per_unit` takes a
//!    whole number and the flags a boolean, both unquoted (`"10"` and
//!    `"true"` are text there, refused: [`count`], [`flag`]); a text field
//!    takes any scalar, spelled as written.
//!
//! Plain scalars are typed as YAML 1.1 types them ([`options`]): a leading
//! `0` is octal (`010` is 8), `yes`, `on` and `y` are true, `no`, `off`
//! and `n` false.

use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_saphyr::{Location, NonFiniteFloatPolicy, Options};

use super::super::raw::S;
use super::super::validate::Validator;

/// How envoyproxy/ratelimit files are parsed: plain scalars typed as
/// YAML 1.1 types them.
pub(super) fn options() -> Options {
    let mut options = Options::default();
    options.legacy_octal_numbers = true;
    // `.inf` is a floating-point number like any other: refused by step 1
    // with the others, not as a parse error.
    options.non_finite_float_policy = NonFiniteFloatPolicy::PassThrough;
    options
}

/// Step 1: where `text` has a value envoyproxy/ratelimit's check refuses, and why
/// (nothing when it does not parse: step 2 says why).
pub(super) fn refused_leaves(text: &str) -> Vec<(Location, String)> {
    let Ok(Leaf::Nested(found)) = serde_saphyr::from_str_with_options::<Leaf>(text, options())
    else {
        return Vec::new();
    };
    found.into_iter().map(|f| (f.at, f.message(text))).collect()
}

/// A value step 1 refuses.
struct Refused {
    at: Location,
    /// The key it is under ("" in a list).
    key: String,
    /// Above what a signed 64-bit number holds, else floating-point.
    huge: bool,
}

impl Refused {
    fn message(&self, text: &str) -> String {
        let span = self.at.span();
        let raw = span
            .byte_offset()
            .zip(span.byte_len())
            .and_then(|(at, len)| text.get(at as usize..(at + len) as usize))
            .unwrap_or("this");
        let shown = if self.key.is_empty() {
            format!("`{raw}`")
        } else {
            format!("`{}: {raw}`", self.key)
        };
        let what = if self.huge {
            format!("a whole number above {}", i64::MAX)
        } else {
            "a floating-point number".to_owned()
        };
        let fix = if self.key == "requests_per_unit" {
            format!(
                "`requests_per_unit` takes a whole number from 0 to {}",
                u32::MAX
            )
        } else {
            format!("quote it (\"{raw}\") if it is text")
        };
        format!(
            "{shown} is {what}, which envoyproxy/ratelimit refuses anywhere but in `metadata`; {fix}"
        )
    }
}

/// Any value, as step 1 sees it.
enum Leaf {
    Fine,
    Float,
    Huge,
    /// A map or a list, with what it holds that is refused.
    Nested(Vec<Refused>),
}

impl Leaf {
    fn refused_under(self, at: Location, key: String, found: &mut Vec<Refused>) {
        match self {
            Leaf::Fine => {}
            Leaf::Float => found.push(Refused {
                at,
                key,
                huge: false,
            }),
            Leaf::Huge => found.push(Refused {
                at,
                key,
                huge: true,
            }),
            Leaf::Nested(mut inner) => found.append(&mut inner),
        }
    }
}

impl<'de> Deserialize<'de> for Leaf {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Leaf, D::Error> {
        d.deserialize_any(LeafVisitor)
    }
}

struct LeafVisitor;

impl<'de> Visitor<'de> for LeafVisitor {
    type Value = Leaf;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Leaf, E> {
        Ok(Leaf::Fine)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Leaf, E> {
        Ok(Leaf::Fine)
    }

    fn visit_u64<E>(self, v: u64) -> Result<Leaf, E> {
        Ok(if i64::try_from(v).is_ok() {
            Leaf::Fine
        } else {
            Leaf::Huge
        })
    }

    fn visit_i128<E>(self, _: i128) -> Result<Leaf, E> {
        Ok(Leaf::Huge)
    }

    fn visit_u128<E>(self, _: u128) -> Result<Leaf, E> {
        Ok(Leaf::Huge)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Leaf, E> {
        Ok(Leaf::Float)
    }

    fn visit_str<E>(self, _: &str) -> Result<Leaf, E> {
        Ok(Leaf::Fine)
    }

    fn visit_unit<E>(self) -> Result<Leaf, E> {
        Ok(Leaf::Fine)
    }

    fn visit_none<E>(self) -> Result<Leaf, E> {
        Ok(Leaf::Fine)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Leaf, D::Error> {
        Leaf::deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Leaf, A::Error> {
        let mut found = Vec::new();
        while let Some(item) = seq.next_element::<S<Leaf>>()? {
            item.value
                .refused_under(item.referenced, String::new(), &mut found);
        }
        Ok(Leaf::Nested(found))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Leaf, A::Error> {
        let mut found = Vec::new();
        while let Some(Key(key)) = map.next_key::<Key>()? {
            // Upstream leaves `metadata` to its own reader: any shape.
            if key.as_deref() == Some("metadata") {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            let value = map.next_value::<S<Leaf>>()?;
            value
                .value
                .refused_under(value.referenced, key.unwrap_or_default(), &mut found);
        }
        Ok(Leaf::Nested(found))
    }
}

/// A map key: its text, `None` when it is not text (step 2 refuses it).
struct Key(Option<String>);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        d.deserialize_any(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, v: &str) -> Result<Key, E> {
        Ok(Key(Some(v.to_owned())))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Key, E> {
        Ok(Key(None))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Key, E> {
        Ok(Key(None))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Key, E> {
        Ok(Key(None))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Key, E> {
        Ok(Key(None))
    }

    fn visit_unit<E>(self) -> Result<Key, E> {
        Ok(Key(None))
    }
}

/// A scalar of a field whose type envoyproxy/ratelimit checks (step 2): quoted, it is
/// text, whatever it spells.
#[derive(Debug)]
pub(super) enum Scalar {
    Null,
    Bool(bool),
    Int(i128),
    Float,
    Text,
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Scalar, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number, true or false")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v.into()))
    }

    fn visit_i128<E>(self, v: i128) -> Result<Scalar, E> {
        Ok(Scalar::Int(v))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Scalar, E> {
        Ok(Scalar::Float)
    }

    fn visit_str<E>(self, _: &str) -> Result<Scalar, E> {
        Ok(Scalar::Text)
    }

    fn visit_unit<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Null)
    }

    fn visit_none<E>(self) -> Result<Scalar, E> {
        Ok(Scalar::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Scalar, D::Error> {
        Scalar::deserialize(d)
    }
}

/// `requests_per_unit`: a whole number from 0 to `u32::MAX`, unquoted
/// (absent or null: 0). `None` when refused (the error is pushed).
pub(super) fn count(v: &mut Validator<'_>, raw: Option<&S<Scalar>>) -> Option<u32> {
    let Some(raw) = raw else { return Some(0) };
    let range = format!(
        "`requests_per_unit` must be a whole number from 0 to {}",
        u32::MAX
    );
    match raw.value {
        Scalar::Null => Some(0),
        Scalar::Int(n) => match u32::try_from(n) {
            Ok(n) => Some(n),
            Err(_) => {
                v.push(raw.referenced, format!("{range}, got {n}"));
                None
            }
        },
        // Said by step 1.
        Scalar::Float => None,
        Scalar::Text => {
            v.push(
                raw.referenced,
                format!("{range}, unquoted: envoyproxy/ratelimit refuses text there"),
            );
            None
        }
        Scalar::Bool(_) => {
            v.push(raw.referenced, format!("{range}, got a boolean"));
            None
        }
    }
}

/// A flag (`shadow_mode`, `unlimited`, …): true or false, unquoted
/// (absent or null: false). Refused, it is pushed and read as false.
pub(super) fn flag(v: &mut Validator<'_>, field: &str, raw: Option<&S<Scalar>>) -> bool {
    let Some(raw) = raw else { return false };
    let refused = match raw.value {
        Scalar::Null => return false,
        Scalar::Bool(b) => return b,
        // Said by step 1.
        Scalar::Float => return false,
        Scalar::Text => {
            format!(
                "`{field}` must be true or false, unquoted: envoyproxy/ratelimit refuses text there"
            )
        }
        Scalar::Int(_) => format!("`{field}` must be true or false"),
    };
    v.push(raw.referenced, refused);
    false
}

#[cfg(test)]
mod tests {
    use crate::config::envoy::tests::load_one;

    /// A file whose one descriptor has `line` (indented as a descriptor's
    /// key) and a limit.
    fn with(line: &str) -> String {
        format!(
            "domain: d\ndescriptors:\n  - key: a\n    {line}\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n"
        )
    }

    /// A file whose one limit has `line` (indented as a key of `rate_limit`).
    fn limit_with(line: &str) -> String {
        format!(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      {line}\n"
        )
    }

    #[test]
    fn floating_point_numbers_are_refused_outside_metadata_as_upstream_refuses_them() {
        let cases = [
            (
                with("value: 1.5"),
                "4:12: `value: 1.5` is a floating-point number",
            ),
            (
                with("value: .inf"),
                "4:12: `value: .inf` is a floating-point number",
            ),
            (
                with("value: 1e3"),
                "4:12: `value: 1e3` is a floating-point number",
            ),
            (
                limit_with("requests_per_unit: 2.5"),
                "6:26: `requests_per_unit: 2.5` is a floating-point number",
            ),
            (
                limit_with("requests_per_unit: 10.0"),
                "6:26: `requests_per_unit: 10.0` is a floating-point number",
            ),
            (
                limit_with("name: 0.5"),
                "6:13: `name: 0.5` is a floating-point number",
            ),
            (
                "domain: 1.5\ndescriptors: []\n".to_owned(),
                "1:9: `domain: 1.5` is a floating-point number",
            ),
            (
                "domain: d\ndescriptors:\n  - key: 2.5\n".to_owned(),
                "3:10: `key: 2.5` is a floating-point number",
            ),
            (
                with("value: 18446744073709551615"),
                "4:12: `value: 18446744073709551615` is a whole number above 9223372036854775807",
            ),
        ];
        for (text, expected) in &cases {
            let errors = load_one(text).expect_err(text);
            assert!(
                errors.iter().any(|e| e.contains(expected)),
                "{text}: {errors:?}"
            );
            assert_eq!(errors.len(), 1, "said once: {errors:?}");
        }
        // As text, and in `metadata` (any shape), they load.
        let domains = load_one(&with(
            "value: \"1.5\"\n    metadata: { ratio: 0.5, list: [1.5] }",
        ))
        .unwrap();
        assert_eq!(domains[0].descriptors[0].value.as_deref(), Some("1.5"));
    }

    #[test]
    fn quoted_numbers_and_flags_are_refused_as_upstream_refuses_them() {
        let cases = [
            (
                limit_with("requests_per_unit: \"10\""),
                "6:26: `requests_per_unit` must be a whole number from 0 to 4294967295, unquoted",
            ),
            (
                limit_with("requests_per_unit: '10'"),
                "6:26: `requests_per_unit` must be a whole number",
            ),
            (
                limit_with("requests_per_unit: true"),
                "6:26: `requests_per_unit` must be a whole number",
            ),
            (
                with("shadow_mode: \"true\""),
                "4:18: `shadow_mode` must be true or false, unquoted",
            ),
            (
                with("quota_mode: 'false'"),
                "4:17: `quota_mode` must be true or false",
            ),
            (
                with("detailed_metric: \"yes\""),
                "4:22: `detailed_metric` must be true or false",
            ),
            (
                with("value_to_metric: 1"),
                "4:22: `value_to_metric` must be true or false",
            ),
            (
                "domain: d\ndescriptors:\n  - key: a\n    rate_limit: { unlimited: \"true\" }\n"
                    .to_owned(),
                "4:30: `unlimited` must be true or false",
            ),
        ];
        for (text, expected) in &cases {
            let errors = load_one(text).expect_err(text);
            assert!(
                errors.iter().any(|e| e.contains(expected)),
                "{text}: {errors:?}"
            );
        }
    }

    #[test]
    fn plain_scalars_are_typed_as_upstream_types_them() {
        // Whole numbers in any base envoyproxy/ratelimit's YAML reads (a leading 0 is
        // octal there), YAML 1.1 booleans, and numbers or booleans as text
        // where text is expected, spelled as written.
        for (line, expected) in [
            ("requests_per_unit: 0x10", 16),
            ("requests_per_unit: 1_000", 1000),
            ("requests_per_unit: 010", 8),
            ("requests_per_unit: 0b11", 3),
            ("requests_per_unit: +5", 5),
            ("requests_per_unit: ~", 0),
        ] {
            let domains = load_one(&limit_with(line)).unwrap_or_else(|e| panic!("{line}: {e:?}"));
            let limit = domains[0].descriptors[0].limit.as_ref().unwrap();
            assert_eq!(limit.requests_per_unit, expected, "{line}");
        }
        for (line, value, shadow) in [
            ("value: 0x10\n    shadow_mode: yes", "0x10", true),
            ("value: 010\n    shadow_mode: on", "010", true),
            ("value: true\n    shadow_mode: off", "true", false),
            ("value: 2001-12-14\n    shadow_mode: ~", "2001-12-14", false),
        ] {
            let domains = load_one(&with(line)).unwrap_or_else(|e| panic!("{line}: {e:?}"));
            let d = &domains[0].descriptors[0];
            assert_eq!(
                (d.value.as_deref(), d.shadow),
                (Some(value), shadow),
                "{line}"
            );
        }
    }
}
