//! The layer's attempts at their edges over a real `redis-server` (with an
//! append-only file, so that a restart keeps what it counted): a login
//! that succeeds while the store is briefly unreachable at its conclusion.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{HeaderName, Request, StatusCode};
use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy};
use sluice_store::{ConnectOptions, KeySet, Limiter, RedisStore};
use sluice_testkit::RedisServer;
use sluice_tower::{FromHeaders, RateLimitLayer};
use tower::ServiceExt;

const LIMITS: &str = r#"
default_plan: free
plans:
  free:
    subject:
      "POST /login":
        - { name: failed-logins, algorithm: gcra, limit: 1, per: 15m, count_if: { status: ["4xx"] } }
"#;

fn login(blip: bool) -> Request<Body> {
    let mut request = Request::post("/login")
        .header("x-tenant", "acme")
        .header("x-user", "10.0.0.1|alice");
    if blip {
        request = request.header("x-blip", "1");
    }
    request.body(Body::empty()).unwrap()
}

/// One login succeeds (200) while Redis is down at the moment its attempt
/// is concluded (killed in the handler; restarted from its append-only
/// file right after, holding what it counted). A success is given back
/// ("no lock-out"): over the HTTP API a report would answer 503 and be
/// sent again, and the expiry gives an unconcluded attempt back; in the
/// layer the failed conclusion is only logged ("it keeps counting"), and
/// the next login of this user is refused for 15 minutes without a single
/// failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_concluded_while_the_store_blips_is_given_back() {
    let redis = Arc::new(Mutex::new(RedisServer::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ])));
    let url = redis.lock().unwrap().url();
    let keys = KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b't'; 32]).unwrap()),
        previous: None,
    };
    let store = RedisStore::connect(
        &url,
        keys,
        &ConnectOptions::with_timeout(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let policy = Policy::compile_for(
        &Config::from_yaml(LIMITS, "limits.yaml").unwrap().limits,
        true,
    );
    let limiter = Arc::new(Limiter::new(policy, store, OnError::Deny));
    let in_handler = redis.clone();
    let app = Router::new()
        .route(
            "/login",
            post(move |headers: http::HeaderMap| {
                let redis = in_handler.clone();
                async move {
                    if headers.contains_key("x-blip") {
                        tokio::task::spawn_blocking(move || redis.lock().unwrap().stop())
                            .await
                            .unwrap();
                    }
                    StatusCode::OK
                }
            }),
        )
        .layer(RateLimitLayer::new(
            limiter.clone(),
            FromHeaders::new(HeaderName::from_static("x-tenant"))
                .subject(HeaderName::from_static("x-user")),
        ));
    // Successes pass, one after another, on a rule of 1.
    for _ in 0..3 {
        let ok = app.clone().oneshot(login(false)).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
    let blipped = app.clone().oneshot(login(true)).await.unwrap();
    assert_eq!(blipped.status(), StatusCode::OK);
    let restarting = redis.clone();
    tokio::task::spawn_blocking(move || restarting.lock().unwrap().restart())
        .await
        .unwrap();
    // Back: the conclusion the store refused is tried again once a second,
    // so a successful login passes within about a second of the store's
    // return, not a window later.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let back = loop {
        let response = app.clone().oneshot(login(false)).await.unwrap();
        if response.status() != StatusCode::SERVICE_UNAVAILABLE
            && response.status() != StatusCode::INTERNAL_SERVER_ERROR
        {
            break tokio::time::Instant::now();
        }
        assert!(tokio::time::Instant::now() < deadline, "Redis never back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let status = loop {
        let response = app.clone().oneshot(login(false)).await.unwrap();
        if response.status() == StatusCode::OK
            || tokio::time::Instant::now() > back + Duration::from_secs(5)
        {
            break response.status();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        status,
        StatusCode::OK,
        "a success concluded during a store blip stays counted: the user is locked out"
    );
}
