//! One embedded decision, side by side with `governor`'s keyed limiter.
//!
//! Both sides cycle through 10,000 tenants whose keys are already in the
//! map, with limits high enough that every request is admitted, so what is
//! measured is the hot path: look the key up, decide, commit.
//!
//! - `single_gcra`: one gcra rule per tenant, against one governor keyed
//!   check.
//! - `three_scopes`: tenant + route + subject rules (gcra, token_bucket,
//!   sliding_window) decided atomically, against three independent governor
//!   checks (which are not atomic: a reference point, not an equivalent).
//!
//! - `valve`: a tenant rule and a global valve with room, `fair` (the
//!   default: the tenant's gate decided too) against `first_come`.
//!
//! `sluice` is the synchronous in-process call (`Limiter::decide_now`);
//! `sluice_async` is the same decision through the async `Limiter::decide`
//! that the server uses, polled once; `sluice_store_only` is the memory
//! store's part alone (no plan or route lookup, no decision summary).
//!
//! Run: `cargo bench -p sluice-store --bench decision`.

use std::hint::black_box;
use std::num::NonZeroU32;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use sluice_core::Request;
use sluice_store::Batch;

mod cases;
use cases::{SINGLE, TENANTS, THREE, VALVE_FAIR, VALVE_FIRST_COME, limiter, now};

fn decisions(c: &mut Criterion) {
    let tenants = cases::tenants();
    let quota = Quota::per_second(NonZeroU32::new(1_000_000).unwrap());

    let mut group = c.benchmark_group("embedded_decision");

    let single = limiter(SINGLE);
    let policy = single.policy();
    for t in &tenants {
        now(single.decide(
            &policy,
            &Request::new(t, "GET /v1/things", None, 1).unwrap(),
        ));
    }
    let mut i = 0;
    group.bench_function(BenchmarkId::new("sluice", "single_gcra"), |b| {
        b.iter(|| {
            i = (i + 1) % TENANTS;
            let request = Request::new(&tenants[i], "GET /v1/things", None, 1).unwrap();
            let decision = single.decide_now(&policy, &request);
            assert!(decision.allowed);
            black_box(decision.remaining())
        })
    });
    group.bench_function(BenchmarkId::new("sluice_async", "single_gcra"), |b| {
        b.iter(|| {
            i = (i + 1) % TENANTS;
            let request = Request::new(&tenants[i], "GET /v1/things", None, 1).unwrap();
            let decision = now(single.decide(&policy, &request));
            assert!(decision.allowed);
            black_box(decision.remaining())
        })
    });

    // The store alone: no policy lookup, no decision summary.
    let rules = policy.applicable("any", "GET /v1/things", false).rules;
    group.bench_function(BenchmarkId::new("sluice_store_only", "single_gcra"), |b| {
        b.iter(|| {
            i = (i + 1) % TENANTS;
            let batch = Batch::new(&tenants[i], None, 1, rules);
            black_box(single.store().decide_now(&batch).unwrap()[0].allowed)
        })
    });

    let governor = RateLimiter::keyed(quota);
    for t in &tenants {
        let _ = governor.check_key(t);
    }
    group.bench_function(BenchmarkId::new("governor", "single_gcra"), |b| {
        b.iter(|| {
            i = (i + 1) % TENANTS;
            black_box(governor.check_key(&tenants[i]).is_ok())
        })
    });

    let three = limiter(THREE);
    let policy = three.policy();
    for t in &tenants {
        now(three.decide(
            &policy,
            &Request::new(t, "GET /v1/things", Some("user-1"), 1).unwrap(),
        ));
    }
    group.bench_function(BenchmarkId::new("sluice", "three_scopes"), |b| {
        b.iter(|| {
            i = (i + 1) % TENANTS;
            let request = Request::new(&tenants[i], "GET /v1/things", Some("user-1"), 1).unwrap();
            let decision = three.decide_now(&policy, &request);
            assert!(decision.allowed);
            black_box(decision.remaining())
        })
    });

    let by_tenant = RateLimiter::keyed(quota);
    let by_route = RateLimiter::keyed(quota);
    let by_subject = RateLimiter::keyed(quota);
    let route_keys: Vec<(String, &str)> = tenants
        .iter()
        .map(|t| (t.clone(), "GET /v1/things"))
        .collect();
    let subject_keys: Vec<(String, &str, &str)> = tenants
        .iter()
        .map(|t| (t.clone(), "GET /v1/things", "user-1"))
        .collect();
    group.bench_function(BenchmarkId::new("governor", "three_scopes"), |b| {
        b.iter(|| {
            i = (i + 1) % TENANTS;
            let ok = by_tenant.check_key(&tenants[i]).is_ok()
                && by_route.check_key(&route_keys[i]).is_ok()
                && by_subject.check_key(&subject_keys[i]).is_ok();
            black_box(ok)
        })
    });
    group.finish();

    let mut group = c.benchmark_group("valve");
    for (name, yaml) in [("first_come", VALVE_FIRST_COME), ("fair", VALVE_FAIR)] {
        let valve = limiter(yaml);
        let policy = valve.policy();
        for t in &tenants {
            now(valve.decide(
                &policy,
                &Request::new(t, "GET /v1/things", None, 1).unwrap(),
            ));
        }
        group.bench_function(BenchmarkId::new("sluice", name), |b| {
            b.iter(|| {
                i = (i + 1) % TENANTS;
                let request = Request::new(&tenants[i], "GET /v1/things", None, 1).unwrap();
                let decision = valve.decide_now(&policy, &request);
                assert!(decision.allowed);
                black_box(decision.remaining())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, decisions);
criterion_main!(benches);
