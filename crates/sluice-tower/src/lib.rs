//! sluice in process, as tower middleware for axum, tonic or hyper
//! services: every request is decided by a [`Limiter`] (memory, Redis or
//! Redis Cluster) before the service sees it, and answered like the sluice
//! service answers: `RateLimit` and `RateLimit-Policy` on every response,
//! 429 problem details with `Retry-After` when denied, 409 for a duplicate
//! submission.
//!
//! - [`layer`]: [`RateLimitLayer`], which wraps services.
//! - [`service`]: [`RateLimit`], which decides and calls the inner service.
//! - [`extract`]: what a request is limited by ([`Keys`]), read by an
//!   [`Extract`] such as [`FromHeaders`].
//! - [`answer`]: decisions and refusals as HTTP answers (shared with the
//!   service).
//! - [`client_ip`]: the client's address behind trusted proxies, for
//!   limits per IP.
//! - [`limits`]: limits declared in code next to a route
//!   (`Limits::route(…).rule("10/1m").concurrent(2, "30s").by(…).prevent_duplicate("5s")`).
//! - [`lease`]: concurrency limits' leases, held by the response body
//!   until it ends or is dropped.
//! - [`usage`]: what a request cost, read from its response (LLM tokens,
//!   …) and settled when the body ends; on `count_if` rules each request
//!   held as an attempt, kept or given back by the response's status.
//! - Adaptive valves (`adaptive:` on a valve): the layer times its inner
//!   service, from the call to the response's head, and tells the
//!   request's adaptive valves how long it took and its status (5xx and
//!   429 count as failures; a gRPC call's `grpc-status` when it comes in
//!   the head) through [`Limiter::observe`](sluice_store::Limiter::observe).
//! - [`digest`]: the body's SHA-256 as the duplicate guard's fingerprint
//!   when a request has no `Idempotency-Key`.
//! - `grpc` (feature `tonic`, on by default): the same for tonic servers,
//!   denials as `RESOURCE_EXHAUSTED` with `RetryInfo`.
//!
//! # Guide
//!
//! Limits are the same YAML as the service's (docs/CONFIG.md), compiled
//! into a [`Policy`](sluice_core::Policy). Attach the layer with
//! `route_layer`, so that only requests that match a route are decided: a
//! 404 spends no budget.
//!
//! ```
//! use std::sync::Arc;
//!
//! use axum::body::Body;
//! use axum::{Router, routing::post};
//! use http::{HeaderName, Request, StatusCode};
//! use sluice_core::config::OnError;
//! use sluice_core::{Config, Policy};
//! use sluice_store::{Limiter, MemoryStore};
//! use sluice_tower::{FromHeaders, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! const LIMITS: &str = r#"
//! default_plan: free
//! plans:
//!   free:
//!     routes:
//!       "POST /v1/invoices": [{ name: invoices, algorithm: fixed_window, limit: 2, per: 1m }]
//!     dedupe:
//!       "POST /v1/invoices": { window: 5s }
//! "#;
//! let config = Config::from_yaml(LIMITS, "limits.yaml").unwrap();
//! let limiter = Arc::new(Limiter::new(
//!     Policy::compile(&config.limits),
//!     MemoryStore::new(100_000),
//!     OnError::Local,
//! ));
//! let keys = FromHeaders::new(HeaderName::from_static("x-tenant"));
//! let app: Router = Router::new()
//!     .route("/v1/invoices", post(|| async { (StatusCode::CREATED, "invoice") }))
//!     .route_layer(RateLimitLayer::new(limiter.clone(), keys));
//!
//! let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! let send = |method: &str, path: &str, key: &str| {
//!     let request = Request::builder()
//!         .method(method)
//!         .uri(path)
//!         .header("x-tenant", "acme")
//!         .header("idempotency-key", key)
//!         .body(Body::empty())
//!         .unwrap();
//!     runtime.block_on(app.clone().oneshot(request)).unwrap().status()
//! };
//! // Unmatched routes are not limited and spend nothing.
//! for _ in 0..5 {
//!     assert_eq!(send("GET", "/nowhere", "k"), StatusCode::NOT_FOUND);
//! }
//! assert_eq!(send("POST", "/v1/invoices", "pay-1"), StatusCode::CREATED);
//! // The same submission again is a 409, and costs nothing.
//! assert_eq!(send("POST", "/v1/invoices", "pay-1"), StatusCode::CONFLICT);
//! assert_eq!(send("POST", "/v1/invoices", "pay-2"), StatusCode::CREATED);
//! assert_eq!(send("POST", "/v1/invoices", "pay-3"), StatusCode::TOO_MANY_REQUESTS);
//!
//! // New limits apply at once, to every route the limiter guards.
//! let raised = LIMITS.replace("limit: 2", "limit: 3");
//! let config = Config::from_yaml(&raised, "limits.yaml").unwrap();
//! limiter.set_policy(Policy::compile(&config.limits));
//! assert_eq!(send("POST", "/v1/invoices", "pay-3"), StatusCode::CREATED);
//! ```
//!
//! The limiter keeps itself healthy (idle keys swept, clocks followed) from
//! the moment a [`RateLimitLayer`] is made. Store events (timeouts, errors,
//! breaker changes) reach a [`Telemetry`](sluice_store::Telemetry) given in
//! [`LimiterOptions`](sluice_store::LimiterOptions), from which an app
//! feeds its own metrics; decisions are the layer's answers, which carry
//! the `RateLimit` fields. On Redis, give every instance the same store
//! settings and pepper, and the limits hold across the fleet (the `redis`
//! feature, on by default; an app that limits in memory only turns it off
//! and builds without the Redis client). `examples/axum_app.rs` serves a
//! complete app: `cargo run -p sluice-tower --example axum_app`.
//!
//! [`Limiter`]: sluice_store::Limiter

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod answer;
pub mod client_ip;
pub mod digest;
pub mod extract;
#[cfg(feature = "tonic")]
pub mod grpc;
pub mod layer;
pub mod lease;
pub mod limits;
pub mod service;
pub mod usage;

pub use answer::{DecisionView, InvalidRequest};
pub use client_ip::{ClientIpHeader, Peer, client_ip};
pub use extract::{Extract, FromHeaders, Keys};
pub use layer::RateLimitLayer;
pub use lease::{Lease, LeaseBody};
pub use service::RateLimit;
pub use usage::{Settlement, Usage};
