//! Every metric docs/OPERATIONS.md documents moves when what it counts
//! happens, on a running `sluice` (with a real Redis where it takes one).

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{Server, post, temp_file};
use serde_json::json;
use sluice_testkit::RedisServer;

const PEPPER: &str = "5c1f0c2b9e8a4f6d3c5b7a9e1f2d4c6b8a0e2f4d6c8b0a1e3f5d7c9b1a3e5f71";

/// The metric names of the table in docs/OPERATIONS.md.
fn documented() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/OPERATIONS.md"),
    )
    .unwrap();
    let names: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `sluice_"))
        .map(|l| format!("sluice_{}", &l[..l.find('`').unwrap()]))
        .collect();
    assert!(names.len() >= 10, "the metrics table: {names:?}");
    names
}

use common::metric_total as total;

/// Metrics of tracing, which this test's service has off: tests/traces.rs
/// makes each move.
const TRACED: [&str; 2] = [
    "sluice_trace_spans_exported_total",
    "sluice_trace_spans_dropped_total",
];

async fn metrics(client: &reqwest::Client, server: &Server) -> String {
    common::get_text(client, server, "/metrics").await
}

fn config(redis: &RedisServer, limit: &str) -> String {
    format!(
        r#"
storage:
  backend: redis
  url: {}
  timeout: 100ms
  on_error: local
  breaker: {{ failures: 2, cool_down: 200ms, probes: 1 }}
keys:
  pepper_env: TEST_SLUICE_PEPPER
reservation_ttl: 1s
default_plan: p
plans:
  p:
    tenant: [{{ name: t, algorithm: fixed_window, limit: {limit}, per: 1h }}]
    routes:
      "POST /login": [{{ name: failed, limit: 5, per: 1h, count_if: {{ status: [401] }} }}]
      "GET /shadow": [{{ name: watch, limit: 1, per: 1h, shadow: true }},
                      {{ name: watch-hot, limit: 1000, per: 1m, shadow: true, tolerance: "2%" }}]
  hot:
    tenant: [{{ name: hot, limit: 1200000, per: 1m, tolerance: "1%" }}]
  bursty:
    tenant: [{{ name: watch-burst, limit: 300, per: 1s, burst: 60, shadow: true, tolerance: "10%" }}]
  greedy:
    tenant: [{{ name: g, limit: 1000, per: 1h }}]
tenants:
  hot-tenant: {{ plan: hot }}
  bursty: {{ plan: bursty }}
  greedy-0: {{ plan: greedy }}
global:
  "GET /valve": [{{ name: orders-valve, limit: 10, per: 1s }}]
"#,
        redis.url()
    )
}

#[tokio::test]
async fn every_documented_metric_moves() {
    let mut redis = RedisServer::start();
    let path = temp_file("metrics.yaml", &config(&redis, "3"));
    let server = Server::start_with_env(
        &["--config", path.to_str().unwrap()],
        &[("TEST_SLUICE_PEPPER", PEPPER)],
    );
    let client = reqwest::Client::new();
    let mut moved = BTreeSet::new();
    let mut check = |metrics: &str, name: &str, prefix: &str| {
        assert!(
            total(metrics, prefix) > 0.0,
            "{prefix} did not move:\n{metrics}"
        );
        moved.insert(name.to_owned());
    };

    // Decisions, denials remembered, a shadow rule's would-be denials.
    for _ in 0..6 {
        post(
            &client,
            &server.base,
            json!({"tenant": "a", "route": "GET /"}),
        )
        .await;
    }
    for _ in 0..2 {
        post(
            &client,
            &server.base,
            json!({"tenant": "b", "route": "GET /shadow"}),
        )
        .await;
    }
    // A heartbeat counts this instance.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let m = metrics(&client, &server).await;
    check(
        &m,
        "sluice_decisions_total",
        "sluice_decisions_total{outcome=\"denied\",reason=\"tenant_limit\"",
    );
    check(
        &m,
        "sluice_decision_duration_seconds",
        "sluice_decision_duration_seconds_count",
    );
    check(
        &m,
        "sluice_store_call_duration_seconds",
        "sluice_store_call_duration_seconds_count",
    );
    check(
        &m,
        "sluice_denial_cache_hits_total",
        "sluice_denial_cache_hits_total",
    );
    check(
        &m,
        "sluice_shadow_denials_total",
        "sluice_shadow_denials_total",
    );
    check(&m, "sluice_live_instances", "sluice_live_instances");

    // A hot tenant with a tolerance: slices taken, decisions answered
    // from them, units held, the declared bounds.
    let started = Instant::now();
    for _ in 0..1_500 {
        post(
            &client,
            &server.base,
            json!({"tenant": "hot-tenant", "route": "GET /"}),
        )
        .await;
    }
    assert!(started.elapsed() < Duration::from_secs(14), "not hot");
    let m = metrics(&client, &server).await;
    for (name, prefix) in [
        (
            "sluice_slices_taken_total",
            "sluice_slices_taken_total{rule=\"hot\",scope=\"tenant\"}",
        ),
        (
            "sluice_slice_units_taken_total",
            "sluice_slice_units_taken_total{rule=\"hot\"",
        ),
        (
            "sluice_slice_decisions_total",
            "sluice_slice_decisions_total",
        ),
        (
            "sluice_slice_units_held",
            "sluice_slice_units_held{rule=\"hot\"",
        ),
        (
            "sluice_slice_bound",
            "sluice_slice_bound{rule=\"hot\",scope=\"tenant\"} 12000",
        ),
        (
            "sluice_slice_shadow_bound",
            "sluice_slice_shadow_bound{rule=\"watch-hot\"",
        ),
    ] {
        check(&m, name, prefix);
    }

    // A shadow rule with a tolerance, on a key that goes from 200 a second
    // (hot, under its 300) to as fast as the client can: what its slices
    // would have held on top of a full bucket is counted (a few rounds,
    // for a machine that runs slow).
    let over = "sluice_slice_shadow_over_admitted_units_total{rule=\"watch-burst\"";
    for _ in 0..4 {
        let steady = Instant::now();
        while steady.elapsed() < Duration::from_millis(1_500) {
            post(
                &client,
                &server.base,
                json!({"tenant": "bursty", "route": "GET /bursty"}),
            )
            .await;
            tokio::time::sleep(Duration::from_millis(4)).await;
        }
        for _ in 0..400 {
            post(
                &client,
                &server.base,
                json!({"tenant": "bursty", "route": "GET /bursty"}),
            )
            .await;
        }
        if metrics(&client, &server).await.contains(over) {
            break;
        }
    }
    let m = metrics(&client, &server).await;
    check(&m, "sluice_slice_shadow_over_admitted_units_total", over);

    // A fair valve (10/s) kept empty by one tenant asking without pause:
    // once the units its gate saved are spent, the gate holds it to its
    // share while the valve refills (a fair-share denial), and the valve
    // is said to be saturated. Asked until that shows, at most 10 s.
    let denials = "sluice_valve_fair_share_denials_total{valve=\"orders-valve\"}";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut held = 0;
    for i in 0.. {
        let (_, body) = post(
            &client,
            &server.base,
            json!({"tenant": "greedy-0", "route": "GET /valve"}),
        )
        .await;
        held += usize::from(body["reason"] == "global_capacity");
        if i % 50 == 49 && total(&metrics(&client, &server).await, denials) > 0.0 {
            break;
        }
        if std::time::Instant::now() > deadline {
            break;
        }
    }
    assert!(held > 0, "the valve held nobody back");
    let m = metrics(&client, &server).await;
    check(
        &m,
        "sluice_valve_fair_share_denials_total",
        "sluice_valve_fair_share_denials_total{valve=\"orders-valve\"}",
    );
    check(
        &m,
        "sluice_valve_saturated",
        "sluice_valve_saturated{valve=\"orders-valve\"}",
    );
    check(
        &m,
        "sluice_valve_fair_share_level",
        "sluice_valve_fair_share_level{valve=\"orders-valve\"}",
    );

    // Usage after the fact: a settle above its estimate goes past the
    // limit (3 an hour, owing at most 3: 4 forgiven), is retried (the
    // same) and contradicted (refused); a report; a reservation left to
    // expire.
    let url = |path: &str| format!("{}{path}", server.base);
    let reserve = json!({"tenant": "u", "route": "GET /", "reserve": true});
    let (_, reserved) = common::post_to(&client, &url("/v1/check"), reserve.clone()).await;
    let settle = json!({"reservation": reserved["reservation"], "cost": 10});
    for body in [
        settle.clone(),
        settle,
        json!({"reservation": reserved["reservation"], "cost": 2}),
    ] {
        common::post_to(&client, &url("/v1/settle"), body).await;
    }
    common::post_to(
        &client,
        &url("/v1/report"),
        json!({"tenant": "v", "route": "GET /"}),
    )
    .await;
    common::post_to(
        &client,
        &url("/v1/check"),
        json!({"tenant": "w", "route": "GET /", "reserve": true}),
    )
    .await;
    // An attempt on a rule that counts by outcome, concluded as a failure.
    let login = json!({"tenant": "x", "route": "POST /login"});
    let (_, checked) = common::post_to(&client, &url("/v1/check"), login).await;
    let failed = json!({"attempt": checked["attempt"], "status": 401});
    let (status, body) = common::post_to(&client, &url("/v1/report"), failed).await;
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = metrics(&client, &server).await;
        if total(&m, "sluice_reservations_expired_total") > 0.0 {
            break m;
        }
        assert!(Instant::now() < deadline, "no reservation expired:\n{m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (name, prefix) in [
        (
            "sluice_settles_total",
            "sluice_settles_total{result=\"applied\"}",
        ),
        (
            "sluice_settles_total",
            "sluice_settles_total{result=\"repeated\"}",
        ),
        (
            "sluice_settles_total",
            "sluice_settles_total{result=\"refused\"}",
        ),
        ("sluice_settled_cost_total", "sluice_settled_cost_total"),
        (
            "sluice_attempts_total",
            "sluice_attempts_total{result=\"counted\"}",
        ),
        ("sluice_debited_units_total", "sluice_debited_units_total"),
        ("sluice_debts_total", "sluice_debts_total"),
        (
            "sluice_forgiven_debt_units_total",
            "sluice_forgiven_debt_units_total",
        ),
        (
            "sluice_reservations_expired_total",
            "sluice_reservations_expired_total",
        ),
    ] {
        check(&m, name, prefix);
    }
    assert_eq!(total(&m, "sluice_forgiven_debt_units_total"), 4.0, "{m}");

    // Reloads, good and bad.
    std::fs::write(&path, config(&redis, "4")).unwrap();
    server.wait_for_log("configuration reloaded");
    std::fs::write(&path, config(&redis, "0")).unwrap();
    server.wait_for_log("configuration not reloaded");
    let m = metrics(&client, &server).await;
    check(
        &m,
        "sluice_config_reloads_total",
        "sluice_config_reloads_total{result=\"ok\"}",
    );
    check(
        &m,
        "sluice_config_reloads_total",
        "sluice_config_reloads_total{result=\"error\"}",
    );

    // Redis goes away: errors, the failure policy, the breaker opens.
    redis.stop();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        post(
            &client,
            &server.base,
            json!({"tenant": "c", "route": "GET /"}),
        )
        .await;
        let m = metrics(&client, &server).await;
        if total(&m, "sluice_breaker_state") > 0.0 {
            check(&m, "sluice_breaker_state", "sluice_breaker_state");
            check(
                &m,
                "sluice_breaker_transitions_total",
                "sluice_breaker_transitions_total{state=\"open\"}",
            );
            check(
                &m,
                "sluice_store_errors_total",
                "sluice_store_errors_total{",
            );
            check(
                &m,
                "sluice_failure_policy_decisions_total",
                "sluice_failure_policy_decisions_total{policy=\"local\"}",
            );
            break;
        }
        assert!(Instant::now() < deadline, "the breaker never opened:\n{m}");
    }
    // Tracing's, with a collector to export to (and one away): moved in
    // tests/traces.rs.
    moved.extend(TRACED.map(str::to_owned));
    let missing: Vec<_> = documented().difference(&moved).cloned().collect();
    assert!(
        missing.is_empty(),
        "documented but never moved: {missing:?}"
    );
}

/// A tenant naming a new subject on every request (an hour's window
/// each: nothing goes idle) fills its quarter of the memory store, not the
/// store: another tenant's new users are still admitted.
#[tokio::test]
async fn a_tenant_making_keys_cannot_fill_the_store_for_the_others() {
    let path = temp_file(
        "tenant-share.yaml",
        "storage:\n  max_entries: 1000\ndefault_plan: p\nplans:\n  p:\n    subject:\n      \"*\": [{ algorithm: sliding_window, limit: 5, per: 1h }]\n",
    );
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    let client = reqwest::Client::new();
    let ask = |tenant: &str, i: usize| json!({"tenant": tenant, "route": "GET /", "subject": format!("user-{i}")});
    let mut refused = 0;
    for i in 0..1_100 {
        let (status, body) = post(&client, &server.base, ask("noisy", i)).await;
        if status == 429 {
            assert_eq!(body["reason"], "store_unavailable");
            refused += 1;
        }
    }
    assert_eq!(refused, 850, "the noisy tenant holds its 250 keys");
    for i in 0..250 {
        let (status, _) = post(&client, &server.base, ask("polite", i)).await;
        assert_eq!(status, 200, "the polite tenant's user {i}");
    }
    let m = metrics(&client, &server).await;
    assert_eq!(
        total(&m, "sluice_store_errors_total{kind=\"full\"}"),
        850.0,
        "{m}"
    );
}

#[tokio::test]
async fn a_full_memory_store_counts_its_refusals() {
    let path = temp_file(
        "full.yaml",
        "storage:\n  max_entries: 1000\ndefault_plan: p\nplans:\n  p:\n    tenant: [{ limit: 5, per: 1h }]\n",
    );
    let server = Server::start(&["--config", path.to_str().unwrap()]);
    let client = reqwest::Client::new();
    let mut refused = 0;
    for i in 0..1_010 {
        let (status, body) = post(
            &client,
            &server.base,
            json!({"tenant": format!("t{i}"), "route": "GET /"}),
        )
        .await;
        if status == 429 {
            assert_eq!(body["reason"], "store_unavailable");
            refused += 1;
        }
    }
    assert_eq!(refused, 10, "exactly the keys beyond max_entries");
    let m = metrics(&client, &server).await;
    assert_eq!(
        total(&m, "sluice_store_errors_total{kind=\"full\"}"),
        10.0,
        "{m}"
    );
}
