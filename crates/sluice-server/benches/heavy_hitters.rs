//! What counting one decision for heavy hitters costs (every decision on a
//! Redis backend, or with the admin API on): 10,000 tenants in turn, so
//! the 512-tenant summary is full and most tenants are not in it.
//!
//! Run: `cargo bench -p sluice-server --bench heavy_hitters`.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_server::admin::heavy::HeavyHitters;

fn record(c: &mut Criterion) {
    let tenants: Vec<String> = (0..10_000).map(|i| format!("tenant-{i:05}")).collect();
    let heavy = HeavyHitters::default();
    for tenant in &tenants {
        heavy.record(tenant, true, false, 1_000);
    }
    let mut i = 0;
    c.bench_function("heavy_hitters_record_10000_tenants", |b| {
        b.iter(|| {
            i = (i + 1) % tenants.len();
            heavy.record(black_box(&tenants[i]), true, false, 1_000);
        })
    });
}

criterion_group!(benches, record);
criterion_main!(benches);
