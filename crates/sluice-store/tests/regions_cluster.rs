//! A region whose store is a real Redis Cluster decides each shared rule as
//! its part of the pool, on every path a decision takes there: one slot,
//! several slots (a tenant's rules and an Envoy descriptor's), settles, and
//! the read-only check; what it asked is noted for the link.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::config::{NamedRule, RegionScope};
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Algorithm, BoundRule, Rule, Scope};
use sluice_store::redis::regions::Regions;
use sluice_store::{Batch, ClusterStore, ConnectOptions, KeySet, Partition, Store};
use sluice_testkit::RedisCluster;

/// `limit` a minute, shared (a bucket's burst its limit).
fn rule(name: &str, algorithm: Algorithm, scope: Scope, limit: i128) -> BoundRule {
    let burst = matches!(algorithm, Algorithm::Gcra | Algorithm::TokenBucket).then_some(limit);
    let aligned = algorithm == Algorithm::FixedWindow;
    let rule = Rule::new(algorithm, limit, 60_000, burst, aligned).unwrap();
    let named = NamedRule {
        name: name.into(),
        rule,
        shadow: false,
        count_if: None,
        tolerance: sluice_core::tolerance::Tolerance::EXACT,
        regions: Some(RegionScope::Shared),
    };
    BoundRule::new(scope, "", &named, 0.8)
}

async fn store(cluster: &RedisCluster) -> ClusterStore {
    let keys = KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[7u8; 32]).unwrap()),
        previous: None,
    };
    let options = ConnectOptions::with_timeout(Duration::from_secs(2));
    let regions = Regions::new(&[("a", 1), ("b", 1), ("c", 1)], "a", 100).unwrap();
    ClusterStore::connect(&cluster.urls(), keys, &options, 1)
        .await
        .unwrap()
        .with_regions(Arc::new(regions))
}

/// Waits, if the minute (a shared rule's window, a bucket's epoch) ends
/// within 5 s, until the next has begun: the test's decisions fall in one.
async fn within_one_minute() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let into = now % 60_000;
    if into > 55_000 {
        tokio::time::sleep(Duration::from_millis(60_000 - into + 50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_region_admits_its_part_of_each_shared_rule_on_every_path() {
    let cluster = RedisCluster::start(3, 0);
    let store = store(&cluster).await;
    within_one_minute().await;
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::Gcra,
        Algorithm::TokenBucket,
    ] {
        // One slot: the tenant's rule alone.
        let rules = [rule("rate", algorithm, Scope::Tenant, 30)];
        let tenant = format!("one-slot-{algorithm:?}");
        let batch = Batch::new(&tenant, None, 1, &rules);
        let mut admitted = 0;
        for _ in 0..40 {
            admitted += u32::from(store.decide(&batch).await.unwrap().outcomes[0].allowed);
        }
        assert_eq!(admitted, 10, "{algorithm:?}: a third of 30, on one slot");
        let peeked = store.peek(&batch).await.unwrap();
        let row = &peeked.rows[0];
        let (seen, _) = row.enforced.decide(&row.state, peeked.now, 1);
        assert!(
            !seen.allowed,
            "{algorithm:?}: the read-only check reads the part: {seen:?}"
        );
        let parts = store.region_parts(&batch).await.unwrap();
        let ours = parts[0].as_ref().expect("a shared rule has parts");
        assert_eq!(
            ours.iter().map(|p| p.share).collect::<Vec<_>>(),
            [10, 10, 10]
        );
    }

    // Several slots: two Envoy descriptors' rules, each in its own slot
    // and each its part (the window a third of 30, the gcra a third of
    // 60); a denial on one gives back the other.
    let rules = [
        rule(
            "descriptor-a",
            Algorithm::FixedWindow,
            Scope::Descriptor,
            30,
        ),
        rule("descriptor-b", Algorithm::Gcra, Scope::Descriptor, 60),
    ];
    let partitions = [
        Partition::Tenant("descriptor-a"),
        Partition::Tenant("descriptor-b"),
    ];
    let batch = Batch {
        partitions: &partitions,
        ..Batch::new("two-slots", None, 1, &rules)
    };
    let mut admitted = 0;
    for _ in 0..40 {
        admitted += u32::from(
            store
                .decide(&batch)
                .await
                .unwrap()
                .outcomes
                .iter()
                .all(|o| o.allowed),
        );
    }
    assert_eq!(admitted, 10, "a third of 30, across two slots");
    drop(cluster);
}
