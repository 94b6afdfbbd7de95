//! `sluice bench --scenario regions`, shortened: three real redis-servers
//! through the delay proxy, a tenant hammering one shared window linked,
//! partitioned and healed (see `sluice_server::bench::regions`); every
//! mark of the scenario must hold.

use sluice_server::bench::regions::{self, Settings};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_budget_across_three_regions_linked_partitioned_and_healed() {
    let settings = Settings {
        windows: 2,
        partition_ms: 6_000,
        ..Settings::default()
    };
    let report = regions::run(&settings).await.unwrap();
    print!("{}", regions::table(&report));
    let (passed, verdict) = regions::verdict(&report);
    assert!(passed, "{verdict}");
    // Every phase measured whole windows, and far decisions are far.
    assert!(report.phases.iter().all(|p| !p.admitted.is_empty()));
    assert!(report.shared_redis_ms.0 >= 2.0 * settings.one_way_ms as f64);
}

/// The same with a shared `sliding_window`: within the pool in every
/// aligned window (the regions together are never more than one sliding
/// window of it), and most of it where the tenant sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sliding_window_across_three_regions_linked_partitioned_and_healed() {
    let settings = Settings {
        windows: 2,
        partition_ms: 6_000,
        sliding: true,
        ..Settings::default()
    };
    let report = regions::run(&settings).await.unwrap();
    print!("{}", regions::table(&report));
    let (passed, verdict) = regions::verdict(&report);
    assert!(passed, "{verdict}");
}
