//! Usage known after the fact against real servers: two `sluice serve`
//! instances on one Redis and on Redis Cluster, thousands of concurrent
//! reserve/settle/report calls, and the store read at the end; a
//! reservation whose instance is killed keeps its estimate, charged once.

mod common;

use std::time::{Duration, Instant};

use common::{Server, get_text, inspect_row, metric_total, post_to, sluice, temp_file};
use serde_json::json;
use sluice_testkit::{RedisCluster, RedisServer};

const PEPPER: &str = "5e1d0c2b9e8a4f6d3c5b7a9e1f2d4c6b8a0e2f4d6c8b0a1e3f5d7c9b1a3e5f71";

/// A plan counting tokens in one window a day long (never denied here),
/// so that what the store holds is exactly what was charged.
fn config(storage: &str, ttl: &str) -> common::TempPath {
    temp_file(
        "usage.yaml",
        &format!(
            "{storage}  timeout: 2s\nkeys:\n  pepper_env: TEST_SLUICE_PEPPER\nreservation_ttl: {ttl}\ndefault_plan: p\nplans:\n  p:\n    tenant: [{{ name: tokens, algorithm: fixed_window, limit: 1000000000, per: 1d }}]\n"
        ),
    )
}

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

/// What the store holds for `tenant`'s `tokens` rule, read by `sluice
/// inspect` (which changes nothing).
fn used(path: &std::path::Path, tenant: &str) -> u64 {
    let out = sluice()
        .args(["inspect", "--config", path.to_str().unwrap()])
        .args(["--tenant", tenant, "--route", "POST /v1/chat"])
        .env("TEST_SLUICE_PEPPER", PEPPER)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    inspect_row(&table, "tokens")[4].parse().unwrap()
}

/// A deterministic stream of numbers (splitmix64).
fn numbers(seed: u64) -> impl Iterator<Item = u64> {
    let mut state = seed;
    std::iter::repeat_with(move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

/// 1,500 reservations (random estimates) and 500 reports over both
/// instances, 64 at a time; each reservation settled at a random actual
/// cost (below, equal or above its estimate) on a random instance, a
/// third of them settled twice (the retry answers the same), a tenth of
/// them then settled again at another cost (refused). The store must hold
/// exactly the sum of the actual costs and the reports.
async fn exact_over(instances: &[Server], path: &std::path::Path) {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .unwrap();
    let bases: Vec<String> = instances.iter().map(|s| s.base.clone()).collect();
    let jobs: Vec<(u64, u64, u64, u64)> = {
        let mut n = numbers(7);
        (0..2_000)
            .map(|_| {
                let (a, b, c, d) = (
                    n.next().unwrap(),
                    n.next().unwrap(),
                    n.next().unwrap(),
                    n.next().unwrap(),
                );
                (a, b, c, d)
            })
            .collect()
    };
    let mut expected = 0;
    let mut tasks = tokio::task::JoinSet::new();
    for (i, (a, b, c, d)) in jobs.into_iter().enumerate() {
        let client = client.clone();
        let bases = bases.clone();
        let report = i % 4 == 3;
        let estimate = 1 + a % 100;
        let actual = b % 200;
        expected += if report { estimate } else { actual };
        tasks.spawn(async move {
            let base = |k: u64| bases[(k % 2) as usize].clone();
            let chat = json!({"tenant": "acme", "route": "POST /v1/chat", "cost": estimate});
            if report {
                let (status, body) =
                    post_to(&client, &format!("{}/v1/report", base(c)), chat).await;
                assert_eq!(status, 200, "{body}");
                return;
            }
            let mut reserve = chat;
            reserve["reserve"] = json!(true);
            let (status, body) = post_to(&client, &format!("{}/v1/check", base(c)), reserve).await;
            assert_eq!(status, 200, "{body}");
            let id = body["reservation"]
                .as_str()
                .expect("a reservation")
                .to_owned();
            let settle = json!({"reservation": id, "cost": actual});
            let (status, first) =
                post_to(&client, &format!("{}/v1/settle", base(d)), settle.clone()).await;
            assert_eq!(status, 200, "{first}");
            if d % 3 == 0 {
                let (status, again) =
                    post_to(&client, &format!("{}/v1/settle", base(d + 1)), settle).await;
                assert_eq!(status, 200, "an identical retry: {again}");
            }
            if d % 10 == 1 {
                let other = json!({"reservation": id, "cost": actual + 1});
                let (status, body) =
                    post_to(&client, &format!("{}/v1/settle", base(d)), other).await;
                assert_eq!(status, 404, "settled otherwise: {body}");
            }
        });
        if tasks.len() >= 64 {
            tasks.join_next().await.unwrap().unwrap();
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    assert_eq!(
        used(path, "acme"),
        expected,
        "the store holds what was charged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_settle_and_report_are_exact_over_two_instances_on_redis() {
    let redis = RedisServer::start();
    let path = config(
        &format!("storage:\n  backend: redis\n  url: {}\n", redis.url()),
        "5m",
    );
    let instances = two_instances(&path);
    exact_over(&instances, &path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reserve_settle_and_report_are_exact_over_two_instances_on_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let nodes = cluster.urls().join(", ");
    let path = config(
        &format!("storage:\n  backend: redis-cluster\n  nodes: [{nodes}]\n"),
        "5m",
    );
    let instances = two_instances(&path);
    exact_over(&instances, &path).await;
}

/// A reservation whose instance is killed before it is settled keeps its
/// estimate: charged once, and no longer settleable after
/// `reservation_ttl`. One settled on the other instance in time is
/// charged its actual cost, and the reserving instance's expiry does not
/// charge it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instances_reservation_keeps_its_estimate_and_is_charged_once() {
    let redis = RedisServer::start();
    let path = config(
        &format!("storage:\n  backend: redis\n  url: {}\n", redis.url()),
        "1s",
    );
    let mut instances = two_instances(&path);
    let client = reqwest::Client::new();
    let reserve = |cost: u64| json!({"tenant": "acme", "route": "POST /v1/chat", "cost": cost, "reserve": true});
    let check = |base: &str| format!("{base}/v1/check");
    // Settled on the other instance in time: 20, not 50.
    let (_, settled) = post_to(&client, &check(&instances[0].base), reserve(50)).await;
    let settle = json!({"reservation": settled["reservation"], "cost": 20});
    let (status, _) = post_to(&client, &format!("{}/v1/settle", instances[1].base), settle).await;
    assert_eq!(status, 200);
    // Left to expire on the live instance, and on the one killed.
    let (_, expiring) = post_to(&client, &check(&instances[0].base), reserve(30)).await;
    let (_, orphan) = post_to(&client, &check(&instances[1].base), reserve(70)).await;
    let reserved = Instant::now();
    let _ = (expiring, &orphan);
    instances[1].child.kill().unwrap();
    instances[1].child.wait().unwrap();
    // Past the orphan's `reservation_ttl` (waiting longer on a loaded
    // machine changes nothing), and the live instance's expiry has
    // claimed its own: waited for, not slept on.
    tokio::time::sleep(
        (reserved + Duration::from_millis(1_500)).saturating_duration_since(Instant::now()),
    )
    .await;
    let expired = || async {
        let metrics = get_text(&client, &instances[0], "/metrics").await;
        metric_total(&metrics, "sluice_reservations_expired_total")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while expired().await < 1.0 {
        assert!(Instant::now() < deadline, "the expiry never claimed it");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let late = json!({"reservation": orphan["reservation"], "cost": 1});
    let (status, body) = post_to(&client, &format!("{}/v1/settle", instances[0].base), late).await;
    assert_eq!(status, 404, "expired: {body}");
    assert_eq!(body["invalid-params"][0]["name"], "reservation", "{body}");
    assert_eq!(used(&path, "acme"), 20 + 30 + 70);
    // The live instance claimed its own expired reservation, and only that
    // one: the settled one was claimed by its settle.
    assert_eq!(expired().await, 1.0);
}
