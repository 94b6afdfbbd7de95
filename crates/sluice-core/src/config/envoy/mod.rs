//! envoyproxy/ratelimit's configuration, read as envoyproxy/ratelimit reads it, into rules.
//!
//! Each file holds one `domain` and a tree of `descriptors`: `key`, optional
//! `value` (each `*` in it matches any run of characters), optional
//! `rate_limit` (`unit`, `requests_per_unit`, `unlimited`, `name`,
//! `replaces`), `shadow_mode`, `quota_mode`, `share_threshold` (wildcard
//! values only), `detailed_metric`, `value_to_metric`, `metadata` (any
//! shape) and nested `descriptors`. A limit is a
//! fixed window aligned to the calendar, as envoyproxy/ratelimit counts.
//!
//! Two sluice extensions, documented in docs/ENVOY.md:
//!
//! - `rate_limit.algorithm` (and `rate_limit.burst`) picks another
//!   algorithm for the same `requests_per_unit` per `unit`;
//! - `rules: [...]` on a descriptor gives it any number of sluice rules
//!   (`{name?, algorithm, limit, per, burst?}`) instead of `rate_limit`.
//!
//! Files are refused as envoyproxy/ratelimit refuses them (empty domain,
//! duplicate domain, empty key, duplicate descriptor, bad unit, unit with
//! `unlimited`, bad `replaces`, unknown keys), with `file:line:column`.
//!
//! envoyproxy/ratelimit accepts any of its keys at any level and ignores
//! the ones out of place. sluice accepts them too, so that a directory
//! envoyproxy/ratelimit loads still loads, but never silently: a misplaced key that
//! only names or marks (`shadow_mode` inside `rate_limit`, `name` on a
//! descriptor) becomes a [note](EnvoyDomain::notes) that `validate` prints
//! and `serve` logs; a misplaced key that would carry a limit (`unit` on a
//! descriptor, `descriptors` inside `rate_limit`) is refused, since
//! envoyproxy/ratelimit would load a limit that never applies.
//!
//! Each role has its file: `unit` (envoyproxy/ratelimit's units), `domain`
//! (what a file loads into), `raw` (a file as YAML says it), `descriptor`
//! (a domain and its tree), `rate_limit` (one limit), `strays` (envoyproxy/ratelimit's
//! keys out of place) and `scalars` (values read as envoyproxy/ratelimit reads them).

use serde_saphyr::Location;

use super::ConfigErrors;
use super::validate::Validator;

mod descriptor;
mod domain;
mod rate_limit;
mod raw;
mod scalars;
mod strays;
mod unit;

pub use domain::{EnvoyDescriptor, EnvoyDomain, EnvoyLimit};
pub use unit::Unit;

use descriptor::envoy_domain;
use raw::RawRoot;

/// Reads envoyproxy/ratelimit configuration files, each `(origin, text)`;
/// every problem of every file is reported. A domain in two files is
/// refused.
pub fn load(files: &[(String, String)]) -> Result<Vec<EnvoyDomain>, ConfigErrors> {
    load_with(files, false)
}

/// [`load`], with domains split over several files merged when `merge` is
/// set (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`): their descriptors
/// join, a descriptor defined twice at the top level is still refused.
pub fn load_with(
    files: &[(String, String)],
    merge: bool,
) -> Result<Vec<EnvoyDomain>, ConfigErrors> {
    let mut errors = Vec::new();
    let mut domains: Vec<(EnvoyDomain, String)> = Vec::new();
    for (origin, text) in files {
        let mut v = Validator::new(origin);
        for (at, refused) in scalars::refused_leaves(text) {
            v.push(at, refused);
        }
        let raw: Option<RawRoot> =
            match serde_saphyr::from_str_with_options(text, scalars::options()) {
                Ok(raw) => Some(raw),
                Err(e) => {
                    v.push(
                        e.location().unwrap_or(Location::UNKNOWN),
                        super::validate::yaml_message(
                            &e,
                            text,
                            e.location().unwrap_or(Location::UNKNOWN),
                        ),
                    );
                    None
                }
            };
        if let Some(mut domain) = raw.and_then(|raw| envoy_domain(&mut v, raw)) {
            domain.notes = v.take_notes();
            match domains.iter_mut().find(|(d, _)| d.domain == domain.domain) {
                Some((existing, _)) if merge => {
                    existing.notes.append(&mut domain.notes);
                    for descriptor in domain.descriptors {
                        let key = descriptor.composite_key();
                        if existing
                            .descriptors
                            .iter()
                            .any(|d| d.composite_key() == key)
                        {
                            v.push(
                                Location::UNKNOWN,
                                format!(
                                    "duplicate descriptor composite key '{}.{key}'",
                                    existing.domain
                                ),
                            );
                        } else {
                            existing.descriptors.push(descriptor);
                        }
                    }
                }
                Some((_, first)) => v.push(
                    Location::UNKNOWN,
                    format!(
                        "duplicate domain '{}' in config file (also in {first})",
                        domain.domain
                    ),
                ),
                None => domains.push((domain, origin.clone())),
            }
        }
        errors.extend(v.into_errors());
    }
    if errors.is_empty() {
        Ok(domains.into_iter().map(|(d, _)| d).collect())
    } else {
        Err(ConfigErrors(errors))
    }
}

#[cfg(test)]
mod tests;
