//! An adaptive valve on Redis Cluster with `global_shards`: its limit
//! changes per decision, and with it would the number of keys a split
//! valve spreads over, so it is kept whole on one key. Low traffic at its
//! part never takes what critical traffic is owed, as on a static valve
//! split over every key.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{
    ClusterStore, ConnectOptions, KeySet, Limiter, LimiterOptions, ManualClock, TimeSource,
};
use sluice_testkit::RedisCluster;

const YAML: &str = r#"
default_plan: low
plans:
  low: { priority: low, tenant: [{ name: t, limit: 100000, per: 1s }] }
  critical: { priority: critical, tenant: [{ name: t, limit: 100000, per: 1s }] }
tenants:
  vip: { plan: critical }
global:
  "POST /v1/search":
    - { name: db, algorithm: fixed_window, limit: 400, per: 1h, share: first_come, adaptive: { latency_target: 100ms } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn low_never_takes_what_critical_is_owed_on_a_cluster() {
    run(YAML).await;
}

/// The same valve, not adaptive, split over 16 keys: no critical denial.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_valve_split_over_keys_denies_no_critical() {
    run(&YAML.replace(", adaptive: { latency_target: 100ms }", "")).await;
}

async fn run(yaml: &str) {
    let cluster = RedisCluster::start(3, 0);
    let clock = Arc::new(ManualClock::new(1_764_460_800_000));
    let keys = KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[b'q'; 32]).unwrap()),
        previous: None,
    };
    let budget = Duration::from_secs(2);
    let store = ClusterStore::connect(
        &cluster.urls(),
        keys,
        &ConnectOptions::with_timeout(budget),
        16,
    )
    .await
    .unwrap()
    .with_time(TimeSource::Client(clock.clone()));
    let mut options = LimiterOptions::new(OnError::Deny);
    options.timeout = Some(budget);
    options.clock = clock.clone();
    let policy = Policy::compile_for(&Config::from_yaml(yaml, "c.yaml").unwrap().limits, true);
    let limiter = Limiter::with_options(policy, store, options);
    let policy = limiter.policy();
    let search = |tenant| Request::new(tenant, "POST /v1/search", None, 1).unwrap();
    let mut low = 0;
    // The static control: stop low at 100, as the adaptive valve does.
    for _ in 0..200 {
        if low == 100 {
            break;
        }
        low += u32::from(limiter.decide(&policy, &search("anyone")).await.allowed);
    }
    let mut denied = 0;
    for _ in 0..64 {
        denied += u32::from(!limiter.decide(&policy, &search("vip")).await.allowed);
    }
    assert_eq!(
        denied, 0,
        "low holds {low} of a 400 valve; {denied} of 64 critical requests were denied by it"
    );
}
