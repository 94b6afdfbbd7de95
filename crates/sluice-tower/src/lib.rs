//! sluice in process, as tower middleware for axum, tonic or hyper
//! services: every request is decided by a [`Limiter`] (memory, Redis or
//! Redis Cluster) before the service sees it, and answered like the sluice
//! service answers: `RateLimit` and `RateLimit-Policy` on every response,
//! 429 problem details with `Retry-After` when denied.
//!
//! - [`layer`]: [`RateLimitLayer`], which wraps services.
//! - [`service`]: [`RateLimit`], which decides and calls the inner service.
//! - [`extract`]: what a request is limited by ([`Keys`]), read by an
//!   [`Extract`] such as [`FromHeaders`].
//! - [`answer`]: decisions and refusals as HTTP answers (shared with the
//!   service).
//! - [`client_ip`]: the client's address behind trusted proxies, for
//!   limits per IP.
//!
//! ```
//! use std::sync::Arc;
//!
//! use axum::{Router, routing::get};
//! use http::HeaderName;
//! use sluice_core::config::OnError;
//! use sluice_core::{Config, Policy};
//! use sluice_store::{Limiter, MemoryStore};
//! use sluice_tower::{FromHeaders, RateLimitLayer};
//!
//! let config = Config::from_yaml(
//!     "default_plan: free\nplans:\n  free:\n    tenant: [{ limit: 100, per: 1m }]\n",
//!     "limits.yaml",
//! )
//! .unwrap();
//! let limiter = Arc::new(Limiter::new(
//!     Policy::compile(&config.limits),
//!     MemoryStore::new(100_000),
//!     OnError::Local,
//! ));
//! let app: Router = Router::new()
//!     .route("/v1/things", get(|| async { "things" }))
//!     .layer(RateLimitLayer::new(limiter, FromHeaders::new(HeaderName::from_static("x-tenant"))));
//! ```
//!
//! [`Limiter`]: sluice_store::Limiter

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod answer;
pub mod client_ip;
pub mod extract;
pub mod layer;
pub mod service;

pub use answer::{DecisionView, InvalidRequest};
pub use client_ip::{Peer, client_ip};
pub use extract::{Extract, FromHeaders, Keys};
pub use layer::RateLimitLayer;
pub use service::RateLimit;
