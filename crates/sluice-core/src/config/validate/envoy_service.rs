//! The `envoy:` section: how Envoy's rate-limit requests map onto sluice.

use std::path::PathBuf;

use super::Validator;
use crate::config::raw::{RawEnvoy, S};
use crate::config::{EnvoyServiceConfig, defaults};

impl Validator<'_> {
    pub(super) fn envoy(&mut self, raw: RawEnvoy) -> EnvoyServiceConfig {
        let tolerance = self.envoy_tolerance(raw.tolerance.as_ref());
        let mut text = |value: Option<S<String>>, field: &str, default: &str| match value {
            None => default.to_owned(),
            Some(v) if !v.value.is_empty() && v.value.len() <= 256 => v.value,
            Some(v) => {
                self.push(v.referenced, format!("`{field}` must be 1 to 256 bytes"));
                default.to_owned()
            }
        };
        EnvoyServiceConfig {
            domain: text(raw.domain, "envoy.domain", defaults::ENVOY_DOMAIN),
            tenant_key: text(raw.tenant_key, "envoy.tenant_key", "tenant"),
            route_key: text(raw.route_key, "envoy.route_key", "route"),
            subject_key: text(raw.subject_key, "envoy.subject_key", "subject"),
            fingerprint_key: text(raw.fingerprint_key, "envoy.fingerprint_key", "fingerprint"),
            config_path: raw.config.map(|c| PathBuf::from(c.value)),
            // A directory is read as envoyproxy/ratelimit reads its runtime
            // directory unless `yaml` is asked for: nothing it would load
            // is left out unasked.
            all_files: match raw.files {
                None => true,
                Some(f) if f.value == "yaml" => false,
                Some(f) if f.value == "all" => true,
                Some(f) => {
                    self.push(
                        f.referenced,
                        format!("`envoy.files` must be `yaml` or `all`, got `{}`", f.value),
                    );
                    false
                }
            },
            merge_domains: raw.merge_domains.unwrap_or(false),
            shadow_mode: raw.shadow_mode.unwrap_or(false),
            tolerance,
        }
    }
}
