//! `sluice` on the Redis backend, against a real `redis-server`.

mod common;

use std::collections::BTreeMap;

use common::{Server, inspect_row, post, post_to, sluice, temp_file};
use serde_json::json;
use sluice_testkit::RedisServer;

const PEPPER: &str = "7d1f0c2b9e8a4f6d3c5b7a9e1f2d4c6b8a0e2f4d6c8b0a1e3f5d7c9b1a3e5f70";

fn config(server: &RedisServer, name: &str) -> common::TempPath {
    temp_file(
        name,
        &format!(
            r#"
storage:
  backend: redis
  url: {}
keys:
  pepper_env: TEST_SLUICE_PEPPER
default_plan: free
plans:
  free:
    tenant: [{{ name: day, algorithm: fixed_window, limit: 1000, per: 1d }}]
    routes:
      "POST /v1/invoices": [{{ name: invoices, algorithm: gcra, limit: 3, per: 1h }}]
    subject:
      "*": [{{ name: per-user, algorithm: sliding_log, limit: 100, per: 1m }}]
"#,
            server.url()
        ),
    )
}

#[test]
fn serve_refuses_a_redis_backend_without_a_pepper() {
    let redis = RedisServer::start();
    let path = config(&redis, "no-pepper.yaml");
    let out = sluice()
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .env_remove("TEST_SLUICE_PEPPER")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("TEST_SLUICE_PEPPER, which is not set"),
        "{stderr}"
    );
    assert!(stderr.contains("openssl rand -hex 32"), "{stderr}");
}

#[test]
fn a_short_pepper_is_refused_without_being_echoed() {
    let redis = RedisServer::start();
    let path = config(&redis, "short-pepper.yaml");
    let out = sluice()
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .env("TEST_SLUICE_PEPPER", "hunter2-too-short")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("at least 32 bytes"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

fn all_values(redis: &RedisServer) -> BTreeMap<String, String> {
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    keys.into_iter()
        .map(|key| {
            let dump: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut conn).unwrap();
            (key, format!("{dump:?}"))
        })
        .collect()
}

#[tokio::test]
async fn serve_check_and_inspect_share_redis_and_never_show_the_pepper_or_tenants() {
    let redis = RedisServer::start();
    let path = config(&redis, "redis.yaml");
    let env = [("TEST_SLUICE_PEPPER", PEPPER)];
    let mut server = Server::start_with_env(&["--config", path.to_str().unwrap()], &env);
    let client = reqwest::Client::new();
    let request = json!({"tenant": "tenant-in-logs?", "route": "POST /v1/invoices", "subject": "user-in-logs?"});
    let mut statuses = Vec::new();
    let mut bodies = String::new();
    for _ in 0..4 {
        let (status, body) = post(&client, &server.base, request.clone()).await;
        statuses.push(status);
        bodies.push_str(&body.to_string());
    }
    assert_eq!(statuses, [200, 200, 200, 429]);

    // `sluice check` decides against the same Redis: the fourth invoice of
    // the hour is denied there too.
    let out = sluice()
        .arg("check")
        .arg("--config")
        .arg(&path)
        .args([
            "--tenant",
            "tenant-in-logs?",
            "--route",
            "POST /v1/invoices",
        ])
        .envs(env)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"reason\":\"route_limit\""));

    // `sluice inspect` reads the state without touching it.
    let before = all_values(&redis);
    let inspect = || {
        sluice()
            .arg("inspect")
            .arg("--config")
            .arg(&path)
            .args([
                "--tenant",
                "tenant-in-logs?",
                "--route",
                "POST /v1/invoices",
                "--subject",
                "user-in-logs?",
            ])
            .envs(env)
            .output()
            .unwrap()
    };
    let out = inspect();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    let row = |policy: &str| inspect_row(&table, policy);
    // scope policy algorithm limit used remaining full-in key
    assert_eq!(row("day")[4], "3", "{table}");
    assert_eq!(row("invoices")[4], "3", "{table}");
    assert_eq!(row("invoices")[5], "0", "{table}");
    assert_eq!(row("per-user")[4], "3", "{table}");
    assert!(row("invoices")[7].starts_with("sl:{"), "{table}");
    assert!(inspect().status.success());
    assert_eq!(all_values(&redis), before, "inspect changed the store");

    server.stop();
    let log = server.log.lock().unwrap().clone();
    for secret in [PEPPER, &PEPPER[..16]] {
        assert!(!log.contains(secret), "the pepper is in the log");
        assert!(!bodies.contains(secret));
        assert!(!table.contains(secret));
    }
    assert!(
        !log.contains("tenant-in-logs") && !log.contains("user-in-logs"),
        "{log}"
    );
    assert!(log.contains("store=\"redis\""), "{log}");
}

#[tokio::test]
async fn serve_starts_while_redis_is_down_reports_not_ready_and_recovers() {
    let port = sluice_testkit::free_port(false);
    let path = temp_file(
        "down.yaml",
        &format!(
            "storage:\n  backend: redis\n  url: redis://127.0.0.1:{port}\n  timeout: 30ms\n  on_error: local\nkeys:\n  pepper_env: TEST_SLUICE_PEPPER\ndefault_plan: p\nplans:\n  p:\n    tenant: [{{ limit: 100, per: 1m }}]\n"
        ),
    );
    let env = [("TEST_SLUICE_PEPPER", PEPPER)];
    let mut server = Server::start_with_env(&["--config", path.to_str().unwrap()], &env);
    let client = reqwest::Client::new();
    let ready = client
        .get(format!("{}/readyz", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 503);
    let body: serde_json::Value = ready.json().await.unwrap();
    assert_eq!(body["store_reachable"], false);

    for _ in 0..10 {
        let started = std::time::Instant::now();
        let (status, body) = post(
            &client,
            &server.base,
            json!({"tenant": "t", "route": "GET /"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["degraded"], "local", "{body}");
        assert!(started.elapsed() < std::time::Duration::from_millis(500));
    }

    let _redis = RedisServer::start_on(port, &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let ready = client
            .get(format!("{}/readyz", server.base))
            .send()
            .await
            .unwrap();
        let (status, body) = post(
            &client,
            &server.base,
            json!({"tenant": "t", "route": "GET /"}),
        )
        .await;
        if ready.status() == 200 && body["degraded"].is_null() {
            assert_eq!(status, 200);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not ready 15s after Redis came up: {body}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    let metrics = common::get_text(&client, &server, "/metrics").await;
    let total = |prefix: &str| common::metric_total(&metrics, prefix);
    assert!(
        total("sluice_failure_policy_decisions_total{policy=\"local\"}") > 0.0,
        "{metrics}"
    );
    assert!(total("sluice_store_errors_total{") > 0.0, "{metrics}");
    assert!(metrics.contains("sluice_breaker_state "), "{metrics}");
    assert!(!metrics.contains("\"t\""), "tenants are never labels");
    server.stop();
    assert!(
        server
            .log
            .lock()
            .unwrap()
            .contains("the failure policy did")
    );
}

/// `/readyz` of a server, as (status, body).
/// Two instances of one configuration, sharing its Redis.
fn two_instances(path: &std::path::Path) -> Vec<Server> {
    (0..2)
        .map(|_| {
            Server::start_with_env(
                &["--config", path.to_str().unwrap()],
                &[("TEST_SLUICE_PEPPER", PEPPER)],
            )
        })
        .collect()
}

async fn readyz(client: &reqwest::Client, server: &Server) -> (u16, serde_json::Value) {
    let response = client
        .get(format!("{}/readyz", server.base))
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.json().await.unwrap())
}

#[tokio::test]
async fn instances_with_different_peppers_on_one_redis_are_not_ready() {
    let redis = RedisServer::start();
    let path = config(&redis, "two-peppers.yaml");
    let first = Server::start_with_env(
        &["--config", path.to_str().unwrap()],
        &[("TEST_SLUICE_PEPPER", PEPPER)],
    );
    let other = "0".repeat(64);
    let mut second = Server::start_with_env(
        &["--config", path.to_str().unwrap()],
        &[("TEST_SLUICE_PEPPER", other.as_str())],
    );
    let client = reqwest::Client::new();
    for server in [&first, &second] {
        server.wait_for_log("another pepper");
        let (status, body) = readyz(&client, server).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["other_peppers"], 1, "{body}");
        assert!(!server.log.lock().unwrap().contains(PEPPER));
    }
    // Once the other pepper is gone (its heartbeat expires), ready again.
    second.stop();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, body) = readyz(&client, &first).await;
        if status == 200 {
            assert_eq!(body["other_peppers"], 0);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{body}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // Instances sharing a pepper are ready together.
    let third = Server::start_with_env(
        &["--config", path.to_str().unwrap()],
        &[("TEST_SLUICE_PEPPER", PEPPER)],
    );
    // Each counts the other once it has read the other's heartbeat (one a
    // second): polled, not a fixed wait a busy machine can outlast.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for server in [&first, &third] {
        loop {
            let (status, body) = readyz(&client, server).await;
            if status == 200 && body["live_instances"] == 2 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{status}: {body}");
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
}

/// The promise to each tenant, over HTTP on a shared Redis: noisy tenants
/// flooding at many times their limit (two instances) never cost a polite
/// tenant a single 429, and get no more than their own limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noisy_tenant_never_starves_a_polite_one() {
    let redis = RedisServer::start();
    let path = temp_file(
        "isolation.yaml",
        &format!(
            "storage:\n  backend: redis\n  url: {}\nkeys:\n  pepper_env: TEST_SLUICE_PEPPER\ndefault_plan: p\nplans:\n  p:\n    tenant: [{{ name: t, algorithm: fixed_window, limit: 50, per: 1h }}]\n",
            redis.url()
        ),
    );
    let instances = two_instances(&path);
    let bases: Vec<String> = instances.iter().map(|s| s.base.clone()).collect();
    let mut tasks = Vec::new();
    // Four noisy tenants, 250 requests each (5× their limit), spread over
    // both instances; two polite tenants send 40 each (under their 50).
    for (tenant, count) in [
        ("noisy-1", 250),
        ("noisy-2", 250),
        ("noisy-3", 250),
        ("noisy-4", 250),
        ("polite-1", 40),
        ("polite-2", 40),
    ] {
        let bases = bases.clone();
        tasks.push(tokio::spawn(async move {
            let client = reqwest::Client::new();
            let (mut admitted, mut denied) = (0u32, 0u32);
            for i in 0..count {
                let base = &bases[i % bases.len()];
                let (status, _) =
                    post(&client, base, json!({"tenant": tenant, "route": "GET /"})).await;
                match status {
                    200 => admitted += 1,
                    429 => denied += 1,
                    other => panic!("{tenant}: status {other}"),
                }
            }
            (tenant, admitted, denied)
        }));
    }
    for task in tasks {
        let (tenant, admitted, denied) = task.await.unwrap();
        if tenant.starts_with("polite") {
            assert_eq!((admitted, denied), (40, 0), "{tenant} was starved");
        } else {
            assert_eq!(admitted, 50, "{tenant} got exactly its own limit");
            assert_eq!(denied, 200);
        }
    }
}

/// Two instances on one Redis: a lease taken through one is released
/// through the other, and concurrent holders over both never exceed the
/// limit.
#[tokio::test]
async fn leases_taken_on_one_instance_are_released_on_another() {
    let redis = RedisServer::start();
    let path = temp_file(
        "leases.yaml",
        &format!(
            "storage:\n  backend: redis\n  url: {}\nkeys:\n  pepper_env: TEST_SLUICE_PEPPER\ndefault_plan: p\nplans:\n  p:\n    routes:\n      \"POST /export\": [{{ name: exports, algorithm: concurrency, limit: 3, lease: 1m }}]\n",
            redis.url()
        ),
    );
    let instances = two_instances(&path);
    let client = reqwest::Client::new();
    let export = json!({"tenant": "acme", "route": "POST /export"});
    let mut leases = Vec::new();
    for i in 0..4 {
        let base = &instances[i % 2].base;
        let (status, body) = post_to(&client, &format!("{base}/v1/acquire"), export.clone()).await;
        if i < 3 {
            assert_eq!(status, 200, "{body}");
            leases.push(body["lease"].as_str().unwrap().to_owned());
        } else {
            assert_eq!(status, 429, "the fourth over both instances: {body}");
        }
    }
    for (i, lease) in leases.iter().enumerate() {
        // Released through the instance that did not take it.
        let base = &instances[(i + 1) % 2].base;
        let (status, body) = post_to(
            &client,
            &format!("{base}/v1/release"),
            json!({ "lease": lease }),
        )
        .await;
        assert_eq!((status, body), (200, json!({"released": true})));
    }
    let (status, _) = post_to(
        &client,
        &format!("{}/v1/release", instances[0].base),
        json!({ "lease": leases[0] }),
    )
    .await;
    assert_eq!(status, 404, "released already");
    let (status, _) = post_to(
        &client,
        &format!("{}/v1/acquire", instances[1].base),
        export,
    )
    .await;
    assert_eq!(status, 200);
    // Nothing in Redis names the tenant or the route.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut redis.connection())
        .unwrap();
    assert!(
        keys.iter()
            .all(|k| !k.contains("acme") && !k.contains("export")),
        "{keys:?}"
    );
}

/// A configuration on `redis` with the admin API on (its token in
/// `TEST_SLUICE_ADMIN`) and plan `p` of `rules` (YAML lines under it).
fn admin_config(redis: &RedisServer, rules: &str) -> common::TempPath {
    temp_file(
        "admin-redis.yaml",
        &format!(
            "storage:\n  backend: redis\n  url: {}\nkeys:\n  pepper_env: TEST_SLUICE_PEPPER\nadmin:\n  token_env: TEST_SLUICE_ADMIN\ndefault_plan: p\nplans:\n  p:\n{rules}",
            redis.url()
        ),
    )
}

/// `sluice serve` on `config`, its admin token `token`.
fn with_admin(config: &std::path::Path, token: &str) -> Server {
    Server::start_with_env(
        &["--config", config.to_str().unwrap()],
        &[("TEST_SLUICE_PEPPER", PEPPER), ("TEST_SLUICE_ADMIN", token)],
    )
}

/// A request to `/v1/admin/overrides/{tenant}` of the service at `base`.
fn overrides(
    client: &reqwest::Client,
    base: &str,
    method: reqwest::Method,
    tenant: &str,
    token: &str,
) -> reqwest::RequestBuilder {
    client
        .request(method, format!("{base}/v1/admin/overrides/{tenant}"))
        .bearer_auth(token)
}

/// `GET /v1/admin/heavy-hitters?by=BY` of the service at `base`.
async fn heavy_hitters(
    client: &reqwest::Client,
    base: &str,
    by: &str,
    token: &str,
) -> serde_json::Value {
    client
        .get(format!("{base}/v1/admin/heavy-hitters?by={by}"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Overrides on Redis: stored encrypted under opaque names, applied by
/// every instance within a second, never silently overwritten.
#[tokio::test]
async fn an_override_made_on_one_instance_applies_on_every_instance() {
    const TOKEN: &str = "an-admin-token-for-tests-000";
    let redis = RedisServer::start();
    let path = admin_config(
        &redis,
        "    routes:\n      \"POST /v1/invoices\": [{ name: invoices, algorithm: gcra, limit: 2, per: 1h }]\n",
    );
    let (a, b) = (with_admin(&path, TOKEN), with_admin(&path, TOKEN));
    let client = reqwest::Client::new();
    let admin = |base: &str, method, tenant: &str| overrides(&client, base, method, tenant, TOKEN);
    let put = admin(&a.base, reqwest::Method::PUT, "acme")
        .json(&json!({"factor": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let version: u64 = put.json::<serde_json::Value>().await.unwrap()["version"]
        .as_u64()
        .unwrap();
    // B reads it from the store at once, and applies it within a second
    // (it reads the change counter twice a second): acme gets 6 across
    // both instances, globex keeps 2.
    let seen = admin(&b.base, reqwest::Method::GET, "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(seen.status(), 200);
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let count = |tenant: &'static str| {
        let (client, bases) = (client.clone(), [a.base.clone(), b.base.clone()]);
        async move {
            let mut admitted = 0;
            for i in 0..10 {
                let body = json!({"tenant": tenant, "route": "POST /v1/invoices"});
                let (status, _) = post(&client, &bases[i % 2], body).await;
                admitted += u32::from(status == 200);
            }
            admitted
        }
    };
    assert_eq!(count("acme").await, 6);
    assert_eq!(count("globex").await, 2);
    // Two edits based on the same version: one wins, the other is told.
    let edit = |base: &str| {
        admin(base, reqwest::Method::PUT, "acme")
            .header("if-match", format!("\"{version}\""))
            .json(&json!({"factor": 4}))
            .send()
    };
    let (first, second) = tokio::join!(edit(&a.base), edit(&b.base));
    let mut statuses = [
        first.unwrap().status().as_u16(),
        second.unwrap().status().as_u16(),
    ];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 412]);
    // Nothing in Redis names the tenant.
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    for key in keys.iter().filter(|k| k.contains("{admin}")) {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut conn).unwrap();
        assert!(!String::from_utf8_lossy(&dump).contains("acme"), "{key}");
        assert!(!String::from_utf8_lossy(&dump).contains("factor"), "{key}");
    }
    assert!(keys.iter().any(|k| k.contains("{admin}")), "{keys:?}");
    // Every change is an audit line; the token is never logged.
    a.wait_for_log("override stored");
    for server in [&a, &b] {
        assert!(!server.log.lock().unwrap().contains(TOKEN));
    }
    // Heavy hitters add up both instances' counts: 10 requests from
    // globex over A and B, 8 of them denied.
    let started = std::time::Instant::now();
    loop {
        let top = heavy_hitters(&client, &a.base, "denied", TOKEN).await;
        let globex = top["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["tenant"] == "globex")
            .cloned();
        if globex
            == Some(json!({"tenant": "globex", "denied": 8, "admitted": 2, "fair_share_denied": 0}))
        {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{top}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // What instances publish of them names no tenant either.
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    assert!(keys.iter().any(|k| k.ends_with(":heavy")), "{keys:?}");
    for key in &keys {
        let dump: Vec<u8> = redis::cmd("DUMP").arg(key).query(&mut conn).unwrap();
        let text = String::from_utf8_lossy(&dump);
        assert!(!text.contains("globex") && !text.contains("acme"), "{key}");
    }
    // Removed through B, gone on A too.
    let gone = admin(&b.base, reqwest::Method::DELETE, "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 204);
    let started = std::time::Instant::now();
    while admin(&a.base, reqwest::Method::GET, "acme")
        .send()
        .await
        .unwrap()
        .status()
        != 404
    {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(3),
            "not removed on A"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// An override that expires leaves Redis, and is not read again and again:
/// before, it stayed in the hash for good and every instance read every
/// override twice a second (and recompiled its policy) from then on.
#[tokio::test]
async fn an_expired_override_leaves_redis_and_costs_no_more_reads() {
    const TOKEN: &str = "an-admin-token-for-tests-001";
    let redis = RedisServer::start();
    let path = admin_config(&redis, "    tenant: [{ name: daily, limit: 2, per: 1d }]\n");
    let server = with_admin(&path, TOKEN);
    let client = reqwest::Client::new();
    let put = client
        .put(format!("{}/v1/admin/overrides/acme", server.base))
        .bearer_auth(TOKEN)
        .json(&json!({"factor": 2, "expires_in": "1s"}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let mut conn = redis.connection();
    let overrides: String = redis::cmd("KEYS")
        .arg("*{admin}:overrides")
        .query::<Vec<String>>(&mut conn)
        .unwrap()
        .pop()
        .expect("the overrides hash");
    let held = |conn: &mut redis::Connection| -> u64 {
        redis::cmd("HLEN").arg(&overrides).query(conn).unwrap()
    };
    assert_eq!(held(&mut conn), 1);
    let started = std::time::Instant::now();
    while held(&mut conn) > 0 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "the expired override is still in Redis"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Its removal was a change every instance reads once; then only the
    // heavy hitters' hash is read, once a second.
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    let reads = |conn: &mut redis::Connection| {
        sluice_testkit::command_calls(conn)
            .get("hgetall")
            .copied()
            .unwrap_or(0)
    };
    let before = reads(&mut conn);
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let during = reads(&mut conn) - before;
    assert!(during <= 4, "{during} HGETALLs in 2 s");
    // And the tenant is back on its plan.
    let mut admitted = 0;
    for _ in 0..4 {
        let (status, _) = post(
            &client,
            &server.base,
            json!({"tenant": "acme", "route": "GET /"}),
        )
        .await;
        admitted += u32::from(status == 200);
    }
    assert_eq!(admitted, 2);
}

/// Heavy hitters cost Redis little: each instance publishes its own
/// windows, and does not read every instance's back each second to find
/// those gone silent (with N instances that was N² reads a second).
#[tokio::test]
async fn publishing_heavy_hitters_reads_nothing_back_each_second() {
    const TOKEN: &str = "an-admin-token-for-tests-002";
    let redis = RedisServer::start();
    let path = admin_config(&redis, "    tenant: [{ name: daily, limit: 2, per: 1d }]\n");
    // What an instance gone for good left (by an older sluice, which wrote
    // no window number beside it).
    let mut conn = redis.connection();
    let heavy = "sl:{admin}:heavy";
    let _: i64 = redis::cmd("HSET")
        .arg(heavy)
        .arg("gone")
        .arg("00")
        .query(&mut conn)
        .unwrap();
    let server = with_admin(&path, TOKEN);
    let client = reqwest::Client::new();
    for tenant in ["acme", "globex", "initech"] {
        post(
            &client,
            &server.base,
            json!({"tenant": tenant, "route": "GET /"}),
        )
        .await;
    }
    let calls = |conn: &mut redis::Connection, command: &str| {
        sluice_testkit::command_calls(conn)
            .get(command)
            .copied()
            .unwrap_or(0)
    };
    // Published within a second or so.
    let started = std::time::Instant::now();
    while calls(&mut conn, "hset") == 0 {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "never published"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The first publication forgets the instance gone silent.
    let started = std::time::Instant::now();
    loop {
        let fields: Vec<String> = redis::cmd("HKEYS").arg(heavy).query(&mut conn).unwrap();
        if !fields.iter().any(|f| f == "gone") {
            assert_eq!(fields.len(), 1, "{fields:?}");
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{fields:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (published, read) = (calls(&mut conn, "hset"), calls(&mut conn, "hgetall"));
    tokio::time::sleep(std::time::Duration::from_millis(3_500)).await;
    let published = calls(&mut conn, "hset") - published;
    let read = calls(&mut conn, "hgetall") - read;
    assert!(published >= 2, "still published each second: {published}");
    // At most one read, should a new window begin meanwhile.
    assert!(read <= 1, "{read} HGETALLs in 3.5 s");
    // And the query still finds them.
    let top = heavy_hitters(&client, &server.base, "admitted", TOKEN).await;
    assert_eq!(top["tenants"].as_array().unwrap().len(), 3, "{top}");
}

/// The heavy hitters' hashes expire (no key lives forever): two windows
/// after the last instance published, nothing reads them any more.
#[tokio::test]
async fn heavy_hitter_keys_expire() {
    const TOKEN: &str = "an-admin-token-for-tests-003";
    let redis = RedisServer::start();
    let path = admin_config(&redis, "    tenant: [{ name: daily, limit: 2, per: 1d }]\n");
    let server = with_admin(&path, TOKEN);
    let client = reqwest::Client::new();
    post(
        &client,
        &server.base,
        json!({"tenant": "acme", "route": "GET /"}),
    )
    .await;
    let mut conn = redis.connection();
    let started = std::time::Instant::now();
    for key in ["sl:{admin}:heavy", "sl:{admin}:heavy-at"] {
        loop {
            let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).unwrap();
            if ttl != -2 {
                assert!(ttl > 0 && ttl <= 120_000, "{key}: PTTL {ttl}");
                break;
            }
            assert!(
                started.elapsed() < std::time::Duration::from_secs(5),
                "{key} never published"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

/// An override that cuts a sharded tenant's rule below its shards stays
/// exact: `factor: 0.05` of 40 over 8 shards admits 2 (each shard held at
/// least 1: 8 were admitted).
#[tokio::test]
async fn an_override_below_a_sharded_tenants_shards_stays_exact() {
    const TOKEN: &str = "an-admin-token-for-tests-004";
    let redis = RedisServer::start();
    let path = temp_file(
        "sharded-admin.yaml",
        &format!(
            "storage:\n  backend: redis\n  url: {}\nkeys:\n  pepper_env: TEST_SLUICE_PEPPER\nadmin:\n  token_env: TEST_SLUICE_ADMIN\ndefault_plan: p\nplans:\n  p:\n    routes:\n      \"POST /x\": [{{ name: x, algorithm: fixed_window, limit: 40, per: 1h }}]\ntenants:\n  big: {{ plan: p, shards: 8 }}\n",
            redis.url()
        ),
    );
    let server = with_admin(&path, TOKEN);
    let client = reqwest::Client::new();
    let put = client
        .put(format!("{}/v1/admin/overrides/big", server.base))
        .bearer_auth(TOKEN)
        .json(&json!({ "factor": 0.05 }))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let mut admitted = 0;
    for _ in 0..20 {
        let (status, _) = post(
            &client,
            &server.base,
            json!({"tenant": "big", "route": "POST /x"}),
        )
        .await;
        admitted += u32::from(status == 200);
    }
    assert_eq!(admitted, 2, "40 × 0.05, whatever the shards");
}

/// Overrides follow the store after it loses its data (FLUSHALL, a
/// restart without persistence, a failover to a lagging replica): an
/// instance notices a store that lost its overrides (even when the change
/// counter reads as it did) or a counter that went backwards, reloads and
/// says so; `GET` and `DELETE` answer from the store; versions never
/// repeat across a loss. Before, an instance kept an override the store no
/// longer had (here a `shadow: true`) until some later change.
#[tokio::test]
async fn overrides_follow_the_store_after_it_loses_its_data() {
    const TOKEN: &str = "an-admin-token-for-tests-005";
    let redis = RedisServer::start();
    let path = admin_config(
        &redis,
        "    tenant: [{ name: daily, algorithm: fixed_window, limit: 2, per: 1d }]\n",
    );
    let (a, b) = (with_admin(&path, TOKEN), with_admin(&path, TOKEN));
    let client = reqwest::Client::new();
    let admin = |base: &str, method, tenant: &str| overrides(&client, base, method, tenant, TOKEN);
    let status_on = |base: String, tenant: &'static str| {
        let request = admin(&base, reqwest::Method::GET, tenant);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    let until = |what: &str, started: std::time::Instant| {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{what}"
        );
    };
    let put = admin(&a.base, reqwest::Method::PUT, "acme")
        .json(&json!({"shadow": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    // B applies it: acme, past its 2 a day, is only shadow-denied there.
    let acme_on_b = || {
        post(
            &client,
            &b.base,
            json!({"tenant": "acme", "route": "GET /"}),
        )
    };
    let started = std::time::Instant::now();
    loop {
        let (status, body) = acme_on_b().await;
        if status == 200 && body["shadow_denied"] == true {
            break;
        }
        until("B never applied the override", started);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The store loses the overrides while its counter reads as before (as
    // FLUSHALL followed by as many changes as before leaves it).
    let mut conn = redis.connection();
    let counter: u64 = redis::cmd("GET")
        .arg("sl:{admin}:version")
        .query(&mut conn)
        .unwrap();
    redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg("sl:{admin}:overrides")
        .arg("sl:{admin}:versions")
        .cmd("SET")
        .arg("sl:{admin}:version")
        .arg(counter)
        .query::<()>(&mut conn)
        .unwrap();
    // Read from the store at once, not from B's copy.
    assert_eq!(status_on(b.base.clone(), "acme").await, 404);
    let gone = admin(&b.base, reqwest::Method::DELETE, "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404, "nothing to delete in the store");
    // B stops applying the shadow: acme is denied past its 2 a day (once
    // B has installed the policy without it, which follows its log line:
    // on a loaded machine a request could come between them).
    b.wait_for_log("the store lost the overrides");
    let started = std::time::Instant::now();
    while acme_on_b().await.0 != 429 {
        until("the shadow no longer applies on B", started);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // A new version is above every version before the loss.
    let put = admin(&a.base, reqwest::Method::PUT, "globex")
        .json(&json!({"factor": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let version = put.json::<serde_json::Value>().await.unwrap()["version"]
        .as_u64()
        .unwrap();
    assert!(version > counter, "{version} after {counter}");
    // B applies it: a third request of globex in a day passes there.
    let started = std::time::Instant::now();
    let mut admitted = 0;
    while admitted < 3 {
        let body = json!({"tenant": "globex", "route": "GET /"});
        admitted += u32::from(post(&client, &b.base, body).await.0 == 200);
        until("B never applied globex's override", started);
    }
    // A counter that went backwards (failover to a lagging replica) is
    // said, and read again.
    let _: () = redis::cmd("SET")
        .arg("sl:{admin}:version")
        .arg(version - 1)
        .query(&mut conn)
        .unwrap();
    b.wait_for_log("went backwards");
    // FLUSHALL: every instance drops every override, and says so.
    let _: () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    for server in [&a, &b] {
        let started = std::time::Instant::now();
        while status_on(server.base.clone(), "globex").await != 404 {
            until("globex outlived FLUSHALL", started);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    a.wait_for_log("the store lost the overrides");
}
