//! The HTTP API, driven in-process through the router with a hand-set clock:
//! one file per endpoint, this one the harness they share.
//!
//! - `check`: `POST /v1/check`, its decision, RateLimit fields and problems;
//! - `forward_auth`: `GET /v1/forward-auth` from a gateway's headers;
//! - `dedupe`: duplicate submissions through both;
//! - `lease`: `POST /v1/acquire` and `POST /v1/release`;
//! - `adaptive`: adaptive valves, their priorities and signals;
//! - `after`: reservations, `POST /v1/settle` and `POST /v1/report`;
//! - `routes`: unknown paths and methods, and spellings of a route;
//! - `health`, `metrics`: `/healthz`, `/readyz` and `/metrics`;
//! - `admin`: `/v1/admin/…`, its token, overrides and heavy hitters;
//! - `fuzz`: every parser against any input, never a 5xx.

#[path = "../common/mod.rs"]
mod common;

mod adaptive;
mod admin;
mod after;
mod check;
mod dedupe;
mod forward_auth;
mod fuzz;
mod health;
mod lease;
mod metrics;
mod routes;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response};
use http_body_util::BodyExt;
use serde_json::Value;
use sfv::{BareItem, ListEntry, Parser};
use sluice_core::{Config, Policy};
use sluice_server::app::App;
use sluice_server::backend::Backend;
use sluice_server::http::router;
use sluice_store::{Limiter, LimiterOptions, ManualClock, MemoryStore};
use tower::ServiceExt;

const CONFIG: &str = r#"
server:
  forward_auth:
    tenant_header: X-Tenant
    subject_header: X-User
    cost_header: X-Cost
default_plan: free
plans:
  free:
    tenant:
      - { name: daily, algorithm: fixed_window, limit: 1000, per: 1d, aligned: true }
    routes:
      "POST /v1/invoices":
        - { name: invoices, algorithm: gcra, limit: 2, per: 1s }
      "GET /v1/reports/*":
        - { name: reports, algorithm: sliding_log, limit: 3, per: 10s }
      "POST /v1/exports":
        - { name: exports, algorithm: concurrency, limit: 2, lease: 30s }
    subject:
      "*":
        - { name: per-user, algorithm: token_bucket, limit: 1, per: 2s, burst: 2 }
    dedupe:
      "POST /v1/payments": { window: 5s }
global:
  "POST /v1/invoices":
    - { name: valve, limit: 1000, per: 1s }
"#;

struct Harness {
    router: Router,
    clock: Arc<ManualClock>,
}

/// A configuration's limiter on a memory store and a hand-set clock.
fn limiter_of(yaml: &str) -> (Config, Arc<ManualClock>, Limiter<Backend>) {
    let config = Config::from_yaml(yaml, "test.yaml").unwrap();
    let clock = Arc::new(ManualClock::new(1_764_460_800_500));
    let store = MemoryStore::with_clock(100_000, clock.clone());
    let limiter = Limiter::new(
        Policy::compile(&config.limits),
        Backend::Memory(store),
        config.storage.on_error,
    );
    (config, clock, limiter)
}

/// [`limiter_of`] with the limiter on the store's hand-set clock too: what
/// it keeps of time itself (a fair valve's level) moves as the store's
/// does.
fn limiter_on_one_clock(yaml: &str) -> (Config, Arc<ManualClock>, Limiter<Backend>) {
    let (config, clock, _) = limiter_of(yaml);
    let options = LimiterOptions {
        clock: clock.clone(),
        ..LimiterOptions::new(config.storage.on_error)
    };
    let store = MemoryStore::with_clock(100_000, clock.clone());
    let limiter = Limiter::with_options(
        Policy::compile(&config.limits),
        Backend::Memory(store),
        options,
    );
    (config, clock, limiter)
}

fn harness() -> Harness {
    harness_of(CONFIG)
}

/// [`harness_of`] with the limiter on the store's hand-set clock (what it
/// keeps of time itself moves with it: an adaptive valve's law).
fn harness_on_one_clock(yaml: &str) -> Harness {
    harness_with(limiter_on_one_clock(yaml))
}

/// [`harness`] of another configuration.
fn harness_of(yaml: &str) -> Harness {
    harness_with(limiter_of(yaml))
}

/// The router of a configuration's limiter, and its clock.
fn harness_with((config, clock, limiter): (Config, Arc<ManualClock>, Limiter<Backend>)) -> Harness {
    let app = App::new(
        limiter,
        config.server.forward_auth.clone(),
        Default::default(),
    );
    Harness {
        router: router(app, &config.server.limits),
        clock,
    }
}

impl Harness {
    async fn send(&self, request: Request<Body>) -> (Response<()>, Value) {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| panic!("body is not JSON ({e}): {bytes:?}"))
        };
        (Response::from_parts(parts, ()), value)
    }

    async fn check(&self, body: impl Into<Body>) -> (Response<()>, Value) {
        let request = Request::post("/v1/check")
            .header("content-type", "application/json")
            .body(body.into())
            .unwrap();
        self.send(request).await
    }

    async fn check_json(&self, body: Value) -> (Response<()>, Value) {
        self.check(body.to_string()).await
    }

    async fn post(&self, path: &str, body: impl Into<Body>) -> (Response<()>, Value) {
        let request = Request::post(path)
            .header("content-type", "application/json")
            .body(body.into())
            .unwrap();
        self.send(request).await
    }

    /// The text of `GET /metrics`.
    async fn metrics(&self) -> String {
        let request = Request::get("/metrics").body(Body::empty()).unwrap();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }
}

fn header<'r>(response: &'r Response<()>, name: &str) -> Option<&'r str> {
    response.headers().get(name).map(|v| v.to_str().unwrap())
}

/// Parses a RateLimit or RateLimit-Policy field as an sf-list: one (name,
/// parameters) per item.
fn sf_list(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list = Parser::new(value)
        .parse::<sfv::List>()
        .expect("a valid structured-field list");
    list.into_iter()
        .map(|entry| {
            let ListEntry::Item(item) = entry else {
                panic!("no inner lists expected")
            };
            let BareItem::String(name) = item.bare_item else {
                panic!("policy names are sf-strings")
            };
            let params = item
                .params
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_owned(),
                        v.as_integer().expect("integer").into(),
                    )
                })
                .collect();
            (name.as_str().to_owned(), params)
        })
        .collect()
}

fn param(items: &[(String, Vec<(String, i64)>)], policy: &str, key: &str) -> i64 {
    let (_, params) = items
        .iter()
        .find(|(n, _)| n == policy)
        .expect("policy listed");
    params
        .iter()
        .find(|(k, _)| k == key)
        .expect("parameter present")
        .1
}

fn forward(headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::get("/v1/forward-auth");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::empty()).unwrap()
}

const TOKEN: &str = "test-admin-token-0123456789";

/// The harness with the admin API on.
fn admin_harness() -> (Harness, Arc<App>) {
    admin_harness_of(CONFIG)
}

/// [`admin_harness`] of another configuration.
fn admin_harness_of(yaml: &str) -> (Harness, Arc<App>) {
    let (config, clock, limiter) = limiter_on_one_clock(yaml);
    let admin = sluice_server::admin::Admin::new(Some(TOKEN.as_bytes().to_vec()), limiter.store())
        .with_clock(clock.clone());
    let app = App::new_with(
        limiter,
        config.server.forward_auth.clone(),
        Default::default(),
        admin,
    );
    app.admin.install(&app.limiter, &config.limits, false);
    let harness = Harness {
        router: router(app.clone(), &config.server.limits),
        clock,
    };
    (harness, app)
}

impl Harness {
    async fn admin(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
        token: Option<&str>,
    ) -> (Response<()>, Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
        self.send(request.body(body).unwrap()).await
    }
}
