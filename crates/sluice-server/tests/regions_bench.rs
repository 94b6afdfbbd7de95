//! `sluice bench --scenario regions`, shortened: three real redis-servers
//! through the delay proxy, a tenant hammering one shared window linked,
//! partitioned and healed (see `sluice_server::bench::regions`); every
//! mark of the scenario must hold.

use sluice_server::bench::regions::{self, Settings, Shared};

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
        algorithm: Shared::SlidingWindow,
        ..Settings::default()
    };
    let report = regions::run(&settings).await.unwrap();
    print!("{}", regions::table(&report));
    let (passed, verdict) = regions::verdict(&report);
    assert!(passed, "{verdict}");
}

/// The same with a shared `gcra`: one bucket of the pool, so no window
/// admits more than the limit and the burst, and a tenant sending to every
/// region gets most of the limit, linked and healed. (Its figures where
/// the tenant sends to one region, and through a cut that follows the
/// adversary, are in docs/BENCHMARKS.md: a bucket's rate moved late is not
/// made up within the window, and a rate granted in flight to a region
/// just cut off is stranded until the epoch ends.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gcra_across_three_regions_linked_partitioned_and_healed() {
    let settings = Settings {
        windows: 2,
        partition_ms: 6_000,
        algorithm: Shared::Gcra,
        ..Settings::default()
    };
    let report = regions::run(&settings).await.unwrap();
    print!("{}", regions::table(&report));
    let (most, limit) = (settings.window_bound(), settings.limit);
    for phase in &report.phases {
        assert!(
            !phase.admitted.is_empty(),
            "{}: no whole window",
            phase.name
        );
        for &n in &phase.admitted {
            assert!(n <= most, "{}: a window admitted {n} > {most}", phase.name);
            if phase.name.ends_with("every region") && !phase.name.contains("cut off") {
                assert!(
                    n as f64 >= 0.9 * limit as f64,
                    "{}: a window admitted {n} < 90% of {limit}",
                    phase.name
                );
            }
        }
    }
    assert!(!report.tenant_in_a_store);
}
