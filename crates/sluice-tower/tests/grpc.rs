//! The gRPC layer around a real tonic server (the gRPC health service),
//! called by a real tonic client over loopback.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use sluice_core::config::OnError;
use sluice_core::{Config, Policy};
use sluice_store::{Limiter, MemoryStore};
use sluice_tower::grpc::GrpcRateLimitLayer;
use sluice_tower::{FromHeaders, Usage};
use tonic::Code;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tonic_types::StatusExt;

const LIMITS: &str = r#"
default_plan: p
plans:
  p:
    routes:
      "POST /grpc.health.v1.Health/Check": [{ name: checks, algorithm: gcra, limit: 2, per: 1h }]
"#;

async fn serve() -> Channel {
    serve_with(LIMITS, None).await.0
}

/// The health service behind the layer, with `limits` and `usage`: a
/// client's channel, and the limiter.
async fn serve_with(limits: &str, usage: Option<Usage>) -> (Channel, Arc<Limiter<MemoryStore>>) {
    let policy = Policy::compile(&Config::from_yaml(limits, "grpc.yaml").unwrap().limits);
    let limiter = Arc::new(Limiter::new(policy, MemoryStore::new(1_000), OnError::Deny));
    let mut layer = GrpcRateLimitLayer::new(
        limiter.clone(),
        FromHeaders::new(HeaderName::from_static("x-tenant")),
    );
    if let Some(usage) = usage {
        layer = layer.with_usage(usage);
    }
    let (_, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(tokio_stream_of(listener)),
    );
    let channel = Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    (channel, limiter)
}

fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    tokio_stream::wrappers::TcpListenerStream::new(listener)
}

fn check(tenant: Option<&str>) -> tonic::Request<HealthCheckRequest> {
    check_service(tenant, "")
}

fn check_service(tenant: Option<&str>, service: &str) -> tonic::Request<HealthCheckRequest> {
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: service.to_owned(),
    });
    if let Some(tenant) = tenant {
        request
            .metadata_mut()
            .insert("x-tenant", tenant.parse().unwrap());
    }
    request
}

#[tokio::test]
async fn denials_are_resource_exhausted_with_retry_info_and_the_ratelimit_fields() {
    let mut client = HealthClient::new(serve().await);
    for left in [1, 0] {
        let response = client.check(check(Some("acme"))).await.unwrap();
        let fields = response.metadata();
        assert!(
            fields
                .get("ratelimit-policy")
                .is_some_and(|v| v.to_str().unwrap().contains("\"checks\";q=2")),
            "{fields:?}"
        );
        assert!(
            fields
                .get("ratelimit")
                .is_some_and(|v| v.to_str().unwrap().contains(&format!("r={left}"))),
            "{fields:?}"
        );
    }
    let denied = client.check(check(Some("acme"))).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");
    let retry = denied
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .expect("RetryInfo");
    assert!(
        retry > Duration::ZERO && retry <= Duration::from_secs(1800),
        "{retry:?}"
    );
    let quota = denied.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations[0].subject, "checks");
    assert!(denied.metadata().get("retry-after").is_some(), "{denied:?}");
    // Another tenant has its own budget.
    assert!(client.check(check(Some("globex"))).await.is_ok());
    // Keys that cannot be read: INVALID_ARGUMENT naming the field.
    let invalid = client.check(check(None)).await.unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument, "{invalid:?}");
    let bad = invalid.get_details_bad_request().expect("BadRequest");
    assert!(
        bad.field_violations[0]
            .field
            .eq_ignore_ascii_case("x-tenant"),
        "{bad:?}"
    );
}

const BY_OUTCOME: &str = r#"
default_plan: p
plans:
  p:
    routes:
      "POST /grpc.health.v1.Health/Check":
        - { name: tokens, algorithm: fixed_window, limit: 1000, per: 1h }
        - { name: misses, algorithm: fixed_window, limit: 2, per: 1h, count_if: { status: [404] } }
"#;

/// What `acme` has left of `tokens`, as a call of one unit would find it.
async fn tokens_left(limiter: &Limiter<MemoryStore>) -> u64 {
    let policy = limiter.policy();
    let applicable = policy.applicable("acme", "POST /grpc.health.v1.Health/Check", false);
    let batch = sluice_store::Batch::new("acme", None, 1, applicable.rules);
    let peeked = limiter.peek(&batch).await.unwrap();
    let row = &peeked.rows[0];
    let (outcome, _) = row.enforced.decide(&row.state, peeked.now, 1);
    u64::from(outcome.remaining) + u64::from(outcome.allowed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_cost_is_settled_from_its_response_and_failures_count_by_their_status() {
    // A served call says it cost 40 (as initial metadata would); a failed
    // one says nothing and keeps its estimate, 1.
    let usage =
        Usage::from_response(|parts| (!parts.headers.contains_key("grpc-status")).then_some(40));
    let (channel, limiter) = serve_with(BY_OUTCOME, Some(usage)).await;
    let mut client = HealthClient::new(channel);
    // Successful checks: each settled at 40, never counted as misses.
    for n in 1..=3u64 {
        client.check(check(Some("acme"))).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while tokens_left(&limiter).await != 1_000 - 40 * n {
            assert!(tokio::time::Instant::now() < deadline, "settled at 40 each");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    // Unknown services answer NOT_FOUND (404): two count, the third call
    // is refused before it is made.
    for _ in 0..2 {
        let missed = client
            .check(check_service(Some("acme"), "nope"))
            .await
            .unwrap_err();
        assert_eq!(missed.code(), Code::NotFound, "{missed:?}");
    }
    let mut missed = 2;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let refused = loop {
        match client.check(check_service(Some("acme"), "nope")).await {
            Err(refused) if refused.code() == Code::ResourceExhausted => break refused,
            Err(miss) => {
                assert_eq!(miss.code(), Code::NotFound);
                missed += 1;
            }
            Ok(_) => panic!("an unknown service is not found"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "two misses counted by their status"
        );
    };
    let quota = refused.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations[0].subject, "misses");
    // The misses' reports counted `misses` only: `tokens` (no `count_if`)
    // holds the three checks settled at 40 and each miss's estimate, 1.
    let expected = 1_000 - 40 * 3 - missed;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokens_left(&limiter).await != expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} tokens left, expected {expected}",
            tokens_left(&limiter).await
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
