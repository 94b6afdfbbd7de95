//! Fair valves with real servers (appendix E): a valve of 100/s on
//! `POST /v1/orders`, three noisy tenants inside their own ceilings of
//! 60/s each offering 80/s (past their ceilings, so that the valve is
//! asked for 180/s; no more, so that the machine's own load, the servers'
//! and the load's, stays well under what two shared cores give), one
//! polite tenant sending 10/s, far below its fair share. Loaded open loop over HTTP (the `sluice bench --scenario
//! valve` machinery), on the memory store, on Redis with two instances and
//! on Redis Cluster with two instances (whole valves, and valves split
//! over 4 keys).

mod common;

use std::time::Duration;

use common::{Server, temp_file};
use sluice_server::bench::open::{Api, Class, ClassReport, Load};
use sluice_server::bench::scenario::{self, Outcome};
use sluice_testkit::{RedisCluster, RedisServer};

const PEPPER: &str = "5f1e0d2c3b4a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

/// How long each run is measured, after the shares have converged.
const MEASURED: Duration = Duration::from_secs(20);

fn config(storage: &str) -> String {
    config_with(storage, "", "")
}

/// The scenario's configuration with `plans` added to its plans and
/// `valve` to its valve rule.
fn config_with(storage: &str, plans: &str, valve: &str) -> String {
    format!(
        r#"
{storage}
  timeout: 2s
keys:
  pepper_env: TEST_SLUICE_PEPPER
default_plan: p
plans:
  p:
    tenant: [{{ name: ceiling, algorithm: gcra, limit: 60, per: 1s }}]
{plans}
global:
  "POST /v1/orders": [{{ name: orders, algorithm: gcra, limit: 100, per: 1s{valve} }}]
"#
    )
}

/// `instances` of `sluice serve` on `storage`.
fn serve(storage: &str, instances: usize) -> Vec<Server> {
    serve_config(&config(storage), instances)
}

/// `instances` of `sluice serve` on configuration `yaml`.
fn serve_config(yaml: &str, instances: usize) -> Vec<Server> {
    let path = temp_file("valves.yaml", yaml);
    let mut servers: Vec<Server> = (0..instances)
        .map(|_| {
            Server::start_with_env(
                &["--config", path.to_str().unwrap()],
                &[("TEST_SLUICE_PEPPER", PEPPER)],
            )
        })
        .collect();
    let last = servers.pop().unwrap().keep(path);
    servers.push(last);
    servers
}

/// One scenario at a time, from before its servers start to after they
/// stop: each loads the machine, and what it shows is fairness, not how
/// the machine shares itself between them.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The scenario's load: the bench's run name (its tenants are
/// `<run>-valve-<class>-<i>`), the polite class's rate.
fn load(servers: &[Server]) -> Load {
    let targets: Vec<&str> = servers.iter().map(|s| s.base.as_str()).collect();
    Load {
        api: Api::Http(targets.join(",")),
        route: "POST /v1/orders".into(),
        classes: Vec::new(),
        duration: MEASURED,
        max_in_flight: 1_024,
        run: format!("valves{}", std::process::id()),
        progress: false,
    }
}

/// The scenario against `servers`, each tenant's requests taking turns
/// over them, the polite tenant sending `polite_rate` a second; and each
/// server's `sluice_valve_fair_share_level` samples, scraped every half
/// second while it runs.
async fn run(servers: &[Server], polite_rate: f64) -> (Outcome, Vec<Vec<f64>>) {
    let polite = Class {
        name: "polite".into(),
        tenants: 1,
        rate: polite_rate,
    };
    let noisy = Class {
        name: "noisy".into(),
        tenants: 3,
        rate: 80.0,
    };
    let bases: Vec<String> = servers.iter().map(|s| s.base.clone()).collect();
    let done = std::sync::Arc::new(tokio::sync::Notify::new());
    let sampler = tokio::spawn({
        let done = done.clone();
        async move {
            let mut samples = vec![Vec::new(); bases.len()];
            loop {
                for (base, samples) in bases.iter().zip(&mut samples) {
                    samples.extend(share_level(base).await);
                }
                tokio::select! {
                    () = done.notified() => return samples,
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    });
    let outcome = scenario::valve(&load(servers), polite, noisy)
        .await
        .unwrap();
    done.notify_one();
    (outcome, sampler.await.unwrap())
}

/// The valve's share level `base` exports: `None` while it is not
/// saturated (+Inf), or when the scrape failed. Panics unless there is
/// exactly one series (one level per valve, not per key or part).
async fn share_level(base: &str) -> Option<f64> {
    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_valve_fair_share_level{"))
        .collect();
    if series.is_empty() {
        return None;
    }
    assert_eq!(series.len(), 1, "one share level per valve: {series:?}");
    assert!(series[0].contains(r#"valve="orders""#), "{}", series[0]);
    let level: f64 = series[0].rsplit(' ').next().unwrap().parse().unwrap();
    level.is_finite().then_some(level)
}

/// What the servers' failure policies decided: none, for the figures to
/// be the store's (a machine too busy to answer in the time budget would
/// have the valve decided per instance).
async fn failed_over(servers: &[Server]) -> f64 {
    let mut total = 0.0;
    for server in servers {
        let metrics = reqwest::get(format!("{}/metrics", server.base))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        total += common::metric_total(&metrics, "sluice_failure_policy_decisions_total");
    }
    total
}

/// What appendix E promises of this scenario, checked on `outcome`: the
/// polite tenant, asking for `polite_rate` a second (below its share, or
/// its plan's reserve), is almost never denied; the noisy ones share the
/// rest evenly, and every instance's share level says so. The polite
/// tenant's bound is 5 %, not appendix E's 2 % (which the deterministic
/// `sluice-store` `tests/fair.rs` holds): on two cores shared with other
/// builds, a server stalled for a moment while the load runs on is seen
/// denying it 3.5 % with the load on time.
fn holds(outcome: &Outcome, levels: &[Vec<f64>], store: &str, polite_rate: f64) {
    eprintln!("{store}: {}; share levels {levels:?}", outcome.verdict);
    let measured: &[ClassReport] = &outcome.phases[1].classes;
    let (polite, noisy) = (&measured[0], &measured[1]);
    let seconds = MEASURED.as_secs_f64();
    assert_eq!(
        polite.errors + noisy.errors,
        0,
        "{store}: {}",
        outcome.verdict
    );
    assert!(
        polite.denied * 100 <= polite.sent * 5,
        "{store}: the polite tenant was denied {} of {}: {}",
        polite.denied,
        polite.sent,
        outcome.verdict
    );
    // The noisy tenants share the rest evenly (with a polite 10/s, 30/s
    // each), ±25%.
    let share = (100.0 - polite_rate) / 3.0;
    for (i, &admitted) in noisy.admitted_per_tenant.iter().enumerate() {
        let rate = admitted as f64 / seconds;
        assert!(
            (share * 0.75..=share * 1.25).contains(&rate),
            "{store}: noisy tenant {i} had {rate:.1}/s, not about {share:.1}: {}",
            outcome.verdict
        );
    }
    // Each instance's one level for the valve, while it was saturated, is
    // that share (a tenant of weight 1 gets it): its median within 25%
    // (35% on Redis Cluster, where a split valve's level is learned from
    // the one key each decision drew from: a median of 16.1 for 21.7 in
    // one unloaded run; the share itself is held to 2% with a hand-set
    // clock by sluice-store's fair_cluster.rs).
    let spread = if store.starts_with("redis-cluster") {
        0.35
    } else {
        0.25
    };
    for (i, samples) in levels.iter().enumerate() {
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        assert!(
            sorted.len() >= 3,
            "{store}: instance {i} saturated in {} scrapes",
            sorted.len()
        );
        let median = sorted[sorted.len() / 2];
        assert!(
            (share * (1.0 - spread)..=share * (1.0 + spread)).contains(&median),
            "{store}: instance {i}'s share level {median:.1}/s, not about {share:.1}: {sorted:?}"
        );
    }
    // The valve's own limit holds: 100 a second, and its burst once.
    let admitted = polite.allowed + noisy.allowed;
    assert!(
        admitted as f64 <= 100.0 * seconds + 100.0,
        "{store}: {admitted} admitted in {seconds} s"
    );
}

/// The scenario on `servers` (started under [`ONE_AT_A_TIME`]), its
/// promises checked, with every decision made by the store (none by a
/// failure policy).
async fn holds_on(servers: &[Server], store: &str) {
    holds_at(servers, store, 10.0).await;
}

/// How far behind its schedule the load itself may fall (99th percentile
/// of its send lag, in any class and phase) for a run to say anything of
/// the service: past it, the machine stalled the generator (another build
/// on the same two cores), the scenario was not what was sent, and it is
/// run again.
const STALLED_LOAD: Duration = Duration::from_millis(100);

/// Runs of the scenario tried before the machine is called too busy.
const ATTEMPTS: usize = 3;

/// [`holds_on`], the polite tenant sending `polite_rate` a second.
async fn holds_at(servers: &[Server], store: &str, polite_rate: f64) {
    for attempt in 1..=ATTEMPTS {
        let (outcome, levels) = run(servers, polite_rate).await;
        let lag = outcome
            .phases
            .iter()
            .flat_map(|p| &p.classes)
            .map(|c| c.send_lag_p99_us)
            .max()
            .unwrap_or(0);
        if lag > STALLED_LOAD.as_micros() as u64 {
            eprintln!(
                "{store}: the load fell {lag} µs behind at p99 (run {attempt}), run again: {}",
                outcome.verdict
            );
            continue;
        }
        let failed = failed_over(servers).await;
        assert_eq!(failed, 0.0, "{store}: the store missed its time budget");
        holds(&outcome, &levels, store, polite_rate);
        return;
    }
    panic!("{store}: the load fell behind in each of {ATTEMPTS} runs: the machine is too busy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_valve_starves_no_one_on_the_memory_store() {
    let _one = ONE_AT_A_TIME.lock().await;
    let servers = serve("storage:\n  backend: memory", 1);
    holds_on(&servers, "memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_valve_starves_no_one_on_redis_with_two_instances() {
    let _one = ONE_AT_A_TIME.lock().await;
    let redis = RedisServer::start();
    let servers = serve(
        &format!("storage:\n  backend: redis\n  url: \"{}\"", redis.url()),
        2,
    );
    holds_on(&servers, "redis").await;
}

/// Two instances on a cluster of three masters, the valve split over
/// `global_shards` keys.
async fn on_a_cluster(global_shards: u16) {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3, 0);
    let nodes = cluster.urls().join(", ");
    let servers = serve(
        &format!(
            "storage:\n  backend: redis-cluster\n  nodes: [{nodes}]\n  global_shards: {global_shards}"
        ),
        2,
    );
    holds_on(
        &servers,
        &format!("redis-cluster, global_shards: {global_shards}"),
    )
    .await;
}

/// The valve on one key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_valve_starves_no_one_on_redis_cluster_with_two_instances() {
    on_a_cluster(1).await;
}

/// The valve over 4 keys (25/s each): one share level per valve, read
/// off all its keys (see `sluice-store`'s `limiter/fair/mod.rs`), so the
/// shares are those of the whole valve: each instance exports one
/// `sluice_valve_fair_share_level` for it, at the whole valve's share
/// (30/s, not a key's 7.5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valve_split_over_four_keys_keeps_one_share_level() {
    on_a_cluster(4).await;
}

/// A valve reserving 40% for the polite tenant's plan, split over 4 keys
/// on the cluster (its rest over 2 of 30/s, the reserve whole on one key
/// of its own slot): the polite tenant asking for 35/s, above the 25/s it
/// would share without the reserve, gets it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plans_reserve_holds_on_redis_cluster_with_two_instances() {
    let _one = ONE_AT_A_TIME.lock().await;
    let cluster = RedisCluster::start(3, 0);
    let nodes = cluster.urls().join(", ");
    let servers = serve_config(
        &reserving(&format!(
            "storage:\n  backend: redis-cluster\n  nodes: [{nodes}]\n  global_shards: 4"
        )),
        2,
    );
    holds_at(&servers, "redis-cluster, reserve 40%", 35.0).await;
}

/// The scenario's configuration with the polite tenant on plan `ent`, for
/// which the valve reserves 40%.
fn reserving(storage: &str) -> String {
    // The tenant `sluice bench` names for the polite class (see `load`).
    let polite = format!("valves{}-valve-polite-0", std::process::id());
    config_with(
        storage,
        &format!(
            "  ent:\n    tenant: [{{ name: ceiling, algorithm: gcra, limit: 60, per: 1s }}]\ntenants:\n  {polite}: {{ plan: ent }}"
        ),
        ", reserve: { ent: \"40%\" }",
    )
}
