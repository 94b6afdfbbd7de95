//! Slice arithmetic, memory ≡ Lua: the same random sequences of requests
//! (which instance, what cost, how much time passes) through two
//! instances on the memory store and two on a real Redis, on one injected
//! clock, give identical decisions (every rule's outcome) and the same
//! number of store calls. A take is a decision of `cost + slice`, so this
//! holds the Lua scripts to the memory engine for takes, and the slices'
//! local arithmetic (sizes, spends, what goes back) to itself on both.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use sluice_core::config::OnError;

use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{
    ConnectOptions, KeySet, Limiter, LimiterOptions, ManualClock, MemoryStore, RedisStore, Store,
    StoreError, Telemetry, TimeSource,
};
use sluice_testkit::RedisServer;

mod remote;
use remote::Remote;

#[derive(Default)]
struct Calls(AtomicU64);

impl Telemetry for Calls {
    fn store_call(&self, _: Duration, _: Option<&StoreError>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

const CONFIG: &str = r#"
default_plan: p
plans:
  p:
    tenant:
      - { algorithm: gcra, limit: 600000, per: 1m, burst: 5000, tolerance: "2%" }
    routes:
      "GET /w":
        - { algorithm: fixed_window, aligned: true, limit: 600, per: 2s, tolerance: "5%" }
      "GET /t":
        - { algorithm: token_bucket, limit: 2000, per: 1s, burst: 900, tolerance: "10%" }
"#;

const ROUTES: [&str; 3] = ["GET /w", "GET /t", "GET /other"];

fn limiter<S: Store>(store: S, clock: &Arc<ManualClock>, calls: &Arc<Calls>) -> Limiter<S> {
    let policy = Policy::compile(&Config::from_yaml(CONFIG, "t.yaml").unwrap().limits);
    let mut options = LimiterOptions::new(OnError::Deny);
    options.clock = clock.clone();
    options.telemetry = calls.clone();
    options.denial_cache = true;
    Limiter::with_options(policy, store, options)
}

#[test]
fn slices_decide_the_same_on_memory_and_redis() {
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let case = AtomicU64::new(0);
    let (decided, called) = (AtomicU64::new(0), AtomicU64::new(0));
    let steps = prop::collection::vec((0usize..2, 0usize..3, 1u64..=2, 0u64..3), 1_000..2_500);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 16,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    runner
        .run(&steps, |steps| {
            runtime.block_on(async {
                let tenant = format!("t{}", case.fetch_add(1, Ordering::Relaxed));
                let clock = Arc::new(ManualClock::new(1_764_460_800_000));
                let memory = Arc::new(MemoryStore::with_clock(10_000, clock.clone()));
                let (memory_calls, redis_calls) =
                    (Arc::new(Calls::default()), Arc::new(Calls::default()));
                let mut on_memory = Vec::new();
                let mut on_redis = Vec::new();
                for _ in 0..2 {
                    on_memory.push(limiter(Remote::new(memory.clone()), &clock, &memory_calls));
                    let keys = KeySet {
                        current: Keyer::new("sd", &Pepper::parse(&[b'q'; 32]).unwrap()),
                        previous: None,
                    };
                    let store = RedisStore::connect(
                        &server.url(),
                        keys,
                        &ConnectOptions::with_timeout(Duration::from_secs(5)),
                    )
                    .await
                    .unwrap()
                    .with_time(TimeSource::Client(clock.clone()));
                    on_redis.push(limiter(store, &clock, &redis_calls));
                }
                for (n, (instance, route, cost, advance)) in steps.iter().enumerate() {
                    let request = Request::new(&tenant, ROUTES[*route], None, *cost).unwrap();
                    let m = &on_memory[*instance];
                    let r = &on_redis[*instance];
                    let (mp, rp) = (m.policy(), r.policy());
                    let md = m.decide(&mp, &request).await;
                    let rd = r.decide(&rp, &request).await;
                    prop_assert_eq!(
                        (md.allowed, &md.outcomes),
                        (rd.allowed, &rd.outcomes),
                        "step {}",
                        n
                    );
                    prop_assert_eq!(
                        memory_calls.0.load(Ordering::Relaxed),
                        redis_calls.0.load(Ordering::Relaxed),
                        "store calls after step {}",
                        n
                    );
                    clock.advance(*advance);
                }
                prop_assert_eq!(
                    on_memory[0].slices_of(&tenant),
                    on_redis[0].slices_of(&tenant)
                );
                decided.fetch_add(steps.len() as u64, Ordering::Relaxed);
                called.fetch_add(redis_calls.0.load(Ordering::Relaxed), Ordering::Relaxed);
                Ok(())
            })
        })
        .unwrap();
    let (decided, called) = (decided.into_inner(), called.into_inner());
    assert!(
        called * 2 < decided,
        "slices were taken and spent: {called} calls for {decided} decisions"
    );
}
