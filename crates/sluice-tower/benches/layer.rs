//! What the layer adds to a request through an axum router: the same
//! router and handler with and without `RateLimitLayer` on the memory
//! store (one gcra rule per tenant, 10,000 tenants, every request
//! admitted), side by side in one run.
//!
//! Run: `cargo bench -p sluice-tower --bench layer`.

use std::hint::black_box;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{HeaderName, Request};
use sluice_core::config::OnError;
use sluice_core::{Config, Policy};
use sluice_store::{Limiter, MemoryStore};
use sluice_tower::{FromHeaders, RateLimitLayer};
use tower::ServiceExt;

const TENANTS: usize = 10_000;

fn requests(c: &mut Criterion) {
    let config = Config::from_yaml(
        "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 1000000000, per: 1s }]\n",
        "bench.yaml",
    )
    .expect("valid");
    let limiter = Arc::new(Limiter::new(
        Policy::compile(&config.limits),
        MemoryStore::new(100_000),
        OnError::Deny,
    ));
    let plain: Router = Router::new().route("/v1/things", get(|| async { "things" }));
    let limited = plain.clone().layer(RateLimitLayer::new(
        limiter,
        FromHeaders::new(HeaderName::from_static("x-tenant")),
    ));
    let tenants: Vec<String> = (0..TENANTS).map(|i| format!("tenant-{i:05}")).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");

    let mut group = c.benchmark_group("axum_request");
    for (name, app) in [("without_layer", &plain), ("with_layer", &limited)] {
        let mut i = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) % TENANTS;
                let request = Request::get("/v1/things")
                    .header("x-tenant", tenants[i].as_str())
                    .body(Body::empty())
                    .expect("request");
                let response = runtime
                    .block_on(app.clone().oneshot(request))
                    .expect("infallible");
                assert!(response.status().is_success());
                black_box(response)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, requests);
criterion_main!(benches);
