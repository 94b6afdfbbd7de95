//! The `sluice` service and command-line tool.
//!
//! - [`cli`]: the subcommands (`serve`, `check`, `validate`).
//! - [`source`]: where the configuration comes from: the sluice file (or
//!   the embedded example), reloaded on change or SIGHUP, the
//!   envoyproxy/ratelimit files it points to, and envoyproxy/ratelimit's
//!   environment variables read as a configuration (`serve
//!   --envoyproxy-env`).
//! - [`bench`](mod@bench): the load generator behind `sluice bench`.
//! - [`backend`]: the store chosen by `storage.backend`.
//! - [`app`]: what every request handler shares, and the one decision tail
//!   every entry point goes through (`App::decide`: metrics, heavy hitters,
//!   the usage ledger).
//! - [`admin`]: overrides, heavy hitters and their storage (its HTTP
//!   routes are in [`http`]); [`ledger`]: the usage ledger; [`inspect`]: a
//!   tenant's buckets read back.
//! - [`envoy`]: the Envoy Rate Limit Service's decisions and answers, for
//!   the native domain and envoyproxy/ratelimit's domains; [`grpc`] is its
//!   transport (and `/json` in [`http`]).
//! - [`http`]: the HTTP API — `/v1/check`, `/v1/forward-auth`, health,
//!   metrics, the admin API.
//! - [`listen`]: accepting connections within `server.limits` (caps and
//!   timeouts against slow and idle clients).
//! - [`metrics`]: Prometheus metrics, fed by the limiter's telemetry hooks.
//! - [`traces`]: OpenTelemetry traces over OTLP, when on: the tracer, the
//!   server spans and the caller's context they continue.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod admin;
pub mod app;
pub mod backend;
pub mod bench;
pub mod cli;
pub mod envoy;
pub mod grpc;
pub mod http;
pub mod inspect;
pub mod ledger;
pub mod listen;
pub mod metrics;
pub mod regions;
pub mod reservation;
pub mod source;
pub mod traces;
pub mod usage;

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
