//! sluice and limitador on one Redis, side by side: the same load (64
//! concurrent tasks in one process, one limit per tenant over 10,000
//! tenants, every request admitted) against one `redis-server` this binary
//! starts on a free loopback port, alternating the clients for `RUNS`
//! rounds of `SECONDS` each.
//!
//! Per run it prints one JSON line: decisions per second, Redis CPU per
//! decision from `INFO commandstats` (every command's time) and from the
//! process (`used_cpu_user` + `used_cpu_sys`).
//!
//! Run: `cargo run --release --manifest-path bench/peers/Cargo.toml --bin redis_peers [RUNS] [SECONDS]`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use limitador::limit::{Context, Limit};
use limitador::storage::redis::AsyncRedisStorage;
use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{ConnectOptions, KeySet, Limiter, RedisStore};
use sluice_testkit::RedisServer;

const TASKS: usize = 64;
const TENANTS: usize = 10_000;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().map_or(3, |a| a.parse().expect("RUNS is a number"));
    let seconds: u64 = args.next().map_or(5, |a| a.parse().expect("SECONDS is a number"));
    let server = RedisServer::start();
    let tenants: Arc<Vec<String>> = Arc::new((0..TENANTS).map(|i| format!("tenant-{i:05}")).collect());

    let sluice = |algorithm: &str| {
        let yaml = format!(
            "default_plan: p\nplans:\n  p:\n    tenant: [{{ algorithm: {algorithm}, limit: 1000000000, per: 1s }}]\n"
        );
        Policy::compile(&Config::from_yaml(&yaml, "bench.yaml").expect("valid").limits)
    };
    let keys = KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[7; 32]).expect("pepper")),
        previous: None,
    };
    let store = RedisStore::connect(&server.url(), keys, &ConnectOptions::with_timeout(Duration::from_secs(2)))
        .await
        .expect("sluice connects");
    let fixed = Arc::new(Limiter::new(sluice("fixed_window"), store.clone(), OnError::Deny));
    let gcra = Arc::new(Limiter::new(sluice("gcra"), store, OnError::Deny));

    let limitador = Arc::new(limitador::AsyncRateLimiter::new_with_storage(Box::new(
        AsyncRedisStorage::new(&server.url()).await.expect("limitador connects"),
    )));
    limitador.add_limit(Limit::new(
        "bench",
        1_000_000_000,
        1,
        Vec::<limitador::limit::Predicate>::new(),
        vec!["tenant".try_into().expect("a variable")],
    ));

    for run in 1..=runs {
        for (name, limiter) in [("sluice_fixed_window", fixed.clone()), ("sluice_gcra", gcra.clone())] {
            let measured = measure(&server, seconds, &tenants, move |tenant| {
                let limiter = limiter.clone();
                async move {
                    let policy = limiter.policy();
                    let request = Request::new(&tenant, "GET /", None, 1).expect("valid");
                    limiter.decide(&policy, &request).await.allowed
                }
            })
            .await;
            report(name, run, measured);
        }
        let limiter = limitador.clone();
        let measured = measure(&server, seconds, &tenants, move |tenant| {
            let limiter = limiter.clone();
            async move {
                // A context per request, as a proxy builds it from its input.
                let values = HashMap::from([("tenant".to_owned(), tenant)]);
                let ctx: Context = values.into();
                let result = limiter
                    .check_rate_limited_and_update(&"bench".into(), &ctx, 1)
                    .await
                    .expect("limitador decides");
                !result.limited
            }
        })
        .await;
        report("limitador_fixed_window", run, measured);
    }
}

struct Measured {
    decisions: u64,
    elapsed: Duration,
    command_us: f64,
    process_us: f64,
}

fn report(peer: &str, run: usize, m: Measured) {
    let n = m.decisions.max(1) as f64;
    println!(
        "{{\"suite\":\"redis_peers\",\"peer\":\"{peer}\",\"backend\":\"redis\",\"run\":{run},\"decisions_per_s\":{:.0},\"redis_command_us_per_decision\":{:.2},\"redis_process_us_per_decision\":{:.2}}}",
        n / m.elapsed.as_secs_f64(),
        m.command_us / n,
        m.process_us / n
    );
}

/// Runs `decide` from `TASKS` tasks for `seconds`; every decision must
/// admit.
async fn measure<F, Fut>(server: &RedisServer, seconds: u64, tenants: &Arc<Vec<String>>, decide: F) -> Measured
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let mut conn = server.connection();
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut conn).expect("reset");
    let cpu_before = process_cpu_us(&mut conn);
    let decisions = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (decide, decisions, tenants) = (decide.clone(), decisions.clone(), tenants.clone());
            tokio::spawn(async move {
                let mut i = t * 7919;
                while Instant::now() < until {
                    i = (i + 104_729) % TENANTS;
                    assert!(decide(tenants[i].clone()).await, "every request is admitted");
                    decisions.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let elapsed = started.elapsed();
    Measured {
        decisions: decisions.load(Ordering::Relaxed),
        elapsed,
        command_us: command_us(&mut conn),
        process_us: process_cpu_us(&mut conn) - cpu_before,
    }
}

/// Every command's time since the stats were reset (`INFO commandstats`),
/// leaving out the INFO and CONFIG calls of this harness.
fn command_us(conn: &mut redis::Connection) -> f64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(conn).expect("INFO");
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter(|line| !line.starts_with("info:") && !line.starts_with("config|"))
        .filter_map(|line| line.split(',').find_map(|kv| kv.split_once("usec=").map(|(_, v)| v)))
        .filter_map(|v| v.parse::<f64>().ok())
        .sum()
}

/// The server process's CPU time so far, µs.
fn process_cpu_us(conn: &mut redis::Connection) -> f64 {
    let info: String = redis::cmd("INFO").arg("cpu").query(conn).expect("INFO cpu");
    info.lines()
        .filter_map(|l| l.strip_prefix("used_cpu_user:").or_else(|| l.strip_prefix("used_cpu_sys:")))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum::<f64>()
        * 1e6
}
