//! Adaptive valves over HTTP: each priority's share of the valve, the
//! signals (`latency_ms` and `status` on `/v1/report` and `/v1/settle`,
//! `status` and the hold time on `/v1/release`) moving its limit, what the
//! metrics show, and bad signals refused naming the field.

use axum::http::StatusCode;
use serde_json::json;

use crate::Harness;

const CONFIG: &str = r#"
default_plan: free
plans:
  free: { priority: low, tenant: [{ name: daily, limit: 100000, per: 1d }] }
  paid: { priority: critical, tenant: [{ name: daily, limit: 100000, per: 1d }] }
tenants:
  vip: { plan: paid }
global:
  "POST /v1/search":
    - { name: search-db, algorithm: concurrency, limit: 40, lease: 30s, adaptive: { latency_target: 100ms, min: 4 } }
"#;

fn search(tenant: &str) -> String {
    json!({ "tenant": tenant, "route": "POST /v1/search" }).to_string()
}

/// Leases `tenant` takes until denied (at most 100).
async fn leases(h: &Harness, tenant: &str) -> Vec<String> {
    let mut taken = Vec::new();
    for _ in 0..100 {
        let (response, body) = h.post("/v1/acquire", search(tenant)).await;
        if response.status() != StatusCode::OK {
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{body}");
            assert_eq!(body["reason"], "global_capacity", "{body}");
            assert_eq!(body["policy"], "search-db", "{body}");
            break;
        }
        taken.push(body["lease"].as_str().unwrap().to_owned());
    }
    taken
}

#[tokio::test]
async fn the_valve_sheds_low_first_and_follows_what_callers_report() {
    let h = crate::harness_on_one_clock(CONFIG);
    let low = leases(&h, "anyone").await;
    assert_eq!(low.len(), 10, "low: a quarter of 40");
    let vip = leases(&h, "vip").await;
    assert_eq!(vip.len(), 30, "critical: the rest");
    // Released after 400 ms each, with their status: slow, so the limit is
    // cut (at most once per 400 ms).
    h.clock.advance(400);
    for lease in low.iter().chain(&vip) {
        let (response, body) = h
            .post(
                "/v1/release",
                json!({ "lease": lease, "status": 200 }).to_string(),
            )
            .await;
        assert_eq!(response.status(), StatusCode::OK, "{body}");
    }
    // Reports of slow requests, 100 ms apart.
    for _ in 0..20 {
        h.clock.advance(100);
        let report = json!({ "tenant": "vip", "route": "POST /v1/search", "cost": 1, "latency_ms": 400, "status": 503 });
        let (response, body) = h.post("/v1/report", report.to_string()).await;
        assert_eq!(response.status(), StatusCode::OK, "{body}");
    }
    let text = h.metrics().await;
    let limit = metric(&text, "sluice_adaptive_valve_limit{valve=\"search-db\"}");
    assert_eq!(limit, 4.0, "cut to min:\n{text}");
    let latency = metric(
        &text,
        "sluice_adaptive_valve_latency_seconds{valve=\"search-db\"}",
    );
    assert!((0.39..0.41).contains(&latency), "{latency}");
    assert!(
        metric(
            &text,
            "sluice_adaptive_valve_shed_total{valve=\"search-db\",priority=\"low\"}"
        ) >= 1.0,
        "{text}"
    );
    // Now low gets one (a quarter of 4, at least one), critical the rest.
    assert_eq!(leases(&h, "anyone").await.len(), 1);
    assert_eq!(leases(&h, "vip").await.len(), 3);
}

#[tokio::test]
async fn bad_signals_are_refused_naming_the_field() {
    let h = crate::harness_on_one_clock(CONFIG);
    let report = |extra: serde_json::Value| {
        let mut body = json!({ "tenant": "vip", "route": "POST /v1/search", "cost": 1 });
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        body.to_string()
    };
    for (path, body, field) in [
        (
            "/v1/report",
            report(json!({ "latency_ms": -1 })),
            "latency_ms",
        ),
        (
            "/v1/report",
            report(json!({ "latency_ms": 3_600_001 })),
            "latency_ms",
        ),
        (
            "/v1/report",
            report(json!({ "latency_ms": "fast" })),
            "latency_ms",
        ),
        ("/v1/report", report(json!({ "status": 99 })), "status"),
        (
            "/v1/check",
            report(json!({ "latency_ms": 5 })),
            "latency_ms",
        ),
        (
            "/v1/acquire",
            report(json!({ "latency_ms": 5 })),
            "latency_ms",
        ),
        (
            "/v1/release",
            json!({ "lease": "x", "status": 600 }).to_string(),
            "status",
        ),
        (
            "/v1/settle",
            json!({ "reservation": "x", "cost": 1, "latency_ms": -5 }).to_string(),
            "latency_ms",
        ),
        (
            "/v1/settle",
            json!({ "reservation": "x", "cost": 1, "status": 1000 }).to_string(),
            "status",
        ),
    ] {
        let (response, problem) = h.post(path, body).await;
        assert_eq!(
            response.status(),
            StatusCode::BAD_REQUEST,
            "{path}: {problem}"
        );
        assert_eq!(
            problem["invalid-params"][0]["name"], field,
            "{path}: {problem}"
        );
    }
}

/// The value of the metric line starting with `name`.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
}
