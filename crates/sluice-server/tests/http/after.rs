//! `"reserve": true`, `POST /v1/settle` and `POST /v1/report`: usage known
//! after the fact, through the router on the memory store.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::{Harness, harness_of, header};

const TOKENS: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ name: tokens, algorithm: gcra, limit: 1000, per: 1m }]
    routes:
      "POST /login": [{ name: logins, algorithm: gcra, limit: 100, per: 1s }]
    subject:
      "POST /login":
        - { name: failed-logins, algorithm: sliding_log, limit: 5, per: 15m, count_if: { status: [401, 403, "5xx"] } }
"#;

fn chat(cost: u64) -> Value {
    json!({"tenant": "acme", "route": "POST /v1/chat", "cost": cost})
}

fn field(body: &Value) -> &str {
    body["invalid-params"][0]["name"]
        .as_str()
        .unwrap_or_default()
}

async fn reserve(h: &Harness, cost: u64) -> String {
    let mut body = chat(cost);
    body["reserve"] = json!(true);
    let (response, body) = h.post("/v1/check", body.to_string()).await;
    assert_eq!(response.status(), StatusCode::OK, "{body}");
    body["reservation"]
        .as_str()
        .expect("a reservation")
        .to_owned()
}

#[tokio::test]
async fn a_reservation_is_settled_once_at_its_actual_cost() {
    let h = harness_of(TOKENS);
    let id = reserve(&h, 600).await;
    assert!(!id.contains("acme"), "the id says nothing of its tenant");
    let settle = json!({"reservation": id, "cost": 100});
    let (response, body) = h.post("/v1/settle", settle.to_string()).await;
    assert_eq!(response.status(), StatusCode::OK, "{body}");
    assert_eq!(body["remaining"], 899, "{body}");
    assert_eq!(body["policy"], "tokens");
    assert!(header(&response, "ratelimit").is_some());
    // An identical retry answers the same, and changes nothing.
    let (response, again) = h.post("/v1/settle", settle.to_string()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(again, body);
    // Another cost: refused, nothing changed.
    let other = json!({"reservation": id, "cost": 900});
    let (response, refused) = h.post("/v1/settle", other.to_string()).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND, "{refused}");
    assert_eq!(field(&refused), "reservation");
    let (_, after) = h.post("/v1/settle", settle.to_string()).await;
    assert_eq!(after["remaining"], 899);
}

#[tokio::test]
async fn settling_above_the_estimate_goes_into_debt_and_the_next_check_waits() {
    let h = harness_of(TOKENS);
    let id = reserve(&h, 800).await;
    let (response, body) = h
        .post(
            "/v1/settle",
            json!({"reservation": id, "cost": 1_300}).to_string(),
        )
        .await;
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "a settle is never refused: {body}"
    );
    assert_eq!(body["allowed"], false, "{body}");
    assert_eq!(body["remaining"], 0);
    // Owing 300 tokens at 1,000 a minute: 18 s, and one token more.
    let (response, denied) = h.check_json(chat(1)).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied["retry_after_ms"], 18_060, "{denied}");
    assert_eq!(header(&response, "retry-after"), Some("19"));
}

#[tokio::test]
async fn a_forged_or_foreign_reservation_is_unknown() {
    let h = harness_of(TOKENS);
    let id = reserve(&h, 10).await;
    let mut forged = id.clone().into_bytes();
    let at = forged.len() / 2;
    forged[at] = if forged[at] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    // Another fleet (another key) never gave this one.
    let foreign = reserve(&harness_of(TOKENS), 10).await;
    for id in [forged.as_str(), "", "x", foreign.as_str()] {
        let (response, body) = h
            .post(
                "/v1/settle",
                json!({"reservation": id, "cost": 1}).to_string(),
            )
            .await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{id}: {body}");
        assert_eq!(field(&body), "reservation");
    }
}

#[tokio::test]
async fn bad_settles_and_reports_name_their_field() {
    let h = harness_of(TOKENS);
    let id = reserve(&h, 10).await;
    for (path, body, named) in [
        ("/v1/settle", json!({"cost": 1}), "reservation"),
        ("/v1/settle", json!({"reservation": id}), "cost"),
        ("/v1/settle", json!({"reservation": id, "cost": -1}), "cost"),
        (
            "/v1/settle",
            json!({"reservation": id, "cost": 4_294_967_296u64}),
            "cost",
        ),
        (
            "/v1/settle",
            json!({"reservation": id, "cost": 1.5}),
            "cost",
        ),
        (
            "/v1/settle",
            json!({"reservation": id, "cost": 1, "extra": 1}),
            "body",
        ),
        (
            "/v1/report",
            json!({"tenant": "acme", "route": "POST /v1/chat", "cost": 0}),
            "cost",
        ),
        (
            "/v1/report",
            json!({"tenant": "acme", "route": "POST /v1/chat", "reserve": true}),
            "reserve",
        ),
        (
            "/v1/report",
            json!({"tenant": "acme", "route": "POST /v1/chat", "status": 700}),
            "status",
        ),
        ("/v1/report", json!({"route": "POST /v1/chat"}), "tenant"),
        (
            "/v1/check",
            json!({"tenant": "acme", "route": "POST /v1/chat", "status": 200}),
            "status",
        ),
    ] {
        let (response, answer) = h.post(path, body.to_string()).await;
        assert_eq!(
            response.status(),
            StatusCode::BAD_REQUEST,
            "{path} {body}: {answer}"
        );
        assert!(
            field(&answer) == named || answer.to_string().contains(named),
            "{path} {body}: {answer}"
        );
    }
}

#[tokio::test]
async fn a_report_past_the_limit_is_counted_and_never_refused() {
    let h = harness_of(TOKENS);
    // Up to 2^32 - 1 tokens may be reported.
    let (response, body) = h.post("/v1/report", chat(4_294_967_295).to_string()).await;
    assert_eq!(response.status(), StatusCode::OK, "{body}");
    assert_eq!(body["allowed"], false);
    let (response, _) = h.check_json(chat(1)).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    // Again: still 200.
    let (response, _) = h.post("/v1/report", chat(10).to_string()).await;
    assert_eq!(response.status(), StatusCode::OK);
}

fn login(ip_user: &str) -> Value {
    json!({"tenant": "acme", "route": "POST /login", "subject": ip_user})
}

/// A check of a login, admitted: its attempt.
async fn attempt(h: &Harness, ip_user: &str) -> String {
    let (response, checked) = h.check_json(login(ip_user)).await;
    assert_eq!(response.status(), StatusCode::OK, "{checked}");
    checked["attempt"].as_str().expect("an attempt").to_owned()
}

/// `attempt` concluded with `status`: the answer.
async fn conclude(h: &Harness, attempt: &str, status: u16) -> (StatusCode, Value) {
    let body = json!({"attempt": attempt, "status": status});
    let (response, body) = h.post("/v1/report", body.to_string()).await;
    (response.status(), body)
}

#[tokio::test]
async fn five_failed_logins_per_ip_and_user_while_successes_pass() {
    let h = harness_of(TOKENS);
    for _ in 0..30 {
        let attempt = attempt(&h, "10.0.0.1|alice").await;
        let (status, body) = conclude(&h, &attempt, 200).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    for status in [401, 403, 500, 401, 503] {
        let attempt = attempt(&h, "10.0.0.1|alice").await;
        let (answered, body) = conclude(&h, &attempt, status).await;
        assert_eq!(answered, StatusCode::OK, "{body}");
    }
    let (response, refused) = h.check_json(login("10.0.0.1|alice")).await;
    assert_eq!(
        response.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "{refused}"
    );
    assert_eq!(refused["reason"], "subject_limit");
    assert_eq!(refused["policy"], "failed-logins");
    assert!(refused.get("attempt").is_none(), "{refused}");
    let (response, _) = h.check_json(login("10.0.0.2|alice")).await;
    assert_eq!(response.status(), StatusCode::OK, "another (IP, user)");
    let metrics = h.metrics().await;
    assert!(
        metrics.contains("sluice_attempts_total{result=\"counted\"} 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sluice_attempts_total{result=\"given_back\"} 30"),
        "{metrics}"
    );
}

/// The case of the report: 50 failed logins at once all passed, each
/// check only asking. Each check now holds its attempt: five pass, 45 are
/// refused before they run, and the five failures leave the sixth
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_failed_logins_at_once_let_five_through() {
    let h = harness_of(TOKENS);
    let mut checks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let request = axum::http::Request::post("/v1/check")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(login("10.0.0.1|alice").to_string()))
            .unwrap();
        let router = h.router.clone();
        checks.spawn(async move {
            use http_body_util::BodyExt;
            use tower::ServiceExt;
            let response = router.oneshot(request).await.unwrap();
            let admitted = response.status() == StatusCode::OK;
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            let body: Value = serde_json::from_slice(&bytes).unwrap();
            admitted.then(|| body["attempt"].as_str().expect("an attempt").to_owned())
        });
    }
    let attempts: Vec<String> = checks.join_all().await.into_iter().flatten().collect();
    assert_eq!(attempts.len(), 5, "admitted at once");
    for attempt in &attempts {
        let (status, body) = conclude(&h, attempt, 401).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let (response, _) = h.check_json(login("10.0.0.1|alice")).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn an_attempt_concludes_once_and_bad_conclusions_name_their_field() {
    let h = harness_of(TOKENS);
    // The check's RateLimit shows the rule that counts by outcome (its
    // attempt takes a place there), as RateLimit-Policy does.
    let (response, _) = h.check_json(login("10.0.0.9|carol")).await;
    let ratelimit = header(&response, "ratelimit").unwrap();
    assert!(ratelimit.contains("\"failed-logins\";r=4"), "{ratelimit}");
    let first = attempt(&h, "10.0.0.1|alice").await;
    // What the check held is shown: the failed-logins rule is advertised.
    let (status, body) = conclude(&h, &first, 401).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(conclude(&h, &first, 401).await.0, StatusCode::OK, "a retry");
    let (status, body) = conclude(&h, &first, 200).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "another status: {body}");
    assert_eq!(field(&body), "attempt", "{body}");
    let second = attempt(&h, "10.0.0.1|alice").await;
    let bad = [
        // A report on this route must conclude the check's attempt.
        (login("10.0.0.1|alice"), "attempt"),
        (json!({"attempt": second}), "status"),
        (json!({"attempt": second, "status": 99}), "status"),
        (json!({"attempt": "forged", "status": 401}), "attempt"),
        (
            json!({"attempt": second, "status": 401, "tenant": "other"}),
            "tenant",
        ),
        (
            json!({"attempt": second, "status": 401, "subject": "10.0.0.9|eve"}),
            "subject",
        ),
        (json!({"attempt": second, "status": 401, "cost": 2}), "cost"),
        (
            json!({"attempt": reserve(&h, 1).await, "status": 401}),
            "attempt",
        ),
    ];
    for (body, named) in bad {
        let (response, answer) = h.post("/v1/report", body.to_string()).await;
        assert!(response.status().is_client_error(), "{body}: {answer}");
        assert_eq!(field(&answer), named, "{body}: {answer}");
    }
    // An attempt is not a reservation; neither belongs on a check.
    let (response, answer) = h
        .post(
            "/v1/settle",
            json!({"reservation": second, "cost": 1}).to_string(),
        )
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND, "{answer}");
    let mut check = login("10.0.0.1|alice");
    check["attempt"] = json!(second);
    let (response, answer) = h.check_json(check).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert_eq!(field(&answer), "attempt", "{answer}");
    // The attempt names the rest: even the check's own fields are
    // refused beside it (nothing a body could test against an id is
    // answered), and the attempt still concludes after.
    let mut same = login("10.0.0.1|alice");
    same["attempt"] = json!(second);
    same["status"] = json!(401);
    let (response, answer) = h.post("/v1/report", same.to_string()).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(field(&answer), "tenant", "{answer}");
    let (status, answer) = conclude(&h, &second, 401).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

#[tokio::test]
async fn a_report_on_a_route_that_counts_by_outcome_leaves_its_other_rules_alone() {
    // Ten logins a minute (counted by the check) and failed logins
    // (held by the check, kept by a failure): each failure concluded
    // takes nothing more of the ten.
    let h = harness_of(
        r#"
default_plan: p
plans:
  p:
    routes:
      "POST /login": [{ name: logins, algorithm: gcra, limit: 10, per: 1m }]
    subject:
      "POST /login":
        - { name: failed-logins, algorithm: sliding_log, limit: 100, per: 15m, count_if: { status: [401] } }
"#,
    );
    for n in 1..=5 {
        let (response, checked) = h.check_json(login("10.0.0.1|alice")).await;
        assert_eq!(response.status(), StatusCode::OK, "{checked}");
        assert_eq!(checked["policy"], "logins", "{checked}");
        assert_eq!(checked["remaining"], 10 - n, "{checked}");
        let attempt = checked["attempt"].as_str().unwrap();
        let (status, body) = conclude(&h, attempt, 401).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}

#[tokio::test]
async fn acquire_reserves_too() {
    let h = harness_of(TOKENS);
    let mut body = chat(5);
    body["reserve"] = json!(true);
    let (response, answer) = h.post("/v1/acquire", body.to_string()).await;
    assert_eq!(response.status(), StatusCode::OK, "{answer}");
    assert!(answer["reservation"].is_string(), "{answer}");
    assert!(answer.get("lease").is_some(), "{answer}");
    let (response, _) = h
        .post(
            "/v1/settle",
            json!({"reservation": answer["reservation"], "cost": 0}).to_string(),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
}
