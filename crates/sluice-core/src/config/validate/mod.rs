//! From raw YAML to a typed [`Config`], collecting every error on the way.
//!
//! [`Validator`] gathers every problem with its `file:line:column`; each
//! section of the file is read by a file of its own:
//!
//! - [`server`], [`storage`], [`keys`], [`ledger`], [`envoy_service`],
//!   [`tracing`]: the
//!   sections of the same names; [`regions`]: `storage.regions`;
//! - [`limits`]: plans, tenants and the default plan;
//! - [`routes`]: route tables and their patterns, `dedupe`;
//! - [`rules`]: one list of rules, and each rule in it;
//! - [`share`]: `share:` and `reserve:` on valves, `weight:` on plans;
//! - [`adaptive`]: `adaptive:` on valves, `priority:` on plans;
//! - [`fields`]: numbers, durations and failure policies, as any section
//!   takes them;
//! - [`yaml`]: what serde-saphyr reports, in the file's own words.

use serde_saphyr::{Location, Options};

use super::raw::RawConfig;
use super::{Config, ConfigError, ConfigErrors};

mod adaptive;
mod envoy_service;
mod fields;
mod keys;
mod ledger;
mod limits;
mod regions;
mod routes;
mod rules;
mod server;
mod share;
mod storage;
mod tolerance;
mod tracing;
mod yaml;

pub use rules::MAX_RULES_PER_LIST;
pub(super) use yaml::yaml_message;

/// Longest plan or rule name.
const MAX_NAME_BYTES: usize = 64;

pub(super) fn load(
    text: &str,
    origin: &str,
    envoy_config: Option<&std::path::Path>,
) -> Result<Config, ConfigErrors> {
    let mut v = Validator::new(origin);
    let raw: RawConfig = if text.trim().is_empty() {
        RawConfig::default()
    } else {
        match serde_saphyr::from_str_with_options(text, Options::default()) {
            Ok(raw) => raw,
            Err(e) => {
                let location = e.location().unwrap_or(Location::UNKNOWN);
                let message = yaml_message(&e, text, location);
                v.push(location, message);
                return Err(ConfigErrors(v.errors));
            }
        }
    };
    let config = v.config(raw, envoy_config);
    if v.errors.is_empty() {
        Ok(config)
    } else {
        v.errors.sort_by_key(|e| (e.line, e.column));
        Err(ConfigErrors(v.errors))
    }
}

pub(super) struct Validator<'a> {
    origin: &'a str,
    errors: Vec<ConfigError>,
    notes: Vec<ConfigError>,
    /// The regions' weights in order, with `storage.regions` (rules shared
    /// across them are checked against their shares).
    region_weights: Option<Vec<u32>>,
}

/// The start of the file, for problems with no better place.
const TOP: Location = Location::UNKNOWN;

impl<'a> Validator<'a> {
    pub(super) fn new(origin: &'a str) -> Validator<'a> {
        Validator {
            origin,
            errors: Vec::new(),
            notes: Vec::new(),
            region_weights: None,
        }
    }

    /// What was accepted without effect, noted since the last call.
    pub(super) fn take_notes(&mut self) -> Vec<ConfigError> {
        std::mem::take(&mut self.notes)
    }

    /// Notes something accepted that has no effect.
    pub(super) fn note(&mut self, at: Location, message: impl Into<String>) {
        let error = self.error(at, message);
        self.notes.push(error);
    }

    fn error(&self, at: Location, message: impl Into<String>) -> ConfigError {
        let (line, column) = if at == Location::UNKNOWN {
            (1, 1)
        } else {
            (at.line(), at.column())
        };
        ConfigError {
            origin: self.origin.to_owned(),
            line,
            column,
            message: message.into(),
        }
    }

    pub(super) fn into_errors(mut self) -> Vec<ConfigError> {
        self.errors.sort_by_key(|e| (e.line, e.column));
        self.errors
    }

    pub(super) fn push(&mut self, at: Location, message: impl Into<String>) {
        let error = self.error(at, message);
        self.errors.push(error);
    }

    /// `envoy_config`, when given, stands for `envoy.config`.
    fn config(&mut self, raw: RawConfig, envoy_config: Option<&std::path::Path>) -> Config {
        let server = self.server(raw.server.unwrap_or_default());
        let storage = self.storage(raw.storage.unwrap_or_default());
        self.region_weights = storage
            .regions
            .as_ref()
            .map(|r| r.in_order().iter().map(|&(_, w)| w).collect());
        let keys = self.keys(raw.keys.unwrap_or_default(), &storage.backend);
        // A configuration for Envoy alone (an `envoy:` section or
        // `--envoy-config`, no plans) gets one empty plan: every request
        // outside the envoyproxy/ratelimit domains is unlimited.
        let envoy_only = (raw.envoy.is_some() || envoy_config.is_some())
            && raw.plans.is_none()
            && raw.default_plan.is_none();
        let limits = self.limits(
            envoy_only,
            raw.default_plan,
            raw.near_limit,
            raw.plans,
            raw.tenants,
            (raw.global, raw.priorities),
        );
        let mut envoy = self.envoy(raw.envoy.unwrap_or_default());
        if let Some(path) = envoy_config {
            envoy.config_path = Some(path.to_path_buf());
        }
        let admin = raw.admin.unwrap_or_default();
        let admin_token = self.secret(admin.token_env, admin.token_file, "admin.token");
        let ledger = raw.ledger.map(|l| self.ledger(l));
        let tracing = raw.tracing.map(|t| self.tracing(t, &storage.backend));
        use crate::config::defaults::{
            ATTEMPT_TTL_MS, MAX_ATTEMPT_TTL_MS, MAX_RESERVATION_TTL_MS, RESERVATION_TTL_MS,
        };
        let reservation_ttl_ms = self.ttl(
            raw.reservation_ttl,
            "reservation_ttl",
            RESERVATION_TTL_MS,
            (MAX_RESERVATION_TTL_MS, "1d"),
        );
        let attempt_ttl_ms = self.ttl(
            raw.attempt_ttl,
            "attempt_ttl",
            ATTEMPT_TTL_MS,
            (MAX_ATTEMPT_TTL_MS, "1h"),
        );
        Config {
            server,
            storage,
            keys,
            limits,
            envoy,
            admin_token,
            ledger,
            tracing,
            reservation_ttl_ms,
            attempt_ttl_ms,
        }
    }

    /// A top-level duration `field`: from 1s to `max` (written as `max_text`),
    /// `default` when absent.
    fn ttl(
        &mut self,
        raw: Option<crate::config::raw::S<String>>,
        field: &str,
        default: u64,
        (max, max_text): (u64, &str),
    ) -> u64 {
        let Some(raw) = raw else {
            return default;
        };
        match crate::duration::parse_duration_ms(&raw.value) {
            Ok(ms) if (1_000..=max).contains(&ms) => ms,
            Ok(_) => {
                self.push(
                    raw.referenced,
                    format!(
                        "`{field}` must be from 1s to {max_text}, got `{}`",
                        raw.value
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
}
