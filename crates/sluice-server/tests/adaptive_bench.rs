//! `sluice bench --scenario adaptive` (see `sluice_server::bench::adaptive`):
//! an adaptive valve before the test kit's downstream, offered twice its
//! capacity by a critical tenant (30%) and a low one (70%), side by side
//! with no valve and a static valve; every mark of the scenario must hold.

use sluice_server::bench::adaptive::{self, Backend, Settings};

async fn scenario(backend: Backend) {
    let settings = Settings {
        backend,
        ..Settings::default()
    };
    let report = adaptive::run(&settings).await.unwrap();
    print!("{}", adaptive::table(&report));
    let (passed, verdict) = adaptive::verdict(&report);
    assert!(passed, "{verdict}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_two_instances_follow_the_downstream_and_shed_low_first() {
    scenario(Backend::Redis).await;
}

/// The adaptive phases alone (the comparison is the Redis run's).
async fn adaptive_only(backend: Backend) {
    let settings = Settings {
        backend,
        phase_ms: 6_000,
        measure_ms: 3_000,
        compare: false,
        ..Settings::default()
    };
    let report = adaptive::run(&settings).await.unwrap();
    print!("{}", adaptive::table(&report));
    let (passed, verdict) = adaptive::verdict(&report);
    assert!(passed, "{verdict}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_memory_one_instance_follows_the_downstream_and_sheds_low_first() {
    adaptive_only(Backend::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_cluster_two_instances_follow_the_downstream_and_shed_low_first() {
    adaptive_only(Backend::Cluster).await;
}
