//! The configuration: one YAML file, parsed, validated and typed.
//!
//! [`Config::from_yaml`] either returns a complete, valid configuration or
//! every problem it found, each with `file:line:column`, what is wrong and
//! what is allowed. Nothing downstream re-validates: a [`Config`] is ready to
//! be compiled into a [`Policy`](crate::policy::Policy).

pub mod envoy;
mod error;
mod raw;
pub mod shards;
pub mod share;
pub mod tracing;
mod validate;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use error::{ConfigError, ConfigErrors};
pub use validate::MAX_RULES_PER_LIST;

use crate::rule::Rule;

/// The whole configuration file.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Listening addresses and the forward-auth header names.
    pub server: ServerConfig,
    /// Where state lives and what to do when it cannot be reached.
    pub storage: StorageConfig,
    /// Key derivation: prefix and pepper sources.
    pub keys: KeysConfig,
    /// Plans, tenants and global valves.
    pub limits: Limits,
    /// The Envoy Rate Limit Service.
    pub envoy: EnvoyServiceConfig,
    /// `admin:` where the admin API's bearer token is read from; `None`:
    /// the admin API is off.
    pub admin_token: Option<SecretSource>,
    /// `ledger:` the durable usage record, when on.
    pub ledger: Option<LedgerConfig>,
    /// `tracing:` spans exported over OTLP; `None`: the `OTEL_*`
    /// variables alone decide (off unless they name a collector).
    pub tracing: Option<tracing::TracingConfig>,
    /// `reservation_ttl`: how long a reservation (`"reserve": true`) may be
    /// settled; unsettled, it keeps its estimate.
    pub reservation_ttl_ms: u64,
    /// `attempt_ttl`: how long an attempt (a check on a route whose rules
    /// count by outcome) may be concluded; unconcluded, it is given back.
    pub attempt_ttl_ms: u64,
}

/// `ledger:` usage per tenant, route pattern and minute, appended to
/// JSON-lines files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerConfig {
    /// The directory the files go in.
    pub dir: PathBuf,
    /// Tenant ids as they are (`clear`) or as HMACs under the pepper
    /// (`hmac`).
    pub hmac_tenants: bool,
    /// How often what was counted is appended (and synced to disk).
    pub flush_every_ms: u64,
    /// A file is closed and a new one begun above this size.
    pub max_file_bytes: u64,
    /// … or when it is older than this.
    pub max_file_age_ms: u64,
}

/// `envoy:` — how Envoy rate-limit requests map onto sluice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyServiceConfig {
    /// The domain decided with sluice's own plans (native mapping).
    pub domain: String,
    /// Descriptor entry key carrying the tenant.
    pub tenant_key: String,
    /// Descriptor entry key carrying the route.
    pub route_key: String,
    /// Descriptor entry key carrying the subject.
    pub subject_key: String,
    /// Descriptor entry key carrying the duplicate guard's fingerprint.
    pub fingerprint_key: String,
    /// envoyproxy/ratelimit configuration: a YAML file, or a directory of
    /// them (its subdirectories included).
    pub config_path: Option<PathBuf>,
    /// A directory's files: every file but dot files (the default, as
    /// envoyproxy/ratelimit's runtime directory loads them), or only
    /// `*.yaml` and `*.yml` ones (`envoy.files: yaml`).
    pub all_files: bool,
    /// Domains split over several files are merged (envoyproxy/ratelimit's
    /// `MERGE_DOMAIN_CONFIG`) instead of refused.
    pub merge_domains: bool,
    /// Every answer is OK, would-be denials only counted (its global
    /// `SHADOW_MODE`).
    pub shadow_mode: bool,
    /// `envoy.tolerance`: the tolerance of every limit of the
    /// envoyproxy/ratelimit domains (those it can bound).
    pub tolerance: crate::tolerance::Tolerance,
}

/// A rule's `regions` (SPEC appendix H), with `storage.regions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionScope {
    /// One budget across every region.
    Shared,
    /// A budget of its own in each region.
    Local,
}

impl RegionScope {
    /// A rule's scope when it does not say: shared for tenant, route,
    /// subject and descriptor rules whose state can be shared out; local
    /// for valves and their gates, the duplicate guard and concurrency
    /// limits (their downstream and in-flight requests are each region's
    /// own), and for the algorithms [`RegionScope::shareable`] refuses.
    pub fn default_for(scope: crate::scope::Scope, rule: &crate::rule::Rule) -> RegionScope {
        use crate::scope::Scope;
        match scope {
            Scope::Tenant | Scope::Route | Scope::Subject | Scope::Descriptor
                if RegionScope::shareable(rule).is_ok() =>
            {
                RegionScope::Shared
            }
            _ => RegionScope::Local,
        }
    }

    /// Whether a rule's budget can be one across regions; if not, why
    /// (for the validation's message). An aligned `fixed_window` and a
    /// `sliding_window` (always aligned) are: each region counts the same
    /// windows, and budget moves between regions per window (see
    /// [`crate::regions`]); a `gcra` and a `token_bucket` are: their rate
    /// moves between regions, their burst with it
    /// ([`crate::regions::bucket`]).
    pub fn shareable(rule: &crate::rule::Rule) -> Result<(), &'static str> {
        use crate::rule::Algorithm;
        match rule.algorithm() {
            Algorithm::FixedWindow if rule.aligned() => Ok(()),
            Algorithm::SlidingWindow | Algorithm::Gcra | Algorithm::TokenBucket => Ok(()),
            Algorithm::FixedWindow => Err(
                "a shared fixed_window needs `aligned: true`, so that every region counts the same windows",
            ),
            Algorithm::Concurrency => Err("requests in flight are each region's own"),
            Algorithm::SlidingLog => Err(
                "a sliding_log keeps each admission's time, which cannot be shared out between regions",
            ),
        }
    }
}

/// `server:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// HTTP API, forward-auth, health and metrics.
    pub http: SocketAddr,
    /// Envoy Rate Limit Service (gRPC).
    pub grpc: SocketAddr,
    /// Which request headers `/v1/forward-auth` reads.
    pub forward_auth: ForwardAuthConfig,
    /// What one client may hold of the server.
    pub limits: ConnectionLimits,
    /// `server.metrics`: a listener of its own for the metrics, besides
    /// `/metrics` on `http` (envoyproxy/ratelimit's `PROMETHEUS_ADDR`).
    pub metrics: Option<MetricsListener>,
}

/// `server.metrics: {listen, path}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsListener {
    /// Where to listen.
    pub listen: SocketAddr,
    /// The one path served there (default `/metrics`).
    pub path: String,
}

/// `server.limits:` what one client may hold of the server, so that slow
/// or idle clients cannot exhaust it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most open connections on each listener (HTTP, gRPC); further ones
    /// are closed at once.
    pub max_connections: u64,
    /// HTTP/1: from the moment a connection is ready for a request
    /// (accepted, or its previous answer sent) until that request's
    /// headers are in; also bounds how long a kept-alive connection may
    /// sit idle.
    pub header_timeout_ms: u64,
    /// HTTP: a whole request, body included, must be handled within this
    /// (else 408).
    pub request_timeout_ms: u64,
    /// gRPC (HTTP/2): a ping every interval; a peer that does not answer
    /// within the same time is dropped.
    pub grpc_keepalive_ms: u64,
    /// gRPC: most concurrent streams per connection.
    pub grpc_max_streams: u32,
    /// gRPC: largest request message, in bytes.
    pub grpc_max_message_bytes: u64,
}

/// `server.forward_auth:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardAuthConfig {
    /// Header carrying the tenant (default `X-Tenant`).
    pub tenant_header: String,
    /// Header carrying the subject, if any.
    pub subject_header: Option<String>,
    /// Header carrying the cost, if any (default cost 1).
    pub cost_header: Option<String>,
    /// Header carrying the fingerprint the duplicate guard compares
    /// (default `Idempotency-Key`).
    pub fingerprint_header: String,
    /// Headers the original request's method is read from, in this order:
    /// the first one present counts (default `X-Forwarded-Method`, then
    /// `X-Original-Method`; one header when configured).
    pub method_headers: Vec<String>,
    /// Headers the original request's URI is read from, in the same way
    /// (default `X-Forwarded-Uri`, then `X-Original-URI`).
    pub uri_headers: Vec<String>,
    /// The subject is the client's IP address, read from
    /// `client_ip_header` only through `trusted_proxies`.
    pub client_ip_subject: bool,
    /// Proxies whose forwarding headers are believed (CIDRs).
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// The header those proxies write the client's address in.
    pub client_ip_header: ClientIpHeader,
}

/// The header trusted proxies write the client's address in. Only that
/// one is read: a proxy passes the other along as the client wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientIpHeader {
    /// `X-Forwarded-For` (nginx, HAProxy, Traefik, Caddy, Envoy, cloud
    /// load balancers).
    #[default]
    XForwardedFor,
    /// `Forwarded: for=` (RFC 7239).
    Forwarded,
}

/// `storage.backend`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// In-process state (the default).
    Memory,
    /// One Redis node.
    Redis {
        /// `redis://`, `rediss://` or `unix://` URL, credentials included.
        url: String,
    },
    /// Redis Cluster, from seed nodes.
    RedisCluster {
        /// Seed node URLs.
        nodes: Vec<String>,
        /// Most keys (on different slots) a global limit is split over.
        global_shards: u16,
    },
}

impl Backend {
    /// The name used in the configuration.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis { .. } => "redis",
            Backend::RedisCluster { .. } => "redis-cluster",
        }
    }
}

/// What a decision does when the store fails or times out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Enforce each limit in process, divided among live instances.
    Local,
    /// Admit.
    Allow,
    /// Deny with reason `store_unavailable`.
    Deny,
}

impl OnError {
    /// The name used in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            OnError::Local => "local",
            OnError::Allow => "allow",
            OnError::Deny => "deny",
        }
    }
}

/// `storage:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageConfig {
    /// Which store.
    pub backend: Backend,
    /// Budget for one store call, in milliseconds.
    pub timeout_ms: u64,
    /// Default failure policy (plans may override it).
    pub on_error: OnError,
    /// Memory store: most keys held at once.
    pub max_entries: u64,
    /// Memory store: most keys one tenant holds (global valves count as one
    /// tenant), so that a tenant naming a new subject on every request
    /// fills its share and not the store.
    pub max_entries_per_tenant: u64,
    /// Memory store: how often idle keys are dropped, in milliseconds.
    pub sweep_interval_ms: u64,
    /// Redis over TLS (`rediss://`): a PEM file of the CA to trust instead
    /// of the system's roots.
    pub tls_ca_file: Option<PathBuf>,
    /// Live instances `on_error: local` assumes until heartbeats tell.
    pub fallback_instances: u64,
    /// Whether denials are remembered until they expire (Redis backends).
    pub denial_cache: bool,
    /// Consecutive store failures that open the circuit breaker.
    pub breaker_failures: u32,
    /// How long the breaker stays open before probing, in milliseconds.
    pub breaker_cool_down_ms: u64,
    /// Consecutive successful probes that close the breaker.
    pub breaker_probes: u32,
    /// `storage.regions`: one budget across regions (SPEC appendix H).
    pub regions: Option<RegionsConfig>,
}

/// `storage.regions`: this region, its peers, and how usage moves between
/// them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionsConfig {
    /// This region's name (`self`).
    pub this: String,
    /// Its weight: its share of a shared rule's budget is its weight over
    /// all regions' (while no usage has moved).
    pub weight: u32,
    /// The other regions, by name.
    pub peers: Vec<PeerRegion>,
    /// How often usage moves between regions, in milliseconds.
    pub sync_every_ms: u64,
    /// A peer not heard from for this long is cut off, in milliseconds.
    pub peer_timeout_ms: u64,
}

impl RegionsConfig {
    /// Every region (this one included) as `(name, weight)`, in the order
    /// of their names: the order every region computes shares in.
    pub fn in_order(&self) -> Vec<(&str, u32)> {
        let mut all: Vec<(&str, u32)> = self
            .peers
            .iter()
            .map(|p| (p.name.as_str(), p.weight))
            .chain(std::iter::once((self.this.as_str(), self.weight)))
            .collect();
        all.sort_unstable();
        all
    }
}

/// One peer region: its name, its store, its weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRegion {
    /// Its name, as its own `storage.regions.self` says it.
    pub name: String,
    /// Its store, credentials included.
    pub store: PeerStore,
    /// Its weight.
    pub weight: u32,
}

/// A peer region's store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerStore {
    /// One Redis (`url`).
    Redis(String),
    /// A Redis Cluster (`nodes`, seed URLs).
    Cluster(Vec<String>),
}

/// Where a secret is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// An environment variable's name.
    Env(String),
    /// A file's path.
    File(PathBuf),
}

/// `keys:`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeysConfig {
    /// Prefix of every Redis key.
    pub prefix: String,
    /// The pepper keys are derived under.
    pub pepper: Option<SecretSource>,
    /// The pepper being rotated away from.
    pub previous_pepper: Option<SecretSource>,
}

/// Plans, tenants and global valves: everything a decision looks up.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// The plan of tenants not listed under `tenants`.
    pub default_plan: String,
    /// Fraction of a rule's capacity used from which a decision is
    /// `near_limit`.
    pub near_limit: f64,
    /// Plans by name.
    pub plans: Vec<PlanSpec>,
    /// Tenants with an explicit plan or shard count.
    pub tenants: Vec<TenantSpec>,
    /// Per-route valves across all tenants.
    pub global: Vec<RouteRules>,
    /// How each valve of `global` is shared when saturated.
    pub valves: Vec<share::ValveShare>,
    /// Requests' priority at adaptive valves by route pattern, over their
    /// plan's (`priorities:`).
    pub priorities: Vec<RoutePriority>,
}

/// A route pattern's priority at adaptive valves (`priorities:`): it wins
/// over the plan's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutePriority {
    /// Which routes.
    pub pattern: RoutePattern,
    /// Their priority.
    pub priority: crate::adaptive::Priority,
}

impl Limits {
    /// How the valve `name` under `pattern` is shared, as validated (for a
    /// valve the configuration does not know: fair, which a valve whose
    /// algorithm does not refill at its rate still cannot be).
    pub fn share_of(&self, pattern: &str, name: &str) -> share::Share {
        self.valve(pattern, name)
            .map_or(share::Share::Fair, |v| v.share)
    }

    /// The sharing written on the valve `name` under `pattern`, if any.
    pub fn valve(&self, pattern: &str, name: &str) -> Option<&share::ValveShare> {
        self.valves
            .iter()
            .find(|v| v.pattern == pattern && v.name == name)
    }
}

/// One plan.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanSpec {
    /// The plan's name.
    pub name: String,
    /// One budget for the tenant across all routes.
    pub tenant: Vec<NamedRule>,
    /// Per tenant per route.
    pub routes: Vec<RouteRules>,
    /// Per subject per route.
    pub subject: Vec<RouteRules>,
    /// Duplicate guards per route pattern (one `fixed_window` rule of 1 per
    /// `window` each, counted per tenant, subject and fingerprint).
    pub dedupe: Vec<RouteRules>,
    /// Failure policy for this plan, overriding `storage.on_error`.
    pub on_error: Option<OnError>,
    /// The plan's tenants' share of a saturated valve, relative to other
    /// plans' (default 1).
    pub weight: f64,
    /// Its requests' priority at adaptive valves (default normal).
    pub priority: crate::adaptive::Priority,
}

/// A tenant listed by id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSpec {
    /// The tenant id.
    pub id: String,
    /// Its plan.
    pub plan: String,
    /// How many slots its keys are spread over (1 = not split).
    pub shards: u16,
}

/// Rules that apply to the routes matching a pattern.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteRules {
    /// Which routes.
    pub pattern: RoutePattern,
    /// The rules.
    pub rules: Vec<NamedRule>,
}

/// A route pattern: `POST /v1/invoices` (exact), `GET /v1/users/*`
/// (prefix) or `*` (every route).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RoutePattern {
    /// Matches this route only.
    Exact(String),
    /// Matches routes starting with this text; `""` matches every route.
    Prefix(String),
}

impl RoutePattern {
    /// The pattern as written in the configuration.
    pub fn source(&self) -> String {
        match self {
            RoutePattern::Exact(route) => route.clone(),
            RoutePattern::Prefix(prefix) => format!("{prefix}*"),
        }
    }

    /// Whether `route` matches.
    pub fn matches(&self, route: &str) -> bool {
        match self {
            RoutePattern::Exact(exact) => exact == route,
            RoutePattern::Prefix(prefix) => route.starts_with(prefix.as_str()),
        }
    }
}

/// A rule with the name that headers and denial reasons show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedRule {
    /// The policy name.
    pub name: String,
    /// The rule.
    pub rule: Rule,
    /// Shadow mode: evaluated and counted, never enforced.
    pub shadow: bool,
    /// `count_if`: only responses of these statuses are counted (the check
    /// before the request only asks); `None`: every request counts.
    pub count_if: Option<crate::status::StatusSet>,
    /// How far over its limit a hot key may be admitted, decided from
    /// local slices ([`Tolerance::EXACT`](crate::tolerance::Tolerance::EXACT):
    /// never).
    pub tolerance: crate::tolerance::Tolerance,
    /// `regions`: one budget across regions or one per region; `None`:
    /// the default for its scope ([`RegionScope::default_for`]).
    pub regions: Option<RegionScope>,
}

/// Defaults, shared with the documentation.
pub mod defaults {
    /// `reservation_ttl`: five minutes.
    pub const RESERVATION_TTL_MS: u64 = 300_000;
    /// The longest `reservation_ttl`: one day.
    pub const MAX_RESERVATION_TTL_MS: u64 = 86_400_000;
    /// `attempt_ttl`: thirty seconds.
    pub const ATTEMPT_TTL_MS: u64 = 30_000;
    /// The longest `attempt_ttl`: one hour.
    pub const MAX_ATTEMPT_TTL_MS: u64 = 3_600_000;
    /// `server.http`.
    pub const HTTP: &str = "127.0.0.1:8080";
    /// `server.grpc`.
    pub const GRPC: &str = "127.0.0.1:8081";
    /// `server.forward_auth.tenant_header`.
    pub const TENANT_HEADER: &str = "X-Tenant";
    /// `server.forward_auth.fingerprint_header`.
    pub const FINGERPRINT_HEADER: &str = "Idempotency-Key";
    /// `server.forward_auth.method_header`: Traefik and Caddy's, then nginx's.
    pub const METHOD_HEADERS: [&str; 2] = ["X-Forwarded-Method", "X-Original-Method"];
    /// `server.forward_auth.uri_header`: Traefik and Caddy's, then nginx's.
    pub const URI_HEADERS: [&str; 2] = ["X-Forwarded-Uri", "X-Original-URI"];
    /// `storage.timeout`.
    pub const TIMEOUT_MS: u64 = 50;
    /// `server.limits.max_connections`.
    pub const MAX_CONNECTIONS: u64 = 10_000;
    /// `server.limits.header_timeout`.
    pub const HEADER_TIMEOUT_MS: u64 = 10_000;
    /// `server.limits.request_timeout`.
    pub const REQUEST_TIMEOUT_MS: u64 = 10_000;
    /// `server.limits.grpc_keepalive`.
    pub const GRPC_KEEPALIVE_MS: u64 = 30_000;
    /// `server.limits.grpc_max_streams`.
    pub const GRPC_MAX_STREAMS: u32 = 1_024;
    /// `server.limits.grpc_max_message_bytes`.
    pub const GRPC_MAX_MESSAGE_BYTES: u64 = 64 * 1024;
    /// `storage.max_entries`.
    pub const MAX_ENTRIES: u64 = 1_000_000;
    /// `storage.sweep_interval`.
    pub const SWEEP_INTERVAL_MS: u64 = 10_000;
    /// `storage.global_shards` (Redis Cluster).
    pub const GLOBAL_SHARDS: u16 = 16;
    /// `keys.prefix`.
    pub const PREFIX: &str = "sl";
    /// `near_limit`.
    pub const NEAR_LIMIT: f64 = 0.8;
    /// `envoy.domain`.
    pub const ENVOY_DOMAIN: &str = "sluice";
    /// `storage.breaker.failures`.
    pub const BREAKER_FAILURES: u32 = 5;
    /// `storage.breaker.cool_down`.
    pub const BREAKER_COOL_DOWN_MS: u64 = 1_000;
    /// `storage.breaker.probes`.
    pub const BREAKER_PROBES: u32 = 3;
}

impl Config {
    /// Parses and validates a configuration. `origin` names the file in
    /// error messages.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Config, ConfigErrors> {
        validate::load(text, origin, None)
    }

    /// [`from_yaml`](Self::from_yaml), with the envoyproxy/ratelimit
    /// configuration at `envoy_config` in place of `envoy.config` (the
    /// command line's `--envoy-config`): as with an `envoy:` section, the
    /// file then needs no `plans`.
    pub fn from_yaml_with_envoy_config(
        text: &str,
        origin: &str,
        envoy_config: &std::path::Path,
    ) -> Result<Config, ConfigErrors> {
        validate::load(text, origin, Some(envoy_config))
    }
}

#[cfg(test)]
mod tests;
