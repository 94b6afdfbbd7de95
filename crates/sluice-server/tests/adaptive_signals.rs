//! Adaptive valves' signals over HTTP where the route counts by outcome
//! (memory store, one hand-set clock): a report that concludes an attempt
//! carries its `latency_ms` to the valve; a report refused carries
//! nothing.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sluice_core::{Config, Policy};
use sluice_server::app::App;
use sluice_server::backend::Backend;
use sluice_server::http::router;
use sluice_store::{Limiter, LimiterOptions, ManualClock, MemoryStore};
use tower::ServiceExt;

const CONFIG: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: t, limit: 100000, per: 1s }]
    routes:
      "POST /v1/search":
        - { name: failures, algorithm: sliding_log, limit: 10000, per: 15m, count_if: { status: ["5xx"] } }
global:
  "POST /v1/search":
    - { name: search-db, algorithm: fixed_window, limit: 100, per: 1s, share: first_come, adaptive: { latency_target: 100ms, min: 5 } }
"#;

fn harness() -> (Router, Arc<ManualClock>) {
    let config = Config::from_yaml(CONFIG, "attack.yaml").unwrap();
    let clock = Arc::new(ManualClock::new(1_764_460_800_500));
    let options = LimiterOptions {
        clock: clock.clone(),
        ..LimiterOptions::new(config.storage.on_error)
    };
    let limiter = Limiter::with_options(
        Policy::compile(&config.limits),
        Backend::Memory(MemoryStore::with_clock(100_000, clock.clone())),
        options,
    );
    let app = App::new(
        limiter,
        config.server.forward_auth.clone(),
        Default::default(),
    );
    (router(app, &config.server.limits), clock)
}

async fn post(router: &Router, path: &str, body: Value) -> (StatusCode, Value) {
    let request = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn metric(router: &Router, name: &str) -> Option<f64> {
    let request = Request::get("/metrics").body(Body::empty()).unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
}

const LATENCY: &str = "sluice_adaptive_valve_latency_seconds{valve=\"search-db\"}";
const LIMIT: &str = "sluice_adaptive_valve_limit{valve=\"search-db\"}";

/// On a route that counts by outcome, `/v1/report` carries the check's
/// `attempt`: the attempt names the route, and the latency reaches its
/// valve (which then cuts its limit, denying some checks).
#[tokio::test]
async fn latency_on_a_report_that_concludes_an_attempt_reaches_the_valve() {
    let (router, clock) = harness();
    let search = json!({ "tenant": "acme", "route": "POST /v1/search" });
    for _ in 0..20 {
        let (status, checked) = post(&router, "/v1/check", search.clone()).await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(checked["reason"], "global_capacity", "{checked}");
            clock.advance(100);
            continue;
        }
        assert_eq!(status, StatusCode::OK, "{checked}");
        let attempt = checked["attempt"].as_str().expect("an attempt").to_owned();
        clock.advance(100);
        let report = json!({ "attempt": attempt, "status": 200, "latency_ms": 400 });
        let (status, body) = post(&router, "/v1/report", report).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let latency = metric(&router, LATENCY).await;
    let limit = metric(&router, LIMIT).await;
    assert!(
        latency.is_some_and(|l| l > 0.3) && limit.is_some_and(|l| l < 100.0),
        "20 reports of 400 ms against a 100 ms target: latency {latency:?} s, limit {limit:?}"
    );
}

/// The converse: a report without its attempt on that route is refused
/// (400, `attempt` needed), and its latency is not counted.
#[tokio::test]
async fn a_refused_report_never_moves_the_law() {
    let (router, clock) = harness();
    for _ in 0..20 {
        clock.advance(100);
        let report = json!({ "tenant": "acme", "route": "POST /v1/search", "cost": 1, "status": 200, "latency_ms": 400 });
        let (status, body) = post(&router, "/v1/report", report).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    }
    let limit = metric(&router, LIMIT).await;
    assert!(
        limit.is_none_or(|l| l == 100.0 || l == 0.0),
        "20 refused reports cut the valve to {limit:?}"
    );
}
