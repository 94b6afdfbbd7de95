//! The tower layer's spans in an app's own traces, as docs/OPERATIONS.md
//! ("Traces") sets it up: the app's `tracing-opentelemetry` layer, an OTLP
//! exporter to a real receiver (the test kit's), the layer around an axum
//! router on a real Redis. Each request's `sluice.decide` is a child of the
//! app's span, its `sluice.store` a child of that, and no span carries the
//! tenant's or the user's text, unless the app says so
//! (`with_trace_attributes`).

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::{HeaderName, Request, StatusCode};
use opentelemetry::trace::TracerProvider;
use opentelemetry_otlp::WithExportConfig;
use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy};
use sluice_store::trace::Disclosure;
use sluice_store::{ConnectOptions, KeySet, Limiter, RedisStore};
use sluice_testkit::{OtlpReceiver, RedisServer};
use sluice_tower::{FromHeaders, RateLimitLayer};
use tower::ServiceExt;
use tracing::Instrument;
use tracing_subscriber::prelude::*;

const LIMITS: &str = r#"
default_plan: free
plans:
  free:
    routes:
      "POST /v1/invoices": [{ name: invoices, algorithm: gcra, limit: 1, per: 1h }]
"#;

const TENANT: &str = "tenant-in-process-traced";
const USER: &str = "user-in-process-traced";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layers_spans_are_children_of_the_apps_without_tenant_text() {
    let redis = RedisServer::start();
    let receiver = OtlpReceiver::start();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(receiver.grpc_endpoint())
        .build()
        .unwrap();
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_simple_exporter(exporter)
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("my-api")));
    let _default = tracing::subscriber::set_default(subscriber);

    let keys = KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'q'; 32]).unwrap()),
        previous: None,
    };
    let store = RedisStore::connect(
        &redis.url(),
        keys,
        &ConnectOptions::with_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let policy = Policy::compile(&Config::from_yaml(LIMITS, "limits.yaml").unwrap().limits);
    let limiter = Arc::new(Limiter::new(policy, store, OnError::Deny));
    let extract = FromHeaders::new(HeaderName::from_static("x-tenant"))
        .subject(HeaderName::from_static("x-user"));
    let layer = RateLimitLayer::new(limiter, extract);
    let app = Router::new()
        .route("/v1/invoices", post(|| async { StatusCode::CREATED }))
        .layer(layer.clone());
    // The same limiter, its spans telling who asked (an app's choice).
    let plain = Router::new()
        .route("/v1/invoices", post(|| async { StatusCode::CREATED }))
        .layer(layer.with_trace_attributes(Disclosure::Plain));

    let mut statuses = Vec::new();
    for n in 0..2 {
        let request = Request::post("/v1/invoices")
            .header("x-tenant", TENANT)
            .header("x-user", USER)
            .body(Body::empty())
            .unwrap();
        let span = tracing::info_span!("request", n);
        let response = app.clone().oneshot(request).instrument(span).await.unwrap();
        statuses.push(response.status());
    }
    assert_eq!(
        statuses,
        [StatusCode::CREATED, StatusCode::TOO_MANY_REQUESTS]
    );
    let request = Request::post("/v1/invoices")
        .header("x-tenant", "tenant-shown")
        .header("x-user", "user-shown")
        .body(Body::empty())
        .unwrap();
    let span = tracing::info_span!("plain-request");
    plain.oneshot(request).instrument(span).await.unwrap();
    drop(_default);
    let _ = provider.force_flush();

    let spans = receiver.wait_for(Duration::from_secs(20), |spans| {
        spans.iter().filter(|s| s.name == "sluice.store").count() >= 3
    });
    let requests: Vec<_> = spans.iter().filter(|s| s.name == "request").collect();
    assert_eq!(requests.len(), 2, "{spans:#?}");
    for request in &requests {
        let decide: Vec<_> = spans
            .iter()
            .filter(|s| s.name == "sluice.decide" && s.parent_span_id == request.span_id)
            .collect();
        assert_eq!(decide.len(), 1, "a decision under each request: {spans:#?}");
        let decide = decide[0];
        assert_eq!(decide.trace_id, request.trace_id);
        let allowed_of = decide.attribute("sluice.allowed");
        let n = request.attribute("n").unwrap();
        assert_eq!(
            allowed_of,
            Some(if n == "0" { "true" } else { "false" }),
            "{decide:#?}"
        );
        let store = spans
            .iter()
            .find(|s| s.name == "sluice.store" && s.parent_span_id == decide.span_id)
            .unwrap_or_else(|| panic!("a store call under the decision: {spans:#?}"));
        assert_eq!(store.attribute("sluice.store.backend"), Some("redis"));
    }
    let shown = spans
        .iter()
        .find(|s| s.name == "plain-request")
        .unwrap_or_else(|| panic!("{spans:#?}"));
    let decide = spans
        .iter()
        .find(|s| s.name == "sluice.decide" && s.parent_span_id == shown.span_id)
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(decide.attribute("sluice.tenant"), Some("tenant-shown"));
    assert_eq!(decide.attribute("sluice.subject"), Some("user-shown"));
    assert_eq!(decide.attribute("sluice.route"), Some("POST /v1/invoices"));
    for span in &spans {
        let texts = span.attributes.values().chain(std::iter::once(&span.name));
        for text in texts {
            assert!(!text.contains(TENANT) && !text.contains(USER), "{span:#?}");
        }
    }
}
