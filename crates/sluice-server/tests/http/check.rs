//! `POST /v1/check`: the decision, its RateLimit fields and problems.

use axum::body::Body;
use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::{harness, header, param, sf_list};

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
