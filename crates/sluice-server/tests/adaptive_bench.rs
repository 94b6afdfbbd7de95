//! `sluice bench --scenario adaptive` (see `sluice_server::bench::adaptive`):
//! an adaptive valve before the test kit's downstream, offered twice its
//! capacity by a critical tenant (30%) and a low one (70%), side by side
//! with no valve and a static valve; every mark of the scenario must hold.

use sluice_server::bench::adaptive::{self, Backend, Settings};

/// Runs the scenario with `settings` and asserts its every mark.
async fn passes(settings: Settings) {
    let report = adaptive::run(&settings).await.unwrap();
    print!("{}", adaptive::table(&report));
    let (passed, verdict) = adaptive::verdict(&report);
    assert!(passed, "{verdict}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_two_instances_follow_the_downstream_and_shed_low_first() {
    passes(Settings {
        backend: Backend::Redis,
        ..Settings::default()
    })
    .await;
}

/// The adaptive phases alone (the comparison is the Redis run's).
async fn adaptive_only(backend: Backend) {
    passes(Settings {
        backend,
        phase_ms: 6_000,
        measure_ms: 3_000,
        compare: false,
        ..Settings::default()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_memory_one_instance_follows_the_downstream_and_sheds_low_first() {
    adaptive_only(Backend::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_cluster_two_instances_follow_the_downstream_and_shed_low_first() {
    adaptive_only(Backend::Cluster).await;
}
