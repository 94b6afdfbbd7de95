//! One budget across three regions, on three real redis-server processes
//! linked through the test kit's delay proxy (40 ms each way), each region
//! with its own stores and region link (region `a` with two instances,
//! taking the lead in turn).
//!
//! A tenant's shared `fixed_window` (600 per aligned 2 s window, tolerance
//! 0) is hammered, and what every region admitted is summed per window:
//!
//! - sent to every region at once: between 90% of the limit and the limit
//!   in every window, linked, with one region cut off (a black hole both
//!   ways), and after the cut heals;
//! - sent to one region only: at least 90% once the link has run;
//! - by an adversary switching regions every 150 ms: never past the limit;
//! - decisions stay local: their p99 stays below the 80 ms a round trip to
//!   a peer would take, also while a peer is black-holed;
//! - no store holds the tenant's name.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_core::config::{NamedRule, RegionScope};
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Algorithm, BoundRule, Rule, Scope};
use sluice_store::redis::regions::{Link, LinkOptions, Peer, PeerStatus, Regions};
use sluice_store::{Batch, ConnectOptions, KeySet, RedisStore, Store};
use sluice_testkit::{DelayProxy, RedisServer};

const PER_MS: u64 = 2_000;
const LIMIT: u64 = 600;
const NAMES: [&str; 3] = ["a", "b", "c"];
const TENANT: &str = "tenant-acme-9f3e";
const ONE_WAY: Duration = Duration::from_millis(40);
const SYNC: Duration = Duration::from_millis(100);

fn rule() -> Vec<BoundRule> {
    let named = NamedRule {
        name: "per-2s".into(),
        rule: Rule::new(
            Algorithm::FixedWindow,
            i128::from(LIMIT),
            PER_MS,
            None,
            true,
        )
        .unwrap(),
        shadow: false,
        count_if: None,
        tolerance: sluice_core::tolerance::Tolerance::EXACT,
        regions: Some(RegionScope::Shared),
    };
    vec![BoundRule::new(Scope::Tenant, "", &named, 0.8)]
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Three regions: their servers, every instance's store and link status,
/// and the proxies between them (`proxies[(from, to)]`).
struct Fleet {
    servers: Vec<RedisServer>,
    /// Per region, its instances' stores.
    stores: Vec<Vec<RedisStore>>,
    status: Vec<Vec<Arc<std::sync::Mutex<Vec<PeerStatus>>>>>,
    proxies: BTreeMap<(usize, usize), DelayProxy>,
    links: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    async fn start() -> Fleet {
        let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let mut proxies = BTreeMap::new();
        for from in 0..3 {
            for (to, server) in servers.iter().enumerate() {
                if from != to {
                    proxies.insert((from, to), DelayProxy::start(server.port(), ONE_WAY));
                }
            }
        }
        let pepper = Pepper::parse(&[3u8; 32]).unwrap();
        let in_order: Vec<(&str, u32)> = NAMES.iter().map(|&n| (n, 1)).collect();
        let (mut stores, mut status, mut links) = (Vec::new(), Vec::new(), Vec::new());
        for (r, server) in servers.iter().enumerate() {
            let regions = Arc::new(Regions::new(&in_order, NAMES[r]).unwrap());
            let instances = if r == 0 { 2 } else { 1 };
            let (mut region_stores, mut region_status) = (Vec::new(), Vec::new());
            for i in 0..instances {
                let keys = KeySet {
                    current: Keyer::new("sl", &pepper),
                    previous: None,
                };
                let options = ConnectOptions::with_timeout(Duration::from_secs(2));
                let store = RedisStore::connect(&server.url(), keys, &options)
                    .await
                    .unwrap()
                    .with_regions(regions.clone());
                let peers = (0..3)
                    .filter(|&p| p != r)
                    .map(|p| Peer {
                        name: NAMES[p].into(),
                        url: proxies[&(r, p)].url(),
                    })
                    .collect();
                let link = Link::new(
                    store.clone(),
                    peers,
                    LinkOptions {
                        sync_every: SYNC,
                        peer_timeout: Duration::from_secs(1),
                        instance: format!("{}{i}", NAMES[r]),
                        connect: options,
                    },
                )
                .unwrap();
                region_status.push(link.status());
                links.push(link.spawn());
                region_stores.push(store);
            }
            stores.push(region_stores);
            status.push(region_status);
        }
        Fleet {
            servers,
            stores,
            status,
            proxies,
            links,
        }
    }

    /// Cuts region `r` off from both others, both ways (or heals it).
    fn cut(&self, r: usize, cut: bool) {
        for (&(from, to), proxy) in &self.proxies {
            if from == r || to == r {
                if cut { proxy.cut() } else { proxy.heal() }
            }
        }
    }

    /// Whether region `r`'s instances see `peer` as cut off.
    fn sees_cut_off(&self, r: usize, peer: &str) -> bool {
        self.status[r].iter().any(|s| {
            let s = s.lock().unwrap();
            s.iter().any(|p| p.name == peer && p.cut_off)
        })
    }
}

/// What one phase saw: admitted per window (summed over regions), and
/// every decision's latency.
#[derive(Default)]
struct Seen {
    per_window: BTreeMap<u64, u64>,
    latencies: Vec<Duration>,
}

impl Seen {
    fn p99(&mut self) -> Duration {
        self.latencies.sort();
        self.latencies[self.latencies.len() * 99 / 100]
    }

    /// The windows wholly inside the phase.
    fn whole_windows(&self, from_ms: u64, to_ms: u64) -> Vec<(u64, u64)> {
        self.per_window
            .iter()
            .filter(|&(&w, _)| w >= from_ms && w + PER_MS <= to_ms)
            .map(|(&w, &n)| (w, n))
            .collect()
    }
}

/// Hammers for `windows` whole windows, starting at the next window:
/// `pick(elapsed)` says which regions the tenant sends to at each moment.
async fn hammer(
    fleet: &Fleet,
    windows: u64,
    pick: impl Fn(Duration) -> Vec<usize> + Send + Sync + 'static,
) -> (Seen, u64, u64) {
    let now = wall_ms();
    let start = now - now % PER_MS + PER_MS;
    tokio::time::sleep(Duration::from_millis(start - now)).await;
    let end = start + windows * PER_MS;
    let began = Instant::now();
    let pick = Arc::new(pick);
    let mut tasks = tokio::task::JoinSet::new();
    for (r, stores) in fleet.stores.iter().enumerate() {
        for store in stores.clone() {
            let pick = pick.clone();
            tasks.spawn(async move {
                let rules = rule();
                let mut seen = Seen::default();
                while wall_ms() < end + 50 {
                    if !pick(began.elapsed()).contains(&r) {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    let asked = Instant::now();
                    let decided = store.decide(&Batch::new(TENANT, None, 1, &rules)).await;
                    seen.latencies.push(asked.elapsed());
                    let decided = decided.expect("a region's own store answers");
                    if decided.outcomes[0].allowed {
                        let window = decided.at_ms - decided.at_ms % PER_MS;
                        *seen.per_window.entry(window).or_default() += 1;
                    }
                    tokio::time::sleep(Duration::from_micros(700)).await;
                }
                seen
            });
        }
    }
    let mut all = Seen::default();
    while let Some(seen) = tasks.join_next().await {
        let seen = seen.unwrap();
        for (w, n) in seen.per_window {
            *all.per_window.entry(w).or_default() += n;
        }
        all.latencies.extend(seen.latencies);
    }
    (all, start, end)
}

/// Every whole window within the limit, and at least `least` of it.
fn check(phase: &str, seen: &mut Seen, (from, to): (u64, u64), least: Option<f64>) {
    let windows = seen.whole_windows(from, to);
    let p99 = seen.p99();
    println!("{phase}: admitted per window {windows:?} (limit {LIMIT}); decision p99 {p99:?}");
    assert!(!windows.is_empty(), "{phase}: no whole window");
    for &(w, n) in &windows {
        assert!(n <= LIMIT, "{phase}: window {w} admitted {n} > {LIMIT}");
        if let Some(least) = least {
            assert!(
                n as f64 >= least * LIMIT as f64,
                "{phase}: window {w} admitted {n} < {least} x {LIMIT}"
            );
        }
    }
    assert!(
        p99 < 2 * ONE_WAY,
        "{phase}: decision p99 {p99:?} is not local (a peer is {ONE_WAY:?} away each way)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_regions_keep_one_budget_linked_partitioned_and_healed() {
    let fleet = Fleet::start().await;
    // Let the links find each other.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(!fleet.sees_cut_off(0, "c"), "the links did not meet");

    let (mut seen, from, to) = hammer(&fleet, 2, |_| vec![0, 1, 2]).await;
    check("linked, every region", &mut seen, (from, to), Some(0.9));

    let (mut seen, from, to) = hammer(&fleet, 2, |_| vec![1]).await;
    check("linked, one region", &mut seen, (from, to), Some(0.9));

    let (mut seen, from, to) = hammer(&fleet, 2, |elapsed| {
        vec![(elapsed.as_millis() / 150 % 3) as usize]
    })
    .await;
    check(
        "an adversary switching regions",
        &mut seen,
        (from, to),
        None,
    );

    fleet.cut(2, true);
    let (mut seen, from, to) = hammer(&fleet, 2, |_| vec![0, 1, 2]).await;
    assert!(fleet.sees_cut_off(0, "c") && fleet.sees_cut_off(2, "a"));
    check("c cut off, every region", &mut seen, (from, to), Some(0.9));
    let (mut seen, from, to) = hammer(&fleet, 2, |_| vec![0]).await;
    check("c cut off, one region", &mut seen, (from, to), None);

    fleet.cut(2, false);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(!fleet.sees_cut_off(0, "c"), "the cut did not heal");
    let (mut seen, from, to) = hammer(&fleet, 2, |_| vec![0, 1, 2]).await;
    check("healed, every region", &mut seen, (from, to), Some(0.9));
    let (mut seen, from, to) = hammer(&fleet, 2, |_| vec![2]).await;
    check("healed, one region", &mut seen, (from, to), Some(0.9));

    for link in &fleet.links {
        link.abort();
    }
    // Nothing readable about the tenant in any region's store.
    for server in &fleet.servers {
        let mut connection = server.client().get_connection().unwrap();
        let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut connection).unwrap();
        assert!(!keys.is_empty());
        for key in keys {
            let dumped: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut connection).unwrap();
            for text in [&key, &dumped] {
                assert!(
                    !text.windows(TENANT.len()).any(|w| w == TENANT.as_bytes()),
                    "the tenant's name is in {}",
                    String::from_utf8_lossy(&key)
                );
            }
        }
    }
}
