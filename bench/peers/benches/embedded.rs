//! One in-process decision against one limit per key, 10,000 keys, every
//! request admitted: sluice (fixed_window and gcra) next to governor's keyed
//! GCRA and limitador's in-memory fixed window, in one run.
//!
//! Run: `cargo bench --manifest-path bench/peers/Cargo.toml --bench embedded`.

use std::collections::HashMap;
use std::hint::black_box;
use std::num::NonZeroU32;

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use limitador::limit::{Context, Limit};
use sluice_core::config::OnError;
use sluice_core::{Config, Policy, Request};
use sluice_store::{Limiter, MemoryStore};

const KEYS: usize = 10_000;

fn sluice(algorithm: &str) -> Limiter<MemoryStore> {
    let yaml = format!(
        "default_plan: p\nplans:\n  p:\n    tenant: [{{ algorithm: {algorithm}, limit: 1000000000, per: 1s }}]\n"
    );
    let config = Config::from_yaml(&yaml, "bench.yaml").expect("valid");
    Limiter::new(Policy::compile(&config.limits), MemoryStore::new(100_000), OnError::Deny)
}

fn decisions(c: &mut Criterion) {
    let keys: Vec<String> = (0..KEYS).map(|i| format!("tenant-{i:05}")).collect();
    let mut group = c.benchmark_group("one_limit_per_key");

    for algorithm in ["fixed_window", "gcra"] {
        let limiter = sluice(algorithm);
        let policy = limiter.policy();
        let mut i = 0;
        group.bench_function(format!("sluice_{algorithm}"), |b| {
            b.iter(|| {
                i = (i + 1) % KEYS;
                let request = Request::new(&keys[i], "GET /", None, 1).expect("valid");
                let decision = limiter.decide_now(&policy, &request);
                assert!(decision.allowed);
                black_box(decision.allowed)
            })
        });
    }

    let governor = RateLimiter::keyed(Quota::per_second(NonZeroU32::new(1_000_000_000).expect("non-zero")));
    let mut i = 0;
    group.bench_function("governor_gcra", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            let allowed = governor.check_key(&keys[i]).is_ok();
            assert!(allowed);
            black_box(allowed)
        })
    });

    let limitador = limitador::RateLimiter::new(100_000);
    limitador.add_limit(Limit::new(
        "bench",
        1_000_000_000,
        1,
        Vec::<limitador::limit::Predicate>::new(),
        vec!["tenant".try_into().expect("a variable")],
    ));
    let namespace = "bench".into();
    // Contexts are built per request, as a proxy would from its input.
    let mut i = 0;
    group.bench_function("limitador_fixed_window", |b| {
        b.iter(|| {
            i = (i + 1) % KEYS;
            let values: HashMap<String, String> = HashMap::from([("tenant".to_owned(), keys[i].clone())]);
            let ctx: Context = values.into();
            let result = limitador
                .check_rate_limited_and_update(&namespace, &ctx, 1)
                .expect("in memory");
            assert!(!result.limited);
            black_box(result.limited)
        })
    });
    group.finish();
}

criterion_group!(benches, decisions);
criterion_main!(benches);
