//! The layer around a real axum router: on the memory store with a
//! hand-set clock, and shared by two "instances" through a real Redis.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use http::{HeaderName, Request, StatusCode};
use http_body_util::BodyExt;
use sfv::{ListEntry, Parser};
use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy};
use sluice_store::{ConnectOptions, KeySet, Limiter, ManualClock, MemoryStore, RedisStore, Store};
use sluice_testkit::RedisServer;
use sluice_tower::{FromHeaders, InvalidRequest, Keys, RateLimitLayer};
use tower::ServiceExt;

const LIMITS: &str = r#"
default_plan: free
plans:
  free:
    tenant: [{ name: hourly, algorithm: fixed_window, limit: 10, per: 1h }]
    routes:
      "POST /v1/invoices": [{ name: invoices, algorithm: gcra, limit: 2, per: 1h }]
    subject:
      "*": [{ name: per-user, algorithm: token_bucket, limit: 4, per: 1h }]
"#;

fn policy() -> Policy {
    Policy::compile(&Config::from_yaml(LIMITS, "limits.yaml").unwrap().limits)
}

/// The app behind the layer, counting the requests that reach it.
fn app<S: Store + 'static>(limiter: Arc<Limiter<S>>, reached: &Arc<AtomicUsize>) -> Router {
    let (a, b) = (reached.clone(), reached.clone());
    let extract = FromHeaders::new(HeaderName::from_static("x-tenant"))
        .subject(HeaderName::from_static("x-user"))
        .cost(HeaderName::from_static("x-cost"));
    Router::new()
        .route(
            "/v1/things",
            get(move || async move {
                a.fetch_add(1, Ordering::Relaxed);
                "things"
            }),
        )
        .route(
            "/v1/invoices",
            post(move || async move {
                b.fetch_add(1, Ordering::Relaxed);
                (StatusCode::CREATED, "invoice")
            }),
        )
        .layer(RateLimitLayer::new(limiter, extract))
}

struct Answer {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

async fn send(app: &Router, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut request = Request::builder().method(method).uri(path);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// `r` of each item of a `RateLimit` field, by policy name.
fn remaining(answer: &Answer) -> Vec<(String, i64)> {
    let field = answer
        .headers
        .get("ratelimit")
        .expect("a RateLimit field")
        .to_str()
        .unwrap();
    Parser::new(field)
        .parse::<sfv::List>()
        .unwrap()
        .into_iter()
        .map(|entry| match entry {
            ListEntry::Item(item) => {
                let name = item.bare_item.as_string().unwrap().as_str().to_owned();
                let r = item
                    .params
                    .get("r")
                    .and_then(|v| v.as_integer())
                    .map(i64::from)
                    .unwrap();
                (name, r)
            }
            ListEntry::InnerList(_) => panic!("no inner lists"),
        })
        .collect()
}

#[tokio::test]
async fn admits_with_the_ratelimit_fields_and_denies_with_a_problem_consuming_nothing() {
    let clock = Arc::new(ManualClock::new(1_764_460_800_000));
    let limiter = Arc::new(Limiter::new(
        policy(),
        MemoryStore::with_clock(10_000, clock.clone()),
        OnError::Deny,
    ));
    let reached = Arc::new(AtomicUsize::new(0));
    let app = app(limiter, &reached);
    let acme = [("x-tenant", "acme")];

    let answer = send(&app, "GET", "/v1/things?page=2", &acme).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body, "things");
    assert_eq!(remaining(&answer), [("hourly".to_owned(), 9)]);
    assert!(
        answer
            .headers
            .get("ratelimit-policy")
            .unwrap()
            .to_str()
            .unwrap()
            .contains("\"hourly\";q=10;w=3600")
    );

    // Two invoices an hour; the third is a 429 problem, never reaching the
    // handler, and consuming nothing from the tenant's hourly budget.
    for _ in 0..2 {
        assert_eq!(
            send(&app, "POST", "/v1/invoices", &acme).await.status,
            StatusCode::CREATED
        );
    }
    let denied = send(&app, "POST", "/v1/invoices", &acme).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.headers["content-type"], "application/problem+json");
    assert!(denied.headers.get("retry-after").is_some());
    let problem: serde_json::Value = serde_json::from_str(&denied.body).unwrap();
    assert_eq!(problem["reason"], "route_limit");
    assert_eq!(problem["violated-policies"][0], "invoices");
    assert_eq!(reached.load(Ordering::Relaxed), 3);
    let answer = send(&app, "GET", "/v1/things", &acme).await;
    assert_eq!(
        remaining(&answer),
        [("hourly".to_owned(), 6)],
        "10 - 1 - 2 - this one"
    );

    // The subject and cost headers reach the decision.
    let answer = send(
        &app,
        "GET",
        "/v1/things",
        &[("x-tenant", "acme"), ("x-user", "u1"), ("x-cost", "3")],
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        remaining(&answer),
        [("hourly".to_owned(), 3), ("per-user".to_owned(), 1)]
    );

    // After the hour, budgets are back.
    clock.advance(3_600_000);
    assert_eq!(
        send(&app, "POST", "/v1/invoices", &acme).await.status,
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn keys_it_cannot_read_are_a_400_naming_the_header() {
    let limiter = Arc::new(Limiter::new(
        policy(),
        MemoryStore::new(10_000),
        OnError::Deny,
    ));
    let reached = Arc::new(AtomicUsize::new(0));
    let app = app(limiter, &reached);
    let cases: [(&[(&str, &str)], &str); 6] = [
        (&[], "x-tenant"),
        (&[("x-tenant", "")], "tenant"),
        (&[("x-tenant", "acme"), ("x-cost", "two")], "x-cost"),
        (&[("x-tenant", "acme"), ("x-cost", "0")], "x-cost"),
        // Sent twice: which counts would be the choice of whoever added one.
        (&[("x-tenant", "acme"), ("x-tenant", "victim")], "x-tenant"),
        (
            &[("x-tenant", "acme"), ("x-cost", "1"), ("x-cost", "9")],
            "x-cost",
        ),
    ];
    for (headers, field) in cases {
        let answer = send(&app, "GET", "/v1/things", headers).await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{}", answer.body);
        let problem: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(problem["invalid-params"][0]["name"], field, "{problem}");
    }
    assert_eq!(reached.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn keys_can_come_from_anywhere_in_the_request() {
    // An authentication layer put the tenant in the request's extensions.
    #[derive(Clone)]
    struct Authenticated(&'static str);
    let limiter = Arc::new(Limiter::new(
        policy(),
        MemoryStore::new(10_000),
        OnError::Deny,
    ));
    let extract = |request: &Request<Body>| -> Result<Keys, InvalidRequest> {
        let Some(Authenticated(tenant)) = request.extensions().get::<Authenticated>().cloned()
        else {
            return Err(InvalidRequest::new("authorization", "sign in first"));
        };
        Ok(Keys {
            tenant: tenant.to_owned(),
            route: format!("{} {}", request.method(), request.uri().path()),
            subject: None,
            cost: 1,
            fingerprint: None,
        })
    };
    let app = Router::new()
        .route("/v1/invoices", post(|| async { "ok" }))
        .layer(RateLimitLayer::new(limiter, extract));
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let mut request = Request::post("/v1/invoices").body(Body::empty()).unwrap();
        request.extensions_mut().insert(Authenticated("globex"));
        statuses.push(app.clone().oneshot(request).await.unwrap().status());
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    let anonymous = Request::post("/v1/invoices").body(Body::empty()).unwrap();
    assert_eq!(
        app.oneshot(anonymous).await.unwrap().status(),
        StatusCode::BAD_REQUEST
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_apps_share_budgets_through_redis() {
    let redis = RedisServer::start();
    let keys = || KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'p'; 32]).unwrap()),
        previous: None,
    };
    let reached = Arc::new(AtomicUsize::new(0));
    let mut apps = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::connect(
            &redis.url(),
            keys(),
            &ConnectOptions::with_timeout(Duration::from_secs(2)),
        )
        .await
        .unwrap();
        apps.push(app(
            Arc::new(Limiter::new(policy(), store, OnError::Deny)),
            &reached,
        ));
    }
    let mut tasks = Vec::new();
    for i in 0..20 {
        let app = apps[i % 2].clone();
        tasks.push(tokio::spawn(async move {
            send(&app, "POST", "/v1/invoices", &[("x-tenant", "shared")])
                .await
                .status
        }));
    }
    let mut created = 0;
    for task in tasks {
        let status = task.await.unwrap();
        assert!(status == StatusCode::CREATED || status == StatusCode::TOO_MANY_REQUESTS);
        created += usize::from(status == StatusCode::CREATED);
    }
    assert_eq!(created, 2, "two invoices an hour across both apps");
    assert_eq!(reached.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn no_spelling_of_a_route_escapes_its_limit() {
    let clock = Arc::new(ManualClock::new(1_764_460_800_000));
    let store = MemoryStore::with_clock(1_000, clock);
    let limiter = Arc::new(Limiter::new(policy(), store, OnError::Deny));
    let reached = Arc::new(AtomicUsize::new(0));
    let app = app(limiter, &reached);
    let tenant = [("x-tenant", "acme")];
    for _ in 0..2 {
        send(&app, "POST", "/v1/invoices", &tenant).await;
    }
    for path in [
        "/v1/invoices/",
        "//v1/invoices",
        "/v1/%69nvoices",
        "/v1/./invoices",
        "/v1/x/../invoices",
        "/v1/invoices;x=1",
        "/v1/invoices?x=1",
    ] {
        let answer = send(&app, "POST", path, &tenant).await;
        assert_eq!(
            answer.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{path} escaped the exhausted limit"
        );
    }
    assert_eq!(reached.load(Ordering::Relaxed), 2);
}

#[tokio::test]
async fn a_duplicate_submission_never_reaches_the_handler() {
    let clock = Arc::new(ManualClock::new(1_764_460_800_000));
    let store = MemoryStore::with_clock(1_000, clock);
    let guarded = format!("{LIMITS}    dedupe:\n      \"POST /v1/invoices\": {{ window: 10s }}\n");
    let policy = Policy::compile(&Config::from_yaml(&guarded, "limits.yaml").unwrap().limits);
    let limiter = Arc::new(Limiter::new(policy, store, OnError::Deny));
    let reached = Arc::new(AtomicUsize::new(0));
    let app = app(limiter, &reached);
    let submit = |key: &'static str| [("x-tenant", "dup"), ("idempotency-key", key)];
    assert_eq!(
        send(&app, "POST", "/v1/invoices", &submit("inv-1"))
            .await
            .status,
        StatusCode::CREATED
    );
    let again = send(&app, "POST", "/v1/invoices", &submit("inv-1")).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
    assert!(
        again.body.contains("\"reason\":\"duplicate\""),
        "{}",
        again.body
    );
    assert_eq!(again.headers.get("retry-after").unwrap(), "10");
    assert_eq!(
        send(&app, "POST", "/v1/invoices", &submit("inv-2"))
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(
        reached.load(Ordering::Relaxed),
        2,
        "the duplicate never ran"
    );
}

#[tokio::test]
async fn limits_per_client_ip_believe_trusted_proxies_only() {
    let clock = Arc::new(ManualClock::new(1_764_460_800_000));
    let store = MemoryStore::with_clock(1_000, clock);
    let limiter = Arc::new(Limiter::new(policy(), store, OnError::Deny));
    let extract = FromHeaders::new(HeaderName::from_static("x-tenant"))
        .client_ip(vec!["10.0.0.0/8".parse().unwrap()]);
    let app = Router::new()
        .route("/v1/things", get(|| async { "things" }))
        .layer(RateLimitLayer::new(limiter, extract));
    let ask_as = |tenant: &'static str, peer: &str, xff: &str| {
        let request = Request::get("/v1/things")
            .header("x-tenant", tenant)
            .header("x-forwarded-for", xff)
            .extension(sluice_tower::Peer(peer.parse().unwrap()))
            .body(Body::empty())
            .unwrap();
        let app = app.clone();
        async move { app.oneshot(request).await.unwrap().status() }
    };
    let ask = |peer: &str, xff: &str| ask_as("ip", peer, xff);
    // The per-user rule (4 an hour) counts per client address.
    for _ in 0..4 {
        assert_eq!(
            ask("10.0.0.2:1000", "1.1.1.1, 203.0.113.5").await,
            StatusCode::OK
        );
    }
    assert_eq!(
        ask("10.0.0.2:1000", "9.9.9.9, 203.0.113.5").await,
        StatusCode::TOO_MANY_REQUESTS,
        "a spoofed left-hand address does not make a new client"
    );
    assert_eq!(ask("10.0.0.2:1000", "203.0.113.6").await, StatusCode::OK);
    // From an untrusted peer the header is not believed (another tenant,
    // whose hourly budget is untouched).
    for _ in 0..4 {
        let status = ask_as("ip2", "198.51.100.1:1", "203.0.113.77").await;
        assert_eq!(status, StatusCode::OK);
    }
    let status = ask_as("ip2", "198.51.100.1:1", "203.0.113.78").await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the peer's 4 are spent"
    );
}

#[tokio::test]
async fn limits_declared_next_to_the_route() {
    use sluice_tower::limits::{By, Limits};
    let layer = Limits::route("POST /v1/payments")
        .rule("2/1m")
        .rule("3/1h")
        .by(By::ClientIp(vec!["10.0.0.0/8".parse().unwrap()]))
        .prevent_duplicate("5s")
        .layer(MemoryStore::new(1_000))
        .unwrap();
    let reached = Arc::new(AtomicUsize::new(0));
    let counter = reached.clone();
    let app = Router::new()
        .route(
            "/v1/payments",
            post(move || async move {
                counter.fetch_add(1, Ordering::Relaxed);
                "paid"
            })
            .route_layer(layer),
        )
        .route("/v1/free", get(|| async { "free" }));
    let pay = |ip: &str, key: &str| {
        let request = Request::post("/v1/payments")
            .header("x-forwarded-for", ip)
            .header("idempotency-key", key)
            .extension(sluice_tower::Peer("10.0.0.1:9".parse().unwrap()))
            .body(Body::empty())
            .unwrap();
        let app = app.clone();
        async move {
            let response = app.oneshot(request).await.unwrap();
            let policy = response
                .headers()
                .get("ratelimit-policy")
                .map(|v| v.to_str().unwrap().to_owned());
            (response.status(), policy)
        }
    };
    let (status, policy) = pay("203.0.113.1", "a").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        policy.as_deref(),
        Some("\"subject-0\";q=2;w=60, \"subject-1\";q=3;w=3600"),
        "named and advertised as a configured rule would be"
    );
    assert_eq!(pay("203.0.113.1", "a").await.0, StatusCode::CONFLICT);
    assert_eq!(pay("203.0.113.1", "b").await.0, StatusCode::OK);
    assert_eq!(
        pay("203.0.113.1", "c").await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        pay("203.0.113.2", "c").await.0,
        StatusCode::OK,
        "per client IP"
    );
    assert_eq!(reached.load(Ordering::Relaxed), 3);
    // A declaration that does not compile says what is wrong.
    let error = Limits::route("POST /x")
        .rule("ten/1m")
        .policy()
        .unwrap_err();
    assert!(error.message.contains("LIMIT"), "{error}");
    let error = Limits::route("POST /x").rule("10/1x").policy().unwrap_err();
    assert!(error.to_string().contains("per"), "{error}");
}

/// A route of at most two exports in flight, declared next to its handler:
/// a slot is held from before the handler runs until the response body
/// ends or is dropped, and given back when the call is abandoned.
#[tokio::test]
async fn concurrent_requests_hold_a_slot_until_their_body_ends_or_drops() {
    use sluice_tower::limits::{By, Limits};
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let reached = Arc::new(AtomicUsize::new(0));
    let (g, r) = (gate.clone(), reached.clone());
    let exports = Limits::route("POST /v1/exports")
        .concurrent(2, "30s")
        .by(By::Header(HeaderName::from_static("x-user")))
        .layer(MemoryStore::new(1_000))
        .unwrap();
    let app: Router = Router::new().route(
        "/v1/exports",
        post(move || async move {
            r.fetch_add(1, Ordering::SeqCst);
            g.acquire().await.unwrap().forget();
            "export"
        })
        .route_layer(exports),
    );
    let call = |app: &Router| {
        let app = app.clone();
        tokio::spawn(async move {
            let request = Request::post("/v1/exports").header("x-user", "u1");
            app.oneshot(request.body(Body::empty()).unwrap())
                .await
                .unwrap()
        })
    };
    async fn until(what: &str, done: impl Fn() -> bool) {
        for _ in 0..500 {
            if done() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("{what}");
    }
    // Two in the handler; a third is refused without reaching it.
    let (first, second) = (call(&app), call(&app));
    until("two handlers run", || reached.load(Ordering::SeqCst) == 2).await;
    // A refusal answers at once; a call let through would wait at the gate.
    let at_once = |app: &Router| {
        let call = call(app);
        async move {
            tokio::time::timeout(Duration::from_secs(5), call)
                .await
                .expect("refused at once, not let through to the handler")
                .unwrap()
        }
    };
    let refused = at_once(&app).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let policy = refused.headers()["ratelimit-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(policy.contains(r#"qu="concurrent-requests""#), "{policy}");
    assert_eq!(reached.load(Ordering::SeqCst), 2);
    // The first handler answers: its slot is held until its body ends.
    gate.add_permits(1);
    let answered = first.await.unwrap();
    assert_eq!(answered.status(), StatusCode::OK);
    assert_eq!(
        at_once(&app).await.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "the body has not ended"
    );
    let body = answered.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"export");
    // Given back (by a task) once the body ended: a third gets in.
    let third = call(&app);
    until("the third handler runs", || {
        reached.load(Ordering::SeqCst) == 3
    })
    .await;
    // A response dropped unread gives its slot back too.
    gate.add_permits(1);
    drop(second.await.unwrap());
    let fourth = call(&app);
    until("the fourth handler runs", || {
        reached.load(Ordering::SeqCst) == 4
    })
    .await;
    // An abandoned call (the client went away while the handler ran).
    third.abort();
    assert!(third.await.unwrap_err().is_cancelled());
    let fifth = call(&app);
    until("the fifth handler runs", || {
        reached.load(Ordering::SeqCst) == 5
    })
    .await;
    gate.add_permits(2);
    for call in [fourth, fifth] {
        assert_eq!(call.await.unwrap().status(), StatusCode::OK);
    }
}

/// Without an `Idempotency-Key`, the same body twice is the same
/// submission; the handler still reads the whole body.
#[tokio::test]
async fn a_body_digest_fingerprints_submissions_without_a_key() {
    use sluice_tower::digest::BodyDigestLayer;
    use sluice_tower::limits::Limits;
    let payments = Limits::route("POST /v1/payments")
        .prevent_duplicate("5s")
        .layer(MemoryStore::new(1_000))
        .unwrap();
    let app: Router = Router::new().route(
        "/v1/payments",
        post(|body: String| async move { format!("paid {body}") })
            .route_layer(payments)
            .route_layer(BodyDigestLayer::new(64)),
    );
    let pay = |body: &str, key: Option<&str>| {
        let mut request = Request::post("/v1/payments");
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        app.clone()
            .oneshot(request.body(Body::from(body.to_owned())).unwrap())
    };
    let first = pay(r#"{"amount": 10}"#, None).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        &body[..],
        br#"paid {"amount": 10}"#,
        "the handler got the body"
    );
    assert_eq!(
        pay(r#"{"amount": 10}"#, None).await.unwrap().status(),
        StatusCode::CONFLICT
    );
    assert_eq!(
        pay(r#"{"amount": 11}"#, None).await.unwrap().status(),
        StatusCode::OK
    );
    // The header, when present, is the fingerprint.
    assert_eq!(pay("a", Some("k1")).await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        pay("b", Some("k1")).await.unwrap().status(),
        StatusCode::CONFLICT
    );
    // Above the bound: 413 before anything is decided.
    let large = pay(&"x".repeat(65), None).await.unwrap();
    assert_eq!(large.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        pay(&"x".repeat(64), None).await.unwrap().status(),
        StatusCode::OK
    );
}
