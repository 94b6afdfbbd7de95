//! The Envoy Rate Limit Service, driven by a real gRPC client over loopback
//! against `sluice serve`, on the memory store and on Redis; this file is
//! the harness the others share.
//!
//! The conformance with envoyproxy/ratelimit, by its test groups:
//!
//! - validation: `cli.rs` (`validate_checks_envoyproxy_files…`) and
//!   `sluice-core`'s config tests (file:line:column refusals);
//! - matching: `envoyproxy_semantics`, `current_language` (wildcards
//!   anywhere, key-only nodes, depth), `sluice-core` `descriptors` tests;
//! - counting: `envoyproxy_semantics` (per value, replaces, shadow, all or
//!   nothing), `current_language` (share_threshold, quota_mode,
//!   `hits_addend: 0`), `quota` (envoyproxy/ratelimit's quota scripts with
//!   its example configuration), `sharded_tenants_…`;
//! - answers: `envoyproxy_semantics`, `current_language`,
//!   `envoyproxy_http_endpoints_…` (`/json`, `/healthcheck`, `/rlconfig`),
//!   stats on the memory store, `zero_limits.rs`;
//! - reload and deployment: `an_envoyproxy_ratelimit_manifest_starts_sluice`
//!   (environment, runtime directory, ConfigMap swap), `sources.rs`
//!   (`--envoy-config`, subdirectories) and `cli.rs`.
//!
//! Files: `envoyproxy` (envoyproxy/ratelimit's configuration language on
//! every store), `native` (the native domain), `requests` (malformed and
//! arbitrary requests, health, other services), `http_endpoints` (`/json`,
//! `/healthcheck`, `/rlconfig`), `manifest` (an envoyproxy/ratelimit
//! Deployment's environment and ConfigMap), `sources` and `zero_limits`.

#[path = "../common/mod.rs"]
mod common;
mod envoyproxy;
mod http_endpoints;
mod manifest;
mod native;
mod quota;
mod requests;
mod sources;
mod statuses;
mod tolerance;
mod zero_limits;

use common::{Server, descriptor, temp_dir, temp_file};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use sluice_testkit::{RedisCluster, RedisServer};
use tonic::transport::Channel;

const ENVOY_CONFIG: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    value: "/api/*"
    rate_limit: { unit: minute, requests_per_unit: 5, name: api }
  - key: path
    value: "/api/health"
    rate_limit: { unlimited: true }
  - key: path
    value: "/blocked"
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: tenant
    descriptors:
      - key: plan
        value: premium
        rate_limit: { unit: minute, requests_per_unit: 10, name: premium, replaces: [{ name: api }] }
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1 }
    shadow_mode: true
  - key: bucket
    rules:
      - { name: smooth, algorithm: gcra, limit: 2, per: 1h }
"#;

const SLUICE_CONFIG: &str = r#"
default_plan: free
plans:
  free:
    tenant: [{ name: tenant-minute, limit: 100, per: 1m }]
    routes:
      "POST /x": [{ name: x, algorithm: fixed_window, limit: 2, per: 1m }]
    subject:
      "*": [{ name: per-user, algorithm: sliding_log, limit: 1, per: 1m }]
    dedupe:
      "POST /pay": { window: 1m }
"#;

fn start(storage: &str, name: &str) -> Server {
    start_with(storage, name, &[("edge.yaml", ENVOY_CONFIG)])
}

/// `sluice serve` with `files` as its envoyproxy/ratelimit directory.
fn start_with(storage: &str, name: &str, files: &[(&str, &str)]) -> Server {
    start_config(&format!("{storage}{SLUICE_CONFIG}"), name, files)
}

/// `sluice serve` with configuration `yaml` and `files` as its
/// envoyproxy/ratelimit directory.
fn start_config(yaml: &str, name: &str, files: &[(&str, &str)]) -> Server {
    let dir = temp_dir("rls");
    for (file, text) in files {
        std::fs::write(dir.path().join(file), text).unwrap();
    }
    let config = temp_file(&format!("{name}.yaml"), yaml);
    Server::start_with_env(
        &[
            "--config",
            config.to_str().unwrap(),
            "--envoy-config",
            dir.path().to_str().unwrap(),
        ],
        &[(
            "TEST_SLUICE_PEPPER",
            "3e1d9c7b5a3f1e2d4c6b8a0f9e7d5c3b1a2f4e6d8c0b9a7f5e3d1c2b4a6f8e0d",
        )],
    )
    .keep(config)
    .keep(dir)
}

/// The `storage` and `keys` sections for `redis`, with the test pepper.
fn redis_storage(redis: &RedisServer) -> String {
    format!(
        "storage:\n  backend: redis\n  url: {}\nkeys:\n  pepper_env: TEST_SLUICE_PEPPER\n",
        redis.url()
    )
}

/// The `storage` and `keys` sections for `redis-cluster`, with the test
/// pepper.
fn cluster_storage(cluster: &RedisCluster) -> String {
    format!(
        "storage:\n  backend: redis-cluster\n  nodes: [{}]\nkeys:\n  pepper_env: TEST_SLUICE_PEPPER\n",
        cluster.urls().join(", ")
    )
}

async fn client(server: &Server) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap()
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> RateLimitResponse {
    let request = RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: hits,
    };
    client
        .should_rate_limit(request)
        .await
        .unwrap()
        .into_inner()
}

fn codes(response: &RateLimitResponse) -> Vec<Code> {
    response
        .statuses
        .iter()
        .map(|s| Code::try_from(s.code).unwrap())
        .collect()
}

fn overall(response: &RateLimitResponse) -> Code {
    Code::try_from(response.overall_code).unwrap()
}

fn header<'r>(response: &'r RateLimitResponse, name: &str) -> Option<&'r str> {
    response
        .response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}
