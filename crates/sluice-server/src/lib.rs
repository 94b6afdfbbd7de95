//! The `sluice` service and command-line tool.
//!
//! - [`cli`]: the subcommands (`serve`, `check`, `validate`).
//! - [`source`]: reading the configuration file (or the embedded example)
//!   and reloading it on change or SIGHUP.
//! - [`bench`]: the load generator behind `sluice bench`.
//! - [`backend`]: the store chosen by `storage.backend`.
//! - [`compat`]: envoyproxy/ratelimit's environment variables, read as a
//!   configuration (`serve --envoyproxy-env`).
//! - [`app`]: what every request handler shares.
//! - [`envoy`]: the Envoy Rate Limit Service (gRPC), including
//!   envoyproxy/ratelimit configurations.
//! - [`http`]: the HTTP API — `/v1/check`, `/v1/forward-auth`, health,
//!   metrics, the admin API.
//! - [`listen`]: accepting connections within `server.limits` (caps and
//!   timeouts against slow and idle clients).
//! - [`metrics`]: Prometheus metrics, fed by the limiter's telemetry hooks.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod admin;
pub mod app;
pub mod backend;
pub mod bench;
pub mod cli;
pub mod compat;
pub mod envoy;
pub mod grpc;
pub mod http;
pub mod inspect;
pub mod ledger;
pub mod listen;
pub mod metrics;
pub mod source;

/// Errors at the binary's edge, where they are only printed.
pub type Fallible<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// What a client sent, to show it back in an error: its first 100
/// characters, `…` after them when there were more.
pub(crate) fn shown(text: &str) -> String {
    let mut shown: String = text.chars().take(100).collect();
    if shown.len() < text.len() {
        shown.push('…');
    }
    shown
}
