//! `sluice bench --scenario regions`: one budget across three regions on
//! one machine (SPEC appendix H).
//!
//! Three real redis-server processes, one per region, each with its own
//! stores and region link (region `a` with two instances, which take the
//! link's lead in turn), linked through the test kit's delay proxy (40 ms
//! each way by default). One tenant's shared `fixed_window` (600 per
//! aligned 2 s window, tolerance 0) is hammered, and what every region
//! admitted is summed per aligned window (by the stores' clock):
//!
//! 1. decisions against one shared Redis reached through the same delay,
//!    for the latency a region would pay without its own store;
//! 2. linked: the tenant sends to every region at once, to one region
//!    only, then as an adversary switching regions every 150 ms;
//! 3. region `c` cut off from both others (a black hole both ways), the
//!    tenant sending to every region, then to `a` only;
//! 4. healed: every region, then `c` only.
//!
//! With `--algorithm sliding-window` the rule is a `sliding_window`; with
//! `gcra`, a gcra of 600 per 2 s and a burst of 60 (a window then admits
//! at most 660: one bucket of the pool).
//!
//! It passes when no window admitted more than the limit, every window of
//! the phases marked so admitted at least 90% of it, decisions stayed
//! local (p99 under one round trip to a peer), and no store holds the
//! tenant's name.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sluice_core::config::{NamedRule, RegionScope};
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Algorithm, BoundRule, Rule, Scope};
use sluice_store::redis::regions::{Address, Link, LinkOptions, Peer, Regions};
use sluice_store::{Batch, ConnectOptions, KeySet, RedisStore, Store};
use sluice_testkit::{DelayProxy, RedisServer};

use crate::Fallible;

const NAMES: [&str; 3] = ["a", "b", "c"];
/// The tenant: its name must be in no store.
const TENANT: &str = "bench-tenant-7f3e";

/// What the scenario runs with.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// The shared rule's aligned window (ms).
    pub window_ms: u64,
    /// The shared rule's limit per window.
    pub limit: u64,
    /// The delay each way between regions.
    pub one_way_ms: u64,
    /// The link's `sync_every`.
    pub sync_every_ms: u64,
    /// Whole windows per phase.
    pub windows: u64,
    /// How long region `c` is cut off.
    pub partition_ms: u64,
    /// The shared rule's algorithm.
    pub algorithm: Shared,
}

/// The shared rule's algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Shared {
    /// An aligned `fixed_window`.
    FixedWindow,
    /// A `sliding_window`.
    SlidingWindow,
    /// A `gcra` of the limit per window and a burst of a tenth of it:
    /// one bucket of the pool (a window admits at most the limit and the
    /// burst).
    Gcra,
}

impl Shared {
    /// Its name in a configuration.
    pub fn name(self) -> &'static str {
        match self {
            Shared::FixedWindow => "fixed_window",
            Shared::SlidingWindow => "sliding_window",
            Shared::Gcra => "gcra",
        }
    }
}

impl Settings {
    /// A gcra's burst (0 for a window).
    pub fn burst(&self) -> u64 {
        match self.algorithm {
            Shared::Gcra => self.limit / 10,
            Shared::FixedWindow | Shared::SlidingWindow => 0,
        }
    }

    /// The most one window may admit: the limit, and a gcra's burst.
    pub fn window_bound(&self) -> u64 {
        self.limit + self.burst()
    }
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            window_ms: 2_000,
            limit: 600,
            one_way_ms: 40,
            sync_every_ms: 100,
            windows: 4,
            partition_ms: 20_000,
            algorithm: Shared::FixedWindow,
        }
    }
}

/// One phase: what it sent where, what each whole window admitted (all
/// regions together), and the decisions' latency.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// What the tenant did, and where.
    pub name: String,
    /// Per whole window, units admitted by all regions.
    pub admitted: Vec<u64>,
    /// Whether each window must reach 90% of the limit.
    pub expects_most: bool,
    /// Decisions made.
    pub decisions: u64,
    /// Their latency's 99th percentile (ms).
    pub p99_ms: f64,
}

/// The scenario's result.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// What it ran with.
    pub settings: Settings,
    /// Decision p50 and p99 against one shared Redis through the delay
    /// (ms).
    pub shared_redis_ms: (f64, f64),
    /// Every phase, in order.
    pub phases: Vec<Phase>,
    /// Whether any store holds the tenant's name.
    pub tenant_in_a_store: bool,
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn rules(settings: &Settings) -> Fallible<Vec<BoundRule>> {
    let (algorithm, burst) = match settings.algorithm {
        Shared::FixedWindow => (Algorithm::FixedWindow, None),
        Shared::SlidingWindow => (Algorithm::SlidingWindow, None),
        Shared::Gcra => (Algorithm::Gcra, Some(i128::from(settings.burst()))),
    };
    let rule = Rule::new(
        algorithm,
        i128::from(settings.limit),
        settings.window_ms,
        burst,
        settings.algorithm == Shared::FixedWindow,
    )?;
    let named = NamedRule {
        name: "per-window".into(),
        rule,
        shadow: false,
        count_if: None,
        tolerance: sluice_core::tolerance::Tolerance::EXACT,
        regions: Some(RegionScope::Shared),
    };
    Ok(vec![BoundRule::new(Scope::Tenant, "", &named, 0.8)])
}

/// Three regions: their servers, each instance's store, the proxies
/// between them (`proxies[(from, to)]`), and the links (stopped when
/// dropped).
struct Fleet {
    servers: Vec<RedisServer>,
    stores: Vec<Vec<RedisStore>>,
    proxies: BTreeMap<(usize, usize), DelayProxy>,
    links: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for link in &self.links {
            link.abort();
        }
    }
}

impl Fleet {
    async fn start(settings: &Settings) -> Fallible<Fleet> {
        let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
        let one_way = Duration::from_millis(settings.one_way_ms);
        let mut proxies = BTreeMap::new();
        for from in 0..3 {
            for (to, server) in servers.iter().enumerate() {
                if from != to {
                    proxies.insert((from, to), DelayProxy::start(server.port(), one_way));
                }
            }
        }
        let pepper = Pepper::parse(&[0x5a; 32]).map_err(|e| e.to_string())?;
        let in_order: Vec<(&str, u32)> = NAMES.iter().map(|&n| (n, 1)).collect();
        let (mut stores, mut links) = (Vec::new(), Vec::new());
        for (r, server) in servers.iter().enumerate() {
            let regions = Regions::new(&in_order, NAMES[r], settings.sync_every_ms);
            let regions = Arc::new(regions.ok_or("no such region")?);
            let mut region = Vec::new();
            for i in 0..if r == 0 { 2 } else { 1 } {
                let keys = KeySet {
                    current: Keyer::new("sl", &pepper),
                    previous: None,
                };
                let options = ConnectOptions::with_timeout(Duration::from_secs(2));
                let store = RedisStore::connect(&server.url(), keys, &options)
                    .await?
                    .with_regions(regions.clone());
                let peers = (0..3)
                    .filter(|&p| p != r)
                    .map(|p| Peer {
                        name: NAMES[p].into(),
                        address: Address::Node(proxies[&(r, p)].url()),
                    })
                    .collect();
                let link = Link::new(
                    store.clone(),
                    peers,
                    LinkOptions {
                        sync_every: Duration::from_millis(settings.sync_every_ms),
                        peer_timeout: Duration::from_millis(10 * settings.sync_every_ms),
                        instance: format!("{}{i}", NAMES[r]),
                        connect: options,
                    },
                )?;
                links.push(link.spawn());
                region.push(store);
            }
            stores.push(region);
        }
        Ok(Fleet {
            servers,
            stores,
            proxies,
            links,
        })
    }

    /// Cuts region `r` off from both others, both ways, or heals it.
    fn cut(&self, r: usize, cut: bool) {
        for (&(from, to), proxy) in &self.proxies {
            if from == r || to == r {
                if cut { proxy.cut() } else { proxy.heal() }
            }
        }
    }

    /// Whether any store holds `text` in a key or a value.
    fn holds(&self, text: &str) -> Fallible<bool> {
        for server in &self.servers {
            let mut connection = server.client().get_connection()?;
            let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut connection)?;
            for key in keys {
                let dumped: Vec<u8> = redis::cmd("DUMP").arg(&key).query(&mut connection)?;
                let found = |b: &[u8]| b.windows(text.len()).any(|w| w == text.as_bytes());
                if found(&key) || found(&dumped) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }
}

/// What hammering saw: admitted per window, every decision's latency.
#[derive(Default)]
struct Seen {
    per_window: BTreeMap<u64, u64>,
    latencies: Vec<Duration>,
}

/// The `q`th quantile of `latencies` (ms).
fn quantile_ms(latencies: &mut [Duration], q: f64) -> f64 {
    latencies.sort_unstable();
    let at = ((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1));
    latencies.get(at).map_or(0.0, |d| d.as_secs_f64() * 1_000.0)
}

/// Hammers `stores` (per region) from the start of the next window for
/// `windows` whole windows; `pick(elapsed)` names the regions the tenant
/// sends to at each moment.
async fn hammer(
    settings: &Settings,
    stores: &[Vec<RedisStore>],
    windows: u64,
    pick: impl Fn(Duration) -> Vec<usize> + Send + Sync + 'static,
) -> Fallible<(Seen, u64, u64)> {
    let per = settings.window_ms;
    let now = wall_ms();
    let start = now - now % per + per;
    tokio::time::sleep(Duration::from_millis(start - now)).await;
    let end = start + windows * per;
    let began = Instant::now();
    let pick = Arc::new(pick);
    let rules = Arc::new(rules(settings)?);
    let mut tasks = tokio::task::JoinSet::new();
    for (r, region) in stores.iter().enumerate() {
        for store in region.clone() {
            let (pick, rules) = (pick.clone(), rules.clone());
            tasks.spawn(async move {
                let mut seen = Seen::default();
                while wall_ms() < end + 50 {
                    if !pick(began.elapsed()).contains(&r) {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    let asked = Instant::now();
                    let decided = store.decide(&Batch::new(TENANT, None, 1, &rules)).await;
                    seen.latencies.push(asked.elapsed());
                    let decided = decided.map_err(|e| e.to_string())?;
                    if decided.outcomes[0].allowed {
                        let at = decided.at_ms;
                        *seen.per_window.entry(at - at % per).or_default() += 1;
                    }
                    tokio::time::sleep(Duration::from_micros(700)).await;
                }
                Ok::<Seen, String>(seen)
            });
        }
    }
    let mut all = Seen::default();
    while let Some(seen) = tasks.join_next().await {
        let seen = seen.map_err(|e| e.to_string())??;
        for (w, n) in seen.per_window {
            *all.per_window.entry(w).or_default() += n;
        }
        all.latencies.extend(seen.latencies);
    }
    Ok((all, start, end))
}

/// Runs one phase.
async fn phase(
    settings: &Settings,
    fleet: &Fleet,
    name: &str,
    (windows, expects_most): (u64, bool),
    pick: impl Fn(Duration) -> Vec<usize> + Send + Sync + 'static,
) -> Fallible<Phase> {
    let (mut seen, start, end) = hammer(settings, &fleet.stores, windows, pick).await?;
    let admitted = seen
        .per_window
        .iter()
        .filter(|&(&w, _)| w >= start && w + settings.window_ms <= end)
        .map(|(_, &n)| n)
        .collect();
    Ok(Phase {
        name: name.to_owned(),
        admitted,
        expects_most,
        decisions: seen.latencies.len() as u64,
        p99_ms: quantile_ms(&mut seen.latencies, 0.99),
    })
}

/// Runs the scenario (see the module's documentation).
pub async fn run(settings: &Settings) -> Fallible<Report> {
    let installed = std::process::Command::new("redis-server")
        .arg("--version")
        .output();
    if !installed.is_ok_and(|o| o.status.success()) {
        return Err("the regions scenario starts three redis-server processes: install Redis 7+ (Debian: apt-get install redis-server)".into());
    }
    let fleet = Fleet::start(settings).await?;
    // The shared-Redis baseline: a region's instance whose store is another
    // region's Redis, through the delay.
    let far = RedisStore::connect(
        &fleet.proxies[&(0, 1)].url(),
        fleet.stores[1][0].keys().clone(),
        &ConnectOptions::with_timeout(Duration::from_secs(2)),
    )
    .await?;
    let (mut seen, _, _) = hammer(settings, &[vec![far]], 1, |_| vec![0]).await?;
    let shared_redis_ms = (
        quantile_ms(&mut seen.latencies, 0.5),
        quantile_ms(&mut seen.latencies, 0.99),
    );
    // Let the links find each other.
    tokio::time::sleep(Duration::from_millis(15 * settings.sync_every_ms)).await;
    let w = settings.windows;
    let switch = |elapsed: Duration| vec![(elapsed.as_millis() / 150 % 3) as usize];
    let mut phases = vec![
        phase(settings, &fleet, "linked, every region", (w, true), |_| {
            vec![0, 1, 2]
        })
        .await?,
        phase(settings, &fleet, "linked, region b only", (w, true), |_| {
            vec![1]
        })
        .await?,
        phase(
            settings,
            &fleet,
            "linked, switching every 150 ms",
            (w, false),
            switch,
        )
        .await?,
    ];
    fleet.cut(2, true);
    let cut_windows = (settings.partition_ms / settings.window_ms)
        .saturating_sub(1)
        .max(2);
    let every = cut_windows / 2;
    phases.push(
        phase(
            settings,
            &fleet,
            "c cut off, every region",
            (every, true),
            |_| vec![0, 1, 2],
        )
        .await?,
    );
    phases.push(
        phase(
            settings,
            &fleet,
            "c cut off, region a only",
            (cut_windows - every, false),
            |_| vec![0],
        )
        .await?,
    );
    fleet.cut(2, false);
    tokio::time::sleep(Duration::from_millis(15 * settings.sync_every_ms)).await;
    phases.push(
        phase(settings, &fleet, "healed, every region", (w, true), |_| {
            vec![0, 1, 2]
        })
        .await?,
    );
    phases.push(
        phase(settings, &fleet, "healed, region c only", (w, true), |_| {
            vec![2]
        })
        .await?,
    );
    let tenant_in_a_store = fleet.holds(TENANT)?;
    Ok(Report {
        settings: settings.clone(),
        shared_redis_ms,
        phases,
        tenant_in_a_store,
    })
}

/// Whether the report meets the scenario's marks, and what it found.
pub fn verdict(report: &Report) -> (bool, String) {
    let (limit, most) = (report.settings.limit, report.settings.window_bound());
    let round_trip = 2.0 * report.settings.one_way_ms as f64;
    let mut notes = Vec::new();
    for phase in &report.phases {
        if phase.admitted.is_empty() {
            notes.push(format!("{}: no whole window", phase.name));
        }
        for &n in &phase.admitted {
            if n > most {
                notes.push(format!("{}: a window admitted {n} > {most}", phase.name));
            }
            if phase.expects_most && (n as f64) < 0.9 * limit as f64 {
                notes.push(format!(
                    "{}: a window admitted {n} < 90% of {limit}",
                    phase.name
                ));
            }
        }
        if phase.p99_ms >= round_trip {
            notes.push(format!(
                "{}: decision p99 {:.1} ms is not local",
                phase.name, phase.p99_ms
            ));
        }
    }
    if report.tenant_in_a_store {
        notes.push("a store holds the tenant's name".to_owned());
    }
    let passed = notes.is_empty();
    if passed {
        notes.push(format!(
            "every window within {most}, at least 90% of {limit} where the tenant sent to every region or to one linked region; decisions local"
        ));
    }
    (passed, notes.join("; "))
}

/// The report as a table.
pub fn table(report: &Report) -> String {
    let s = &report.settings;
    let mut out = format!(
        "one shared {}, {} per aligned {} ms window{}, 3 regions {} ms apart each way, sync_every {} ms\n",
        s.algorithm.name(),
        s.limit,
        s.window_ms,
        match s.burst() {
            0 => String::new(),
            burst => format!(" (burst {burst})"),
        },
        s.one_way_ms,
        s.sync_every_ms
    );
    out.push_str(&format!(
        "decisions against one shared Redis {} ms away: p50 {:.1} ms, p99 {:.1} ms\n",
        s.one_way_ms, report.shared_redis_ms.0, report.shared_redis_ms.1
    ));
    out.push_str(&format!(
        "{:<34} {:>10} {:>11}  admitted per window (all regions)\n",
        "phase", "decisions", "p99 (ms)"
    ));
    for phase in &report.phases {
        let admitted: Vec<String> = phase.admitted.iter().map(u64::to_string).collect();
        out.push_str(&format!(
            "{:<34} {:>10} {:>11.2}  {}\n",
            phase.name,
            phase.decisions,
            phase.p99_ms,
            admitted.join(" ")
        ));
    }
    out
}
