//! The layer times its inner service and tells the request's adaptive
//! valves how it answered: a slow service cuts the valve's limit, a
//! failing one too, with no report from the application.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{HeaderName, Request, StatusCode};
use sluice_core::config::OnError;
use sluice_core::{Config, Policy};
use sluice_store::{Limiter, MemoryStore};
use sluice_tower::{FromHeaders, RateLimitLayer};
use tower::ServiceExt;

const LIMITS: &str = r#"
default_plan: free
plans:
  free: { tenant: [{ name: t, limit: 100000, per: 1s }] }
global:
  "POST /search":
    - { name: search-db, algorithm: concurrency, limit: 100, lease: 30s, adaptive: { latency_target: 20ms, min: 3 } }
  "POST /other":
    - { name: other-db, algorithm: concurrency, limit: 100, lease: 30s, adaptive: { latency_target: 1s, min: 3 } }
"#;

fn search(path: &str) -> Request<Body> {
    Request::post(path)
        .header("x-tenant", "acme")
        .body(Body::empty())
        .unwrap()
}

#[tokio::test]
async fn the_layer_reports_its_inner_services_latency_and_status() {
    let policy = Policy::compile(&Config::from_yaml(LIMITS, "limits.yaml").unwrap().limits);
    let limiter = Arc::new(Limiter::new(
        policy,
        MemoryStore::new(10_000),
        OnError::Deny,
    ));
    let app = Router::new()
        // 60 ms each: three times the target.
        .route(
            "/search",
            post(|| async {
                tokio::time::sleep(Duration::from_millis(60)).await;
                StatusCode::OK
            }),
        )
        // Fast, but failing.
        .route("/other", post(|| async { StatusCode::SERVICE_UNAVAILABLE }))
        .layer(RateLimitLayer::new(
            limiter.clone(),
            FromHeaders::new(HeaderName::from_static("x-tenant")),
        ));
    // (Once cut to 3, a request of normal priority may hold one lease;
    // the last one's is given back in the background: some are denied.)
    let mut answered = 0;
    for _ in 0..12 {
        let response = app.clone().oneshot(search("/search")).await.unwrap();
        answered += u32::from(response.status() == StatusCode::OK);
        let response = app.clone().oneshot(search("/other")).await.unwrap();
        answered += u32::from(response.status() == StatusCode::SERVICE_UNAVAILABLE);
        drop(response);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(answered >= 12, "{answered} of 24 reached the service");
    let levels = limiter.adaptive_levels();
    let level = |name: &str| levels.iter().find(|l| l.valve.as_ref() == name).unwrap();
    let search = level("search-db");
    assert!(search.latency_ms >= 55.0, "{search:?}");
    assert!(search.effective_limit < 100, "cut: {search:?}");
    let other = level("other-db");
    assert!(other.latency_ms < 50.0, "{other:?}");
    assert!(other.effective_limit < 100, "failing: cut: {other:?}");
}
