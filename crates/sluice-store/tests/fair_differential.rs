//! Fair valves' gates, memory ≡ Lua: random sequences of requests from
//! tenants of random weights on a random fair valve (`gcra` or
//! `token_bucket`, with or without a reserve), decided by one limiter whose
//! store is the memory store and a Redis one side by side (see
//! `twin/mod.rs`), on one hand-set clock. The limiter's fair valves set
//! each gate (`Scope::Share`, a `token_bucket` whose rate, limit in the
//! thousands, and burst change on every decision) as the valve's level
//! gives it; both stores must answer every rule alike and be left in the
//! same states, step by step, through clock steps of an hour either way
//! and reloads that change weights and the valve's limit (so the gates'
//! `per`). On one Redis and on Redis Cluster (where the gate is decided in
//! the tenant's slot, the valve after it, and the gate given back when
//! the valve denies).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use sluice_core::config::OnError;
use sluice_core::rule::MAX_LIMIT;
use sluice_core::{Algorithm, Config, Policy, Request, Scope};
use sluice_store::{Clock, Limiter, LimiterOptions, ManualClock, Store};
use sluice_testkit::{RedisCluster, RedisServer};

mod twin;
use twin::Twin;

const HOUR: u64 = 3_600_000;
const ROUTE: &str = "POST /v1/orders";

/// A fair valve and the plans of the tenants that share it.
#[derive(Debug, Clone)]
struct Valve {
    algorithm: Algorithm,
    /// Per second.
    limit: u64,
    extra_burst: u64,
    /// Per plan: weight (thousandths) and the tenants' own ceiling (per
    /// second).
    plans: Vec<(u64, u64)>,
    /// A share of the valve reserved for plan 1, in percent.
    reserve: Option<u64>,
}

impl Valve {
    /// The configuration, the valve's limit and every weight `scale`
    /// times what they are (a reload).
    fn yaml(&self, tenants: usize, scale: (u64, u64)) -> String {
        let mut yaml = String::from("default_plan: p0\nplans:\n");
        for (i, (weight, ceiling)) in self.plans.iter().enumerate() {
            let weight = (weight * scale.1).clamp(1, 1_000_000);
            yaml.push_str(&format!(
                "  p{i}:\n    weight: {}\n    tenant: [{{ name: ceiling, algorithm: gcra, limit: {ceiling}, per: 1s }}]\n",
                weight as f64 / 1_000.0
            ));
        }
        yaml.push_str("tenants:\n");
        for t in 0..tenants {
            yaml.push_str(&format!("  t{t}: {{ plan: p{} }}\n", t % self.plans.len()));
        }
        let limit = self.limit * scale.0;
        let mut valve = format!(
            "{{ name: orders, algorithm: {}, limit: {limit}, per: 1s, burst: {}",
            self.algorithm.name(),
            limit + self.extra_burst
        );
        if let Some(percent) = self.reserve.filter(|_| self.plans.len() > 1) {
            valve.push_str(&format!(", reserve: {{ p1: \"{percent}%\" }}"));
        }
        valve.push_str(" }");
        yaml.push_str(&format!("global:\n  \"{ROUTE}\": [{valve}]\n"));
        yaml
    }
}

fn valve() -> impl Strategy<Value = Valve> {
    let algorithm = prop_oneof![Just(Algorithm::Gcra), Just(Algorithm::TokenBucket)];
    let weight = prop_oneof![
        Just(1u64),
        Just(500),
        Just(1_000),
        Just(3_000),
        Just(1_000_000)
    ];
    let ceiling = prop_oneof![3 => Just(100_000u64), 1 => 5u64..=200];
    (
        algorithm,
        20u64..=400,
        prop_oneof![Just(0u64), 0u64..=200],
        prop::collection::vec((weight, ceiling), 1..=3),
        prop::option::weighted(0.3, 10u64..=60),
    )
        .prop_map(|(algorithm, limit, extra_burst, plans, reserve)| Valve {
            algorithm,
            limit,
            extra_burst,
            plans,
            reserve,
        })
}

/// What happens before a step's request.
#[derive(Debug, Clone, Copy)]
enum Event {
    /// Time moves on by the gap.
    Tick,
    /// The clock steps back an hour.
    Back,
    /// The clock steps forward an hour.
    Forward,
    /// A reload: the valve's limit and the weights this many times those
    /// generated (1: as generated).
    Reload(u64, u64),
}

/// (tenant, cost, gap, event).
fn steps() -> impl Strategy<Value = Vec<(usize, u64, u64, Event)>> {
    let cost = prop_oneof![12 => Just(1u64), 3 => 2u64..=5, 1 => 20u64..=80];
    let gap = prop_oneof![5 => Just(0u64), 5 => 0u64..4, 1 => 0u64..60, 1 => Just(300u64)];
    let scale = prop_oneof![Just(1u64), Just(2), Just(5)];
    let event = prop_oneof![
        40 => Just(Event::Tick),
        1 => Just(Event::Back),
        1 => Just(Event::Forward),
        1 => (scale.clone(), scale).prop_map(|(v, w)| Event::Reload(v, w)),
    ];
    prop::collection::vec((0usize..6, cost, gap, event), 150..400)
}

/// What the cases covered, summed.
#[derive(Default)]
struct Covered {
    cases: AtomicU64,
    /// Cases in which a gate denied.
    gated: AtomicU64,
    /// Gate limits under the open gate's, distinct per case, summed.
    rates: AtomicU64,
    /// Of which in the thousands.
    thousands: AtomicU64,
}

/// Runs `steps` for `tenants` through one limiter on `twin`: every call
/// it makes of the store must be answered alike by both stores.
async fn run<S: Store>(
    twin: Twin<S>,
    clock: &Arc<ManualClock>,
    (valve, tenants): (&Valve, usize),
    steps: &[(usize, u64, u64, Event)],
    covered: &Covered,
) -> Result<(), TestCaseError> {
    let policy = |scale| {
        Policy::compile(
            &Config::from_yaml(&valve.yaml(tenants, scale), "t.yaml")
                .unwrap()
                .limits,
        )
    };
    let options = LimiterOptions {
        clock: clock.clone(),
        ..LimiterOptions::new(OnError::Deny)
    };
    let limiter = Limiter::with_options(policy((1, 1)), twin.clone(), options);
    let names: Vec<String> = (0..tenants).map(|t| format!("t{t}")).collect();
    for (i, &(tenant, cost, gap, event)) in steps.iter().enumerate() {
        clock.advance(gap);
        match event {
            Event::Tick => {}
            Event::Back => clock.set(clock.now_ms() - HOUR),
            Event::Forward => clock.advance(HOUR),
            Event::Reload(v, w) => limiter.set_policy(policy((v, w))),
        }
        let request = Request::new(&names[tenant % tenants], ROUTE, None, cost).unwrap();
        let policy = limiter.policy();
        limiter.decide(&policy, &request).await;
        if let Some(diverged) = twin.diverged() {
            prop_assert!(false, "step {} ({:?}): {}", i, event, diverged);
        }
    }
    let calls = twin.calls();
    let gates = || {
        calls.iter().flat_map(|call| {
            call.rules
                .iter()
                .zip(&call.outcomes)
                .filter(|(rule, _)| rule.scope() == Scope::Share)
        })
    };
    let limits: std::collections::BTreeSet<u64> = gates()
        .map(|(rule, _)| rule.rule().limit())
        .filter(|&limit| limit < MAX_LIMIT)
        .collect();
    covered.cases.fetch_add(1, Ordering::Relaxed);
    if gates().any(|(_, outcome)| !outcome.allowed) {
        covered.gated.fetch_add(1, Ordering::Relaxed);
    }
    covered
        .rates
        .fetch_add(limits.len() as u64, Ordering::Relaxed);
    let thousands = limits.iter().filter(|&&l| l >= 1_000).count();
    covered
        .thousands
        .fetch_add(thousands as u64, Ordering::Relaxed);
    Ok(())
}

/// The cases of one store (see `twin::run_cases`); then what they
/// covered is checked: gates that denied, at many rates.
fn cases<S: Store, F: Future<Output = Twin<S>>>(
    cases: u32,
    connect: impl Fn(String, Arc<ManualClock>) -> F,
) {
    let covered = Covered::default();
    let strategy = (valve(), 2usize..=6, steps());
    twin::run_cases(
        file!(),
        cases,
        strategy,
        connect,
        |twin, clock, _, (valve, tenants, steps)| {
            let covered = &covered;
            async move { run(twin, &clock, (&valve, tenants), &steps, covered).await }
        },
    );
    let (cases, gated) = (covered.cases.into_inner(), covered.gated.into_inner());
    let (rates, thousands) = (covered.rates.into_inner(), covered.thousands.into_inner());
    assert!(
        gated * 3 >= cases,
        "gates denied in {gated} of {cases} cases"
    );
    assert!(
        rates >= 10 * cases && thousands >= 3 * cases,
        "{rates} gate rates ({thousands} in the thousands) over {cases} cases"
    );
}

#[test]
fn gates_decide_the_same_on_memory_and_redis() {
    let server = RedisServer::start();
    let url = server.url();
    cases(16, |prefix, clock| {
        let url = url.clone();
        async move { twin::on_redis(&url, &prefix, &clock).await }
    });
}

/// One Redis Cluster for every case (each under keys of its own).
#[test]
fn gates_decide_the_same_on_memory_and_redis_cluster() {
    let cluster = RedisCluster::start(3, 0);
    let urls = cluster.urls();
    cases(8, |prefix, clock| {
        let urls = urls.clone();
        async move { twin::on_cluster(&urls, &prefix, &clock).await }
    });
}
