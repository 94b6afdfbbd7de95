//! Sweeping idle keys from the memory store, and what a thread deciding
//! meanwhile sees: N tenants decide once, the clock moves a minute on (every
//! key is idle), and `MemoryStore::sweep` removes them all while another
//! thread decides for 1,000 other tenants in a loop. Prints, for three
//! rounds, how long the sweep took and how many decisions the other thread
//! made in that time, with its slowest.
//!
//! Run: `cargo run --release -p sluice-store --example sweep -- 1000000`
//! (N, default 1,000,000); under `strace -c -f -e trace=membarrier` it
//! also counts the barriers the map's reclamation issued.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use sluice_core::{Config, Policy};
use sluice_store::{Batch, ManualClock, MemoryStore};

const YAML: &str = "
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 1000, per: 1s }]
";

fn main() {
    let keys: usize = std::env::args()
        .nth(1)
        .map_or(1_000_000, |n| n.parse().expect("a number of keys"));
    let config = Config::from_yaml(YAML, "sweep.yaml").expect("valid");
    let policy = Policy::compile(&config.limits);
    let rules = policy.applicable("any", "GET /", false).rules.to_vec();
    let tenants: Vec<String> = (0..keys).map(|i| format!("tenant-{i:07}")).collect();
    for round in 0..3u64 {
        let clock = Arc::new(ManualClock::new(1_000_000 + round * 10_000_000));
        let store = Arc::new(MemoryStore::with_clock(keys + 1_000, clock.clone()));
        for tenant in &tenants {
            let batch = Batch::new(tenant, None, 1, &rules);
            assert!(store.decide_now(&batch).expect("room for every key")[0].allowed);
        }
        clock.advance(60_000);
        let stop = Arc::new(AtomicBool::new(false));
        let other = {
            let (store, stop, rules) = (store.clone(), stop.clone(), rules.clone());
            std::thread::spawn(move || {
                let hot: Vec<String> = (0..1_000).map(|i| format!("hot-{i}")).collect();
                let (mut decisions, mut slowest) = (0usize, Duration::ZERO);
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let batch = Batch::new(&hot[decisions % hot.len()], None, 1, &rules);
                    std::hint::black_box(store.decide_now(&batch).expect("decided"));
                    slowest = slowest.max(started.elapsed());
                    decisions += 1;
                }
                (decisions, slowest)
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        let removed = store.sweep();
        let took = started.elapsed();
        stop.store(true, Ordering::Relaxed);
        let (decisions, slowest) = other.join().expect("the other thread");
        assert_eq!(removed, keys, "every tenant's key was idle");
        println!(
            "swept {removed} keys in {took:.1?}; the other thread: {decisions} decisions in all, slowest {slowest:.1?}"
        );
    }
}
