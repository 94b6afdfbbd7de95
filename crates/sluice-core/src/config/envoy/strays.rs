//! Upstream's keys out of place: refused if they carry a limit, else noted.

use super::raw::Stray;
use crate::config::validate::Validator;

/// Keys that would carry a limit: out of place, envoyproxy/ratelimit loads a limit
/// that never applies, so sluice refuses them.
const CARRY_LIMITS: [&str; 7] = [
    "rate_limit",
    "descriptors",
    "unit",
    "requests_per_unit",
    "unlimited",
    "replaces",
    "rules",
];

/// [`refuse_or_note`] over the named fields of `raw`.
macro_rules! strays {
    ($v:expr, $place:expr, $raw:expr, [$($key:ident),* $(,)?]) => {
        $crate::config::envoy::strays::refuse_or_note($v, $place, &[$((stringify!($key), &$raw.$key)),*])
    };
}
pub(super) use strays;

/// Refuses or notes each of envoyproxy/ratelimit's keys found out of `place`.
pub(super) fn refuse_or_note(v: &mut Validator<'_>, place: &str, keys: &[(&str, &Stray)]) {
    for (key, stray) in keys {
        let Some(stray) = stray else { continue };
        if CARRY_LIMITS.contains(key) {
            v.push(
                stray.referenced,
                format!("`{key}` has no effect {place}: envoyproxy/ratelimit would load it and never apply it, so sluice refuses it; move it where it belongs"),
            );
        } else {
            v.note(
                stray.referenced,
                format!("`{key}` has no effect {place}, as in envoyproxy/ratelimit; ignored"),
            );
        }
    }
}
