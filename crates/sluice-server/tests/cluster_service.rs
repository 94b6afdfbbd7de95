//! `sluice` on the Redis Cluster backend, against a real cluster.

mod common;

use common::{Server, inspect_row, post, sluice, temp_file};
use serde_json::json;
use sluice_testkit::RedisCluster;

const PEPPER: &str = "0a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9";
const TOKEN: &str = "a-cluster-admin-token-0001";

#[tokio::test]
async fn serve_check_and_inspect_run_on_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let nodes = cluster.urls().join(", ");
    let path = temp_file(
        "cluster.yaml",
        &format!(
            r#"
storage:
  backend: redis-cluster
  nodes: [{nodes}]
  global_shards: 4
keys:
  pepper_env: TEST_SLUICE_PEPPER
admin:
  token_env: TEST_SLUICE_ADMIN
default_plan: free
plans:
  free:
    tenant: [{{ name: day, algorithm: fixed_window, limit: 1000, per: 1d }}]
    routes:
      "POST /v1/invoices": [{{ name: invoices, algorithm: gcra, limit: 3, per: 1h }}]
global:
  "POST /v1/exports": [{{ name: exports, algorithm: fixed_window, limit: 8, per: 1h }}]
"#
        ),
    );
    let env = [("TEST_SLUICE_PEPPER", PEPPER), ("TEST_SLUICE_ADMIN", TOKEN)];
    let mut server = Server::start_with_env(&["--config", path.to_str().unwrap()], &env);
    let client = reqwest::Client::new();
    let ready = client
        .get(format!("{}/readyz", server.base))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);

    let invoice = json!({"tenant": "acme", "route": "POST /v1/invoices"});
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let (status, body) = post(&client, &server.base, invoice.clone()).await;
        assert!(body["degraded"].is_null(), "{body}");
        statuses.push(status);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);

    // The export valve (8 an hour: too small to split, each key of a split
    // valve holding at least 25, so one key) admits 8 of 12
    // requests from many tenants; denials by the valve are refunded to the
    // tenants.
    let mut admitted = 0;
    for i in 0..12 {
        let (status, body) = post(
            &client,
            &server.base,
            json!({"tenant": format!("t{i}"), "route": "POST /v1/exports"}),
        )
        .await;
        assert!(body["degraded"].is_null(), "{body}");
        if status == 200 {
            admitted += 1;
        } else {
            assert_eq!(body["reason"], "global_capacity", "{body}");
        }
    }
    assert_eq!(admitted, 8);

    // `sluice check` decides against the same cluster.
    let out = sluice()
        .arg("check")
        .arg("--config")
        .arg(&path)
        .args(["--tenant", "acme", "--route", "POST /v1/invoices"])
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

    // `sluice inspect` reads the tenant's keys and a valve shard.
    for (route, policy, used) in [
        ("POST /v1/invoices", "invoices", "3"),
        ("POST /v1/exports", "day", "3"),
    ] {
        let out = sluice()
            .arg("inspect")
            .arg("--config")
            .arg(&path)
            .args(["--tenant", "acme", "--route", route])
            .envs(env)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let table = String::from_utf8_lossy(&out.stdout).to_string();
        assert_eq!(inspect_row(&table, policy)[4], used, "{table}");
        if route == "POST /v1/exports" {
            let valve = table
                .lines()
                .find(|l| l.contains("exports"))
                .expect("a valve row");
            assert!(valve.contains("8/1h"), "the valve, whole: {table}");
            assert!(table.contains("split over up to 4 keys"), "{table}");
        }
    }

    // Overrides and heavy hitters are kept in the cluster too, each in the
    // one slot of `{admin}` (written by scripts of several keys).
    let put = client
        .put(format!("{}/v1/admin/overrides/globex", server.base))
        .bearer_auth(TOKEN)
        .json(&json!({"factor": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 200);
    let admin_keys = || {
        let mut all: Vec<String> = Vec::new();
        for url in cluster.urls() {
            let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg("*{admin}*")
                .query(&mut conn)
                .unwrap();
            all.extend(keys);
        }
        all.sort();
        all
    };
    let started = std::time::Instant::now();
    loop {
        let keys = admin_keys();
        let has = |suffix: &str| keys.iter().any(|k| k.ends_with(suffix));
        if has("{admin}:overrides") && has("{admin}:heavy") && has("{admin}:heavy-at") {
            break;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{keys:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    server.stop();
    let log = server.log.lock().unwrap().clone();
    assert!(log.contains("store=\"redis-cluster\""), "{log}");
    assert!(!log.contains(PEPPER) && !log.contains("acme"), "{log}");
}
