//! Measures the memory store's resident bytes per key.
//!
//! Fills a store with one million keys (tenant ids of 12 bytes; one rule per
//! key) for each algorithm and reports the growth of the process's resident
//! set divided by the number of keys, each key a tenant of its own counted
//! against its share as `sluice serve` counts it (the worst case: a
//! tenant's count is held once, however many keys it has). `sliding_log`
//! is measured with one
//! admitted unit per key; each further distinct millisecond adds 16 bytes.
//!
//! Run: `cargo run --release -p sluice-store --example memory_per_key`.

use sluice_core::{Config, Policy, Request};
use sluice_store::{Limiter, MemoryStore};

const KEYS: usize = 1_000_000;

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("Linux /proc");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// Each algorithm is measured in a fresh process, so that memory freed by
/// one measurement is not reused by the next.
fn main() {
    if let Some(algorithm) = std::env::args().nth(1) {
        println!("{algorithm:>16} {:>14}", measure(&algorithm));
        return;
    }
    println!("{:>16} {:>14}", "algorithm", "bytes per key");
    let me = std::env::current_exe().expect("own path");
    for algorithm in [
        "gcra",
        "token_bucket",
        "fixed_window",
        "sliding_window",
        "sliding_log",
    ] {
        let out = std::process::Command::new(&me)
            .arg(algorithm)
            .output()
            .expect("measurement runs");
        print!("{}", String::from_utf8_lossy(&out.stdout));
    }
}

fn measure(algorithm: &str) -> u64 {
    let yaml = format!(
        "default_plan: p\nplans:\n  p:\n    tenant: [{{ algorithm: {algorithm}, limit: 100, per: 1h }}]\n"
    );
    let config = Config::from_yaml(&yaml, "measure.yaml").expect("valid config");
    let tenants: Vec<String> = (0..KEYS).map(|i| format!("tenant-{i:05}")).collect();
    let limiter = Limiter::new(
        Policy::compile(&config.limits),
        // As `sluice serve` makes it: each tenant's keys counted against
        // its share (here every key is a tenant of its own).
        MemoryStore::new(2 * KEYS)
            .with_tenant_share(config.storage.max_entries_per_tenant as usize),
        config.storage.on_error,
    );
    let policy = limiter.policy();
    let before = resident_bytes();
    for tenant in &tenants {
        let request = Request::new(tenant, "GET /", None, 1).expect("valid request");
        assert!(limiter.decide_now(&policy, &request).allowed);
    }
    let after = resident_bytes();
    assert_eq!(limiter.store().len(), KEYS);
    (after - before) / KEYS as u64
}
