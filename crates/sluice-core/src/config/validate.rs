//! From raw YAML to a typed [`Config`], collecting every error on the way.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;

use serde_saphyr::{Location, Options};

use super::raw::{RawConfig, RawKeys, RawPlan, RawRule, RawServer, RawStorage, S};
use super::{
    Backend, ClientIpHeader, Config, ConfigError, ConfigErrors, ConnectionLimits,
    EnvoyServiceConfig, ForwardAuthConfig, KeysConfig, Limits, MetricsListener, NamedRule, OnError,
    PlanSpec, RoutePattern, RouteRules, SecretSource, ServerConfig, StorageConfig, TenantSpec,
    defaults,
};
use crate::duration::{HumanDuration, parse_duration_ms};
use crate::rule::{Algorithm, Rule};

use crate::request::{MAX_ROUTE_BYTES, MAX_TENANT_BYTES};

/// Most shards a tenant may be split over.
const MAX_SHARDS: i64 = 1024;

mod share;
/// The one (empty) plan of a configuration for Envoy alone.
const ENVOY_ONLY_PLAN: &str = "default";
const MAX_NAME_BYTES: usize = 64;
/// Most rules in one list (a plan's `tenant` rules, one pattern's
/// `routes` or `subject` rules, one `global` valve). A request is decided
/// against at most four lists, all in one call to the store: bounded, so
/// that call's arguments and answer are (Redis's Lua gives up on more than
/// about 2,000 rules in a call; 4 × 64 stays far below).
pub const MAX_RULES_PER_LIST: usize = 64;
const MAX_TIMEOUT_MS: u64 = 10_000;

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

/// serde-saphyr's message without its source snippet or position (we print
/// the position ourselves, as `file:line:column`); a value of the wrong type
/// is reported with its field's name and what the field takes (never with
/// the value, which may be a secret such as a URL with a password).
pub(super) fn yaml_message(error: &serde_saphyr::Error, text: &str, at: Location) -> String {
    // (serde-saphyr's own words advise a setting of its API.)
    if let serde_saphyr::Error::DuplicateMappingKey { key, .. } = error.without_snippet() {
        return match key {
            Some(key) => format!("`{key}` is given twice in one mapping: give each key once"),
            None => "a key is given twice in one mapping: give each key once".to_owned(),
        };
    }
    let full = error.without_snippet().to_string();
    let first = full.lines().next().unwrap_or("invalid YAML").trim();
    let message = match first.rfind(" at line ") {
        Some(at) => &first[..at],
        None => first,
    };
    let expected = match message {
        "invalid i64" | "invalid u64" | "invalid i32" | "invalid u32" => "a whole number",
        "invalid boolean" => "true or false",
        "invalid floating point" => "a number (e.g. 0.8)",
        "expected string scalar" => "one value (text), not a list or a map",
        "expected sequence start" => "a list (`[a, b]`, or one `- ` item per line)",
        "expected mapping start" => "a map (`key: value` pairs, or `{ key: value }`)",
        _ => return message.to_owned(),
    };
    match field_at(text, at) {
        Some(field) => format!("`{field}` must be {expected}"),
        None => format!("expected {expected} here"),
    }
}

/// The name of the key whose value starts at `at`, on the same line
/// (`name: value`, in block or flow style).
fn field_at(text: &str, at: Location) -> Option<String> {
    let line = text
        .lines()
        .nth(usize::try_from(at.line()).ok()?.checked_sub(1)?)?;
    let before: String = line
        .chars()
        .take(usize::try_from(at.column()).ok()?.saturating_sub(1))
        .collect();
    let head = before[..before.rfind(':')?].trim_end();
    let name: String = head
        .chars()
        .rev()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '-')
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    (!name.is_empty()).then_some(name)
}

pub(super) struct Validator<'a> {
    origin: &'a str,
    errors: Vec<ConfigError>,
    notes: Vec<ConfigError>,
}

/// The start of the file, for problems with no better place.
const TOP: Location = Location::UNKNOWN;

impl<'a> Validator<'a> {
    pub(super) fn new(origin: &'a str) -> Validator<'a> {
        Validator {
            origin,
            errors: Vec::new(),
            notes: Vec::new(),
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
            raw.global,
        );
        let mut envoy = self.envoy(raw.envoy.unwrap_or_default());
        if let Some(path) = envoy_config {
            envoy.config_path = Some(path.to_path_buf());
        }
        let admin = raw.admin.unwrap_or_default();
        let admin_token = self.secret(admin.token_env, admin.token_file, "admin.token");
        let ledger = raw.ledger.map(|l| self.ledger(l));
        Config {
            server,
            storage,
            keys,
            limits,
            envoy,
            admin_token,
            ledger,
        }
    }

    fn ledger(&mut self, raw: S<super::raw::RawLedger>) -> super::LedgerConfig {
        let at = raw.referenced;
        let raw = raw.value;
        let dir = match raw.dir {
            Some(d) if !d.value.is_empty() => PathBuf::from(d.value),
            Some(d) => {
                self.push(d.referenced, "`ledger.dir` must be a directory path");
                PathBuf::new()
            }
            None => {
                self.push(at, "`ledger` needs `dir`, the directory its files go in");
                PathBuf::new()
            }
        };
        let hmac_tenants = match raw.tenants {
            None => false,
            Some(t) if t.value == "clear" => false,
            Some(t) if t.value == "hmac" => true,
            Some(t) => {
                self.push(
                    t.referenced,
                    format!(
                        "`ledger.tenants` must be `clear` or `hmac`, got `{}`",
                        t.value
                    ),
                );
                false
            }
        };
        super::LedgerConfig {
            dir,
            hmac_tenants,
            flush_every_ms: self.duration_in(
                raw.flush_every.as_ref(),
                "ledger.flush_every",
                10_000,
                100..=60_000,
            ),
            max_file_bytes: self.integer_in(
                raw.max_file_bytes.as_ref(),
                "ledger.max_file_bytes",
                64 * 1024 * 1024,
                4_096..=(1 << 40),
            ),
            max_file_age_ms: self.duration_in(
                raw.max_file_age.as_ref(),
                "ledger.max_file_age",
                3_600_000,
                60_000..=31 * 86_400_000,
            ),
        }
    }

    fn envoy(&mut self, raw: super::raw::RawEnvoy) -> EnvoyServiceConfig {
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
            all_files: match raw.files {
                None => false,
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
        }
    }

    fn server(&mut self, raw: RawServer) -> ServerConfig {
        let forward = raw.forward_auth.unwrap_or_default();
        let tenant_header = match forward.tenant_header {
            Some(h) => self.header_name(&h, "server.forward_auth.tenant_header"),
            None => defaults::TENANT_HEADER.to_owned(),
        };
        let subject_header = forward
            .subject_header
            .map(|h| self.header_name(&h, "server.forward_auth.subject_header"));
        let cost_header = forward
            .cost_header
            .map(|h| self.header_name(&h, "server.forward_auth.cost_header"));
        let client_ip_subject = match &forward.subject_from {
            None => false,
            Some(f) if f.value == "header" => false,
            Some(f) if f.value == "client_ip" => {
                if subject_header.is_some() {
                    self.push(
                        f.referenced,
                        "`server.forward_auth.subject_from: client_ip` and `subject_header` exclude each other",
                    );
                }
                true
            }
            Some(f) => {
                self.push(
                    f.referenced,
                    format!(
                        "`server.forward_auth.subject_from` must be `header` or `client_ip`, got `{}`",
                        f.value
                    ),
                );
                false
            }
        };
        let mut trusted_proxies = Vec::new();
        for cidr in forward.trusted_proxies.iter().flatten() {
            let parsed = cidr.value.parse::<ipnet::IpNet>().or_else(|_| {
                cidr.value
                    .parse::<std::net::IpAddr>()
                    .map(ipnet::IpNet::from)
            });
            match parsed {
                Ok(net) => trusted_proxies.push(net),
                Err(_) => self.push(
                    cidr.referenced,
                    format!(
                        "`server.forward_auth.trusted_proxies` takes addresses or CIDRs such as 10.0.0.0/8, got `{}`",
                        cidr.value
                    ),
                ),
            }
        }
        let client_ip_header = match &forward.client_ip_header {
            None => ClientIpHeader::default(),
            Some(h) if h.value.eq_ignore_ascii_case("x-forwarded-for") => {
                ClientIpHeader::XForwardedFor
            }
            Some(h) if h.value.eq_ignore_ascii_case("forwarded") => ClientIpHeader::Forwarded,
            Some(h) => {
                self.push(
                    h.referenced,
                    format!(
                        "`server.forward_auth.client_ip_header` must be `x-forwarded-for` or `forwarded`, got `{}`",
                        h.value
                    ),
                );
                ClientIpHeader::default()
            }
        };
        let fingerprint_header = match forward.fingerprint_header {
            Some(h) => self.header_name(&h, "server.forward_auth.fingerprint_header"),
            None => defaults::FINGERPRINT_HEADER.to_owned(),
        };
        let method_headers = match forward.method_header {
            Some(h) => vec![self.header_name(&h, "server.forward_auth.method_header")],
            None => defaults::METHOD_HEADERS.map(str::to_owned).to_vec(),
        };
        let uri_headers = match forward.uri_header {
            Some(h) => vec![self.header_name(&h, "server.forward_auth.uri_header")],
            None => defaults::URI_HEADERS.map(str::to_owned).to_vec(),
        };
        let limits = raw.limits.unwrap_or_default();
        let limits = ConnectionLimits {
            max_connections: self.integer_in(
                limits.max_connections.as_ref(),
                "server.limits.max_connections",
                defaults::MAX_CONNECTIONS,
                1..=1_000_000,
            ),
            header_timeout_ms: self.duration_in(
                limits.header_timeout.as_ref(),
                "server.limits.header_timeout",
                defaults::HEADER_TIMEOUT_MS,
                100..=600_000,
            ),
            request_timeout_ms: self.duration_in(
                limits.request_timeout.as_ref(),
                "server.limits.request_timeout",
                defaults::REQUEST_TIMEOUT_MS,
                100..=600_000,
            ),
            grpc_keepalive_ms: self.duration_in(
                limits.grpc_keepalive.as_ref(),
                "server.limits.grpc_keepalive",
                defaults::GRPC_KEEPALIVE_MS,
                1_000..=3_600_000,
            ),
            grpc_max_streams: self.integer_in(
                limits.grpc_max_streams.as_ref(),
                "server.limits.grpc_max_streams",
                u64::from(defaults::GRPC_MAX_STREAMS),
                1..=65_536,
            ) as u32,
            grpc_max_message_bytes: self.integer_in(
                limits.grpc_max_message_bytes.as_ref(),
                "server.limits.grpc_max_message_bytes",
                defaults::GRPC_MAX_MESSAGE_BYTES,
                1_024..=16 * 1024 * 1024,
            ),
        };
        let metrics = raw.metrics.map(|m| {
            let at = m.referenced;
            let m = m.value;
            if m.listen.is_none() {
                self.push(at, "`server.metrics` needs `listen`, an IP address and port such as 0.0.0.0:9090");
            }
            let path = match m.path {
                None => "/metrics".to_owned(),
                Some(p) => {
                    let ok = p.value.starts_with('/')
                        && p.value.len() <= 256
                        && p.value.bytes().all(|b| b.is_ascii_graphic() && b != b'?' && b != b'#');
                    if !ok {
                        self.push(
                            p.referenced,
                            format!("`server.metrics.path` must be a path such as /metrics (at most 256 characters, no query), got `{}`", p.value),
                        );
                    }
                    p.value
                }
            };
            MetricsListener {
                listen: self.address(m.listen, "server.metrics.listen", "0.0.0.0:9090"),
                path,
            }
        });
        ServerConfig {
            metrics,
            http: self.address(raw.http, "server.http", defaults::HTTP),
            grpc: self.address(raw.grpc, "server.grpc", defaults::GRPC),
            forward_auth: ForwardAuthConfig {
                tenant_header,
                subject_header,
                cost_header,
                fingerprint_header,
                method_headers,
                uri_headers,
                client_ip_subject,
                trusted_proxies,
                client_ip_header,
            },
            limits,
        }
    }

    fn address(&mut self, raw: Option<S<String>>, field: &str, default: &str) -> SocketAddr {
        let fallback: SocketAddr = default.parse().expect("default addresses parse");
        let Some(raw) = raw else { return fallback };
        raw.value.parse().unwrap_or_else(|_| {
            self.push(
                raw.referenced,
                format!(
                    "`{field}` must be an IP address and port such as {default}, got `{}`",
                    raw.value
                ),
            );
            fallback
        })
    }

    fn header_name(&mut self, raw: &S<String>, field: &str) -> String {
        let ok = !raw.value.is_empty()
            && raw.value.len() <= 128
            && raw
                .value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !ok {
            self.push(
                raw.referenced,
                format!(
                    "`{field}` must be an HTTP header name (letters, digits, `-`), got `{}`",
                    raw.value
                ),
            );
        }
        raw.value.clone()
    }

    fn storage(&mut self, raw: RawStorage) -> StorageConfig {
        let backend_name = raw.backend.as_ref().map_or("memory", |b| b.value.as_str());
        let backend_at = raw.backend.as_ref().map_or(TOP, |b| b.referenced);
        let backend = match backend_name {
            "memory" => Backend::Memory,
            "redis" => {
                match &raw.url {
                    Some(url) => {
                        self.redis_url(url, "storage.url");
                        Backend::Redis {
                            url: url.value.clone(),
                        }
                    }
                    None => {
                        self.push(backend_at, "`storage.backend: redis` needs `storage.url`, e.g. redis://127.0.0.1:6379");
                        Backend::Memory
                    }
                }
            }
            "redis-cluster" => match &raw.nodes {
                Some(nodes) if !nodes.value.is_empty() => {
                    for node in &nodes.value {
                        self.redis_url(node, "storage.nodes");
                    }
                    Backend::RedisCluster {
                        nodes: nodes.value.iter().map(|n| n.value.clone()).collect(),
                        global_shards: self.integer_in(
                            raw.global_shards.as_ref(),
                            "storage.global_shards",
                            u64::from(defaults::GLOBAL_SHARDS),
                            1..=1024,
                        ) as u16,
                    }
                }
                _ => {
                    self.push(
                        backend_at,
                        "`storage.backend: redis-cluster` needs `storage.nodes`, a list of seed URLs such as [redis://127.0.0.1:7000]",
                    );
                    Backend::Memory
                }
            },
            other => {
                self.push(
                    backend_at,
                    format!(
                        "unknown `storage.backend` `{other}`; allowed: memory, redis, redis-cluster"
                    ),
                );
                Backend::Memory
            }
        };
        if let Some(url) = raw.url.as_ref().filter(|_| backend_name != "redis") {
            self.push(url.referenced, "`storage.url` is only for `backend: redis`");
        }
        if let Some(shards) = raw
            .global_shards
            .as_ref()
            .filter(|_| backend_name != "redis-cluster")
        {
            self.push(
                shards.referenced,
                "`storage.global_shards` is only for `backend: redis-cluster` (elsewhere a global limit is one key)",
            );
        }
        if let Some(nodes) = raw
            .nodes
            .as_ref()
            .filter(|_| backend_name != "redis-cluster")
        {
            self.push(
                nodes.referenced,
                "`storage.nodes` is only for `backend: redis-cluster`",
            );
        }
        let timeout_ms = self.duration_in(
            raw.timeout.as_ref(),
            "storage.timeout",
            defaults::TIMEOUT_MS,
            1..=MAX_TIMEOUT_MS,
        );
        let sweep_interval_ms = self.duration_in(
            raw.sweep_interval.as_ref(),
            "storage.sweep_interval",
            defaults::SWEEP_INTERVAL_MS,
            100..=3_600_000,
        );
        let on_error = raw
            .on_error
            .as_ref()
            .map_or(OnError::Local, |o| self.on_error(o, "storage.on_error"));
        let max_entries = match raw.max_entries {
            None => defaults::MAX_ENTRIES,
            Some(m) if (1_000..=1_000_000_000).contains(&m.value) => m.value as u64,
            Some(m) => {
                self.push(
                    m.referenced,
                    format!(
                        "`storage.max_entries` must be from 1000 to 1000000000, got {}",
                        m.value
                    ),
                );
                defaults::MAX_ENTRIES
            }
        };
        // A quarter by default: a tenant making keys leaves three quarters
        // to the others.
        let max_entries_per_tenant = match raw.max_entries_per_tenant {
            None => max_entries / 4,
            Some(m) if (1..=max_entries as i64).contains(&m.value) => m.value as u64,
            Some(m) => {
                self.push(
                    m.referenced,
                    format!(
                        "`storage.max_entries_per_tenant` must be from 1 to `storage.max_entries` ({max_entries}), got {}",
                        m.value
                    ),
                );
                max_entries / 4
            }
        };
        let urls: Vec<&str> = match &backend {
            Backend::Memory => Vec::new(),
            Backend::Redis { url } => vec![url.as_str()],
            Backend::RedisCluster { nodes, .. } => nodes.iter().map(String::as_str).collect(),
        };
        let tls_ca_file = raw.tls_ca_file.map(|file| {
            if urls.is_empty() || !urls.iter().all(|u| u.starts_with("rediss://")) {
                self.push(
                    file.referenced,
                    "`storage.tls_ca_file` is for Redis over TLS: use rediss:// URLs with it",
                );
            }
            PathBuf::from(file.value)
        });
        let fallback_instances = self.integer_in(
            raw.fallback_instances.as_ref(),
            "storage.fallback_instances",
            1,
            1..=10_000,
        );
        let breaker = raw.breaker.unwrap_or_default();
        let breaker_failures = self.integer_in(
            breaker.failures.as_ref(),
            "storage.breaker.failures",
            u64::from(defaults::BREAKER_FAILURES),
            1..=1_000,
        );
        let breaker_probes = self.integer_in(
            breaker.probes.as_ref(),
            "storage.breaker.probes",
            u64::from(defaults::BREAKER_PROBES),
            1..=1_000,
        );
        let breaker_cool_down_ms = self.duration_in(
            breaker.cool_down.as_ref(),
            "storage.breaker.cool_down",
            defaults::BREAKER_COOL_DOWN_MS,
            10..=600_000,
        );
        StorageConfig {
            backend,
            timeout_ms,
            on_error,
            max_entries,
            max_entries_per_tenant,
            sweep_interval_ms,
            tls_ca_file,
            fallback_instances,
            denial_cache: raw.denial_cache.is_none_or(|d| d.value),
            breaker_failures: breaker_failures as u32,
            breaker_cool_down_ms,
            breaker_probes: breaker_probes as u32,
        }
    }

    fn redis_url(&mut self, url: &S<String>, field: &str) {
        let ok = ["redis://", "rediss://", "unix://", "redis+unix://"]
            .iter()
            .any(|scheme| url.value.starts_with(scheme) && url.value.len() > scheme.len());
        if !ok {
            // Never echo the URL: it may carry a password.
            self.push(
                url.referenced,
                format!("`{field}` must be a redis://, rediss:// or unix:// URL"),
            );
        }
    }

    fn on_error(&mut self, raw: &S<String>, field: &str) -> OnError {
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

    fn integer_in(
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

    fn duration_in(
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

    fn keys(&mut self, raw: RawKeys, backend: &Backend) -> KeysConfig {
        let prefix = match raw.prefix {
            None => defaults::PREFIX.to_owned(),
            Some(p) => {
                let ok = (1..=32).contains(&p.value.len())
                    && p.value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
                if !ok {
                    self.push(
                        p.referenced,
                        format!(
                            "`keys.prefix` must be 1 to 32 letters, digits, `_` or `-`, got `{}`",
                            p.value
                        ),
                    );
                }
                p.value
            }
        };
        let pepper = self.secret(raw.pepper_env, raw.pepper_file, "keys.pepper");
        let previous_at = raw
            .previous_pepper_env
            .as_ref()
            .or(raw.previous_pepper_file.as_ref())
            .map(|p| p.referenced);
        let previous_pepper = self.secret(
            raw.previous_pepper_env,
            raw.previous_pepper_file,
            "keys.previous_pepper",
        );
        if let (Some(at), Backend::RedisCluster { .. }) = (previous_at, backend) {
            self.push(
                at,
                "`keys.previous_pepper_*` is not supported with `backend: redis-cluster`: keys under two peppers sit on different slots and cannot be read in one script; change the pepper without it (see docs/OPERATIONS.md)",
            );
        }
        KeysConfig {
            prefix,
            pepper,
            previous_pepper,
        }
    }

    fn secret(
        &mut self,
        env: Option<S<String>>,
        file: Option<S<String>>,
        field: &str,
    ) -> Option<SecretSource> {
        match (env, file) {
            (Some(_), Some(file)) => {
                self.push(
                    file.referenced,
                    format!("set either `{field}_env` or `{field}_file`, not both"),
                );
                None
            }
            (Some(env), None) if env.value.is_empty() => {
                self.push(
                    env.referenced,
                    format!("`{field}_env` must name an environment variable"),
                );
                None
            }
            (Some(env), None) => Some(SecretSource::Env(env.value)),
            (None, Some(file)) if file.value.is_empty() => {
                self.push(file.referenced, format!("`{field}_file` must be a path"));
                None
            }
            (None, Some(file)) => Some(SecretSource::File(PathBuf::from(file.value))),
            (None, None) => None,
        }
    }

    fn limits(
        &mut self,
        envoy_only: bool,
        default_plan: Option<S<String>>,
        near_limit: Option<S<f64>>,
        plans: Option<S<BTreeMap<String, S<RawPlan>>>>,
        tenants: Option<BTreeMap<String, S<super::raw::RawTenant>>>,
        global: Option<BTreeMap<String, S<Vec<S<RawRule>>>>>,
    ) -> Limits {
        let near_limit = match near_limit {
            None => defaults::NEAR_LIMIT,
            Some(n) if n.value > 0.0 && n.value <= 1.0 => n.value,
            Some(n) => {
                self.push(
                    n.referenced,
                    format!(
                        "`near_limit` must be a fraction above 0 and at most 1 (e.g. 0.8), got {}",
                        crate::number::shown(n.value)
                    ),
                );
                defaults::NEAR_LIMIT
            }
        };
        let (global_rules, valves, reserved) = self.global_table(global.unwrap_or_default());
        let global_names: Vec<String> = global_rules
            .iter()
            .flat_map(|r| r.rules.iter().map(|n| n.name.clone()))
            .collect();

        let plans_at = plans.as_ref().map_or(TOP, |p| p.referenced);
        let mut specs = Vec::new();
        for (name, plan) in plans.map(|p| p.value).unwrap_or_default() {
            if name.is_empty() || name.len() > MAX_NAME_BYTES {
                self.push(
                    plan.referenced,
                    format!("plan names must be 1 to {MAX_NAME_BYTES} bytes"),
                );
            }
            specs.push(self.plan(name, plan, &global_names));
        }
        if envoy_only {
            specs.push(PlanSpec {
                name: ENVOY_ONLY_PLAN.to_owned(),
                tenant: Vec::new(),
                routes: Vec::new(),
                subject: Vec::new(),
                dedupe: Vec::new(),
                on_error: None,
                weight: 1.0,
            });
        } else if specs.is_empty() {
            self.push(plans_at, "`plans` must define at least one plan");
        }
        self.reserved_plans(reserved, &specs);
        let plan_list = || {
            specs
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let default_plan = match default_plan {
            None if envoy_only => ENVOY_ONLY_PLAN.to_owned(),
            None => {
                self.push(TOP, "`default_plan` is missing: name the plan that tenants not listed under `tenants` get");
                String::new()
            }
            Some(d) => {
                if !specs.is_empty() && !specs.iter().any(|p| p.name == d.value) {
                    let list = plan_list();
                    self.push(
                        d.referenced,
                        format!(
                            "`default_plan` names unknown plan `{}`; defined plans: {list}",
                            d.value
                        ),
                    );
                }
                d.value
            }
        };
        let mut tenant_specs = Vec::new();
        for (id, tenant) in tenants.unwrap_or_default() {
            if id.is_empty() || id.len() > MAX_TENANT_BYTES {
                self.push(
                    tenant.referenced,
                    format!("tenant ids must be 1 to {MAX_TENANT_BYTES} bytes"),
                );
            }
            let plan = match &tenant.value.plan {
                Some(p) => {
                    if !specs.iter().any(|s| s.name == p.value) {
                        let list = plan_list();
                        self.push(
                            p.referenced,
                            format!(
                                "tenant `{id}` has unknown plan `{}`; defined plans: {list}",
                                p.value
                            ),
                        );
                    }
                    p.value.clone()
                }
                None => default_plan.clone(),
            };
            let shards = match &tenant.value.shards {
                None => 1,
                Some(s) if (1..=MAX_SHARDS).contains(&s.value) => s.value as u16,
                Some(s) => {
                    self.push(
                        s.referenced,
                        format!("`shards` must be from 1 to {MAX_SHARDS}, got {}", s.value),
                    );
                    1
                }
            };
            tenant_specs.push(TenantSpec { id, plan, shards });
        }
        Limits {
            default_plan,
            near_limit,
            plans: specs,
            tenants: tenant_specs,
            global: global_rules,
            valves,
        }
    }

    fn plan(&mut self, name: String, plan: S<RawPlan>, global_names: &[String]) -> PlanSpec {
        let at = plan.referenced;
        let raw = plan.value;
        let tenant = self.rules(raw.tenant.unwrap_or_default(), "tenant");
        let routes = self.route_table(raw.routes.unwrap_or_default(), "route");
        let subject = self.route_table(raw.subject.unwrap_or_default(), "subject");
        let dedupe = self.dedupe(raw.dedupe.unwrap_or_default());
        let on_error = raw.on_error.as_ref().map(|o| self.on_error(o, "on_error"));
        let weight = self.weight(raw.weight.as_ref());

        // A name must say which rule denied: it may not be shared by two
        // scopes that can apply to the same request.
        let mut owner: HashMap<&str, &str> = HashMap::new();
        let groups = [
            ("tenant", tenant.iter().collect::<Vec<_>>()),
            ("route", routes.iter().flat_map(|r| &r.rules).collect()),
            ("subject", subject.iter().flat_map(|r| &r.rules).collect()),
        ];
        for name in global_names {
            owner.insert(name, "global");
        }
        let mut clashes = Vec::new();
        for (scope, rules) in &groups {
            let mut seen_here: Vec<&str> = Vec::new();
            for rule in rules {
                if seen_here.contains(&rule.name.as_str()) {
                    continue;
                }
                seen_here.push(&rule.name);
                if let Some(other) = owner.insert(&rule.name, scope) {
                    clashes.push(format!(
                        "plan `{name}`: policy name `{}` is used by both {other} and {scope} rules; names must tell scopes apart",
                        rule.name
                    ));
                }
            }
        }
        for clash in clashes {
            self.push(at, clash);
        }
        PlanSpec {
            name,
            tenant,
            routes,
            subject,
            dedupe,
            on_error,
            weight,
        }
    }

    fn route_table(
        &mut self,
        table: BTreeMap<String, S<Vec<S<RawRule>>>>,
        scope: &str,
    ) -> Vec<RouteRules> {
        let mut seen = Vec::with_capacity(table.len());
        table
            .into_iter()
            .map(|(pattern, rules)| {
                let at = rules.referenced;
                let pattern = self.distinct_pattern(&mut seen, pattern, at);
                RouteRules {
                    pattern,
                    rules: self.rules(rules.value, scope),
                }
            })
            .collect()
    }

    /// `dedupe: { "ROUTE PATTERN": { window: 5s } }`: one rule each, a
    /// `fixed_window` of 1 per window (opened by the first admission).
    fn dedupe(&mut self, raw: BTreeMap<String, S<super::raw::RawDedupe>>) -> Vec<RouteRules> {
        let mut seen = Vec::with_capacity(raw.len());
        raw.into_iter()
            .map(|(pattern, entry)| {
                let at = entry.referenced;
                let pattern = self.distinct_pattern(&mut seen, pattern, at);
                let window = match &entry.value.window {
                    Some(w) => self.duration_in(Some(w), "dedupe.window", 1_000, 10..=86_400_000),
                    None => {
                        self.push(
                            at,
                            "`dedupe` entries need a `window`, e.g. `{ window: 5s }`",
                        );
                        1_000
                    }
                };
                let rule = Rule::new(Algorithm::FixedWindow, 1, window, None, false)
                    .expect("a window of 1 within bounds is a valid rule");
                RouteRules {
                    pattern,
                    rules: vec![NamedRule {
                        name: "dedupe".to_owned(),
                        rule,
                        shadow: false,
                    }],
                }
            })
            .collect()
    }

    /// `text` as a pattern of a table whose patterns so far are `seen`
    /// (each with its spelling): two spellings of one route (`GET /a/b`,
    /// `get /a/b/`) are refused, since requests are normalised before they
    /// are matched and only one of their lists could ever apply.
    fn distinct_pattern(
        &mut self,
        seen: &mut Vec<(RoutePattern, String)>,
        text: String,
        at: Location,
    ) -> RoutePattern {
        let pattern = self.pattern(&text, at);
        if let Some((_, other)) = seen.iter().find(|(p, _)| *p == pattern) {
            self.push(
                at,
                format!(
                    "route pattern `{text}` is the same route as `{other}` (both `{}` once normalised): give their rules in one list",
                    pattern.source()
                ),
            );
        }
        seen.push((pattern.clone(), text));
        pattern
    }

    fn pattern(&mut self, text: &str, at: Location) -> RoutePattern {
        if text.is_empty() || text.len() > MAX_ROUTE_BYTES {
            self.push(
                at,
                format!("route patterns must be 1 to {MAX_ROUTE_BYTES} bytes"),
            );
        }
        // Patterns are matched against normalised routes, so they are
        // normalised too (a prefix keeps its trailing slash: `GET /v1/users/*`
        // covers `/v1/users/42`, not `/v1/users-admin`).
        match text.find('*') {
            None => RoutePattern::Exact(crate::route::normalize(text).into_owned()),
            Some(star) if star + 1 == text.len() => {
                let prefix = &text[..star];
                let mut normal = crate::route::normalize(prefix).into_owned();
                if prefix.ends_with('/') && !normal.ends_with('/') {
                    normal.push('/');
                }
                RoutePattern::Prefix(normal)
            }
            Some(_) => {
                self.push(
                    at,
                    format!("route pattern `{text}`: `*` may only end a pattern (`GET /v1/users/*`) or stand alone (`*`)"),
                );
                RoutePattern::Exact(text.to_owned())
            }
        }
    }

    pub(super) fn rules(&mut self, raw: Vec<S<RawRule>>, scope: &str) -> Vec<NamedRule> {
        if let Some(extra) = raw.get(MAX_RULES_PER_LIST) {
            self.push(
                extra.referenced,
                format!(
                    "a list of `{scope}` rules holds at most {MAX_RULES_PER_LIST} rules, got {}",
                    raw.len()
                ),
            );
        }
        let mut out: Vec<NamedRule> = Vec::with_capacity(raw.len());
        for (index, rule) in raw.into_iter().enumerate() {
            let at = rule.referenced;
            self.no_share(&rule.value, scope);
            let name = match &rule.value.name {
                Some(n) => {
                    let ok = !n.value.is_empty()
                        && n.value.len() <= MAX_NAME_BYTES
                        && n.value
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
                    if !ok {
                        self.push(
                            n.referenced,
                            format!("`name` must be 1 to {MAX_NAME_BYTES} letters, digits, `_`, `-` or `.`, got `{}`", n.value),
                        );
                    }
                    if out.iter().any(|r| r.name == n.value) {
                        self.push(
                            n.referenced,
                            format!("`name` `{}` is used twice in this list", n.value),
                        );
                    }
                    n.value.clone()
                }
                None => format!("{scope}-{index}"),
            };
            let shadow = rule.value.shadow.as_ref().is_some_and(|s| s.value);
            if let Some(rule) = self.rule(rule.value, at) {
                out.push(NamedRule { name, rule, shadow });
            }
        }
        out
    }

    fn rule(&mut self, raw: RawRule, at: Location) -> Option<Rule> {
        let algorithm = match &raw.algorithm {
            None => Algorithm::Gcra,
            Some(a) => match Algorithm::from_name(&a.value) {
                Some(algorithm) => algorithm,
                None => {
                    let allowed: Vec<_> = Algorithm::ALL.iter().map(|a| a.name()).collect();
                    self.push(
                        a.referenced,
                        format!(
                            "unknown `algorithm` `{}`; allowed: {}",
                            a.value,
                            allowed.join(", ")
                        ),
                    );
                    return None;
                }
            },
        };
        if algorithm == Algorithm::Concurrency {
            return self.concurrency_rule(&raw, at);
        }
        if let Some(lease) = &raw.lease {
            self.push(
                lease.referenced,
                "`lease` is only for `algorithm: concurrency`; rate rules take `per`",
            );
            return None;
        }
        let Some(limit) = &raw.limit else {
            self.push(at, "rule needs `limit`, the number of units per `per`");
            return None;
        };
        let Some(per) = &raw.per else {
            self.push(at, "rule needs `per`, a duration such as 1s, 1m or 1h");
            return None;
        };
        let per_ms = match parse_duration_ms(&per.value) {
            Ok(ms) => ms,
            Err(e) => {
                self.push(per.referenced, format!("`per`: {e}"));
                return None;
            }
        };
        let aligned = raw.aligned.as_ref().is_some_and(|a| a.value);
        match Rule::new(
            algorithm,
            limit.value.into(),
            per_ms,
            raw.burst.as_ref().map(|b| b.value.into()),
            aligned,
        ) {
            Ok(rule) => Some(rule),
            Err(e) => {
                use crate::rule::RuleError as E;
                let place = match e {
                    E::Limit(..) | E::SlidingLogTooLarge(_) => limit.referenced,
                    E::TooLarge { field: "limit", .. } => limit.referenced,
                    E::Period(_) => per.referenced,
                    E::Burst(_) | E::BurstNotAllowed(_) | E::TooLarge { .. } => {
                        raw.burst.as_ref().map_or(at, |b| b.referenced)
                    }
                    E::AlignedNotAllowed(..) => raw.aligned.as_ref().map_or(at, |a| a.referenced),
                    E::ConcurrencyTooLarge(_) | E::Lease(_) => at,
                };
                self.push(place, e.to_string());
                None
            }
        }
    }

    /// `{algorithm: concurrency, limit, lease}`.
    fn concurrency_rule(&mut self, raw: &RawRule, at: Location) -> Option<Rule> {
        for (field, place) in [
            ("per", raw.per.as_ref().map(|p| p.referenced)),
            ("burst", raw.burst.as_ref().map(|b| b.referenced)),
            ("aligned", raw.aligned.as_ref().map(|a| a.referenced)),
        ] {
            if let Some(place) = place {
                self.push(
                    place,
                    format!("`{field}` is not for `algorithm: concurrency`, which takes `limit` (leases at once) and `lease` (how long one may be held)"),
                );
                return None;
            }
        }
        let Some(limit) = &raw.limit else {
            self.push(
                at,
                "a concurrency rule needs `limit`, the number of leases held at once",
            );
            return None;
        };
        let Some(lease) = &raw.lease else {
            self.push(at, "a concurrency rule needs `lease`, how long one may be held before it expires, such as 30s");
            return None;
        };
        let lease_ms = match parse_duration_ms(&lease.value) {
            Ok(ms) => ms,
            Err(e) => {
                self.push(lease.referenced, format!("`lease`: {e}"));
                return None;
            }
        };
        match Rule::concurrency(limit.value.into(), lease_ms) {
            Ok(rule) => Some(rule),
            Err(e) => {
                let place = match e {
                    crate::rule::RuleError::Lease(_) => lease.referenced,
                    _ => limit.referenced,
                };
                self.push(place, e.to_string());
                None
            }
        }
    }
}
