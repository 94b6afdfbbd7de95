//! Hot keys on a running `sluice` over a real Redis: a tenant decided
//! hundreds of times a second from a rule with a `tolerance` is decided
//! from slices, and `sluice inspect --url` shows the slices the service
//! holds for it; admin overrides of other tenants leave its slices alone.

mod common;

use std::time::Duration;

use common::{Server, get_text, metric_total, post, sluice, temp_file};
use serde_json::json;
use sluice_testkit::RedisServer;

const PEPPER: &str = "5c1f0c2b9e8a4f6d3c5b7a9e1f2d4c6b8a0e2f4d6c8b0a1e3f5d7c9b1a3e5f71";
const TOKEN: &str = "hot-keys-admin-token-0123456789";

/// A service on `redis` whose tenants have 10,000,000 an hour with 1%.
fn hourly(redis: &RedisServer) -> Server {
    let config = temp_file(
        "hot-keys.yaml",
        &format!(
            "storage:\n  backend: redis\n  url: {}\nkeys:\n  pepper_env: TEST_SLUICE_PEPPER\nadmin:\n  token_env: TEST_HOT_ADMIN\ndefault_plan: p\nplans:\n  p:\n    tenant: [{{ name: hourly, limit: 10000000, per: 1h, tolerance: \"1%\" }}]\n",
            redis.url()
        ),
    );
    Server::start_with_env(
        &["--config", config.to_str().unwrap()],
        &[("TEST_SLUICE_PEPPER", PEPPER), ("TEST_HOT_ADMIN", TOKEN)],
    )
    .keep(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_slices_a_service_holds_for_a_tenant() {
    let redis = RedisServer::start();
    let server = hourly(&redis);
    let base = server.base.clone();
    let hammer = tokio::spawn(async move {
        let client = reqwest::Client::new();
        let until = std::time::Instant::now() + Duration::from_secs(4);
        while std::time::Instant::now() < until {
            let (status, _) =
                post(&client, &base, json!({"tenant": "hot", "route": "GET /"})).await;
            assert_eq!(status, 200);
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let out = sluice()
        .args(["inspect", "--url", &server.base, "--tenant", "hot"])
        .env("SLUICE_ADMIN_TOKEN", TOKEN)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = table
        .lines()
        .skip_while(|l| !l.starts_with("slices held by this instance"))
        .nth(1)
        .unwrap_or_else(|| panic!("no slices shown:\n{table}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&cells[..2], ["tenant", "hourly"], "{table}");
    let units: u64 = cells[2].parse().unwrap();
    assert!(
        units > 0 && units <= 100_000,
        "1% of the limit at most: {table}"
    );
    // A cold tenant holds none.
    let out = sluice()
        .args(["inspect", "--url", &server.base, "--tenant", "cold"])
        .env("SLUICE_ADMIN_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("slices held"));
    hammer.await.unwrap();
}

/// Five overrides a second of other tenants while a tenant is hot: its
/// decisions are still answered from slices (each override used to drop
/// every slice, and the key had to be found hot again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_of_other_tenants_leave_a_hot_tenants_slices_alone() {
    let redis = RedisServer::start();
    let server = hourly(&redis);
    let client = reqwest::Client::new();
    let decide = |client: reqwest::Client, base: String, seconds: u64| async move {
        let until = std::time::Instant::now() + Duration::from_secs(seconds);
        let mut decided = 0u64;
        while std::time::Instant::now() < until {
            let (status, _) =
                post(&client, &base, json!({"tenant": "hot", "route": "GET /"})).await;
            assert_eq!(status, 200);
            decided += 1;
        }
        decided
    };
    // Hot first.
    decide(client.clone(), server.base.clone(), 1).await;
    let local = |m: &str| metric_total(m, "sluice_slice_decisions_total");
    let before = local(&get_text(&client, &server, "/metrics").await);
    let hammer = tokio::spawn(decide(client.clone(), server.base.clone(), 3));
    for n in 0..15 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let put = client
            .put(format!("{}/v1/admin/overrides/other-{n}", server.base))
            .bearer_auth(TOKEN)
            .json(&json!({"factor": 2}))
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), 200);
    }
    let decided = hammer.await.unwrap() as f64;
    let answered_here = local(&get_text(&client, &server, "/metrics").await) - before;
    assert!(
        answered_here >= 0.95 * decided,
        "{answered_here} of {decided} decisions from slices"
    );
}
