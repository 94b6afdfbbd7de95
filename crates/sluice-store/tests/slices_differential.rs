//! Slice arithmetic, memory ≡ Lua: the same random sequences of requests
//! (which instance, what cost, how much time passes) through two
//! instances on the memory store and two on a real Redis, on one injected
//! clock, give identical decisions (every rule's outcome) and the same
//! number of store calls. A take is a decision of `cost + slice`, so this
//! holds the Lua scripts to the memory engine for takes, and the slices'
//! local arithmetic (sizes, spends, what goes back) to itself on both.
//!
//! What slices give back is held to the Lua scripts too: random sequences
//! of requests on two instances sharing one store that is the memory store
//! and Redis (one node, and Redis Cluster) side by side (`twin/mod.rs`),
//! with give-back passes, instances giving back all they hold, reloads
//! that drop slices, long gaps that let them expire and clock steps; every
//! take and every give-back (`Change::GiveBack` naming the take's time and
//! `whole_at`) must be answered alike and leave the same states.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use sluice_core::config::OnError;

use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{
    Clock, ConnectOptions, KeySet, Limiter, LimiterOptions, ManualClock, MemoryStore, RedisStore,
    Store, StoreError, Telemetry, TimeSource,
};
use sluice_testkit::RedisServer;

mod remote;
use remote::Remote;
mod twin;

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

fn limiter<S: Store>(
    store: S,
    yaml: &str,
    clock: &Arc<ManualClock>,
    calls: &Arc<Calls>,
) -> Limiter<S> {
    let policy = Policy::compile(&Config::from_yaml(yaml, "t.yaml").unwrap().limits);
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
                    on_memory.push(limiter(
                        Remote::new(memory.clone()),
                        CONFIG,
                        &clock,
                        &memory_calls,
                    ));
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
                    on_redis.push(limiter(store, CONFIG, &clock, &redis_calls));
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

/// Rules whose slices' give-backs return all, some or none of what they
/// hold: a token bucket refilling slowly (100,000 an hour), whose slices
/// can still be given back whole long after their take; a `gcra` of 300 a
/// second that the load keeps near its limit; the tenant's `gcra`, which
/// refills what its slices held within milliseconds (a give-back then
/// returns nothing); a window, into which units go back until it ends.
const GIVE_BACKS: &str = r#"
default_plan: p
plans:
  p:
    tenant:
      - { algorithm: gcra, limit: 600000, per: 1m, burst: 5000, tolerance: "2%" }
    routes:
      "GET /w":
        - { algorithm: fixed_window, aligned: true, limit: 3000, per: 2s, tolerance: "5%" }
      "GET /t":
        - { algorithm: token_bucket, limit: 100000, per: 1h, burst: 20000, tolerance: "2%" }
      "GET /g":
        - { algorithm: gcra, limit: 300, per: 1s, burst: 600, tolerance: "10%" }
"#;

const GIVE_BACK_ROUTES: [&str; 3] = ["GET /w", "GET /t", "GET /g"];

/// What happens before a step's request, beside time moving on.
#[derive(Debug, Clone, Copy)]
enum Event {
    Decide,
    /// The instance gives back what its slices dropped or let expire
    /// unspent held (what `sluice serve` does every 100 ms).
    GiveBackDropped,
    /// The instance gives back every slice it holds (it stops), then goes
    /// on deciding.
    GiveBackAll,
    /// A reload on the instance: the token bucket's tolerance and the
    /// window's limit changed (their slices dropped), or changed back.
    Reload,
    /// The clock steps back an hour.
    Back,
    /// The clock steps forward an hour.
    Forward,
}

/// (instance, route, cost, gap, event).
fn takes_and_give_backs() -> impl Strategy<Value = Vec<(usize, usize, u64, u64, Event)>> {
    let cost = prop_oneof![20 => 1u64..=2, 1 => 5u64..=40];
    // Mostly under a millisecond apart (each key hot on each instance),
    // now and then long enough for slices to expire or keys to cool.
    let gap = prop_oneof![4_000 => 0u64..3, 8 => 50u64..300, 1 => 1_000u64..2_500];
    // A key is hot (takes slices) from its second second of about 100
    // decisions a second on an instance: what cools it (a reload of its
    // rule, a clock step) comes about once a case.
    let event = prop_oneof![
        6_000 => Just(Event::Decide),
        120 => Just(Event::GiveBackDropped),
        1 => Just(Event::GiveBackAll),
        1 => Just(Event::Reload),
        1 => Just(Event::Back),
        1 => Just(Event::Forward),
    ];
    prop::collection::vec((0usize..2, 0usize..3, cost, gap, event), 1_000..2_000)
}

/// Runs `steps` through two instances on `twin`: every take (a decision
/// of `cost + slice`) and every give-back (`Change::GiveBack` naming the
/// take's time and `whole_at`) must be answered alike by both stores and
/// leave the same states. Counts the give-backs that returned something
/// into `returned`, and the others into `kept`.
async fn run_takes_and_give_backs<S: Store>(
    twin: twin::Twin<S>,
    clock: &Arc<ManualClock>,
    tenant: &str,
    steps: &[(usize, usize, u64, u64, Event)],
    (returned, kept): (&AtomicU64, &AtomicU64),
) -> Result<(), TestCaseError> {
    let calls = Arc::new(Calls::default());
    let instances = [
        limiter(twin.clone(), GIVE_BACKS, clock, &calls),
        limiter(twin.clone(), GIVE_BACKS, clock, &calls),
    ];
    let reloaded = GIVE_BACKS
        .replace(
            "burst: 20000, tolerance: \"2%\"",
            "burst: 20000, tolerance: \"4%\"",
        )
        .replace("limit: 3000, per: 2s", "limit: 3500, per: 2s");
    let mut changed = [false, false];
    for (n, &(instance, route, cost, gap, event)) in steps.iter().enumerate() {
        clock.advance(gap);
        let on = &instances[instance];
        match event {
            Event::Decide => {}
            Event::GiveBackDropped => {
                on.give_back_dropped_slices().await;
            }
            Event::GiveBackAll => {
                on.give_back_slices().await;
            }
            Event::Reload => {
                changed[instance] = !changed[instance];
                let yaml = if changed[instance] {
                    &reloaded
                } else {
                    GIVE_BACKS
                };
                on.set_policy(Policy::compile(
                    &Config::from_yaml(yaml, "t.yaml").unwrap().limits,
                ));
            }
            Event::Back => clock.set(clock.now_ms() - 3_600_000),
            Event::Forward => clock.advance(3_600_000),
        }
        let request = Request::new(tenant, GIVE_BACK_ROUTES[route], None, cost).unwrap();
        let policy = on.policy();
        on.decide(&policy, &request).await;
        if let Some(diverged) = twin.diverged() {
            prop_assert!(false, "step {} ({:?}): {}", n, event, diverged);
        }
    }
    for on in &instances {
        on.give_back_slices().await;
    }
    if let Some(diverged) = twin.diverged() {
        prop_assert!(false, "the last give-backs: {}", diverged);
    }
    for call in twin.calls() {
        if let Some(sluice_store::Change::GiveBack { .. }) = call.change {
            let counter = if call.changed { returned } else { kept };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok(())
}

/// The cases of one store (see `twin::run_cases`), each a tenant of its
/// own; then what they covered is checked: give-backs that returned units
/// and give-backs too late to return any.
fn takes_and_give_backs_cases<S: Store, F: Future<Output = twin::Twin<S>>>(
    cases: u32,
    connect: impl Fn(String, Arc<ManualClock>) -> F,
) {
    let (returned, kept) = (AtomicU64::new(0), AtomicU64::new(0));
    twin::run_cases(
        file!(),
        cases,
        takes_and_give_backs(),
        connect,
        |twin, clock, tenant, steps| {
            let counts = (&returned, &kept);
            async move { run_takes_and_give_backs(twin, &clock, &tenant, &steps, counts).await }
        },
    );
    let (returned, kept) = (returned.into_inner(), kept.into_inner());
    assert!(
        returned >= 2 * u64::from(cases) && kept >= u64::from(cases),
        "give-backs: {returned} returned units, {kept} returned none, over {cases} cases"
    );
}

#[test]
fn takes_and_give_backs_match_on_memory_and_redis() {
    let server = RedisServer::start();
    let url = server.url();
    takes_and_give_backs_cases(8, |prefix, clock| {
        let url = url.clone();
        async move { twin::on_redis(&url, &prefix, &clock).await }
    });
}

#[test]
fn takes_and_give_backs_match_on_memory_and_redis_cluster() {
    let cluster = sluice_testkit::RedisCluster::start(3, 0);
    let urls = cluster.urls();
    takes_and_give_backs_cases(3, |prefix, clock| {
        let urls = urls.clone();
        async move { twin::on_cluster(&urls, &prefix, &clock).await }
    });
}
