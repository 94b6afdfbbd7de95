//! The configuration file as YAML says it, before validation.
//!
//! Every field the validator may complain about is `Spanned`, so that its
//! error can point at `file:line:column`. Unknown fields are errors: a typo
//! must not silently leave a limit unenforced.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_saphyr::Spanned;

pub(crate) type S<T> = Spanned<T>;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawConfig {
    pub server: Option<RawServer>,
    pub storage: Option<RawStorage>,
    pub keys: Option<RawKeys>,
    pub default_plan: Option<S<String>>,
    pub near_limit: Option<S<f64>>,
    pub plans: Option<S<BTreeMap<String, S<RawPlan>>>>,
    pub tenants: Option<BTreeMap<String, S<RawTenant>>>,
    pub global: Option<BTreeMap<String, S<Vec<S<RawRule>>>>>,
    pub priorities: Option<BTreeMap<String, S<String>>>,
    pub envoy: Option<RawEnvoy>,
    pub admin: Option<RawAdmin>,
    pub ledger: Option<S<RawLedger>>,
    pub tracing: Option<RawTracing>,
    pub reservation_ttl: Option<S<String>>,
    pub attempt_ttl: Option<S<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLedger {
    pub dir: Option<S<String>>,
    pub tenants: Option<S<String>>,
    pub flush_every: Option<S<String>>,
    pub max_file_bytes: Option<S<i64>>,
    pub max_file_age: Option<S<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTracing {
    pub endpoint: Option<S<String>>,
    pub protocol: Option<S<String>>,
    pub headers: Option<BTreeMap<String, S<String>>>,
    pub sampler: Option<S<String>>,
    pub ratio: Option<S<f64>>,
    pub service_name: Option<S<String>>,
    pub resource: Option<BTreeMap<String, S<String>>>,
    pub queue: Option<S<i64>>,
    pub timeout: Option<S<String>>,
    pub attributes: Option<S<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub token_env: Option<S<String>>,
    pub token_file: Option<S<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawEnvoy {
    pub domain: Option<S<String>>,
    pub tenant_key: Option<S<String>>,
    pub route_key: Option<S<String>>,
    pub subject_key: Option<S<String>>,
    pub fingerprint_key: Option<S<String>>,
    pub config: Option<S<String>>,
    pub files: Option<S<String>>,
    pub merge_domains: Option<bool>,
    pub shadow_mode: Option<bool>,
    pub tolerance: Option<S<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawServer {
    pub http: Option<S<String>>,
    pub grpc: Option<S<String>>,
    pub forward_auth: Option<RawForwardAuth>,
    pub limits: Option<RawLimits>,
    pub metrics: Option<S<RawMetrics>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawMetrics {
    pub listen: Option<S<String>>,
    pub path: Option<S<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimits {
    pub max_connections: Option<S<i64>>,
    pub header_timeout: Option<S<String>>,
    pub request_timeout: Option<S<String>>,
    pub grpc_keepalive: Option<S<String>>,
    pub grpc_max_streams: Option<S<i64>>,
    pub grpc_max_message_bytes: Option<S<i64>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawForwardAuth {
    pub tenant_header: Option<S<String>>,
    pub subject_header: Option<S<String>>,
    pub cost_header: Option<S<String>>,
    pub fingerprint_header: Option<S<String>>,
    pub method_header: Option<S<String>>,
    pub uri_header: Option<S<String>>,
    pub subject_from: Option<S<String>>,
    pub trusted_proxies: Option<Vec<S<String>>>,
    pub client_ip_header: Option<S<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawStorage {
    pub backend: Option<S<String>>,
    pub url: Option<S<String>>,
    pub nodes: Option<S<Vec<S<String>>>>,
    pub global_shards: Option<S<i64>>,
    pub timeout: Option<S<String>>,
    pub on_error: Option<S<String>>,
    pub max_entries: Option<S<i64>>,
    pub max_entries_per_tenant: Option<S<i64>>,
    pub sweep_interval: Option<S<String>>,
    pub tls_ca_file: Option<S<String>>,
    pub fallback_instances: Option<S<i64>>,
    pub denial_cache: Option<S<bool>>,
    pub breaker: Option<RawBreaker>,
    pub regions: Option<S<RawRegions>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRegions {
    #[serde(rename = "self")]
    pub this: Option<S<String>>,
    pub weight: Option<S<i64>>,
    pub peers: Option<S<BTreeMap<String, S<RawPeer>>>>,
    pub sync_every: Option<S<String>>,
    pub peer_timeout: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPeer {
    pub url: Option<S<String>>,
    pub nodes: Option<S<Vec<S<String>>>>,
    pub weight: Option<S<i64>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBreaker {
    pub failures: Option<S<i64>>,
    pub cool_down: Option<S<String>>,
    pub probes: Option<S<i64>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawKeys {
    pub prefix: Option<S<String>>,
    pub pepper_env: Option<S<String>>,
    pub pepper_file: Option<S<String>>,
    pub previous_pepper_env: Option<S<String>>,
    pub previous_pepper_file: Option<S<String>>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPlan {
    pub tenant: Option<Vec<S<RawRule>>>,
    pub routes: Option<BTreeMap<String, S<Vec<S<RawRule>>>>>,
    pub subject: Option<BTreeMap<String, S<Vec<S<RawRule>>>>>,
    pub dedupe: Option<BTreeMap<String, S<RawDedupe>>>,
    pub on_error: Option<S<String>>,
    pub weight: Option<S<f64>>,
    pub priority: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawDedupe {
    pub window: Option<S<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTenant {
    pub plan: Option<S<String>>,
    pub shards: Option<S<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    pub name: Option<S<String>>,
    pub algorithm: Option<S<String>>,
    pub limit: Option<S<i64>>,
    pub per: Option<S<String>>,
    pub burst: Option<S<i64>>,
    pub aligned: Option<S<bool>>,
    pub shadow: Option<S<bool>>,
    pub tolerance: Option<S<String>>,
    pub lease: Option<S<String>>,
    pub share: Option<S<String>>,
    pub reserve: Option<S<BTreeMap<String, S<String>>>>,
    pub max_debt: Option<S<i64>>,
    pub count_if: Option<S<RawCountIf>>,
    pub regions: Option<S<String>>,
    pub adaptive: Option<S<RawAdaptive>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAdaptive {
    pub latency_target: Option<S<String>>,
    pub min: Option<S<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawCountIf {
    pub status: Option<S<Vec<S<RawStatus>>>>,
}

/// A status code as YAML writes it: `401` or `"4xx"`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawStatus {
    Code(i64),
    Text(String),
}
