//! Traces from a real `sluice serve` on a real Redis to a real OTLP
//! receiver (the test kit's, over HTTP and over gRPC): a decision's spans
//! continue the caller's W3C trace, carry the documented attributes and no
//! tenant text, and a sampled decision is the exemplar of its latency
//! bucket; a collector away costs decisions nothing, and what it misses
//! is counted.

mod common;

use std::time::{Duration, Instant};

use common::traces::{named, none_holds, of_trace, traceparent};
use common::{Server, descriptor, get_text, metric_total, sluice, temp_file};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::json;
use sluice_testkit::{OtlpReceiver, ReceivedSpan, RedisServer};

const PEPPER: &str = "5e1f0c2b9e8a4f6d3c5b7a9e1f2d4c6b8a0e2f4d6c8b0a1e3f5d7c9b1a3e5f71";
/// Text of the tenant, subject and route: no span may carry any of it.
const TENANT: &str = "tenant-acme-traced";
const SUBJECT: &str = "subject-alice-traced";
const ROUTE: &str = "POST /v1/invoices-traced";

const SERVER: i32 = 2;
const CLIENT: i32 = 3;

fn start(redis: &RedisServer, tracing: &str, env: &[(&str, &str)]) -> Server {
    let config = temp_file(
        "traces.yaml",
        &format!(
            r#"
storage:
  backend: redis
  url: {}
keys:
  pepper_env: TEST_TRACES_PEPPER
default_plan: p
plans:
  p:
    routes:
      "{ROUTE}": [{{ name: invoices, algorithm: fixed_window, limit: 1, per: 1h }}]
{tracing}
"#,
            redis.url()
        ),
    );
    // Batches leave within 100 ms (not the SDK's 5 s): a test waits no
    // longer than that for its spans.
    let mut vars = vec![
        ("TEST_TRACES_PEPPER", PEPPER),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    vars.extend_from_slice(env);
    Server::start_with_env(&["--config", config.to_str().unwrap()], &vars).keep(config)
}

fn child_of<'s>(spans: &[&'s ReceivedSpan], parent: &ReceivedSpan, name: &str) -> &'s ReceivedSpan {
    let children: Vec<_> = named(spans, name)
        .into_iter()
        .filter(|s| s.parent_span_id == parent.span_id)
        .collect();
    assert_eq!(
        children.len(),
        1,
        "one {name} under {}: {spans:#?}",
        parent.name
    );
    children[0]
}

/// No span, attribute or resource carries the tenant's, subject's or
/// route's text.
fn no_tenant_text(spans: &[ReceivedSpan]) {
    none_holds(spans, &[TENANT, SUBJECT, ROUTE, "invoices-traced"]);
}

/// A decision's spans: the server span under the caller's, the decision
/// under it, the store call under the decision.
fn decision_spans<'s>(
    spans: &[&'s ReceivedSpan],
    server_name: &str,
    caller: &str,
) -> (&'s ReceivedSpan, &'s ReceivedSpan, &'s ReceivedSpan) {
    let servers = named(spans, server_name);
    assert_eq!(servers.len(), 1, "one server span: {spans:#?}");
    let server = servers[0];
    assert_eq!(
        server.parent_span_id, caller,
        "the caller's span is the parent"
    );
    assert_eq!(server.kind, SERVER);
    let decide = child_of(spans, server, "sluice.decide");
    let store = child_of(spans, decide, "sluice.store");
    assert_eq!(store.kind, CLIENT);
    assert_eq!(store.attribute("sluice.store.backend"), Some("redis"));
    assert_eq!(store.attribute("db.system.name"), Some("redis"));
    assert_eq!(store.attribute("sluice.store.op"), Some("decide"));
    assert_eq!(store.attribute("sluice.store.slots"), Some("1"));
    assert_eq!(store.attribute("sluice.store.shard"), Some("0"));
    assert_eq!(store.attribute("sluice.breaker"), Some("closed"));
    (server, decide, store)
}

#[tokio::test]
async fn a_decision_over_http_continues_the_callers_trace_without_tenant_text() {
    let redis = RedisServer::start();
    let receiver = OtlpReceiver::start();
    let tracing = format!(
        "tracing:\n  endpoint: {}\n  protocol: http/protobuf\n  resource: {{ deployment.environment: test }}\n",
        receiver.http_endpoint()
    );
    let server = start(&redis, &tracing, &[]);
    let client = reqwest::Client::new();
    let check = |n: u32, sampled: bool| {
        let (header, trace, parent) = traceparent(n, sampled);
        let request = client
            .post(format!("{}/v1/check", server.base))
            .header("traceparent", header)
            .header("tracestate", "vendor=opaque")
            .json(&json!({"tenant": TENANT, "route": ROUTE, "subject": SUBJECT}));
        async move {
            (
                request.send().await.unwrap().status().as_u16(),
                trace,
                parent,
            )
        }
    };
    let (admitted, trace_1, parent_1) = check(1, true).await;
    let (denied, trace_2, parent_2) = check(2, true).await;
    let (_, unsampled, _) = check(3, false).await;
    assert_eq!((admitted, denied), (200, 429));
    let reported = client
        .post(format!("{}/v1/report", server.base))
        .header("traceparent", traceparent(4, true).0)
        .json(&json!({"tenant": TENANT, "route": ROUTE, "cost": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(reported.status(), 200);
    let (_, trace_4, _) = traceparent(4, true);

    // Three sampled traces: check, check, report (three spans each).
    let spans = receiver.wait_for(Duration::from_secs(20), |spans| {
        [&trace_1, &trace_2, &trace_4]
            .iter()
            .all(|t| of_trace(spans, t).len() >= 3)
    });
    let first = of_trace(&spans, &trace_1);
    let (server_span, decide, _) = decision_spans(&first, "POST /v1/check", &parent_1);
    assert_eq!(server_span.attribute("http.route"), Some("/v1/check"));
    assert_eq!(server_span.attribute("http.request.method"), Some("POST"));
    assert_eq!(
        server_span.attribute("http.response.status_code"),
        Some("200")
    );
    assert_eq!(server_span.via, "http");
    assert_eq!(decide.attribute("sluice.allowed"), Some("true"));
    assert_eq!(decide.attribute("sluice.cost"), Some("1"));
    assert_eq!(decide.attribute("sluice.near_limit"), Some("true"));
    assert_eq!(decide.attribute("sluice.reason"), None);

    let second = of_trace(&spans, &trace_2);
    let (server_span, decide, _) = decision_spans(&second, "POST /v1/check", &parent_2);
    assert_eq!(
        server_span.attribute("http.response.status_code"),
        Some("429")
    );
    assert_eq!(decide.attribute("sluice.allowed"), Some("false"));
    assert_eq!(decide.attribute("sluice.reason"), Some("route_limit"));
    assert_eq!(decide.attribute("sluice.rule"), Some("invoices"));
    assert_eq!(decide.attribute("sluice.scope"), Some("route"));

    // A report: its span, and its store call (a change).
    let report = of_trace(&spans, &trace_4);
    let server_span = named(&report, "POST /v1/report")[0];
    let change = child_of(&report, server_span, "sluice.report");
    assert_eq!(change.attribute("sluice.cost"), Some("2"));
    assert_eq!(change.attribute("sluice.applied"), Some("true"));
    let store = child_of(&report, change, "sluice.store");
    assert_eq!(store.attribute("sluice.store.op"), Some("adjust"));

    // The caller did not sample the third: nor did sluice.
    assert!(of_trace(&spans, &unsampled).is_empty(), "{spans:#?}");
    no_tenant_text(&spans);
    let resource = &spans[0].resource;
    assert_eq!(
        resource.get("service.name").map(String::as_str),
        Some("sluice")
    );
    assert_eq!(
        resource.get("deployment.environment").map(String::as_str),
        Some("test")
    );

    // The collector's answers are counted (once each export returns).
    let deadline = Instant::now() + Duration::from_secs(10);
    // A connection of its own each time: a pooled one the server closed
    // for idleness meanwhile would fail the request, not sluice.
    let fresh = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let metrics = loop {
        let metrics = get_text(&fresh, &server, "/metrics").await;
        if metric_total(&metrics, "sluice_trace_spans_exported_total") >= 9.0 {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "exports never counted: {metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        metric_total(&metrics, "sluice_trace_spans_dropped_total"),
        0.0
    );
    // The latency histogram names a sampled decision's trace.
    let exemplars: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_decision_duration_seconds_bucket") && l.contains("# {"))
        .collect();
    assert!(
        exemplars
            .iter()
            .any(|l| l.contains(&format!("trace_id=\"{trace_1}\""))
                || l.contains(&format!("trace_id=\"{trace_2}\""))),
        "an exemplar with a sampled trace id: {exemplars:#?}"
    );
    assert!(
        !metrics.contains(&unsampled),
        "an unsampled trace is no exemplar"
    );
}

#[tokio::test]
async fn a_decision_over_grpc_continues_envoys_trace() {
    let redis = RedisServer::start();
    let receiver = OtlpReceiver::start();
    let tracing = format!(
        "tracing:\n  endpoint: {}\n  protocol: grpc\n",
        receiver.grpc_endpoint()
    );
    let server = start(&redis, &tracing, &[]);
    let mut rls = RateLimitServiceClient::connect(server.grpc.clone())
        .await
        .unwrap();
    let (header, trace, parent) = traceparent(9, true);
    let mut request = tonic::Request::new(RateLimitRequest {
        domain: "sluice".into(),
        descriptors: vec![descriptor(&[
            ("tenant", TENANT),
            ("route", ROUTE),
            ("subject", SUBJECT),
        ])],
        hits_addend: 0,
    });
    request
        .metadata_mut()
        .insert("traceparent", header.parse().unwrap());
    rls.should_rate_limit(request).await.unwrap();
    let spans = receiver.wait_for(Duration::from_secs(20), |spans| {
        of_trace(spans, &trace).len() >= 3
    });
    let spans_of = of_trace(&spans, &trace);
    let (server_span, decide, _) = decision_spans(
        &spans_of,
        "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
        &parent,
    );
    assert_eq!(server_span.via, "grpc");
    assert_eq!(server_span.attribute("rpc.system"), Some("grpc"));
    assert_eq!(server_span.attribute("rpc.grpc.status_code"), Some("0"));
    assert_eq!(decide.attribute("sluice.allowed"), Some("true"));
    no_tenant_text(&spans);
}

#[tokio::test]
async fn derived_and_plain_attributes_are_the_operators_choice() {
    let redis = RedisServer::start();
    let receiver = OtlpReceiver::start();
    for (choice, n) in [("derived", 20u32), ("plain", 21)] {
        let tracing = format!(
            "tracing:\n  endpoint: {}\n  attributes: {choice}\n",
            receiver.http_endpoint()
        );
        let server = start(&redis, &tracing, &[]);
        let (header, trace, _) = traceparent(n, true);
        reqwest::Client::new()
            .post(format!("{}/v1/check", server.base))
            .header("traceparent", header)
            .json(&json!({"tenant": TENANT, "route": ROUTE, "subject": SUBJECT}))
            .send()
            .await
            .unwrap();
        let spans = receiver.wait_for(Duration::from_secs(20), |spans| {
            !named(&of_trace(spans, &trace), "sluice.decide").is_empty()
        });
        let decide = named(&of_trace(&spans, &trace), "sluice.decide")[0].clone();
        let tenant = decide.attribute("sluice.tenant").unwrap();
        match choice {
            "derived" => {
                assert_eq!(tenant.len(), 32, "the tenant's tag: {tenant}");
                assert!(tenant.bytes().all(|b| b.is_ascii_hexdigit()));
                assert_eq!(decide.attribute("sluice.route"), Some(ROUTE));
                assert_eq!(decide.attribute("sluice.subject"), None);
            }
            _ => {
                assert_eq!(tenant, TENANT);
                assert_eq!(decide.attribute("sluice.route"), Some(ROUTE));
                assert_eq!(decide.attribute("sluice.subject"), Some(SUBJECT));
            }
        }
    }
}

#[tokio::test]
async fn a_collector_away_costs_decisions_nothing_and_its_spans_are_counted() {
    let redis = RedisServer::start();
    // A black hole: connections are accepted by the kernel, never
    // answered; each export waits out its 5 s timeout.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tracing = format!(
        "tracing:\n  endpoint: http://{}\n  timeout: 5s\n  queue: 16\n",
        hole.local_addr().unwrap()
    );
    let server = start(&redis, &tracing, &[]);
    let client = reqwest::Client::new();
    let mut slowest = Duration::ZERO;
    for n in 0..100u32 {
        let started = Instant::now();
        let status = client
            .post(format!("{}/v1/check", server.base))
            .header("traceparent", traceparent(n, true).0)
            .json(&json!({"tenant": format!("t{n}"), "route": ROUTE}))
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status, 200);
        slowest = slowest.max(started.elapsed());
    }
    // Waiting on an export would take its 5 s timeout: a decision is
    // answered far within it (the bound is loose for shared machines).
    assert!(
        slowest < Duration::from_secs(1),
        "slowest decision {slowest:?}"
    );
    let metrics = get_text(&client, &server, "/metrics").await;
    let dropped = metric_total(&metrics, "sluice_trace_spans_dropped_total");
    // 300 spans, at most 16 waiting and a batch of 16 in flight (and a
    // batch of slack).
    assert!(dropped >= 300.0 - 48.0, "dropped {dropped}: {metrics}");
    assert_eq!(
        metric_total(&metrics, "sluice_trace_spans_exported_total"),
        0.0
    );
    drop(hole);
}

#[test]
fn tracing_off_exports_nothing_and_the_histogram_has_no_exemplars() {
    let redis = RedisServer::start();
    let receiver = OtlpReceiver::start();
    let server = start(&redis, "", &[]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = reqwest::Client::new();
        for _ in 0..3 {
            client
                .post(format!("{}/v1/check", server.base))
                .header("traceparent", traceparent(30, true).0)
                .json(&json!({"tenant": TENANT, "route": ROUTE}))
                .send()
                .await
                .unwrap();
        }
        let metrics = get_text(&client, &server, "/metrics").await;
        assert!(metrics.contains("sluice_decision_duration_seconds_bucket"));
        assert!(!metrics.contains("# {"), "no exemplar without tracing");
    });
    std::thread::sleep(Duration::from_secs(1));
    assert!(receiver.spans().is_empty());
    assert!(!server.log.lock().unwrap().contains("traces exported"));
}

#[test]
fn bad_tracing_settings_are_refused_naming_the_field_or_variable() {
    let bad_fields = [
        ("endpoint: https://collector:4318", "`tracing.endpoint`"),
        ("protocol: http/json", "`tracing.protocol`"),
        ("sampler: sometimes", "`tracing.sampler`"),
        ("ratio: 2", "`tracing.ratio`"),
        ("attributes: everything", "`tracing.attributes`"),
        ("queue: 0", "`tracing.queue`"),
        ("timeout: 5m", "`tracing.timeout`"),
        ("exporter: zipkin", "exporter"),
        ("attributes: derived", "`tracing.attributes`"),
        (
            "protocol: grpc\n  endpoint: http://c:4317/v1/traces",
            "`tracing.endpoint`",
        ),
    ];
    for (field, named) in bad_fields {
        let config = temp_file("bad-tracing.yaml", &format!("tracing:\n  {field}\n"));
        let output = sluice()
            .arg("validate")
            .arg(config.to_str().unwrap())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(!output.status.success(), "{field} accepted");
        assert!(
            stderr.contains(named) || stdout.contains(named),
            "{field}: {stderr}{stdout}"
        );
    }
    let plan = "default_plan: p\nplans:\n  p:\n    tenant: [{ name: t, algorithm: gcra, limit: 1, per: 1s }]\n";
    for (name, value) in [
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "lots"),
    ] {
        let said = serve_refuses(&format!("{plan}tracing: {{}}\n"), &[(name, value)]);
        assert!(said.contains(name), "{name}={value}: {said}");
    }
    // The tenant's tag needs the pepper, which the memory store has not.
    let said = serve_refuses(&format!("{plan}tracing: {{ attributes: derived }}\n"), &[]);
    assert!(said.contains("tracing.attributes"), "{said}");
}

/// What `sluice serve` says refusing to start on `config` with `env`.
fn serve_refuses(config: &str, env: &[(&str, &str)]) -> String {
    let config = temp_file("refused.yaml", config);
    let output = sluice()
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--grpc",
            "127.0.0.1:0",
            "--config",
        ])
        .arg(config.to_str().unwrap())
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(!output.status.success(), "started: {env:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}
