//! Duplicate submissions: a 409 that consumes nothing.

use axum::http::StatusCode;
use serde_json::json;

use crate::{forward, harness, header};

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
