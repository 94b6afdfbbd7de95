//! Decisions per second through the Redis store, next to the ceiling
//! `redis-benchmark` reaches with the same call on the same server.
//!
//! Starts its own `redis-server` on a free loopback port. Phase 1: one
//! process, `TASKS` concurrent tasks deciding for 10,000 tenants (tenant
//! gcra + route token_bucket: two rules, one FCALL) for `SECONDS`.
//! Phase 2: `redis-benchmark` sends the same FCALL (same function, two
//! keys, same arguments, random keys) with 64 connections. Redis CPU per
//! decision comes from `INFO commandstats`.
//!
//! Run: `cargo run --release -p sluice-store --example redis_throughput`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::script::Decide;
use sluice_store::{ConnectOptions, KeySet, Limiter, RedisStore};
use sluice_testkit::{RedisServer, command_usec};

const TASKS: usize = 64;
const SECONDS: u64 = 5;
const TENANTS: usize = 10_000;

const YAML: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 1000000, per: 1s }]
    routes:
      "*": [{ algorithm: token_bucket, limit: 1000000, per: 1s }]
"#;

fn main() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let per_second = runtime.block_on(through_the_store(&server));
    let mut conn = server.connection();
    let (calls, usec) = command_usec(&mut conn, "fcall").expect("fcall stats");
    let store_usec = usec as f64 / calls as f64;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut conn)
        .expect("reset stats");

    let ceiling = redis_benchmark(&server);
    let (calls, usec) = command_usec(&mut conn, "fcall").expect("fcall stats");
    let bench_usec = usec as f64 / calls as f64;

    println!(
        "{:<44} {:>14} {:>22}",
        "", "decisions/s", "Redis CPU µs/decision"
    );
    println!(
        "{:<44} {:>14.0} {:>22.2}",
        format!("sluice RedisStore, 1 process, {TASKS} tasks"),
        per_second,
        store_usec
    );
    println!(
        "{:<44} {:>14.0} {:>22.2}",
        "redis-benchmark FCALL, 64 connections", ceiling, bench_usec
    );
    println!(
        "ratio sluice / redis-benchmark: {:.2}",
        per_second / ceiling
    );
}

async fn through_the_store(server: &RedisServer) -> f64 {
    let keys = KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'x'; 32]).expect("valid pepper")),
        previous: None,
    };
    let store = RedisStore::connect(
        &server.url(),
        keys,
        &ConnectOptions::with_timeout(Duration::from_secs(5)),
    )
    .await
    .expect("connect");
    let policy = Policy::compile_for(
        &Config::from_yaml(YAML, "bench.yaml").expect("valid").limits,
        true,
    );
    let limiter = Arc::new(Limiter::new(policy, store, OnError::Deny));
    let tenants: Arc<Vec<String>> =
        Arc::new((0..TENANTS).map(|i| format!("tenant-{i:05}")).collect());
    let decided = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(SECONDS);
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (limiter, tenants, decided) = (limiter.clone(), tenants.clone(), decided.clone());
            tokio::spawn(async move {
                let policy = limiter.policy();
                let mut i = t * 997;
                while Instant::now() < deadline {
                    i = (i + 1) % TENANTS;
                    let request =
                        Request::new(&tenants[i], "GET /v1/things", None, 1).expect("valid");
                    let decision = limiter.decide(&policy, &request).await;
                    assert_eq!(decision.outcomes.len(), 2, "decided by Redis");
                    decided.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    decided.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

/// Runs redis-benchmark with the decision function (loaded by the store)
/// and returns its requests per second.
fn redis_benchmark(server: &RedisServer) -> f64 {
    let decide = Decide::new();
    let total = 200_000.to_string();
    let out = std::process::Command::new("redis-benchmark")
        .args([
            "-p",
            &server.port().to_string(),
            "-c",
            "64",
            "-n",
            &total,
            "-r",
            "10000",
            "-q",
        ])
        // now (server clock), 2 rules, not rotating, no lease; then per rule:
        // algorithm, limit, per, burst, aligned, cost, shadow.
        .args([
            "FCALL",
            decide.function_name(),
            "2",
            "sl:{t__rand_int__}:a",
            "sl:{t__rand_int__}:b",
            "",
            "2",
            "0",
            "",
        ])
        .args(["1", "1000000", "1000", "1000000", "0", "1", "0"])
        .args(["2", "1000000", "1000", "1000000", "0", "1", "0"])
        .output()
        .expect("redis-benchmark runs (install redis-tools)");
    let text = String::from_utf8_lossy(&out.stdout);
    // "FCALL ...: 61983.24 requests per second, p50=..."
    let last = text.rsplit('\r').next().unwrap_or(&text);
    last.split(" requests per second")
        .next()
        .and_then(|head| head.split_whitespace().last())
        .and_then(|number| number.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("cannot read redis-benchmark output: {text}"))
}
