//! Decisions per second through the Redis store, next to the same call
//! replayed on the same server without the store.
//!
//! Starts its own `redis-server` on a free loopback port. Phase 1: one
//! process, `TASKS` concurrent tasks deciding for 10,000 tenants (tenant
//! gcra + route token_bucket: two rules, one FCALL) for `SECONDS`.
//! Phase 2: the same FCALL (same function, keys and arguments, random
//! tenants) replayed like `redis-benchmark`, 64 in flight. Redis CPU per
//! decision comes from `INFO commandstats`.
//!
//! Run: `cargo run --release -p sluice-store --example redis_throughput`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::redis::{Decide, DecideCall, Selection};
use sluice_store::{Batch, ConnectOptions, KeySet, Limiter, RedisStore, TimeSource, Valve};
use sluice_testkit::{RedisServer, command_usec, replay};

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
    let limiter = runtime.block_on(limiter(&server));
    let per_second = runtime.block_on(through_the_store(limiter.clone()));
    let mut conn = server.connection();
    let (calls, usec) = command_usec(&mut conn, "fcall").expect("fcall stats");
    let store_usec = usec as f64 / calls as f64;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut conn)
        .expect("reset stats");

    let ceiling = redis_benchmark(&server, &limiter);
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
        "the same FCALL replayed, 64 in flight", ceiling, bench_usec
    );
    println!("ratio sluice / replayed: {:.2}", per_second / ceiling);
}

async fn limiter(server: &RedisServer) -> Arc<Limiter<RedisStore>> {
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
    Arc::new(Limiter::new(policy, store, OnError::Deny))
}

async fn through_the_store(limiter: Arc<Limiter<RedisStore>>) -> f64 {
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

/// Replays the decision function's call (loaded by the store) with the
/// keys and packed arguments the store sends, as `redis-benchmark` would
/// (64 in flight, random tenants), and returns calls per second.
fn redis_benchmark(server: &RedisServer, limiter: &Limiter<RedisStore>) -> f64 {
    let decide = Decide::new();
    let policy = limiter.policy();
    let rules = policy.applicable("any", "GET /v1/things", false).rules;
    let tenants: Vec<String> = (0..TENANTS).map(|i| format!("tenant-{i:05}")).collect();
    replay(server.port(), 4, 16, 200_000, TENANTS as u64, |t| {
        let batch = Batch::new(&tenants[t as usize], None, 1, rules);
        let keys = KeySet::keys(&limiter.store().keys().current, &batch, Valve::WHOLE);
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(decide.function_name());
        DecideCall::new(
            &batch,
            Selection::ALL,
            keys.keys.into_vec(),
            &keys.records,
            None,
            &TimeSource::Server,
        )
        .fill(&mut cmd);
        cmd
    })
}
