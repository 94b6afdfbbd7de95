//! The layer times its inner service and tells the request's adaptive
//! valves how it answered: a slow service cuts the valve's limit, a
//! failing one too, an inner error and a call given up on count as
//! failures, with no report from the application.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{HeaderName, Request, Response, StatusCode};
use sluice_core::config::OnError;
use sluice_core::{Config, Policy};
use sluice_store::{Limiter, MemoryStore};
use sluice_tower::{FromHeaders, RateLimitLayer};
use tower::{Layer, ServiceExt, service_fn};

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

const GIVE_UP: &str = r#"
default_plan: free
plans:
  free: { tenant: [{ name: t, limit: 100000, per: 1s }] }
global:
  "POST /search":
    - { name: search-db, algorithm: concurrency, limit: 100, lease: 30s, adaptive: { latency_target: 20ms, min: 3 } }
"#;

fn limiter() -> Arc<Limiter<MemoryStore>> {
    let policy = Policy::compile(&Config::from_yaml(GIVE_UP, "limits.yaml").unwrap().limits);
    Arc::new(Limiter::new(
        policy,
        MemoryStore::new(10_000),
        OnError::Deny,
    ))
}

fn call() -> Request<Body> {
    Request::post("/search")
        .header("x-tenant", "acme")
        .body(Body::empty())
        .unwrap()
}

/// An inner service erring after 60 ms (three times the target), twelve
/// times: each error reaches the law as a failed call of its latency.
#[tokio::test]
async fn an_inner_error_reaches_the_valve_as_a_failure() {
    let limiter = limiter();
    let inner = service_fn(|_request: Request<Body>| async {
        tokio::time::sleep(Duration::from_millis(60)).await;
        Err::<Response<Body>, std::io::Error>(std::io::Error::other("upstream timed out"))
    });
    let service = RateLimitLayer::new(
        limiter.clone(),
        FromHeaders::new(HeaderName::from_static("x-tenant")),
    )
    .layer(inner);
    for _ in 0..12 {
        assert!(service.clone().oneshot(call()).await.is_err());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let levels = limiter.adaptive_levels();
    assert!(
        levels[0].latency_ms > 0.0 && levels[0].effective_limit < 100,
        "12 failed calls of 60 ms against a 20 ms target: {levels:?}"
    );
}

/// A caller that gives up after 30 ms on an inner service taking 500 ms:
/// the call is dropped, and the valve hears of it as a failure.
#[tokio::test]
async fn a_call_given_up_on_reaches_the_valve_as_a_failure() {
    let limiter = limiter();
    let inner = service_fn(|_request: Request<Body>| async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        Ok::<_, std::io::Error>(Response::new(Body::empty()))
    });
    let service = RateLimitLayer::new(
        limiter.clone(),
        FromHeaders::new(HeaderName::from_static("x-tenant")),
    )
    .layer(inner);
    for _ in 0..12 {
        let call = service.clone().oneshot(call());
        assert!(
            tokio::time::timeout(Duration::from_millis(30), call)
                .await
                .is_err()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let levels = limiter.adaptive_levels();
    assert!(
        levels[0].latency_ms > 0.0 && levels[0].effective_limit < 100,
        "12 calls abandoned after 30 ms (target 20 ms): {levels:?}"
    );
}
