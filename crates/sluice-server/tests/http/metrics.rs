//! `GET /metrics`: decisions counted by plan and route pattern.

use serde_json::json;

use crate::common::metric_total;
use crate::harness;

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
    let text = h.metrics().await;
    let count = |labels: &str| metric_total(&text, &format!("sluice_decisions_total{{{labels}}}"));
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
