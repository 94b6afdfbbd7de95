//! Decisions per second on a 3-master Redis Cluster next to one standalone
//! Redis, same load, same run.
//!
//! Starts a standalone `redis-server` and a cluster of 3 masters (no
//! replicas) on free loopback ports. Each phase runs `TASKS` concurrent
//! tasks in one process for `SECONDS`, over 10,000 tenants, on each store in
//! turn: first decisions with two tenant-slot rules (tenant gcra + route
//! token_bucket: one script call), then the same with a global valve added
//! (on the cluster: a second call on the valve's slot; the valve is split
//! over 16 keys). Redis CPU per decision is the decision calls' time
//! (`FCALL`, and `EVALSHA`/`EVAL` for the refund script) from
//! `INFO commandstats`, summed over the nodes.
//!
//! Run: `cargo run --release -p sluice-store --example cluster_throughput`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{ClusterStore, ConnectOptions, KeySet, Limiter, RedisStore, Store};
use sluice_testkit::{RedisCluster, RedisServer, command_usec};

const TASKS: usize = 64;
const SECONDS: u64 = 5;
const TENANTS: usize = 10_000;
const VALVE_SHARDS: u16 = 16;

const YAML: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 1000000, per: 1s }]
    routes:
      "*": [{ algorithm: token_bucket, limit: 1000000, per: 1s }]
global:
  "POST /v1/valved": [{ algorithm: gcra, limit: 100000000, per: 1s }]
"#;

fn keys() -> KeySet {
    KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'x'; 32]).expect("valid pepper")),
        previous: None,
    }
}

fn main() {
    let server = RedisServer::start();
    let mut cluster = RedisCluster::start(3, 0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let options = ConnectOptions::with_timeout(Duration::from_secs(5));
    let (standalone, clustered) = runtime.block_on(async {
        let standalone = RedisStore::connect(&server.url(), keys(), &options)
            .await
            .expect("connect to Redis");
        let clustered = ClusterStore::connect(&cluster.urls(), keys(), &options, VALVE_SHARDS)
            .await
            .expect("connect to the cluster");
        (standalone, clustered)
    });
    let policy = || {
        Policy::compile_for(
            &Config::from_yaml(YAML, "bench.yaml").expect("valid").limits,
            true,
        )
    };
    let standalone = Arc::new(Limiter::new(policy(), standalone, OnError::Deny));
    let clustered = Arc::new(Limiter::new(policy(), clustered, OnError::Deny));

    println!(
        "{:<34} {:>14} {:>22}",
        "", "decisions/s", "Redis CPU µs/decision"
    );
    for (route, rules, label) in [
        ("GET /v1/things", 2, "tenant + route"),
        ("POST /v1/valved", 3, "tenant + route + global valve"),
    ] {
        reset(&mut [&mut server.connection()]);
        let one = runtime.block_on(load(&standalone, route, rules));
        let one_cpu = script_usec(&mut [&mut server.connection()]) / one.0;
        let mut nodes: Vec<redis::Connection> = cluster
            .master_ports()
            .into_iter()
            .map(|port| cluster.node(port).connection())
            .collect();
        reset(&mut nodes.iter_mut().collect::<Vec<_>>());
        let three = runtime.block_on(load(&clustered, route, rules));
        let three_cpu = script_usec(&mut nodes.iter_mut().collect::<Vec<_>>()) / three.0;
        println!("{label}:");
        println!(
            "{:<34} {:>14.0} {:>22.2}",
            "  standalone Redis", one.1, one_cpu
        );
        println!(
            "{:<34} {:>14.0} {:>22.2}",
            "  Redis Cluster, 3 masters", three.1, three_cpu
        );
        println!("  ratio cluster / standalone: {:.2}", three.1 / one.1);
    }
}

fn reset(connections: &mut [&mut redis::Connection]) {
    for connection in connections {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(*connection)
            .expect("reset stats");
    }
}

/// Microseconds spent in `FCALL` (the decisions) and `EVALSHA`/`EVAL`
/// (refunds), summed over the nodes.
fn script_usec(connections: &mut [&mut redis::Connection]) -> f64 {
    connections
        .iter_mut()
        .map(|c| {
            ["fcall", "evalsha", "eval"]
                .iter()
                .filter_map(|command| command_usec(c, command))
                .map(|(_, usec)| usec as f64)
                .sum::<f64>()
        })
        .sum()
}

/// Decisions made, and per second, in `SECONDS` of `TASKS` concurrent
/// tasks.
async fn load<S: Store + 'static>(
    limiter: &Arc<Limiter<S>>,
    route: &'static str,
    rules: usize,
) -> (f64, f64) {
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
                    let request = Request::new(&tenants[i], route, None, 1).expect("valid");
                    let decision = limiter.decide(&policy, &request).await;
                    assert!(
                        decision.allowed && decision.degraded.is_none(),
                        "{decision:?}"
                    );
                    assert_eq!(decision.outcomes.len(), rules, "decided by Redis");
                    decided.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    let decided = decided.load(Ordering::Relaxed) as f64;
    (decided, decided / started.elapsed().as_secs_f64())
}
