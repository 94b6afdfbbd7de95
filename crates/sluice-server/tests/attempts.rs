//! Attempts on rules that count by outcome, on a real `sluice serve` over
//! a real Redis: every entry point that decides hands out the attempt its
//! check holds (`/v1/check` and `/v1/acquire` in the answer, forward-auth
//! in the `Sluice-Attempt` header, native Envoy requests in
//! `request_headers_to_add`), `/v1/report` concludes it, and an attempt
//! never concluded is given back after `attempt_ttl`.

mod common;

use std::time::{Duration, Instant};

use common::{Server, descriptor, get_text, metric_total, post_to, temp_file};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::json;
use sluice_testkit::RedisServer;

const PEPPER: &str = "7a1d0c2b9e8a4f6d3c5b7a9e1f2d4c6b8a0e2f4d6c8b0a1e3f5d7c9b1a3e5f71";

/// Two failed logins per (tenant, user) every 15 minutes.
fn start(redis: &RedisServer) -> Server {
    let config = temp_file(
        "attempts.yaml",
        &format!(
            "server:\n  forward_auth:\n    subject_header: X-User\nstorage:\n  backend: redis\n  url: {}\nkeys:\n  pepper_env: TEST_SLUICE_PEPPER\nattempt_ttl: 1s\ndefault_plan: p\nplans:\n  p:\n    subject:\n      \"POST /login\":\n        - {{ name: failed-logins, algorithm: gcra, limit: 2, per: 15m, count_if: {{ status: [401] }} }}\n",
            redis.url()
        ),
    );
    Server::start_with_env(
        &["--config", config.to_str().unwrap()],
        &[("TEST_SLUICE_PEPPER", PEPPER)],
    )
}

const DOORS: [&str; 5] = [
    "check",
    "acquire",
    "forward-auth",
    "grpc-native",
    "grpc-native-override",
];

/// A login of `tenant` through `door`: the attempt it holds when admitted.
async fn ask(
    client: &reqwest::Client,
    server: &Server,
    door: &str,
    tenant: &str,
) -> Option<String> {
    let body = json!({"tenant": tenant, "route": "POST /login", "subject": "alice"});
    match door {
        "check" | "acquire" => {
            let (status, answer) =
                post_to(client, &format!("{}/v1/{door}", server.base), body).await;
            (status == 200).then(|| answer["attempt"].as_str().expect("an attempt").to_owned())
        }
        "forward-auth" => {
            let response = client
                .get(format!("{}/v1/forward-auth", server.base))
                .header("X-Tenant", tenant)
                .header("X-User", "alice")
                .header("X-Forwarded-Method", "POST")
                .header("X-Forwarded-Uri", "/login")
                .send()
                .await
                .unwrap();
            let attempt = response.headers().get("sluice-attempt");
            (response.status() == 200).then(|| {
                attempt
                    .expect("Sluice-Attempt")
                    .to_str()
                    .unwrap()
                    .to_owned()
            })
        }
        "grpc-native" | "grpc-native-override" => {
            let mut rls = RateLimitServiceClient::connect(server.grpc.clone())
                .await
                .unwrap();
            let mut d = descriptor(&[
                ("tenant", tenant),
                ("route", "POST /login"),
                ("subject", "alice"),
            ]);
            if door == "grpc-native-override" {
                d.limit = Some(RateLimitOverride {
                    requests_per_unit: 100,
                    unit: Unit::Hour as i32,
                });
            }
            let request = RateLimitRequest {
                domain: "sluice".into(),
                descriptors: vec![d],
                hits_addend: 0,
            };
            let answer = rls.should_rate_limit(request).await.unwrap().into_inner();
            let attempt = answer
                .request_headers_to_add
                .iter()
                .find(|h| h.key == "sluice-attempt")
                .map(|h| h.value.clone());
            (answer.overall_code == Code::Ok as i32).then(|| attempt.expect("sluice-attempt"))
        }
        other => panic!("no door {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_door_hands_out_the_attempt_a_report_concludes() {
    let redis = RedisServer::start();
    let server = start(&redis);
    let client = reqwest::Client::new();
    let report = format!("{}/v1/report", server.base);
    for door in DOORS {
        let tenant = format!("via-{door}");
        // A success given back, then two failures counted.
        for status in [200, 401, 401] {
            let attempt = ask(&client, &server, door, &tenant).await;
            let attempt = attempt.unwrap_or_else(|| panic!("{door}: admitted"));
            let (answered, body) = post_to(
                &client,
                &report,
                json!({"attempt": attempt, "status": status}),
            )
            .await;
            assert_eq!(answered, 200, "{door}: {body}");
        }
        assert_eq!(
            ask(&client, &server, door, &tenant).await,
            None,
            "{door}: a third failure after two"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_never_concluded_is_given_back_after_attempt_ttl() {
    let redis = RedisServer::start();
    let server = start(&redis);
    let client = reqwest::Client::new();
    let started = Instant::now();
    for _ in 0..2 {
        assert!(ask(&client, &server, "check", "idle").await.is_some());
    }
    // Both places are held while the attempts may still be concluded.
    assert_eq!(ask(&client, &server, "check", "idle").await, None);
    let deadline = Instant::now() + Duration::from_secs(15);
    while ask(&client, &server, "check", "idle").await.is_none() {
        assert!(Instant::now() < deadline, "never given back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "given back before attempt_ttl"
    );
    // The first place is back once its attempt expired; the second's
    // expiry may be counted a moment later.
    loop {
        let metrics = get_text(&client, &server, "/metrics").await;
        let expired = metric_total(&metrics, "sluice_attempts_total{result=\"expired\"}");
        if expired >= 2.0 {
            break;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
