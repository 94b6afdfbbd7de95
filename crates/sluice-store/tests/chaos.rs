//! Redis trouble, for real: a paused, killed and restarted `redis-server`
//! under load. Every test is bounded in time and runs on loopback.
//!
//! The recovery times measured here are printed (run with `--nocapture`)
//! and quoted in docs/OPERATIONS.md.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{ConnectOptions, KeySet, Limiter, LimiterOptions, RedisStore};
use sluice_testkit::{RedisServer, command_calls};

const BUDGET: Duration = Duration::from_millis(50);
/// What a decision may take beyond its budget: scheduling on a shared,
/// two-core machine.
const SLACK: Duration = Duration::from_millis(100);

fn keys() -> KeySet {
    KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'z'; 32]).unwrap()),
        previous: None,
    }
}

async fn limiter(server: &RedisServer, yaml: &str, on_error: OnError) -> Arc<Limiter<RedisStore>> {
    let store = RedisStore::connect(&server.url(), keys(), &ConnectOptions::with_timeout(BUDGET))
        .await
        .unwrap();
    let mut options = LimiterOptions::new(on_error);
    options.timeout = Some(BUDGET);
    options.denial_cache = true;
    let policy = Policy::compile_for(&Config::from_yaml(yaml, "chaos.yaml").unwrap().limits, true);
    Arc::new(Limiter::with_options(policy, store, options))
}

const GENEROUS: &str = r#"
default_plan: p
plans:
  p:
    tenant: [{ algorithm: gcra, limit: 100000, per: 1s }]
"#;

/// Decides for `tenant` until `until`, recording the slowest decision and
/// whether any was made by Redis or by the failure policy.
async fn load(
    limiter: Arc<Limiter<RedisStore>>,
    tenant: &'static str,
    until: Instant,
) -> (Duration, u64, u64) {
    let policy = limiter.policy();
    let request = Request::new(tenant, "GET /", None, 1).unwrap();
    let (mut slowest, mut by_store, mut by_policy) = (Duration::ZERO, 0, 0);
    while Instant::now() < until {
        let started = Instant::now();
        let decision = limiter.decide(&policy, &request).await;
        slowest = slowest.max(started.elapsed());
        if decision.degraded.is_some() {
            by_policy += 1;
        } else {
            by_store += 1;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    (slowest, by_store, by_policy)
}

/// Waits until decisions are made by Redis again; returns how long that took.
async fn recovery(limiter: &Limiter<RedisStore>, limit: Duration) -> Duration {
    let policy = limiter.policy();
    let request = Request::new("probe", "GET /", None, 1).unwrap();
    let started = Instant::now();
    loop {
        let decision = limiter.decide(&policy, &request).await;
        if decision.degraded.is_none() && !decision.outcomes.is_empty() {
            return started.elapsed();
        }
        assert!(started.elapsed() < limit, "no recovery within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_never_delays_a_decision_beyond_its_budget() {
    let server = RedisServer::start();
    let limiter = limiter(&server, GENEROUS, OnError::Deny).await;
    // Healthy first.
    let (slowest, by_store, _) = load(
        limiter.clone(),
        "t0",
        Instant::now() + Duration::from_millis(300),
    )
    .await;
    assert!(by_store > 0);
    assert!(
        slowest < BUDGET + SLACK,
        "healthy decision took {slowest:?}"
    );

    server.signal("STOP");
    let until = Instant::now() + Duration::from_secs(2);
    let tasks: Vec<_> = ["a", "b", "c", "d"]
        .into_iter()
        .map(|t| tokio::spawn(load(limiter.clone(), t, until)))
        .collect();
    let mut slowest = Duration::ZERO;
    let mut by_policy = 0;
    for task in tasks {
        let (s, _, p) = task.await.unwrap();
        slowest = slowest.max(s);
        by_policy += p;
    }
    println!(
        "paused Redis: slowest decision {slowest:?} (budget {BUDGET:?}), {by_policy} by on_error"
    );
    assert!(
        slowest <= BUDGET + SLACK,
        "a decision took {slowest:?} with Redis paused"
    );
    assert!(by_policy > 0);
    assert_eq!(limiter.breaker_state(), sluice_store::BreakerState::Open);

    server.signal("CONT");
    let took = recovery(&limiter, Duration::from_secs(10)).await;
    println!("paused Redis: back to Redis {took:?} after SIGCONT");
    assert!(took < Duration::from_secs(5), "recovery took {took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_redis_is_used_again_scripts_and_all() {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, GENEROUS, OnError::Local).await;
    let (_, by_store, _) = load(
        limiter.clone(),
        "t",
        Instant::now() + Duration::from_millis(200),
    )
    .await;
    assert!(by_store > 0);

    server.stop();
    let (slowest, _, by_policy) = load(
        limiter.clone(),
        "t",
        Instant::now() + Duration::from_millis(500),
    )
    .await;
    println!("killed Redis: slowest decision {slowest:?}, {by_policy} by on_error");
    assert!(by_policy > 0, "decisions went on under the failure policy");
    assert!(
        slowest <= BUDGET + SLACK,
        "a decision took {slowest:?} with Redis down"
    );

    let restarted = Instant::now();
    server.restart();
    let took = recovery(&limiter, Duration::from_secs(15)).await;
    println!(
        "killed Redis: back to Redis {took:?} after the new server answered ({:?} after restart began)",
        restarted.elapsed()
    );
    assert!(took < Duration::from_secs(10));
    // The new server had no function: the first calls loaded it again.
    let calls = command_calls(&mut server.connection());
    assert!(calls.get("fcall").copied().unwrap_or(0) > 0, "{calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_limits_across_two_instances_stay_within_the_limit_during_an_outage() {
    // Two instances learn from heartbeats that they are two; during the
    // outage each enforces half of the tenant's 100 per hour.
    let yaml =
        "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 100, per: 1h }]\n";
    let mut server = RedisServer::start();
    let a = limiter(&server, yaml, OnError::Local).await;
    let b = limiter(&server, yaml, OnError::Local).await;
    assert_eq!(
        a.store().heartbeat("instance-a", 5_000).await.unwrap().live,
        1
    );
    let live = b.store().heartbeat("instance-b", 5_000).await.unwrap().live;
    assert_eq!(live, 2);
    a.set_live_instances(live);
    b.set_live_instances(live);

    server.stop();
    let admitted = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .flat_map(|l| [l.clone(), l])
        .map(|limiter| {
            let admitted = admitted.clone();
            tokio::spawn(async move {
                let policy = limiter.policy();
                let request = Request::new("busy", "GET /", None, 1).unwrap();
                for _ in 0..150 {
                    let decision = limiter.decide(&policy, &request).await;
                    assert_eq!(decision.degraded, Some(OnError::Local));
                    if decision.allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let admitted = admitted.load(Ordering::Relaxed);
    println!("outage under local, 2 instances: {admitted} admitted of a 100/h limit");
    assert_eq!(admitted, 100, "each instance admits exactly its half");
}

/// The duplicate guard across two instances and an outage, under
/// `on_error: local`: a fingerprint is admitted at most twice in its
/// window (one extra, by the instance that did not know it), whether it
/// was first admitted before the outage or during it. Before, each
/// instance admitted it once more locally, and Redis once more after (3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fingerprint_is_admitted_at_most_once_per_instance_through_an_outage() {
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: gcra, limit: 100000, per: 1s }]\n    dedupe:\n      \"POST /pay\": { window: 1h }\n";
    let server = RedisServer::start();
    let (a, b) = (
        limiter(&server, yaml, OnError::Local).await,
        limiter(&server, yaml, OnError::Local).await,
    );
    for l in [&a, &b] {
        l.set_live_instances(2);
    }
    let admitted: [AtomicU64; 2] = Default::default();
    let pay = |limiter: Arc<Limiter<RedisStore>>, n: usize| {
        let admitted = &admitted;
        async move {
            let policy = limiter.policy();
            let request = Request::new("acme", "POST /pay", Some("u"), 1)
                .unwrap()
                .with_fingerprint(Some(["f1", "f2"][n]))
                .unwrap();
            if limiter.decide(&policy, &request).await.allowed {
                admitted[n].fetch_add(1, Ordering::Relaxed);
            }
        }
    };
    // f1 admitted through Redis.
    pay(a.clone(), 0).await;
    // Redis paused (it keeps its data): both instances decide locally.
    server.signal("STOP");
    for l in [&a, &b, &a, &b] {
        pay(l.clone(), 0).await;
        pay(l.clone(), 1).await;
    }
    server.signal("CONT");
    for l in [&a, &b] {
        recovery(l, Duration::from_secs(10)).await;
    }
    for l in [&a, &b] {
        pay(l.clone(), 0).await;
        pay(l.clone(), 1).await;
    }
    let admitted = admitted.map(|n| n.load(Ordering::Relaxed));
    assert_eq!(admitted, [2, 2], "f1 and f2: at most one extra each");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_tenant_costs_redis_about_one_call_per_admission_and_reset() {
    // 10 per second in fixed windows; the flooder sends about 500 per
    // second (50× its limit) for 3 seconds; a polite tenant sends 5 per
    // second.
    let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: fixed_window, limit: 10, per: 1s }]\n";
    let server = RedisServer::start();
    let limiter = limiter(&server, yaml, OnError::Deny).await;
    let mut conn = server.connection();
    let before = command_calls(&mut conn).get("fcall").copied().unwrap_or(0);
    let until = Instant::now() + Duration::from_secs(3);

    let flood = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let policy = limiter.policy();
            let request = Request::new("flooder", "GET /", None, 1).unwrap();
            let (mut sent, mut admitted) = (0u64, 0u64);
            while Instant::now() < until {
                for _ in 0..10 {
                    sent += 1;
                    admitted += u64::from(limiter.decide(&policy, &request).await.allowed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (sent, admitted)
        })
    };
    let polite = {
        let limiter = limiter.clone();
        tokio::spawn(async move {
            let policy = limiter.policy();
            let request = Request::new("polite", "GET /", None, 1).unwrap();
            let (mut sent, mut admitted) = (0u64, 0u64);
            while Instant::now() < until {
                sent += 1;
                admitted += u64::from(limiter.decide(&policy, &request).await.allowed);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            (sent, admitted)
        })
    };
    let (flood_sent, flood_admitted) = flood.await.unwrap();
    let (polite_sent, polite_admitted) = polite.await.unwrap();
    let calls = command_calls(&mut conn).get("fcall").copied().unwrap_or(0) - before;
    let flood_calls = calls - polite_sent;
    println!(
        "flood: {flood_sent} requests, {flood_admitted} admitted, {flood_calls} Redis calls; polite: {polite_admitted}/{polite_sent} admitted"
    );
    assert!(flood_sent >= 600, "the flood was {flood_sent} requests");
    assert_eq!(
        polite_admitted, polite_sent,
        "the polite tenant is unaffected"
    );
    // Each 1s window: 10 admissions, then one denial remembered until the
    // window ends. Four windows at most in three seconds.
    assert!(flood_admitted <= 40);
    assert!(
        flood_calls <= flood_admitted + 4 * 2,
        "{flood_calls} calls for the flooder"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_redis_host_costs_no_more_than_the_budget() {
    let store = RedisStore::connect(
        "redis://no-such-host.invalid:6379",
        keys(),
        &ConnectOptions::with_timeout(BUDGET),
    )
    .await
    .unwrap();
    let mut options = LimiterOptions::new(OnError::Allow);
    options.timeout = Some(BUDGET);
    let policy = Policy::compile_for(
        &Config::from_yaml(GENEROUS, "chaos.yaml").unwrap().limits,
        true,
    );
    let limiter = Arc::new(Limiter::with_options(policy, store, options));
    let (slowest, by_store, by_policy) =
        load(limiter, "t", Instant::now() + Duration::from_millis(500)).await;
    println!("unresolvable host: slowest decision {slowest:?}, {by_policy} by on_error");
    assert_eq!(by_store, 0);
    assert!(by_policy > 0);
    assert!(slowest <= BUDGET + SLACK, "a decision took {slowest:?}");
}
