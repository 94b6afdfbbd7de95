//! Values any section takes: failure policies, bounded numbers and
//! durations, text checked by a parser, maps of names to text.

use super::Validator;
use crate::config::OnError;
use std::collections::BTreeMap;

use crate::config::raw::S;
use crate::duration::{HumanDuration, parse_duration_ms};

impl Validator<'_> {
    pub(super) fn on_error(&mut self, raw: &S<String>, field: &str) -> OnError {
        match raw.value.as_str() {
            "local" => OnError::Local,
            "allow" => OnError::Allow,
            "deny" => OnError::Deny,
            other => {
                self.push(
                    raw.referenced,
                    format!("unknown `{field}` `{other}`; allowed: local, allow, deny"),
                );
                OnError::Local
            }
        }
    }

    pub(super) fn integer_in(
        &mut self,
        raw: Option<&S<i64>>,
        field: &str,
        default: u64,
        range: std::ops::RangeInclusive<u64>,
    ) -> u64 {
        let Some(raw) = raw else { return default };
        match u64::try_from(raw.value) {
            Ok(value) if range.contains(&value) => value,
            _ => {
                self.push(
                    raw.referenced,
                    format!(
                        "`{field}` must be from {} to {}, got {}",
                        range.start(),
                        range.end(),
                        raw.value
                    ),
                );
                default
            }
        }
    }

    pub(super) fn duration_in(
        &mut self,
        raw: Option<&S<String>>,
        field: &str,
        default: u64,
        range: std::ops::RangeInclusive<u64>,
    ) -> u64 {
        let Some(raw) = raw else { return default };
        match parse_duration_ms(&raw.value) {
            Ok(ms) if range.contains(&ms) => ms,
            Ok(ms) => {
                self.push(
                    raw.referenced,
                    format!(
                        "`{field}` must be from {} to {}, got {}",
                        HumanDuration(*range.start()),
                        HumanDuration(*range.end()),
                        HumanDuration(ms)
                    ),
                );
                default
            }
            Err(e) => {
                self.push(raw.referenced, format!("`{field}`: {e}"));
                default
            }
        }
    }

    /// `raw`'s text through `parse`; `None`, with the error pushed, when
    /// it is refused.
    pub(super) fn checked<T>(
        &mut self,
        raw: &S<String>,
        field: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        match parse(&raw.value) {
            Ok(value) => Some(value),
            Err(e) => {
                self.push(raw.referenced, format!("`{field}` {e}"));
                None
            }
        }
    }

    /// A map of names to text (headers, resource attributes), each pair
    /// checked by `check`.
    pub(super) fn pairs(
        &mut self,
        raw: BTreeMap<String, S<String>>,
        field: &str,
        check: impl Fn(&str, &str) -> Result<(), String>,
    ) -> Vec<(String, String)> {
        let mut pairs = Vec::with_capacity(raw.len());
        for (key, value) in raw {
            match check(&key, &value.value) {
                Ok(()) => pairs.push((key, value.value)),
                Err(e) => self.push(value.referenced, format!("`{field}`: {e}")),
            }
        }
        pairs
    }
}
