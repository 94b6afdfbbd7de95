//! Measures Redis memory per key for each algorithm (`MEMORY USAGE`).
//!
//! Starts its own `redis-server` on a free loopback port, makes one
//! admission (cost 1, and cost 10 for sliding_log) per algorithm through the
//! real script, and prints `MEMORY USAGE` of the key it wrote; then the
//! key of three rules of one scope (gcra, token_bucket, fixed_window: a
//! record each).
//!
//! Run: `cargo run --release -p sluice-store --example redis_memory`.

use std::time::Duration;

use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Algorithm, Config, Policy};
use sluice_store::{Batch, ConnectOptions, KeySet, RedisStore, Store, Valve};
use sluice_testkit::RedisServer;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let server = RedisServer::start();
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
    let mut conn = server.connection();
    println!("{:<16} {:>6} {:>14}", "algorithm", "cost", "MEMORY USAGE");
    for algorithm in Algorithm::ALL {
        for cost in [1u64, 10] {
            if cost > 1 && algorithm != Algorithm::SlidingLog {
                continue;
            }
            let window = if algorithm == Algorithm::Concurrency {
                "lease"
            } else {
                "per"
            };
            let yaml = format!(
                "default_plan: p\nplans:\n  p:\n    tenant: [{{ algorithm: {}, limit: 100, {window}: 1h }}]\n",
                algorithm.name()
            );
            let policy = Policy::compile(
                &Config::from_yaml(&yaml, "measure.yaml")
                    .expect("valid")
                    .limits,
            );
            let tenant = format!("{}-{cost}", algorithm.name());
            let rules = policy.applicable(&tenant, "GET /", false).rules;
            // A concurrency rule writes only when it takes a lease.
            let batch = Batch {
                lease: Some(1),
                ..Batch::new(&tenant, None, cost, rules)
            };
            let outcomes = store.decide(&batch).await.expect("decide").outcomes;
            assert!(outcomes[0].allowed);
            let key = KeySet::keys(&store.keys().current, &batch, Valve::WHOLE)
                .keys
                .remove(0);
            let bytes: u64 = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&key)
                .query(&mut conn)
                .expect("MEMORY USAGE");
            println!("{:<16} {:>6} {:>14}", algorithm.name(), cost, bytes);
        }
    }
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 100, per: 1h }, { algorithm: token_bucket, limit: 100, per: 1h }, { algorithm: fixed_window, limit: 100, per: 1h }]\n";
    let policy = Policy::compile(
        &Config::from_yaml(yaml, "measure.yaml")
            .expect("valid")
            .limits,
    );
    let rules = policy.applicable("three", "GET /", false).rules;
    let batch = Batch::new("three", None, 1, rules);
    let outcomes = store.decide(&batch).await.expect("decide").outcomes;
    assert!(outcomes.iter().all(|o| o.allowed));
    let keys = KeySet::keys(&store.keys().current, &batch, Valve::WHOLE).keys;
    assert!(keys.iter().all(|k| *k == keys[0]), "one key for the three");
    let bytes: u64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&keys[0])
        .query(&mut conn)
        .expect("MEMORY USAGE");
    println!("{:<16} {:>6} {:>14}", "three rules", 1, bytes);
}
