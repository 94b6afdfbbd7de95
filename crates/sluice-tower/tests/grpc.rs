//! The gRPC layer around a real tonic server (the gRPC health service),
//! called by a real tonic client over loopback.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use sluice_core::config::OnError;
use sluice_core::{Config, Policy};
use sluice_store::{Limiter, MemoryStore};
use sluice_tower::FromHeaders;
use sluice_tower::grpc::GrpcRateLimitLayer;
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
    let policy = Policy::compile(&Config::from_yaml(LIMITS, "grpc.yaml").unwrap().limits);
    let limiter = Arc::new(Limiter::new(policy, MemoryStore::new(1_000), OnError::Deny));
    let layer = GrpcRateLimitLayer::new(
        limiter,
        FromHeaders::new(HeaderName::from_static("x-tenant")),
    );
    let (_, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(tokio_stream_of(listener)),
    );
    Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap()
}

fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    tokio_stream::wrappers::TcpListenerStream::new(listener)
}

fn check(tenant: Option<&str>) -> tonic::Request<HealthCheckRequest> {
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
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
