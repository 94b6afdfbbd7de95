//! The HTTP API, driven in-process through the router with a hand-set clock.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use sfv::{BareItem, ListEntry, Parser};
use sluice_core::{Config, Policy};
use sluice_server::app::App;
use sluice_server::backend::Backend;
use sluice_server::http::router;
use sluice_store::{Limiter, ManualClock, MemoryStore};
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

/// The test configuration's limiter on a memory store and a hand-set
/// clock.
fn limiter() -> (Config, Arc<ManualClock>, Limiter<Backend>) {
    let config = Config::from_yaml(CONFIG, "test.yaml").unwrap();
    let clock = Arc::new(ManualClock::new(1_764_460_800_500));
    let store = MemoryStore::with_clock(100_000, clock.clone());
    let limiter = Limiter::new(
        Policy::compile(&config.limits),
        Backend::Memory(store),
        config.storage.on_error,
    );
    (config, clock, limiter)
}

fn harness() -> Harness {
    let (config, clock, limiter) = limiter();
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

#[tokio::test]
async fn allowed_answers_200_with_both_ratelimit_fields() {
    let h = harness();
    let (response, body) = h
        .check_json(json!({"tenant": "acme", "route": "POST /v1/invoices", "subject": "u1"}))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(header(&response, "content-type"), Some("application/json"));
    assert_eq!(body["allowed"], true);
    assert_eq!(body["reason"], Value::Null);
    assert_eq!(body["retry_after_ms"], Value::Null);
    assert!(header(&response, "retry-after").is_none());

    let policy = sf_list(header(&response, "ratelimit-policy").unwrap());
    let names: Vec<&str> = policy.iter().map(|(n, _)| n.as_str()).collect();
    // The global valve is never advertised.
    assert_eq!(names, ["daily", "invoices", "per-user"]);
    assert_eq!(param(&policy, "daily", "q"), 1000);
    assert_eq!(param(&policy, "daily", "w"), 86_400);
    assert_eq!(param(&policy, "invoices", "q"), 2);
    // A bucket of 2 refilled 1 per 2 s: 4 s to refill.
    assert_eq!(param(&policy, "per-user", "q"), 2);
    assert_eq!(param(&policy, "per-user", "w"), 4);

    let state = sf_list(header(&response, "ratelimit").unwrap());
    assert_eq!(param(&state, "daily", "r"), 999);
    assert_eq!(param(&state, "invoices", "r"), 1);
    assert_eq!(param(&state, "per-user", "r"), 1);
    // 500ms into the aligned day: the day resets in 86399.5s, rounded up.
    assert_eq!(param(&state, "daily", "t"), 86_400);
    // The JSON names the policy closest to its limit.
    assert_eq!(body["policy"], "invoices");
    assert_eq!(body["limit"], 2);
    assert_eq!(body["remaining"], 1);
    assert_eq!(body["near_limit"], false);
}

#[tokio::test]
async fn denied_answers_429_problem_with_retry_after_rounded_up() {
    let h = harness();
    let request = json!({"tenant": "acme", "route": "POST /v1/invoices"});
    for _ in 0..2 {
        assert_eq!(
            h.check_json(request.clone()).await.0.status(),
            StatusCode::OK
        );
    }
    h.clock.advance(100);
    let (response, body) = h.check_json(request.clone()).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&response, "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["status"], 429);
    assert_eq!(body["violated-policies"], json!(["invoices"]));
    assert_eq!(body["allowed"], false);
    assert_eq!(body["reason"], "route_limit");
    assert_eq!(body["policy"], "invoices");
    assert_eq!(body["remaining"], 0);
    // gcra 2/s: the next unit is free 500ms after the first, 400ms from now.
    assert_eq!(body["retry_after_ms"], 400);
    assert_eq!(header(&response, "retry-after"), Some("1"));
    let state = sf_list(header(&response, "ratelimit").unwrap());
    assert_eq!(param(&state, "invoices", "r"), 0);
    // Denied requests consume nothing: the daily budget still shows 2 used.
    assert_eq!(param(&state, "daily", "r"), 998);

    h.clock.advance(400);
    assert_eq!(h.check_json(request).await.0.status(), StatusCode::OK);
}

#[tokio::test]
async fn subject_limits_apply_per_subject() {
    let h = harness();
    let as_user = |u: &str| json!({"tenant": "acme", "route": "GET /v1/other", "subject": u});
    for _ in 0..2 {
        assert_eq!(h.check_json(as_user("u1")).await.0.status(), StatusCode::OK);
    }
    let (response, body) = h.check_json(as_user("u1")).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["reason"], "subject_limit");
    assert_eq!(body["retry_after_ms"], 2_000);
    assert_eq!(header(&response, "retry-after"), Some("2"));
    assert_eq!(h.check_json(as_user("u2")).await.0.status(), StatusCode::OK);
}

#[tokio::test]
async fn cost_above_capacity_is_its_own_outcome() {
    let h = harness();
    let (response, body) = h
        .check_json(json!({"tenant": "acme", "route": "POST /v1/invoices", "cost": 3}))
        .await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["reason"], "cost_exceeds_capacity");
    assert_eq!(body["policy"], "invoices");
    assert_eq!(body["retry_after_ms"], Value::Null);
    assert!(
        header(&response, "retry-after").is_none(),
        "waiting would not help"
    );
    // Nothing was consumed.
    let (ok, _) = h
        .check_json(json!({"tenant": "acme", "route": "POST /v1/invoices", "cost": 2}))
        .await;
    assert_eq!(ok.status(), StatusCode::OK);
}

#[tokio::test]
async fn bad_input_is_a_400_problem_naming_the_field() {
    let h = harness();
    let long = "t".repeat(257);
    let cases: Vec<(Body, &str)> = vec![
        (Body::from("{not json"), "body"),
        (Body::from(""), "body"),
        (Body::from("[1,2]"), "body"),
        (Body::from("[]"), "body"),
        (Body::from(r#""acme""#), "body"),
        (Body::from(vec![0xff, 0xfe]), "body"),
        (Body::from(r#"{"route": "GET /"}"#), "tenant"),
        (Body::from(r#"{"tenant": "a"}"#), "route"),
        (
            Body::from(json!({"tenant": long, "route": "GET /"}).to_string()),
            "tenant",
        ),
        (Body::from(r#"{"tenant": "", "route": "GET /"}"#), "tenant"),
        (Body::from(r#"{"tenant": 7, "route": "GET /"}"#), "tenant"),
        (
            Body::from(r#"{"tenant": "a", "route": "GET /", "subject": ""}"#),
            "subject",
        ),
        (
            Body::from(r#"{"tenant": "a", "route": "GET /", "cost": 0}"#),
            "cost",
        ),
        (
            Body::from(r#"{"tenant": "a", "route": "GET /", "cost": -3}"#),
            "cost",
        ),
        (
            Body::from(r#"{"tenant": "a", "route": "GET /", "cost": 2.5}"#),
            "cost",
        ),
        (
            Body::from(r#"{"tenant": "a", "route": "GET /", "cost": 1000001}"#),
            "cost",
        ),
        (
            Body::from(r#"{"tenant": "a", "route": "GET /", "cost": 99999999999999999999999}"#),
            "cost",
        ),
        (
            Body::from(r#"{"tenant": "a", "route": "GET /", "cost": "3"}"#),
            "cost",
        ),
        (
            Body::from(r#"{"tenant": "a", "route": "GET /", "tenat": "b"}"#),
            "tenat",
        ),
        (
            Body::from(r#"{"tenant": "a", "route": "GET /"} trailing"#),
            "body",
        ),
    ];
    for (body, field) in cases {
        let (response, problem) = h.check(body).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{problem}");
        assert_eq!(
            header(&response, "content-type"),
            Some("application/problem+json")
        );
        assert_eq!(problem["status"], 400);
        assert_eq!(problem["invalid-params"][0]["name"], field, "{problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.len() > 10);
        assert!(!detail.contains("CheckBody"), "no type of ours: {detail}");
    }
    let (response, problem) = h
        .check(r#"{"tenant": "a", "route": "GET /", "cost": 0}"#)
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        problem["detail"],
        "`cost` must be a whole number from 1 to 1000000, got 0"
    );
    for (cost, shown) in [("-0.0", "0"), ("1e7", "10000000"), ("1e300", "1e+300")] {
        let body = format!(r#"{{"tenant": "a", "route": "GET /", "cost": {cost}}}"#);
        let (response, problem) = h.check(body).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{cost}");
        assert_eq!(
            problem["detail"],
            format!("`cost` must be a whole number from 1 to 1000000, got {shown}"),
            "{cost}"
        );
    }
}

/// JSON has one kind of number: a whole cost written 2.0 or 2e0 is 2.
#[tokio::test]
async fn a_whole_cost_is_read_however_it_is_written() {
    let h = harness();
    let mut remaining = None;
    for cost in ["1", "2.0", "2e0", "20E-1"] {
        let body = format!(r#"{{"tenant": "w", "route": "GET /", "cost": {cost}}}"#);
        let (response, answer) = h.check(body).await;
        assert_eq!(response.status(), StatusCode::OK, "{cost}: {answer}");
        let now = answer["remaining"].as_u64().unwrap();
        if let Some(before) = remaining {
            assert_eq!(before - now, 2, "cost {cost} took 2");
        }
        remaining = Some(now);
    }
}

#[tokio::test]
async fn oversize_body_is_refused_without_a_500() {
    let h = harness();
    let huge = format!(
        r#"{{"tenant": "{}", "route": "GET /"}}"#,
        "x".repeat(64 * 1024)
    );
    let (response, body) = h.check(huge).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(
        header(&response, "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(body["invalid-params"][0]["name"], "body", "{body}");
}

fn forward(headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::get("/v1/forward-auth");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::empty()).unwrap()
}

#[tokio::test]
async fn forward_auth_reads_traefik_and_caddy_headers() {
    let h = harness();
    let traefik = [
        ("X-Tenant", "acme"),
        ("X-Forwarded-Method", "GET"),
        ("X-Forwarded-Uri", "/v1/reports/7?format=csv"),
    ];
    for _ in 0..3 {
        let (response, _) = h.send(forward(&traefik)).await;
        assert_eq!(response.status(), StatusCode::OK);
        let policy = sf_list(header(&response, "ratelimit-policy").unwrap());
        assert!(
            policy.iter().any(|(n, _)| n == "reports"),
            "route from method + path, query dropped"
        );
    }
    let (response, body) = h.send(forward(&traefik)).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body["reason"], "route_limit");
    assert_eq!(header(&response, "retry-after"), Some("10"));
}

/// With `method_header` and `uri_header` set, forward-auth reads those
/// headers and no other: a client's own `X-Forwarded-Uri`, passed along by
/// a gateway that writes `X-Original-URI`, changes nothing.
#[tokio::test]
async fn forward_auth_reads_only_the_original_headers_it_is_told_to() {
    let config = CONFIG.replace(
        "    cost_header: X-Cost\n",
        "    cost_header: X-Cost\n    method_header: X-Original-Method\n    uri_header: X-Original-URI\n",
    );
    let config = Config::from_yaml(&config, "test.yaml").unwrap();
    let store = MemoryStore::with_clock(1000, Arc::new(ManualClock::new(1_764_460_800_500)));
    let limiter = Limiter::new(
        Policy::compile(&config.limits),
        Backend::Memory(store),
        config.storage.on_error,
    );
    let app = App::new(
        limiter,
        config.server.forward_auth.clone(),
        Default::default(),
    );
    let h = Harness {
        router: router(app, &config.server.limits),
        clock: Arc::new(ManualClock::new(0)),
    };
    let spoofed = [
        ("X-Tenant", "acme"),
        ("X-Forwarded-Method", "GET"),
        ("X-Forwarded-Uri", "/unlimited"),
        ("X-Original-Method", "POST"),
        ("X-Original-URI", "/v1/invoices"),
    ];
    for allowed in [true, true, false] {
        let (response, body) = h.send(forward(&spoofed)).await;
        assert_eq!(response.status() == StatusCode::OK, allowed, "{body}");
    }
    // The default order is not in force: X-Forwarded-* alone is missing.
    let (response, problem) = h
        .send(forward(&[
            ("X-Tenant", "acme"),
            ("X-Forwarded-Method", "GET"),
            ("X-Forwarded-Uri", "/"),
        ]))
        .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(problem["invalid-params"][0]["name"], "X-Original-Method");
    // A name that is no header name is refused with the field.
    let bad = CONFIG.replace(
        "    cost_header: X-Cost\n",
        "    cost_header: X-Cost\n    uri_header: \"X Original\"\n",
    );
    let error = Config::from_yaml(&bad, "test.yaml")
        .unwrap_err()
        .to_string();
    assert!(error.contains("server.forward_auth.uri_header"), "{error}");
}

#[tokio::test]
async fn forward_auth_reads_nginx_headers_subject_and_cost() {
    let h = harness();
    let nginx = [
        ("X-Tenant", "acme"),
        ("X-User", "u9"),
        ("X-Cost", "2"),
        ("X-Original-Method", "POST"),
        ("X-Original-URI", "/v1/invoices"),
    ];
    let (response, _) = h.send(forward(&nginx)).await;
    assert_eq!(response.status(), StatusCode::OK);
    let state = sf_list(header(&response, "ratelimit").unwrap());
    assert_eq!(param(&state, "invoices", "r"), 0);
    assert_eq!(param(&state, "per-user", "r"), 0);
}

#[tokio::test]
async fn forward_auth_without_its_headers_or_with_one_twice_is_a_400() {
    let h = harness();
    let cases: [(&[(&str, &str)], &str); 7] = [
        (
            &[("X-Forwarded-Method", "GET"), ("X-Forwarded-Uri", "/")],
            "X-Tenant",
        ),
        (&[("X-Tenant", "acme")], "X-Forwarded-Method"),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
                ("X-Cost", "many"),
            ],
            "X-Cost",
        ),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
                ("X-Cost", "0"),
            ],
            "X-Cost",
        ),
        // Sent twice: which one counts would be whoever added the other's
        // choice.
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Tenant", "victim"),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
            ],
            "X-Tenant",
        ),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
                ("X-Forwarded-Uri", "/v1/reports"),
            ],
            "X-Forwarded-Uri",
        ),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
                ("X-Cost", "1"),
                ("X-Cost", "1"),
            ],
            "X-Cost",
        ),
    ];
    for (headers, field) in cases {
        let (response, problem) = h.send(forward(headers)).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{problem}");
        assert_eq!(problem["invalid-params"][0]["name"], field, "{problem}");
    }
    // A field out of its bounds is named by the header that carried it.
    let long = format!("/{}", "a".repeat(1100));
    let tenant = "t".repeat(257);
    let user = "u".repeat(257);
    type Headers<'a> = &'a [(&'a str, &'a str)];
    let bounds: [(Headers<'_>, &str, &str); 4] = [
        (
            &[
                ("X-Tenant", &tenant),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
            ],
            "X-Tenant",
            "`tenant` must be 1 to 256 bytes",
        ),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", &long),
            ],
            "X-Forwarded-Uri",
            "`route` must be 1 to 1024 bytes",
        ),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-Original-Method", "GET"),
                ("X-Original-URI", &long),
            ],
            "X-Original-URI",
            "`route` must be 1 to 1024 bytes",
        ),
        (
            &[
                ("X-Tenant", "acme"),
                ("X-User", &user),
                ("X-Forwarded-Method", "GET"),
                ("X-Forwarded-Uri", "/"),
            ],
            "X-User",
            "`subject` must be 1 to 256 bytes",
        ),
    ];
    for (headers, name, says) in bounds {
        let (response, problem) = h.send(forward(headers)).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{problem}");
        assert_eq!(problem["invalid-params"][0]["name"], name, "{problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert!(
            detail.starts_with(&format!("header `{name}`: {says}")),
            "{detail}"
        );
    }
    let (_, problem) = h
        .send(forward(&[
            ("X-Tenant", "acme"),
            ("X-Tenant", "victim"),
            ("X-Forwarded-Method", "GET"),
            ("X-Forwarded-Uri", "/"),
        ]))
        .await;
    assert_eq!(
        problem["detail"],
        "header `X-Tenant` must be sent once, got 2 values"
    );
}

/// A wrong path or method is a problem too, saying what there is.
#[tokio::test]
async fn an_unknown_path_or_method_is_a_problem_saying_what_there_is() {
    let h = harness();
    let long = format!("/{}", "x".repeat(500));
    for path in ["/v1/chek", "/v1/check/", long.as_str()] {
        let request = Request::get(path).body(Body::empty()).unwrap();
        let (response, problem) = h.send(request).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
        assert_eq!(
            header(&response, "content-type"),
            Some("application/problem+json")
        );
        assert_eq!(problem["invalid-params"][0]["name"], "path");
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains("POST /v1/check"), "{detail}");
        assert!(
            detail.len() < 500,
            "the path shown within a bound: {detail}"
        );
    }
    let request = Request::get("/v1/check").body(Body::empty()).unwrap();
    let (response, problem) = h.send(request).await;
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(&response, "allow"), Some("POST"));
    assert_eq!(problem["invalid-params"][0]["name"], "method");
}

#[tokio::test]
async fn health_and_readiness() {
    let h = harness();
    let (response, body) = h
        .send(Request::get("/healthz").body(Body::empty()).unwrap())
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body["status"], "ok");
    let (response, body) = h
        .send(Request::get("/readyz").body(Body::empty()).unwrap())
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body["status"], "ready");
    assert_eq!(body["store"], "memory");
}

#[tokio::test]
async fn no_answer_names_the_tenant_or_the_subject() {
    let h = harness();
    let (response, body) = h
        .check_json(json!({"tenant": "tenant-secret-name", "route": "POST /v1/invoices", "subject": "subject-secret"}))
        .await;
    let headers = format!("{:?}", response.headers());
    for secret in ["tenant-secret-name", "subject-secret"] {
        assert!(!headers.contains(secret));
        assert!(!body.to_string().contains(secret));
    }
}

#[tokio::test]
async fn metrics_count_decisions_by_plan_and_route_pattern_never_by_tenant() {
    let h = harness();
    for _ in 0..3 {
        h.check_json(json!({"tenant": "tenant-secret", "route": "POST /v1/invoices"}))
            .await;
    }
    h.check_json(json!({"tenant": "tenant-secret", "route": "GET /v1/reports/7"}))
        .await;
    h.check_json(json!({"tenant": "tenant-secret", "route": "GET /elsewhere"}))
        .await;
    let request = Request::get("/metrics").body(Body::empty()).unwrap();
    let response = h.router.clone().oneshot(request).await.unwrap();
    let text = String::from_utf8(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let count = |labels: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("sluice_decisions_total{{{labels}}}")))
            .unwrap_or_else(|| panic!("no series {labels}:\n{text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    let invoices = r#"plan="free",route="POST /v1/invoices""#;
    assert_eq!(
        count(&format!(r#"outcome="allowed",reason="none",{invoices}"#)),
        2.0
    );
    assert_eq!(
        count(&format!(
            r#"outcome="denied",reason="route_limit",{invoices}"#
        )),
        1.0
    );
    assert_eq!(
        count(r#"outcome="allowed",reason="none",plan="free",route="GET /v1/reports/*""#),
        1.0
    );
    assert_eq!(
        count(r#"outcome="allowed",reason="none",plan="free",route="*""#),
        1.0
    );
    assert!(
        !text.contains("tenant-secret")
            && !text.contains("/elsewhere")
            && !text.contains("reports/7")
    );
}

/// Fuzzing the request parsers: whatever the body or headers, the answer is
/// a decision (200, 429) or a problem naming a field (400, 413), never a
/// 5xx or a panic.
mod fuzz {
    use proptest::prelude::*;

    use super::*;

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(|f| json!(f)),
            Just(json!(u64::MAX)),
            "\\PC{0,40}".prop_map(Value::from),
            "[a-z]{250,300}".prop_map(Value::from),
            Just(Value::from("GET /v1/reports/7")),
            Just(Value::from("POST /v1/invoices")),
        ];
        leaf.prop_recursive(2, 8, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map("[a-z]{1,8}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A body: a request object with each member absent or any JSON value,
    /// sometimes an unknown member, or raw bytes.
    fn body() -> impl Strategy<Value = Vec<u8>> {
        let member = |name: &'static str| {
            prop::option::of(json_value()).prop_map(move |v| v.map(|v| (name.to_owned(), v)))
        };
        let object = (
            member("tenant"),
            member("route"),
            member("subject"),
            member("cost"),
            member("extra"),
        )
            .prop_map(|(a, b, c, d, e)| {
                let members: serde_json::Map<String, Value> =
                    [a, b, c, d, e].into_iter().flatten().collect();
                Value::Object(members).to_string().into_bytes()
            });
        // Mostly well formed, with any text in the ids: reaches decisions.
        let plausible = (
            "\\PC{1,40}",
            "[A-Z]{1,7} /[ -~]{0,30}",
            prop::option::of("\\PC{1,20}"),
            1u64..5,
        )
            .prop_map(|(tenant, route, subject, cost)| {
                json!({"tenant": tenant, "route": route, "subject": subject, "cost": cost})
                    .to_string()
                    .into_bytes()
            });
        prop_oneof![
            4 => object,
            3 => plausible,
            1 => prop::collection::vec(any::<u8>(), 0..64),
        ]
    }

    /// Checks an answer: a decision, or a problem naming a field.
    fn judge(status: StatusCode, body: &Value) -> Result<(), TestCaseError> {
        match status.as_u16() {
            200 | 409 | 429 => {
                prop_assert!(body["allowed"].is_boolean() || body.is_null(), "{body}")
            }
            400 | 413 => {
                let name = &body["invalid-params"][0]["name"];
                prop_assert!(name.as_str().is_some_and(|n| !n.is_empty()), "{body}");
            }
            other => prop_assert!(false, "status {other}: {body}"),
        }
        Ok(())
    }

    fn header_value() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            "[ -~]{0,40}".prop_map(String::into_bytes),
            prop::collection::vec(32u8..=255, 0..40),
            Just(b"GET".to_vec()),
            Just(b"/v1/reports/1?x=%zz#frag".to_vec()),
            Just("x".repeat(300).into_bytes()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 600, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn check_answers_every_body_without_a_5xx(body in body()) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            let h = harness();
            let (response, value) = runtime.block_on(h.check(body));
            judge(response.status(), &value)?;
        }

        #[test]
        fn acquire_and_release_answer_every_body_without_a_5xx(
            body in body(),
            lease in prop_oneof![
                "\\PC{0,40}".prop_map(|l| json!({"lease": l}).to_string().into_bytes()),
                // Leases of the right form naming random requests and ids.
                (any::<u128>(), "\\PC{0,8}", "\\PC{0,12}").prop_map(|(id, t, r)| {
                    let mut bytes = vec![1u8];
                    bytes.extend_from_slice(&id.to_be_bytes());
                    for part in [t, r] {
                        bytes.push(1);
                        bytes.extend_from_slice(&(part.len() as u16).to_be_bytes());
                        bytes.extend_from_slice(part.as_bytes());
                    }
                    bytes.push(0);
                    use base64::Engine;
                    let lease = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
                    json!({"lease": lease}).to_string().into_bytes()
                }),
                prop::collection::vec(any::<u8>(), 0..48),
            ],
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            let h = harness();
            let (response, value) = runtime.block_on(h.post("/v1/acquire", body));
            judge(response.status(), &value)?;
            let (response, value) = runtime.block_on(h.post("/v1/release", lease));
            match response.status().as_u16() {
                200 => prop_assert_eq!(value, json!({"released": true})),
                400 | 404 => {
                    let name = &value["invalid-params"][0]["name"];
                    prop_assert!(name.as_str().is_some_and(|n| !n.is_empty()), "{value}");
                }
                other => prop_assert!(false, "status {other}: {value}"),
            }
        }

        #[test]
        fn json_answers_every_body_without_a_5xx(
            descriptors in prop::collection::vec(
                prop::collection::vec(("\\PC{0,12}", "\\PC{0,12}"), 0..4), 0..4),
            domain in prop_oneof![Just("edge".to_owned()), "\\PC{0,10}"],
            hits in prop::option::of(json_value()),
            raw in prop::option::of(prop::collection::vec(any::<u8>(), 0..48)),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            let h = harness();
            let body = match raw {
                Some(bytes) => bytes,
                None => {
                    let descriptors: Vec<Value> = descriptors
                        .iter()
                        .map(|entries| json!({"entries": entries.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()}))
                        .collect();
                    let mut request = json!({"domain": domain, "descriptors": descriptors});
                    if let Some(hits) = hits {
                        request["hitsAddend"] = hits;
                    }
                    request.to_string().into_bytes()
                }
            };
            let request = Request::post("/json").body(Body::from(body)).unwrap();
            let (response, value) = runtime.block_on(h.send(request));
            match response.status().as_u16() {
                200 | 429 => prop_assert!(value["overallCode"].is_string(), "{value}"),
                400 => {
                    let name = &value["invalid-params"][0]["name"];
                    prop_assert!(name.as_str().is_some_and(|n| !n.is_empty()), "{value}");
                }
                other => prop_assert!(false, "status {other}: {value}"),
            }
        }

        #[test]
        fn forward_auth_answers_every_header_set_without_a_5xx(
            values in prop::collection::vec(prop::option::of(header_value()), 7),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            let h = harness();
            let names = ["X-Tenant", "X-Forwarded-Method", "X-Forwarded-Uri", "X-Original-Method", "X-Original-URI", "X-User", "X-Cost"];
            let mut request = Request::get("/v1/forward-auth");
            for (name, value) in names.iter().zip(values) {
                if let Some(value) = value.and_then(|v| axum::http::HeaderValue::from_bytes(&v).ok()) {
                    request = request.header(*name, value);
                }
            }
            let (response, value) = runtime.block_on(h.send(request.body(Body::empty()).unwrap()));
            judge(response.status(), &value)?;
        }
    }
}

/// Spellings of `POST /v1/invoices` a client might try once the limit is
/// spent (see `sluice_core::route`).
const SPELLINGS: [&str; 14] = [
    "/v1/invoices/",
    "//v1/invoices",
    "/v1//invoices",
    "/v1/%69nvoices",
    "/v1/%69%6e%76%6f%69%63%65%73",
    "/v1/./invoices",
    "/v1/x/../invoices",
    "/v1/%2e/invoices",
    "/v1/invoices;jsessionid=1",
    "/v1;a=1/invoices",
    "/v1/invoices?page=2",
    "/v1/invoices#frag",
    "/v1/invoices/?a#b",
    "http://api.example/v1/invoices",
];

#[tokio::test]
async fn no_spelling_of_a_route_escapes_its_limit_through_forward_auth() {
    let h = harness();
    let exact = [
        ("X-Tenant", "acme"),
        ("X-Forwarded-Method", "POST"),
        ("X-Forwarded-Uri", "/v1/invoices"),
    ];
    for _ in 0..2 {
        assert_eq!(h.send(forward(&exact)).await.0.status(), StatusCode::OK);
    }
    assert_eq!(
        h.send(forward(&exact)).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    for method in ["POST", "post", "Post"] {
        for uri in SPELLINGS {
            let headers = [
                ("X-Tenant", "acme"),
                ("X-Forwarded-Method", method),
                ("X-Forwarded-Uri", uri),
            ];
            let (response, body) = h.send(forward(&headers)).await;
            assert_eq!(
                response.status(),
                StatusCode::TOO_MANY_REQUESTS,
                "{method} {uri} escaped the exhausted limit"
            );
            assert_eq!(body["policy"], "invoices", "{method} {uri}");
        }
    }
}

#[tokio::test]
async fn no_spelling_of_a_route_escapes_its_limit_through_check() {
    let h = harness();
    let check = |route: String| h.check_json(json!({"tenant": "acme", "route": route}));
    for _ in 0..2 {
        assert_eq!(
            check("POST /v1/invoices".into()).await.0.status(),
            StatusCode::OK
        );
    }
    for method in ["POST", "post"] {
        for path in SPELLINGS {
            let route = format!("{method} {path}");
            let (response, body) = check(route.clone()).await;
            assert_eq!(
                response.status(),
                StatusCode::TOO_MANY_REQUESTS,
                "{route} escaped the exhausted limit"
            );
            assert_eq!(body["policy"], "invoices", "{route}");
        }
    }
}

#[tokio::test]
async fn a_duplicate_submission_is_a_409_and_consumes_nothing() {
    let h = harness();
    let pay_as = |subject: &str, fingerprint: Option<&str>| {
        let mut body = json!({"tenant": "acme", "route": "POST /v1/payments", "subject": subject});
        if let Some(f) = fingerprint {
            body["fingerprint"] = json!(f);
        }
        h.check_json(body)
    };
    let pay = |fingerprint: Option<&str>| pay_as("u1", fingerprint);
    let (response, first) = pay(Some("pay-1")).await;
    assert_eq!(response.status(), StatusCode::OK);
    let left = first["remaining"].as_u64();
    // The same submission again: 409, what is left of the window, and no
    // budget spent.
    let (response, body) = pay(Some("pay-1")).await;
    assert_eq!(response.status(), StatusCode::CONFLICT, "{body}");
    assert_eq!(
        header(&response, "content-type"),
        Some("application/problem+json")
    );
    assert_eq!(body["reason"], "duplicate");
    assert_eq!(body["status"], 409);
    assert_eq!(body["retry_after_ms"], 5_000);
    assert_eq!(header(&response, "retry-after"), Some("5"));
    // Another submission passes, and finds the budget as the first left it
    // but for its own unit.
    let (response, second) = pay(Some("pay-2")).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        second["remaining"].as_u64(),
        left.map(|l| l.saturating_sub(1))
    );
    // Without a fingerprint: one request per window per subject.
    assert_eq!(pay_as("u9", None).await.0.status(), StatusCode::OK);
    assert_eq!(pay_as("u9", None).await.0.status(), StatusCode::CONFLICT);
    assert_eq!(pay_as("u8", None).await.0.status(), StatusCode::OK);
    // The window passes: the same fingerprint is new again.
    h.clock.advance(5_000);
    assert_eq!(pay(Some("pay-1")).await.0.status(), StatusCode::OK);
    // Forward-auth reads `Idempotency-Key`.
    let forwarded = |key: &str| {
        forward(&[
            ("X-Tenant", "acme"),
            ("X-User", "u2"),
            ("X-Forwarded-Method", "POST"),
            ("X-Forwarded-Uri", "/v1/payments"),
            ("Idempotency-Key", key),
        ])
    };
    assert_eq!(h.send(forwarded("k-1")).await.0.status(), StatusCode::OK);
    let (response, body) = h.send(forwarded("k-1")).await;
    assert_eq!(response.status(), StatusCode::CONFLICT, "{body}");
    // An oversize fingerprint is refused by name.
    let (response, body) = pay(Some(&"f".repeat(300))).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(body.to_string().contains("fingerprint"), "{body}");
}

#[tokio::test]
async fn a_request_another_rule_denies_leaves_no_fingerprint() {
    let h = harness();
    let pay = |f: &str| {
        h.check_json(json!({"tenant": "acme", "route": "POST /v1/payments", "subject": "u3", "fingerprint": f}))
    };
    // The per-user bucket (burst 2) runs out first.
    assert_eq!(pay("a").await.0.status(), StatusCode::OK);
    assert_eq!(pay("b").await.0.status(), StatusCode::OK);
    let (response, body) = pay("c").await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["reason"], "subject_limit");
    // Once the bucket refills, "c" is a first submission, not a duplicate.
    h.clock.advance(2_000);
    assert_eq!(pay("c").await.0.status(), StatusCode::OK);
}

#[tokio::test]
async fn leases_are_acquired_released_once_and_expire() {
    let h = harness();
    let export = json!({"tenant": "acme", "route": "POST /v1/exports"}).to_string();
    // A check says whether a slot is free and takes none.
    for _ in 0..3 {
        assert_eq!(h.check(export.clone()).await.0.status(), StatusCode::OK);
    }
    let (response, first) = h.post("/v1/acquire", export.clone()).await;
    assert_eq!(response.status(), StatusCode::OK, "{first}");
    assert_eq!(first["allowed"], true);
    let lease = first["lease"].as_str().expect("a lease").to_owned();
    // Advertised as requests in flight, not per window.
    let policy = Parser::new(header(&response, "ratelimit-policy").unwrap())
        .parse::<sfv::List>()
        .unwrap();
    let exports = policy
        .iter()
        .find_map(|entry| match entry {
            ListEntry::Item(item)
                if item.bare_item
                    == BareItem::String(
                        sfv::String::from_string("exports".to_owned()).unwrap(),
                    ) =>
            {
                Some(item)
            }
            _ => None,
        })
        .expect("exports advertised");
    let params: Vec<(String, String)> = exports
        .params
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), format!("{v:?}")))
        .collect();
    assert_eq!(params.len(), 2, "{params:?}");
    assert!(
        params[0].0 == "q" && params[0].1.contains('2'),
        "{params:?}"
    );
    assert!(
        params[1].0 == "qu" && params[1].1.contains("concurrent-requests"),
        "{params:?}"
    );
    let (_, second) = h.post("/v1/acquire", export.clone()).await;
    let second = second["lease"].as_str().unwrap().to_owned();
    // Full: the third is denied, and so is a check.
    let (response, denied) = h.post("/v1/acquire", export.clone()).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{denied}");
    assert_eq!(denied["reason"], "route_limit");
    assert!(denied.get("lease").is_none());
    assert!(header(&response, "retry-after").is_some());
    assert_eq!(
        h.check(export.clone()).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Released once; twice, garbled or unknown: 404, freeing nothing.
    let release = |lease: &str| json!({ "lease": lease }).to_string();
    let (response, body) = h.post("/v1/release", release(&lease)).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body, json!({"released": true}));
    // Another id for the same request (one character of the id changed).
    let other_char = if &lease[10..11] == "A" { "B" } else { "A" };
    let forged = format!("{}{other_char}{}", &lease[..10], &lease[11..]);
    for other in [lease.as_str(), "nonsense", forged.as_str()] {
        let (response, body) = h.post("/v1/release", release(other)).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{other}: {body}");
        assert_eq!(body["invalid-params"][0]["name"], "lease");
    }
    for bad in [
        json!({}),
        json!({"lease": "x", "extra": 1}),
        json!({"lease": 5}),
        json!([]),
    ] {
        let (response, problem) = h.post("/v1/release", bad.to_string()).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert!(!problem.to_string().contains("Body"), "{problem}");
    }
    let (response, third) = h.post("/v1/acquire", export.clone()).await;
    assert_eq!(response.status(), StatusCode::OK, "{third}");
    assert_eq!(
        h.post("/v1/acquire", export.clone()).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Leases not released run out: the slots are free again, and an
    // expired lease is not released.
    h.clock.advance(30_000);
    assert_eq!(
        h.post("/v1/acquire", export.clone()).await.0.status(),
        StatusCode::OK
    );
    assert_eq!(
        h.post("/v1/release", release(&second)).await.0.status(),
        StatusCode::NOT_FOUND
    );
    // Where no concurrency rule applies, there is nothing to release.
    let (response, body) = h
        .post(
            "/v1/acquire",
            json!({"tenant": "acme", "route": "POST /v1/invoices"}).to_string(),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body["lease"], Value::Null);
}

const TOKEN: &str = "test-admin-token-0123456789";

/// The harness with the admin API on.
fn admin_harness() -> (Harness, Arc<App>) {
    let (config, clock, limiter) = limiter();
    let admin = sluice_server::admin::Admin::new(Some(TOKEN.as_bytes().to_vec()), limiter.store());
    let app = App::new_with(
        limiter,
        config.server.forward_auth.clone(),
        Default::default(),
        admin,
    );
    app.admin.install(&app, &config.limits, false);
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

#[tokio::test]
async fn the_admin_api_is_absent_without_a_token_and_refuses_a_wrong_one() {
    let h = harness();
    let (response, _) = h
        .admin("GET", "/v1/admin/overrides", None, Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let (h, _) = admin_harness();
    for token in [
        None,
        Some("wrong"),
        Some("test-admin-token-012345678"),
        Some("test-admin-token-0123456789x"),
    ] {
        let (response, body) = h.admin("GET", "/v1/admin/overrides", None, token).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(body["invalid-params"][0]["name"], "Authorization");
        assert_eq!(header(&response, "www-authenticate"), Some("Bearer"));
    }
    let (response, body) = h
        .admin("GET", "/v1/admin/overrides", None, Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body, json!({"overrides": []}));
    // The scheme's case does not matter (RFC 9110, 11.1); another scheme
    // or a bare token is refused.
    for (authorization, status) in [
        (format!("bearer {TOKEN}"), StatusCode::OK),
        (format!("BEARER {TOKEN}"), StatusCode::OK),
        (format!("Basic {TOKEN}"), StatusCode::UNAUTHORIZED),
        (TOKEN.to_owned(), StatusCode::UNAUTHORIZED),
        ("Bearer".to_owned(), StatusCode::UNAUTHORIZED),
    ] {
        let request = Request::get("/v1/admin/overrides")
            .header("authorization", &authorization)
            .body(Body::empty())
            .unwrap();
        let (response, _) = h.send(request).await;
        assert_eq!(response.status(), status, "{authorization}");
    }
}

#[tokio::test]
async fn overrides_scale_shadow_and_expire_one_tenant_only() {
    let (h, app) = admin_harness();
    let invoice = |tenant: &str| json!({"tenant": tenant, "route": "POST /v1/invoices"});
    async fn admitted(h: &Harness, tenant: &str) -> u32 {
        let body = json!({"tenant": tenant, "route": "POST /v1/invoices"});
        let mut n = 0;
        while h.check_json(body.clone()).await.0.status() == StatusCode::OK {
            n += 1;
            assert!(n < 100);
        }
        n
    }
    // Doubled for acme (invoices: 2 → 5 with factor 2.5); globex keeps 2.
    let (response, stored) = h
        .admin(
            "PUT",
            "/v1/admin/overrides/acme",
            Some(json!({"factor": 2.5})),
            Some(TOKEN),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK, "{stored}");
    assert_eq!(stored["tenant"], "acme");
    let version = stored["version"].as_u64().unwrap();
    assert_eq!(
        header(&response, "etag"),
        Some(format!("\"{version}\"").as_str())
    );
    assert_eq!(admitted(&h, "acme").await, 5);
    assert_eq!(admitted(&h, "globex").await, 2);
    // A stale If-Match is refused; the right one goes through.
    let mut stale = Request::put("/v1/admin/overrides/acme")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("if-match", format!("\"{}\"", version + 7))
        .body(Body::from(json!({"shadow": true}).to_string()))
        .unwrap();
    let (response, _) = h.send(stale).await;
    assert_eq!(response.status(), StatusCode::PRECONDITION_FAILED);
    stale = Request::put("/v1/admin/overrides/acme")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("if-match", format!("\"{version}\""))
        .body(Body::from(
            json!({"shadow": true, "expires_in": "1s"}).to_string(),
        ))
        .unwrap();
    let (response, stored) = h.send(stale).await;
    assert_eq!(response.status(), StatusCode::OK, "{stored}");
    // Shadow: never denied, the would-be denial marked.
    for _ in 0..5 {
        let (response, body) = h.check_json(invoice("acme")).await;
        assert_eq!(response.status(), StatusCode::OK);
        if body.get("shadow_denied") == Some(&json!(true)) {
            break;
        }
    }
    let (response, body) = h.check_json(invoice("acme")).await;
    assert_eq!(
        (response.status(), &body["shadow_denied"]),
        (StatusCode::OK, &json!(true)),
        "{body}"
    );
    // …and in heavy hitters as a denial.
    let (_, top) = h
        .admin(
            "GET",
            "/v1/admin/heavy-hitters?by=denied",
            None,
            Some(TOKEN),
        )
        .await;
    assert_eq!(top["tenants"][0]["tenant"], "acme", "{top}");
    let (_, list) = h
        .admin("GET", "/v1/admin/overrides", None, Some(TOKEN))
        .await;
    assert_eq!(list["overrides"].as_array().unwrap().len(), 1);
    // Expired, it no longer applies nor lists.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    app.admin.sync(&app, false).await;
    let (response, _) = h
        .admin("GET", "/v1/admin/overrides/acme", None, Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        h.check_json(invoice("acme")).await.0.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    // Removed: 204, then 404.
    let (response, _) = h
        .admin("PUT", "/v1/admin/overrides/globex", Some(json!({"plan": "free", "rules": {"routes": {"POST /v1/invoices": [{"name": "invoices", "limit": 3, "per": "1s"}]}}})), Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    h.clock.advance(1_000);
    assert_eq!(admitted(&h, "globex").await, 3, "its own rules");
    let (response, _) = h
        .admin("DELETE", "/v1/admin/overrides/globex", None, Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let (response, _) = h
        .admin("DELETE", "/v1/admin/overrides/globex", None, Some(TOKEN))
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_bad_override_is_a_400_naming_the_field_and_changes_nothing() {
    let (h, _) = admin_harness();
    let cases = [
        (json!({}), "body"),
        (json!({"plan": "platinum"}), "plan"),
        (json!({"factor": 0}), "factor"),
        (json!({"factor": 5000}), "factor"),
        (json!({"factor": "two"}), "factor"),
        (json!({"shadow": "yes"}), "shadow"),
        (
            json!({"rules": {"tenant": [{"limit": 0, "per": "1s"}]}}),
            "rules.tenant",
        ),
        (
            json!({"rules": {"tenant": [], "routes": {"GET /": [{"per": "1s"}]}}}),
            "rules.routes",
        ),
        (json!({"rules": {"subject": "x"}}), "rules.subject"),
        (json!({"rules": {"everything": []}}), "rules.everything"),
        (json!({"rules": 5}), "rules"),
        (json!([]), "body"),
        (json!({"factor": 2, "expires_in": "forever"}), "expires_in"),
        (json!({"factor": 2, "expires_in": "500ms"}), "expires_in"),
        (json!({"factor": 2, "colour": "red"}), "colour"),
        (json!({"shadow": ["no-such-policy"]}), "shadow"),
        (json!({"shadow": [1]}), "shadow"),
    ];
    for (body, field) in cases {
        let (response, problem) = h
            .admin(
                "PUT",
                "/v1/admin/overrides/acme",
                Some(body.clone()),
                Some(TOKEN),
            )
            .await;
        assert_eq!(
            response.status(),
            StatusCode::BAD_REQUEST,
            "{body}: {problem}"
        );
        let named = problem["invalid-params"][0]["name"].as_str().unwrap();
        assert_eq!(named, field, "{body}: {problem}");
        let detail = problem["detail"].as_str().unwrap();
        for ours in ["PutBody", "f64", "u64", "u32"] {
            assert!(!detail.contains(ours), "no Rust in it: {detail}");
        }
    }
    let (_, problem) = h
        .admin(
            "PUT",
            "/v1/admin/overrides/acme",
            Some(json!({"factor": 1e308})),
            Some(TOKEN),
        )
        .await;
    assert_eq!(
        problem["detail"],
        "`factor` must be above 0 and at most 1000, got 1e308"
    );
    let (_, problem) = h
        .admin(
            "PUT",
            "/v1/admin/overrides/acme",
            Some(json!({"shadow": "yes"})),
            Some(TOKEN),
        )
        .await;
    assert!(
        problem["detail"]
            .as_str()
            .unwrap()
            .contains("`shadow` takes true, false or a list of policy names"),
        "{problem}"
    );
    // A tenant in the path that is not UTF-8: a problem naming it.
    for method in ["GET", "PUT", "DELETE"] {
        let (response, problem) = h
            .admin(
                method,
                "/v1/admin/overrides/%ff",
                Some(json!({"shadow": true})),
                Some(TOKEN),
            )
            .await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{method}");
        assert_eq!(problem["invalid-params"][0]["name"], "tenant", "{problem}");
    }
    let (_, list) = h
        .admin("GET", "/v1/admin/overrides", None, Some(TOKEN))
        .await;
    assert_eq!(list, json!({"overrides": []}), "nothing half-applied");
}

#[tokio::test]
async fn heavy_hitters_name_the_most_denied_tenants_to_the_admin_api_only() {
    let (h, _) = admin_harness();
    for (tenant, requests) in [("flood", 30), ("drizzle", 6), ("polite", 2)] {
        for _ in 0..requests {
            h.check_json(json!({"tenant": tenant, "route": "POST /v1/invoices"}))
                .await;
        }
    }
    let (response, top) = h
        .admin(
            "GET",
            "/v1/admin/heavy-hitters?by=denied&limit=2",
            None,
            Some(TOKEN),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK, "{top}");
    assert!(top["window_s"].as_u64().unwrap() >= 60);
    assert_eq!(
        top["tenants"],
        json!([
            {"tenant": "flood", "denied": 28, "admitted": 2, "fair_share_denied": 0},
            {"tenant": "drizzle", "denied": 4, "admitted": 2, "fair_share_denied": 0}
        ])
    );
    let (_, admitted) = h
        .admin(
            "GET",
            "/v1/admin/heavy-hitters?by=admitted",
            None,
            Some(TOKEN),
        )
        .await;
    assert_eq!(admitted["tenants"].as_array().unwrap().len(), 3);
    for bad in [
        "by=cost",
        "limit=0",
        "limit=1001",
        "limit=ten",
        "colour=red",
    ] {
        let (response, problem) = h
            .admin(
                "GET",
                &format!("/v1/admin/heavy-hitters?{bad}"),
                None,
                Some(TOKEN),
            )
            .await;
        assert_eq!(
            response.status(),
            StatusCode::BAD_REQUEST,
            "{bad}: {problem}"
        );
    }
    let (response, _) = h.admin("GET", "/v1/admin/heavy-hitters", None, None).await;
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    // Never in the metrics.
    let response = h
        .router
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let text = response.into_body().collect().await.unwrap().to_bytes();
    assert!(!String::from_utf8_lossy(&text).contains("flood"));
}

#[tokio::test]
async fn a_shadow_override_can_name_some_policies_only() {
    let (h, _) = admin_harness();
    // Shadow for `invoices` only: never denied by it, its would-be
    // denials marked; `per-user` still enforced.
    let (response, stored) = h
        .admin(
            "PUT",
            "/v1/admin/overrides/acme",
            Some(json!({"shadow": ["invoices"]})),
            Some(TOKEN),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK, "{stored}");
    assert_eq!(stored["shadow"], json!(["invoices"]));
    let mut marked = false;
    for _ in 0..5 {
        let (response, body) = h
            .check_json(json!({"tenant": "acme", "route": "POST /v1/invoices"}))
            .await;
        assert_eq!(response.status(), StatusCode::OK, "{body}");
        marked |= body.get("shadow_denied") == Some(&json!(true));
    }
    assert!(marked, "the would-be denials are marked");
    let with_user = json!({"tenant": "acme", "route": "POST /v1/invoices", "subject": "u1"});
    let statuses = [
        h.check_json(with_user.clone()).await.0.status(),
        h.check_json(with_user.clone()).await.0.status(),
        h.check_json(with_user.clone()).await.0.status(),
    ];
    assert_eq!(
        statuses[2],
        StatusCode::TOO_MANY_REQUESTS,
        "per-user is enforced"
    );
}
