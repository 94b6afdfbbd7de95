//! Traces at their edges, on a real `sluice serve`, Redis and OTLP
//! receiver (a hostile review found each of these broken once): every
//! door's spans continue the caller's trace (a settle and an attempt's
//! conclusion run on tasks of their own), background work starts no trace,
//! no span holds tenant text whatever the door or its error, a caller's
//! method text is not a span name, and a collector that never answers
//! holds neither memory past the queue (whatever the `OTEL_BSP_*`
//! variables say) nor the exit. On Redis Cluster, a store call's span
//! counts the slots it touched.

mod common;

use std::time::{Duration, Instant};

use common::traces::{named, none_holds, of_trace, traceparent};
use common::{Server, get_text, metric_total, temp_file};
use serde_json::{Value, json};
use sluice_testkit::{OtlpReceiver, RedisCluster, RedisServer};

const PEPPER: &str = "6e1f0c2b9e8a4f6d3c5b7a9e1f2d4c6b8a0e2f4d6c8b0a1e3f5d7c9b1a3e5f72";
const TENANT: &str = "tenant-edge-secret";
const SUBJECT: &str = "subject-edge-secret";

fn start(redis: &RedisServer, tracing: &str, env: &[(&str, &str)]) -> Server {
    let config = temp_file(
        "edges.yaml",
        &format!(
            r#"
storage: {{ backend: redis, url: "{}" }}
keys: {{ pepper_env: TEST_EDGES_PEPPER }}
server: {{ forward_auth: {{ tenant_header: X-Tenant }} }}
attempt_ttl: 1s
default_plan: p
plans:
  p:
    routes:
      "POST /v1/invoices-secret": [{{ name: invoices, algorithm: fixed_window, limit: 1000, per: 1h }}]
      "POST /v1/exports-secret": [{{ name: exports, algorithm: concurrency, limit: 5, lease: 1m }}]
    subject:
      "POST /login-secret": [{{ name: failed-logins, algorithm: gcra, limit: 100, per: 15m, count_if: {{ status: [401] }} }}]
{tracing}
"#,
            redis.url()
        ),
    );
    let mut vars = vec![
        ("TEST_EDGES_PEPPER", PEPPER),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    vars.extend_from_slice(env);
    Server::start_with_env(&["--config", config.to_str().unwrap()], &vars).keep(config)
}

/// POSTs `body` to `path` under the caller's `traceparent`: (status, body).
async fn post(server: &Server, path: &str, traceparent: &str, body: Value) -> (u16, Value) {
    let response = reqwest::Client::new()
        .post(format!("{}{path}", server.base))
        .header("traceparent", traceparent)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn every_doors_spans_continue_the_callers_trace_and_hold_no_tenant_text() {
    let redis = RedisServer::start();
    let receiver = OtlpReceiver::start();
    let tracing = format!("tracing: {{ endpoint: {} }}", receiver.http_endpoint());
    let server = start(&redis, &tracing, &[("OTEL_BSP_SCHEDULE_DELAY", "100")]);
    let exports = json!({"tenant": TENANT, "route": "POST /v1/exports-secret"});
    let login = json!({"tenant": TENANT, "route": "POST /login-secret", "subject": SUBJECT});
    let sampled = |n| traceparent(n, true).0;

    // Each change, under a trace of its own: (trace number, the span the
    // change makes).
    let mut expected = Vec::new();
    let reserved =
        json!({"reserve": true, "cost": 5, "tenant": TENANT, "route": "POST /v1/invoices-secret"});
    let (_, held) = post(&server, "/v1/check", &sampled(1), reserved.clone()).await;
    let settle = json!({"reservation": held["reservation"], "cost": 2});
    assert_eq!(
        post(&server, "/v1/settle", &sampled(2), settle).await.0,
        200
    );
    expected.push((2, "sluice.settle"));
    let (_, leased) = post(&server, "/v1/acquire", &sampled(3), exports).await;
    let release = json!({"lease": leased["lease"], "status": 200});
    assert_eq!(
        post(&server, "/v1/release", &sampled(4), release).await.0,
        200
    );
    expected.push((4, "sluice.release"));
    let (_, attempt) = post(&server, "/v1/check", &sampled(5), login.clone()).await;
    let conclude = json!({"attempt": attempt["attempt"], "status": 401});
    assert_eq!(
        post(&server, "/v1/report", &sampled(6), conclude).await.0,
        200
    );
    expected.push((6, "sluice.conclude"));
    let report = json!({"tenant": TENANT, "route": "POST /v1/invoices-secret", "cost": 3});
    assert_eq!(
        post(&server, "/v1/report", &sampled(7), report).await.0,
        200
    );
    expected.push((7, "sluice.report"));
    // Refusals: a bad body, an unknown lease.
    assert_eq!(
        post(&server, "/v1/check", &sampled(8), json!({"tenant": TENANT}))
            .await
            .0,
        400
    );
    let unknown = json!({"lease": "AAAA", "status": 200});
    assert_eq!(
        post(&server, "/v1/release", &sampled(9), unknown).await.0,
        404
    );
    // Forward-auth, under a method of the caller's own.
    let forwarded = reqwest::Client::new()
        .request(
            reqwest::Method::from_bytes(format!("FROB-{TENANT}").as_bytes()).unwrap(),
            format!("{}/v1/forward-auth", server.base),
        )
        .header("traceparent", sampled(10))
        .header("X-Tenant", TENANT)
        .header("X-Forwarded-Method", "POST")
        .header("X-Forwarded-Uri", "/v1/invoices-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(forwarded.status(), 200);
    // An unsampled caller's settle: nothing of it goes out.
    let (_, held) = post(&server, "/v1/check", &sampled(11), reserved).await;
    let (unsampled, unsampled_trace, _) = traceparent(12, false);
    let settle = json!({"reservation": held["reservation"], "cost": 1});
    assert_eq!(post(&server, "/v1/settle", &unsampled, settle).await.0, 200);
    // An attempt left to expire (attempt_ttl 1s): background work.
    post(&server, "/v1/check", &sampled(13), login).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let spans = receiver.wait_for(Duration::from_secs(20), |spans| {
        expected
            .iter()
            .all(|(n, name)| !named(&of_trace(spans, &traceparent(*n, true).1), name).is_empty())
    });
    for (n, name) in &expected {
        let (_, trace, caller) = traceparent(*n, true);
        let in_trace = of_trace(&spans, &trace);
        let server_span = in_trace
            .iter()
            .find(|s| s.parent_span_id == caller)
            .unwrap_or_else(|| {
                panic!("trace {n}: a server span under the caller's: {in_trace:#?}")
            });
        let change = named(&in_trace, name);
        assert_eq!(change.len(), 1, "trace {n}: one {name}: {in_trace:#?}");
        assert_eq!(change[0].parent_span_id, server_span.span_id, "trace {n}");
        let store = in_trace
            .iter()
            .find(|s| s.name == "sluice.store" && s.parent_span_id == change[0].span_id);
        assert!(
            store.is_some(),
            "trace {n}: the change's store call: {in_trace:#?}"
        );
    }
    let (_, forward_trace, _) = traceparent(10, true);
    let forward = of_trace(&spans, &forward_trace);
    assert!(
        forward.iter().any(|s| s.name == "_OTHER /v1/forward-auth"
            && s.attribute("http.request.method") == Some("_OTHER")),
        "{forward:#?}"
    );
    assert!(of_trace(&spans, &unsampled_trace).is_empty(), "{spans:#?}");
    // Every request named its caller: a span without a parent is one
    // that background work started (the attempt's expiry).
    let roots: Vec<_> = spans
        .iter()
        .filter(|s| s.parent_span_id.is_empty())
        .collect();
    assert!(roots.is_empty(), "spans of no request: {roots:#?}");
    none_holds(&spans, &[TENANT, SUBJECT, "-secret"]);
    for span in &spans {
        if let Some(error) = span.attribute("error.type") {
            assert!(
                error.len() < 20 && !error.contains(' '),
                "a closed set: {span:#?}"
            );
        }
    }
}

/// A collector that accepts connections and never answers.
fn black_hole() -> (std::net::TcpListener, String) {
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", hole.local_addr().unwrap());
    (hole, endpoint)
}

#[tokio::test]
async fn a_collector_that_never_answers_holds_no_memory_past_the_queue() {
    let redis = RedisServer::start();
    let (_hole, endpoint) = black_hole();
    let tracing = format!("tracing: {{ endpoint: {endpoint}, queue: 16 }}");
    // Variables that would let exports pile up, or end them before the
    // exporter counts them: not read.
    let env = [
        ("OTEL_BSP_MAX_CONCURRENT_EXPORTS", "0"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "300"),
    ];
    let server = start(&redis, &tracing, &env);
    server.wait_for_log("OTEL_BSP_MAX_CONCURRENT_EXPORTS is set but not read");
    let route = json!({"tenant": TENANT, "route": "POST /v1/invoices-secret"});
    for n in 0..100 {
        let status = post(&server, "/v1/check", &traceparent(n, true).0, route.clone()).await;
        assert_eq!(status.0, 200);
    }
    // 300 spans (server, decision, store call), at most 16 waiting and one
    // batch of 16 in flight: the rest is dropped, and counted, at once.
    let metrics = get_text(&reqwest::Client::new(), &server, "/metrics").await;
    let dropped = metric_total(&metrics, "sluice_trace_spans_dropped_total");
    assert!(dropped >= 300.0 - 32.0, "dropped {dropped}");
}

#[tokio::test]
async fn stopping_waits_for_a_collector_that_never_answers_a_bounded_time() {
    let redis = RedisServer::start();
    let (_hole, endpoint) = black_hole();
    // The default export timeout (10 s) and queue.
    let mut server = start(&redis, &format!("tracing: {{ endpoint: {endpoint} }}"), &[]);
    let route = json!({"tenant": TENANT, "route": "POST /v1/invoices-secret"});
    for n in 0..20 {
        post(&server, "/v1/check", &traceparent(n, true).0, route.clone()).await;
    }
    // The batch processor's timer (5 s) sends those into the hole; more
    // wait behind them.
    tokio::time::sleep(Duration::from_millis(5_600)).await;
    for n in 20..40 {
        post(&server, "/v1/check", &traceparent(n, true).0, route.clone()).await;
    }
    let started = Instant::now();
    server.stop();
    let took = started.elapsed();
    // No connection is open: nothing to drain; the last spans get
    // traces::SHUTDOWN (2 s), not the export's 10 s.
    assert!(took < Duration::from_secs(4), "stopped after {took:?}");
}

#[tokio::test]
async fn on_redis_cluster_a_store_calls_span_counts_its_slots() {
    let cluster = RedisCluster::start(3, 0);
    let receiver = OtlpReceiver::start();
    let config = temp_file(
        "edges-cluster.yaml",
        &format!(
            r#"
storage: {{ backend: redis-cluster, nodes: [{}] }}
keys: {{ pepper_env: TEST_EDGES_PEPPER }}
tracing: {{ endpoint: {} }}
default_plan: p
plans:
  p:
    tenant: [{{ name: day, algorithm: fixed_window, limit: 1000, per: 1d }}]
global:
  "POST /v1/invoices-secret": [{{ name: valve, algorithm: fixed_window, limit: 100000, per: 1h }}]
"#,
            cluster.urls().join(", "),
            receiver.http_endpoint()
        ),
    );
    let env = [
        ("TEST_EDGES_PEPPER", PEPPER),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let server = Server::start_with_env(&["--config", config.to_str().unwrap()], &env);
    let route = json!({"tenant": TENANT, "route": "POST /v1/invoices-secret"});
    let (header, trace, _) = traceparent(40, true);
    assert_eq!(
        post(&server, "/v1/check", &header, route.clone()).await.0,
        200
    );
    let report = json!({"tenant": TENANT, "route": "POST /v1/invoices-secret", "cost": 2});
    let (header, report_trace, _) = traceparent(41, true);
    assert_eq!(post(&server, "/v1/report", &header, report).await.0, 200);
    let spans = receiver.wait_for(Duration::from_secs(20), |spans| {
        !named(&of_trace(spans, &trace), "sluice.store").is_empty()
            && !named(&of_trace(spans, &report_trace), "sluice.store").is_empty()
    });
    // The tenant's rule in its slot, the valve's in another.
    let decided = named(&of_trace(&spans, &trace), "sluice.store")[0];
    assert_eq!(
        decided.attribute("sluice.store.backend"),
        Some("redis-cluster")
    );
    assert_eq!(
        decided.attribute("sluice.store.slots"),
        Some("2"),
        "{decided:#?}"
    );
    let reported = named(&of_trace(&spans, &report_trace), "sluice.store")[0];
    assert_eq!(reported.attribute("sluice.store.op"), Some("adjust"));
    assert_eq!(
        reported.attribute("sluice.store.slots"),
        Some("1"),
        "{reported:#?}"
    );
    none_holds(&spans, &[TENANT, "-secret"]);
}

#[tokio::test]
async fn a_reload_that_changes_tracing_keeps_the_running_exporter_and_says_so() {
    let redis = RedisServer::start();
    let (first, second) = (OtlpReceiver::start(), OtlpReceiver::start());
    let config = |receiver: &OtlpReceiver, limit: u32| {
        format!(
            "storage: {{ backend: redis, url: \"{}\" }}\nkeys: {{ pepper_env: TEST_EDGES_PEPPER }}\nreservation_ttl: 1s\ntracing: {{ endpoint: {} }}\ndefault_plan: p\nplans:\n  p:\n    tenant: [{{ name: t, algorithm: fixed_window, limit: {limit}, per: 1h }}]\n",
            redis.url(),
            receiver.http_endpoint()
        )
    };
    let path = temp_file("edges-reload.yaml", &config(&first, 1));
    let env = [
        ("TEST_EDGES_PEPPER", PEPPER),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let server = Server::start_with_env(&["--config", path.to_str().unwrap()], &env);
    // Changes first, in and out of requests (a reservation left to expire,
    // a report): the reload after them is still applied and logged.
    let reserve = json!({"tenant": "another", "route": "GET /", "reserve": true});
    let (status, _) = post(&server, "/v1/check", &traceparent(48, true).0, reserve).await;
    assert_eq!(status, 200);
    let report = json!({"tenant": "a-third", "route": "GET /", "cost": 1});
    post(&server, "/v1/report", &traceparent(49, true).0, report).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    std::fs::write(&path, config(&second, 5)).unwrap();
    server.wait_for_log("configuration reloaded");
    let log = server.log.lock().unwrap().clone();
    assert!(
        log.contains("`tracing`") && log.contains("take effect on restart"),
        "{log}"
    );
    // The limits changed; the exporter did not.
    let route = json!({"tenant": TENANT, "route": "GET /"});
    for n in 50..52 {
        let (status, _) = post(&server, "/v1/check", &traceparent(n, true).0, route.clone()).await;
        assert_eq!(status, 200, "the reloaded limit of 5 applies");
    }
    let (_, trace, _) = traceparent(51, true);
    first.wait_for(Duration::from_secs(20), |spans| {
        !of_trace(spans, &trace).is_empty()
    });
    assert!(second.spans().is_empty(), "{:#?}", second.spans());
}
