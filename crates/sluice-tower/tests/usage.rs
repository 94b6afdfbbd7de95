//! Usage known once the response is, through the layer around a real axum
//! router: tokens read from a response header and settled when the body
//! ends or is dropped (debt included), and `count_if` rules holding each
//! request as an attempt, kept or given back by the response's status.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::HeaderMap;
use axum::routing::post;
use http::{HeaderName, Request, StatusCode};
use http_body_util::BodyExt;
use sluice_core::config::OnError;
use sluice_core::{Config, Policy};
use sluice_store::{Limiter, LimiterOptions, ManualClock, MemoryStore};
use sluice_tower::{FromHeaders, RateLimitLayer, Usage};
use tower::ServiceExt;

const LIMITS: &str = r#"
default_plan: free
plans:
  free:
    routes:
      "POST /v1/chat": [{ name: tokens, algorithm: gcra, limit: 1000, per: 1m }]
      "POST /login": [{ name: logins, algorithm: gcra, limit: 100, per: 1m }]
    subject:
      "POST /login":
        - { name: failed-logins, algorithm: sliding_log, limit: 3, per: 15m, count_if: { status: ["4xx"] } }
"#;

fn limiter() -> (Arc<ManualClock>, Arc<Limiter<MemoryStore>>) {
    let config = Config::from_yaml(LIMITS, "limits.yaml").unwrap();
    let clock = Arc::new(ManualClock::new(1_764_460_800_000));
    let mut options = LimiterOptions::new(OnError::Deny);
    options.clock = clock.clone();
    let limiter = Limiter::with_options(
        Policy::compile(&config.limits),
        MemoryStore::with_clock(10_000, clock.clone()),
        options,
    );
    (clock, Arc::new(limiter))
}

/// The chat handler answers with the tokens the request asked to use
/// (`x-tokens`) in `x-usage-tokens`; the login handler with 401 unless the
/// password is right.
fn app(limiter: Arc<Limiter<MemoryStore>>) -> Router {
    let keys = FromHeaders::new(HeaderName::from_static("x-tenant"))
        .subject(HeaderName::from_static("x-user"));
    Router::new()
        .route(
            "/v1/chat",
            post(|headers: HeaderMap| async move {
                let tokens = headers.get("x-tokens").cloned();
                let mut response = axum::response::Response::new(Body::from("a long answer"));
                if let Some(tokens) = tokens {
                    response.headers_mut().insert("x-usage-tokens", tokens);
                }
                response
            }),
        )
        .route(
            "/login",
            post(|headers: HeaderMap| async move {
                if headers.contains_key("x-slow") {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                if headers.get("x-password").is_some_and(|p| p == "right") {
                    StatusCode::OK
                } else {
                    StatusCode::UNAUTHORIZED
                }
            }),
        )
        .layer(
            RateLimitLayer::new(limiter, keys)
                .with_usage(Usage::header(HeaderName::from_static("x-usage-tokens"))),
        )
}

fn chat(tokens: Option<u64>) -> Request<Body> {
    let mut request = Request::post("/v1/chat").header("x-tenant", "acme");
    if let Some(tokens) = tokens {
        request = request.header("x-tokens", tokens.to_string());
    }
    request.body(Body::empty()).unwrap()
}

/// What the tenant has left of its tokens, as a request of one unit would
/// find it (without counting it).
async fn remaining(limiter: &Limiter<MemoryStore>) -> u64 {
    left_of(limiter, "POST /v1/chat", None).await
}

/// What `acme` (as `subject`) has left of the first rule of `route`, as a
/// request of one unit would find it (without counting it).
async fn left_of(limiter: &Limiter<MemoryStore>, route: &str, subject: Option<&str>) -> u64 {
    let policy = limiter.policy();
    let applicable = policy.applicable("acme", route, subject.is_some());
    let batch = sluice_store::Batch::new("acme", subject, 1, applicable.rules);
    let peeked = limiter.peek(&batch).await.unwrap();
    let row = &peeked.rows[0];
    let (outcome, _) = row.enforced.decide(&row.state, peeked.now, 1);
    u64::from(outcome.remaining) + u64::from(outcome.allowed)
}

/// Waits for the settle the body's end spawned (at most 2 s).
async fn settled_to(limiter: &Limiter<MemoryStore>, expected: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let left = remaining(limiter).await;
        if left == expected {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{left} left, expected {expected}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_read_from_the_response_are_settled_when_the_body_ends_or_is_dropped() {
    let (_clock, limiter) = limiter();
    let app = app(limiter.clone());
    // 600 tokens, the body read to its end: 1 reserved, 600 charged.
    let response = app.clone().oneshot(chat(Some(600))).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        remaining(&limiter).await,
        999,
        "only the estimate until the body ends"
    );
    response.into_body().collect().await.unwrap();
    settled_to(&limiter, 400).await;
    // 600 more, the body dropped unread (the client went away): still
    // charged, 200 past the limit.
    let response = app.clone().oneshot(chat(Some(600))).await.unwrap();
    drop(response);
    settled_to(&limiter, 0).await;
    let denied = app.clone().oneshot(chat(Some(1))).await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    // Owing 200 tokens at 1,000 a minute: 12 s, and one more token.
    assert_eq!(denied.headers()["retry-after"], "13");
    // A response that does not say what it cost keeps the estimate.
    let (_clock, limiter) = self::limiter();
    let app = self::app(limiter.clone());
    let response = app.oneshot(chat(None)).await.unwrap();
    response.into_body().collect().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(remaining(&limiter).await, 999);
}

fn login(password: &str) -> Request<Body> {
    Request::post("/login")
        .header("x-tenant", "acme")
        .header("x-user", "10.0.0.1|alice")
        .header("x-password", password)
        .body(Body::empty())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_are_counted_by_their_status_and_successes_are_not() {
    let (_clock, limiter) = limiter();
    let app = app(limiter.clone());
    for _ in 0..10 {
        let ok = app.clone().oneshot(login("right")).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
    for _ in 0..3 {
        let failed = app.clone().oneshot(login("wrong")).await.unwrap();
        assert_eq!(failed.status(), StatusCode::UNAUTHORIZED);
    }
    // Each attempt is concluded before its response goes out: the three
    // failures are counted, the next login refused.
    let refused = app.clone().oneshot(login("right")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    // `logins` (no `count_if`) holds what the checks took, one for each
    // login admitted.
    assert_eq!(
        left_of(&limiter, "POST /login", Some("10.0.0.1|alice")).await,
        100 - 13
    );
}

/// Twenty failed logins at once (each taking 100 ms): three reach the
/// service, holding the rule's three places while they run; the others
/// are refused before they do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_at_once_reach_the_service_no_more_than_the_limit() {
    let (_clock, limiter) = limiter();
    let app = app(limiter.clone());
    let mut logins = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let mut request = login("wrong");
        request.headers_mut().insert("x-slow", "1".parse().unwrap());
        logins.spawn(app.clone().oneshot(request));
    }
    let statuses: Vec<StatusCode> = logins
        .join_all()
        .await
        .into_iter()
        .map(|r| r.unwrap().status())
        .collect();
    let served = statuses
        .iter()
        .filter(|s| **s == StatusCode::UNAUTHORIZED)
        .count();
    assert_eq!(served, 3, "{statuses:?}");
    let refused = app.clone().oneshot(login("right")).await.unwrap();
    assert_eq!(
        refused.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "three failures"
    );
}

/// A login whose call is abandoned before the service answers gives its
/// attempt back: the outcome was never known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_login_gives_its_attempt_back() {
    let (_clock, limiter) = limiter();
    let app = app(limiter.clone());
    for _ in 0..3 {
        let mut request = login("wrong");
        request.headers_mut().insert("x-slow", "1".parse().unwrap());
        let call = app.clone().oneshot(request);
        // Abandoned after 20 ms, while the service sleeps.
        assert!(
            tokio::time::timeout(Duration::from_millis(20), call)
                .await
                .is_err()
        );
    }
    // Given back on tasks of their own: soon.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let response = app.clone().oneshot(login("right")).await.unwrap();
        if response.status() == StatusCode::OK {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never given back");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
