//! Every entry point's decisions reach the metrics, heavy hitters and the
//! usage ledger exactly once, on a real `sluice serve`: HTTP `/v1/check`,
//! `/v1/acquire`, `/v1/forward-auth`, and gRPC on the native domain (with
//! and without a `limit` override) and on an envoyproxy/ratelimit domain
//! (over gRPC and `POST /json`), whose descriptors carry no tenant: counted
//! in the metrics, never in heavy hitters or the ledger.
//!
//! Each entry point asks twice over a limit of one: one admitted, one
//! denied, under a tenant of its own.

mod common;

use std::collections::BTreeMap;

use common::{Server, descriptor, metric_total, post_to, temp_dir, temp_file, temp_path};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};

const TOKEN: &str = "decision-tail-admin-token";
const ROUTE: &str = "POST /v1/invoices";

const ENVOY_CONFIG: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: hour, requests_per_unit: 1 }
"#;

/// The tenant each entry point decides for.
const ENTRY_POINTS: [&str; 5] = [
    "via-check",
    "via-acquire",
    "via-forward-auth",
    "via-grpc-native",
    "via-grpc-native-override",
];

fn start(ledger: &std::path::Path) -> Server {
    let envoy = temp_dir("tail-envoy");
    std::fs::write(envoy.path().join("edge.yaml"), ENVOY_CONFIG).unwrap();
    let config = temp_file(
        "tail.yaml",
        &format!(
            "ledger:\n  dir: {}\n  flush_every: 100ms\nadmin:\n  token_env: TEST_TAIL_TOKEN\ndefault_plan: p\nplans:\n  p:\n    routes:\n      \"{ROUTE}\": [{{ name: invoices, algorithm: fixed_window, limit: 1, per: 1h }}]\n",
            ledger.display()
        ),
    );
    Server::start_with_env(
        &[
            "--config",
            config.to_str().unwrap(),
            "--envoy-config",
            envoy.path().to_str().unwrap(),
        ],
        &[("TEST_TAIL_TOKEN", TOKEN)],
    )
    .keep(config)
    .keep(envoy)
}

async fn metrics(client: &reqwest::Client, server: &Server) -> String {
    common::get_text(client, server, "/metrics").await
}

/// Decisions counted in `/metrics`: (allowed, denied).
fn decisions(metrics: &str) -> (f64, f64) {
    (
        metric_total(metrics, "sluice_decisions_total{outcome=\"allowed\""),
        metric_total(metrics, "sluice_decisions_total{outcome=\"denied\""),
    )
}

/// One decision through entry point `via` for its tenant: whether it was
/// admitted.
async fn ask(client: &reqwest::Client, server: &Server, via: &str) -> bool {
    let body = json!({"tenant": via, "route": ROUTE});
    match via {
        "via-check" => {
            post_to(client, &format!("{}/v1/check", server.base), body)
                .await
                .0
                == 200
        }
        "via-acquire" => {
            post_to(client, &format!("{}/v1/acquire", server.base), body)
                .await
                .0
                == 200
        }
        "via-forward-auth" => {
            let response = client
                .get(format!("{}/v1/forward-auth", server.base))
                .header("X-Tenant", via)
                .header("X-Forwarded-Method", "POST")
                .header("X-Forwarded-Uri", "/v1/invoices")
                .send()
                .await
                .unwrap();
            response.status() == 200
        }
        "via-grpc-native" | "via-grpc-native-override" => {
            let mut rls = RateLimitServiceClient::connect(server.grpc.clone())
                .await
                .unwrap();
            let mut d = descriptor(&[("tenant", via), ("route", ROUTE)]);
            if via == "via-grpc-native-override" {
                d.limit = Some(RateLimitOverride {
                    requests_per_unit: 5,
                    unit: Unit::Hour as i32,
                });
            }
            let request = RateLimitRequest {
                domain: "sluice".into(),
                descriptors: vec![d],
                hits_addend: 0,
            };
            let answer = rls.should_rate_limit(request).await.unwrap().into_inner();
            answer.overall_code == Code::Ok as i32
        }
        other => panic!("no entry point {other}"),
    }
}

/// Every line of the ledger, summed per tenant: (admitted, denied).
fn ledger(dir: &std::path::Path) -> BTreeMap<String, (u64, u64)> {
    let mut sums = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            let line: Value = serde_json::from_str(line).unwrap();
            let sum: &mut (u64, u64) = sums
                .entry(line["tenant"].as_str().unwrap().to_owned())
                .or_default();
            sum.0 += line["admitted"].as_u64().unwrap();
            sum.1 += line["denied"].as_u64().unwrap();
        }
    }
    sums
}

/// Heavy hitters, per tenant: (admitted, denied).
async fn heavy_hitters(client: &reqwest::Client, server: &Server) -> BTreeMap<String, (u64, u64)> {
    let top: Value = client
        .get(format!(
            "{}/v1/admin/heavy-hitters?by=admitted&limit=1000",
            server.base
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    top["tenants"]
        .as_array()
        .unwrap_or_else(|| panic!("{top}"))
        .iter()
        .map(|t| {
            let count = |field: &str| t[field].as_u64().unwrap();
            (
                t["tenant"].as_str().unwrap().to_owned(),
                (count("admitted"), count("denied")),
            )
        })
        .collect()
}

#[tokio::test]
async fn every_entry_point_accounts_each_decision_once() {
    let dir = temp_path("tail-ledger", "ledger");
    let mut server = start(&dir);
    let client = reqwest::Client::new();
    for via in ENTRY_POINTS {
        let before = decisions(&metrics(&client, &server).await);
        assert!(
            ask(&client, &server, via).await,
            "{via}: the first admitted"
        );
        assert!(
            !ask(&client, &server, via).await,
            "{via}: the second denied"
        );
        let after = decisions(&metrics(&client, &server).await);
        assert_eq!(
            (after.0 - before.0, after.1 - before.1),
            (1.0, 1.0),
            "{via}: one allowed and one denied decision in /metrics"
        );
    }
    let top = heavy_hitters(&client, &server).await;
    for via in ENTRY_POINTS {
        assert_eq!(
            top.get(via),
            Some(&(1, 1)),
            "{via} in heavy hitters: {top:?}"
        );
    }
    server.stop();
    let summed = ledger(&dir);
    for via in ENTRY_POINTS {
        assert_eq!(
            summed.get(via),
            Some(&(1, 1)),
            "{via} in the ledger: {summed:?}"
        );
    }
    assert_eq!(summed.len(), ENTRY_POINTS.len(), "{summed:?}");
}

/// envoyproxy/ratelimit descriptors carry no tenant (docs/OPERATIONS.md,
/// "Heavy hitters"): their decisions are counted once in the metrics, and
/// in envoyproxy/ratelimit's own stats, but nowhere a tenant is.
#[tokio::test]
async fn an_envoyproxy_ratelimit_decision_is_counted_once_and_billed_to_no_tenant() {
    let dir = temp_path("tail-ledger-edge", "ledger");
    let mut server = start(&dir);
    let client = reqwest::Client::new();
    let request = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![descriptor(&[("remote_address", "10.0.0.1")])],
        hits_addend: 0,
    };
    let mut rls = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let mut codes = Vec::new();
    let before = decisions(&metrics(&client, &server).await);
    for _ in 0..2 {
        let answer = rls
            .should_rate_limit(request.clone())
            .await
            .unwrap()
            .into_inner();
        codes.push(answer.overall_code);
    }
    // The same through envoyproxy/ratelimit's `POST /json`.
    let json_body = json!({"domain": "edge", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.2"}]}]});
    let url = format!("{}/json", server.base);
    let statuses = [
        post_to(&client, &url, json_body.clone()).await.0,
        post_to(&client, &url, json_body).await.0,
    ];
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::OverLimit as i32],
        "over gRPC"
    );
    assert_eq!(statuses, [200, 429], "over /json");
    let text = metrics(&client, &server).await;
    let after = decisions(&text);
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (2.0, 2.0),
        "{text}"
    );
    assert_eq!(
        metric_total(&text, "ratelimit_service_rate_limit_total_hits{"),
        4.0,
        "{text}"
    );
    assert!(heavy_hitters(&client, &server).await.is_empty());
    // Stopping flushes what the ledger counted.
    server.stop();
    let summed = if dir.exists() {
        ledger(&dir)
    } else {
        BTreeMap::new()
    };
    assert!(summed.is_empty(), "{summed:?}");
}
