//! A fleet with a region on Redis Cluster, when something goes wrong: a
//! region on one Redis rotating its pepper (its keys name a previous
//! pepper's key, in another slot, which a cluster cannot be sent), and one
//! master of the cluster stalled (a failover under way).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::config::{NamedRule, RegionScope};
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Algorithm, BoundRule, Rule, Scope};
use sluice_store::redis::regions::{Address, Link, LinkOptions, Peer, PeerStatus, Regions};
use sluice_store::{Batch, ClusterStore, ConnectOptions, KeySet, RedisStore, Store};
use sluice_testkit::{RedisCluster, RedisServer};

fn window_rule() -> BoundRule {
    let rule = Rule::new(Algorithm::FixedWindow, 30, 60_000, None, true).unwrap();
    let named = NamedRule {
        name: "rate".into(),
        rule,
        shadow: false,
        count_if: None,
        tolerance: sluice_core::tolerance::Tolerance::EXACT,
        regions: Some(RegionScope::Shared),
    };
    BoundRule::new(Scope::Tenant, "", &named, 0.8)
}

async fn within_one_minute() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let into = now % 60_000;
    if into > 40_000 {
        tokio::time::sleep(Duration::from_millis(60_000 - into + 50)).await;
    }
}

const REGIONS: [(&str, u32); 3] = [("eu", 1), ("us", 1), ("ap", 1)];

fn regions(this: &str) -> Arc<Regions> {
    Arc::new(Regions::new(&REGIONS, this, 100).unwrap())
}

fn options() -> ConnectOptions {
    ConnectOptions::with_timeout(Duration::from_secs(2))
}

fn link_options(instance: &str) -> LinkOptions {
    LinkOptions {
        sync_every: Duration::from_millis(100),
        peer_timeout: Duration::from_secs(2),
        instance: instance.into(),
        connect: ConnectOptions::with_timeout(Duration::from_millis(300)),
    }
}

fn peer<'a>(statuses: &'a BTreeMap<&str, Vec<PeerStatus>>, at: &str, of: &str) -> &'a PeerStatus {
    statuses[at].iter().find(|s| s.name == of).unwrap()
}

fn dbsize(cluster: &mut RedisCluster, port: u16) -> u64 {
    cluster.key_count(port)
}

/// The three regions linked (eu on the cluster), `us` rotating its pepper
/// or not, a tenant deciding in eu and us at every sync for a few seconds;
/// answers each link's peers' statuses, by region.
async fn run(
    cluster: &RedisCluster,
    us_redis: &RedisServer,
    ap_redis: &RedisServer,
    prefix: &str,
    us_rotating: bool,
) -> BTreeMap<&'static str, Vec<PeerStatus>> {
    let new = Pepper::parse(&[7u8; 32]).unwrap();
    let old = Pepper::parse(&[0x5a; 32]).unwrap();
    let keys = |previous: bool| KeySet {
        current: Keyer::new(prefix, &new),
        previous: previous.then(|| Keyer::new(prefix, &old)),
    };
    let eu = ClusterStore::connect(&cluster.urls(), keys(false), &options(), 1)
        .await
        .unwrap()
        .with_regions(regions("eu"));
    let us = RedisStore::connect(&us_redis.url(), keys(us_rotating), &options())
        .await
        .unwrap()
        .with_regions(regions("us"));
    let ap = RedisStore::connect(&ap_redis.url(), keys(false), &options())
        .await
        .unwrap()
        .with_regions(regions("ap"));
    let node = |name: &str, server: &RedisServer| Peer {
        name: name.into(),
        address: Address::Node(server.url()),
    };
    let on_cluster = || Peer {
        name: "eu".into(),
        address: Address::Cluster(cluster.urls()),
    };
    let mut eu_link = Link::new(
        eu.clone(),
        vec![node("us", us_redis), node("ap", ap_redis)],
        link_options("eu0"),
    )
    .unwrap();
    let mut us_link = Link::new(
        us.clone(),
        vec![on_cluster(), node("ap", ap_redis)],
        link_options("us0"),
    )
    .unwrap();
    let mut ap_link = Link::new(
        ap.clone(),
        vec![on_cluster(), node("us", us_redis)],
        link_options("ap0"),
    )
    .unwrap();
    // Every link announces itself first.
    for _ in 0..2 {
        eu_link.sync().await.unwrap();
        us_link.sync().await.unwrap();
        ap_link.sync().await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let rules = [window_rule()];
    let batch = Batch::new("rotating-tenant", None, 1, &rules);
    // The tenant keeps sending to us (one request per sync): its key
    // changes there every sync, and every shipping carries it.
    for _ in 0..30 {
        us.decide(&batch).await.unwrap();
        // (eu too: its part moves, and it ships the key to us.)
        eu.decide(&batch).await.unwrap();
        eu_link.sync().await.unwrap();
        us_link.sync().await.unwrap();
        ap_link.sync().await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    let status = |link: &Link| link.status().lock().unwrap().clone();
    BTreeMap::from([
        ("eu", status(&eu_link)),
        ("us", status(&us_link)),
        ("ap", status(&ap_link)),
    ])
}

/// A region on one Redis rotating its pepper still ships to its peer on
/// Redis Cluster, and a region that is not rotating relays the rotating
/// one's keys there: the cluster is sent each key without the previous
/// pepper's (it carries nothing over), and hears from both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_rotating_its_pepper_ships_to_its_cluster_peer() {
    let cluster = RedisCluster::start(3, 0);
    let (us_redis, ap_redis) = (RedisServer::start(), RedisServer::start());
    within_one_minute().await;
    let rotating = run(&cluster, &us_redis, &ap_redis, "sr", true).await;
    for (at, of) in [("us", "eu"), ("ap", "eu")] {
        let s = peer(&rotating, at, of);
        assert_eq!(s.failures, 0, "{at} failed to ship to {of}: {s:?}");
    }
    for of in ["us", "ap"] {
        let s = peer(&rotating, "eu", of);
        assert!(!s.cut_off, "eu cut {of} off, never heard: {s:?}");
    }
    drop(cluster);
}

/// One master of the region's cluster stalled (not the one holding the
/// link's own keys): the tenants on the others still decide, and the link
/// still moves their budget and ships (a call on the stalled node fails
/// alone), so the peer does not cut the region off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_stalled_master_does_not_stop_the_link_for_every_tenant() {
    let mut cluster = RedisCluster::start(3, 0);
    let us_redis = RedisServer::start();
    within_one_minute().await;
    let keys = KeySet {
        current: Keyer::new("sl", &Pepper::parse(&[7u8; 32]).unwrap()),
        previous: None,
    };
    let options = ConnectOptions::with_timeout(Duration::from_millis(300));
    let eu = ClusterStore::connect(&cluster.urls(), keys.clone(), &options, 1)
        .await
        .unwrap()
        .with_regions(regions("eu"));
    let us = RedisStore::connect(&us_redis.url(), keys, &options)
        .await
        .unwrap()
        .with_regions(regions("us"));
    let mut eu_link = Link::new(
        eu.clone(),
        vec![Peer {
            name: "us".into(),
            address: Address::Node(us_redis.url()),
        }],
        link_options("eu0"),
    )
    .unwrap();
    let mut us_link = Link::new(
        us.clone(),
        vec![Peer {
            name: "eu".into(),
            address: Address::Cluster(cluster.urls()),
        }],
        link_options("us0"),
    )
    .unwrap();
    for _ in 0..2 {
        eu_link.sync().await.unwrap();
        us_link.sync().await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // The master of the `{admin}` slot (the link's own keys): it holds the
    // lead key, the others answer MOVED.
    let masters = cluster.master_ports();
    let admin = *masters
        .iter()
        .find(|&&port| {
            redis::cmd("EXISTS")
                .arg("sl:{admin}:regions:lead")
                .query::<i64>(&mut cluster.node(port).connection())
                .is_ok_and(|n| n == 1)
        })
        .expect("a master holds the lead key");
    // Tenants, each on the master its first decision wrote a key to.
    let rules = [window_rule()];
    let mut healthy = None;
    let mut stalled = None;
    for i in 0..40 {
        let tenant = format!("tenant-{i}");
        let before: Vec<u64> = masters.iter().map(|&p| dbsize(&mut cluster, p)).collect();
        eu.decide(&Batch::new(&tenant, None, 1, &rules))
            .await
            .unwrap();
        let after: Vec<u64> = masters.iter().map(|&p| dbsize(&mut cluster, p)).collect();
        let on = masters[(0..masters.len()).find(|&m| after[m] > before[m]).unwrap()];
        if on == admin {
            healthy.get_or_insert(tenant);
        } else if stalled.is_none() {
            stalled = Some((tenant, on));
        }
        if healthy.is_some() && stalled.is_some() {
            break;
        }
    }
    let healthy = healthy.expect("a tenant on the admin slot's master");
    let (stalled, port) = stalled.expect("a tenant on another master");
    for _ in 0..3 {
        eu_link.sync().await.unwrap();
        us_link.sync().await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
    }

    cluster.node(port).signal("STOP");
    let started = Instant::now();
    let (mut synced, mut failed, mut healthy_admitted) = (0, 0, 0);
    while started.elapsed() < Duration::from_secs(5) {
        // The healthy tenant decides (its master answers) ...
        let o = eu
            .decide(&Batch::new(&healthy, None, 1, &rules))
            .await
            .unwrap();
        healthy_admitted += u32::from(o.outcomes[0].allowed);
        // ... and the stalled one is asked too (noted, then it waits).
        let stalled_batch_rules = rules.clone();
        let stalled_tenant = stalled.clone();
        let eu_for = eu.clone();
        tokio::spawn(async move {
            let batch = Batch::new(&stalled_tenant, None, 1, &stalled_batch_rules);
            let _ = tokio::time::timeout(Duration::from_millis(50), eu_for.decide(&batch)).await;
        });
        match tokio::time::timeout(Duration::from_secs(1), eu_link.sync()).await {
            Ok(Ok(_)) => synced += 1,
            _ => failed += 1,
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), us_link.sync()).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = |link: &Link| -> PeerStatus { link.status().lock().unwrap()[0].clone() };
    let (at_us, at_eu) = (status(&us_link), status(&eu_link));
    cluster.node(port).signal("CONT");
    println!(
        "one master of {masters:?} stalled ({port}; admin slot on {admin}): healthy tenant admitted {healthy_admitted}; eu's syncs: {synced} ok, {failed} failed; us sees eu: cut_off {}, last heard {:?}; eu sees us: cut_off {}",
        at_us.cut_off, at_us.last_heard_ms, at_eu.cut_off
    );
    assert!(healthy_admitted > 0, "the healthy tenant decides");
    assert!(
        synced > 0,
        "eu's link failed every sync ({failed}) while one master of three stalled"
    );
    assert!(
        !at_us.cut_off,
        "us cut eu off: one stalled master stopped eu's link for every tenant"
    );
    drop(cluster);
}
