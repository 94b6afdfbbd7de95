//! `sluice bench --scenario hot-key`: what slices save the store, and what
//! they admit, measured on a shared Redis (or Redis Cluster).
//!
//! Two instances — two limiters in this process, each with its own store
//! connection and its own heartbeat every second, as two `sluice serve`
//! would — hammer one tenant from several tasks each, with a few cold
//! tenants decided beside it. Each phase runs with `tolerance: "1%"` and
//! then exactly (`"0%"`), in one run:
//!
//! - *under its limit*: 1,200,000 per minute, offered 16,000 a second
//!   (80% of it); the figure is
//!   store calls per decision, read from the store itself (`INFO
//!   commandstats` of every node given, heartbeats included);
//! - *one aligned window*: 20,000 per aligned 10 s `fixed_window`, offered
//!   several times that; the figure is what was admitted inside the window
//!   and the store calls it took (offered 8,000 a second: four times the
//!   window's rate).
//!
//! The cold tenants' decisions are one store call each: the hot tenant's
//! calls are the store's count less theirs.
//!
//! Cold tenants must hold no slice whenever they are decided: every one of
//! their decisions went to the store.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use sluice_core::config::OnError;
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Config, Policy, Request};
use sluice_store::{ClusterStore, ConnectOptions, KeySet, Limiter, LimiterOptions, RedisStore};

use crate::Fallible;
use crate::backend::Backend;

/// Where the two instances share their budgets.
#[derive(Debug, Clone)]
pub enum Shared {
    /// One Redis (`redis://…`).
    Redis(String),
    /// Redis Cluster: every node whose calls count (its masters).
    Cluster(Vec<String>),
}

/// One phase in one mode.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// `under its limit` or `aligned window`.
    pub phase: &'static str,
    /// `tolerance 1%` or `exact`.
    pub mode: &'static str,
    /// Decisions of the hot tenant.
    pub decisions: u64,
    /// Of which admitted (in the window, for the window phase).
    pub admitted: u64,
    /// Calls the store ran, of any kind, heartbeats included.
    pub store_calls: u64,
    /// Of which the hot tenant's and the heartbeats: the store's count
    /// less one per cold decision.
    pub hot_calls: u64,
    /// Decisions of the cold tenants, and of those, how many found a slice
    /// held for their tenant (must be none).
    pub cold: (u64, u64),
}

impl Measured {
    /// The hot tenant's store calls (heartbeats included) per decision.
    pub fn calls_per_decision(&self) -> f64 {
        self.hot_calls as f64 / self.decisions.max(1) as f64
    }
}

const UNDER: &str = "default_plan: p\nplans:\n  p:\n    tenant: [{ name: hot, limit: 1200000, per: 1m, tolerance: \"TOL\" }]\n";
const WINDOW: &str = "default_plan: p\nplans:\n  p:\n    tenant: [{ name: window, algorithm: fixed_window, aligned: true, limit: 20000, per: 10s, tolerance: \"TOL\" }]\n";
/// Tasks per instance deciding for the hot tenant.
const TASKS: usize = 8;
/// Decisions a second offered under the limit (of 20,000 a second).
const UNDER_RATE: u64 = 16_000;
/// Decisions a second offered to the window: four times its 2,000 a
/// second.
const WINDOW_RATE: u64 = 8_000;

/// Runs both phases, each with a tolerance of 1% and exactly; `seconds`
/// is the length of the phase under the limit (the window phase lasts its
/// window).
pub async fn hot_key(shared: &Shared, seconds: u64) -> Fallible<Vec<Measured>> {
    let run = format!("hk{}", std::process::id());
    let mut rows = Vec::new();
    for (mode, tolerance) in [("tolerance 1%", "1%"), ("exact", "0%")] {
        let yaml = UNDER.replace("TOL", tolerance);
        let tenant = format!("{run}-under-{tolerance}");
        let instances = instances(shared, &yaml).await?;
        let until = Instant::now() + Duration::from_secs(seconds);
        let before = store_calls(shared).await?;
        let (decisions, admitted, cold) =
            hammer(&instances, &tenant, until, UNDER_RATE, None).await?;
        let store_calls = store_calls(shared).await?.saturating_sub(before);
        rows.push(Measured {
            phase: "under its limit",
            mode,
            decisions,
            admitted,
            store_calls,
            hot_calls: store_calls.saturating_sub(cold.0),
            cold,
        });
    }
    for (mode, tolerance) in [("tolerance 1%", "1%"), ("exact", "0%")] {
        let yaml = WINDOW.replace("TOL", tolerance);
        let tenant = format!("{run}-window-{tolerance}");
        let instances = instances(shared, &yaml).await?;
        // From the start of the next aligned window to 100 ms before its
        // end (the store reads the same wall clock).
        let now = wall_ms();
        let start = now - now % 10_000 + 10_000;
        tokio::time::sleep(Duration::from_millis(start + 20 - now)).await;
        let until = Instant::now() + Duration::from_millis(9_880);
        let before = store_calls(shared).await?;
        let (decisions, admitted, cold) = hammer(
            &instances,
            &tenant,
            until,
            WINDOW_RATE,
            Some(start + 10_000),
        )
        .await?;
        let store_calls = store_calls(shared).await?.saturating_sub(before);
        rows.push(Measured {
            phase: "aligned window",
            mode,
            decisions,
            admitted,
            store_calls,
            hot_calls: store_calls.saturating_sub(cold.0),
            cold,
        });
    }
    Ok(rows)
}

/// Whether the figures meet the marks: under the limit, at most
/// one store call per 100 decisions with a tolerance; in the window,
/// 19,000 to 20,200 admitted, with far fewer calls than decisions; cold
/// tenants never from a slice.
pub fn verdict(rows: &[Measured]) -> (bool, String) {
    let mut notes = Vec::new();
    let mut passed = true;
    for row in rows {
        if row.cold.1 > 0 {
            passed = false;
            notes.push(format!(
                "{} {}: {} cold decisions found a slice",
                row.phase, row.mode, row.cold.1
            ));
        }
        if row.mode != "exact"
            && row.phase == "under its limit"
            && row.hot_calls * 100 > row.decisions
        {
            passed = false;
            notes.push(format!(
                "under its limit: {} store calls for {} decisions",
                row.hot_calls, row.decisions
            ));
        }
        if row.phase == "aligned window" && !(19_000..=20_200).contains(&row.admitted) {
            passed = false;
            notes.push(format!(
                "{}: {} admitted in the window",
                row.mode, row.admitted
            ));
        }
        if row.phase == "aligned window"
            && row.mode != "exact"
            && row.hot_calls * 10 > row.decisions
        {
            passed = false;
            notes.push(format!(
                "aligned window: {} store calls for {} decisions",
                row.hot_calls, row.decisions
            ));
        }
    }
    if notes.is_empty() {
        notes.push("every mark met".to_owned());
    }
    (passed, notes.join("; "))
}

/// The rows as a table.
pub fn table(rows: &[Measured]) -> String {
    let mut out = format!(
        "{:<16} {:<13} {:>10} {:>10} {:>11} {:>9} {:>15} {:>12}\n",
        "phase",
        "mode",
        "decisions",
        "admitted",
        "store calls",
        "hot's",
        "calls/decision",
        "cold (slice)"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<16} {:<13} {:>10} {:>10} {:>11} {:>9} {:>15.5} {:>8} ({})\n",
            r.phase,
            r.mode,
            r.decisions,
            r.admitted,
            r.store_calls,
            r.hot_calls,
            r.calls_per_decision(),
            r.cold.0,
            r.cold.1
        ));
    }
    out
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Two instances of `yaml` on `shared`, each with its heartbeat running.
async fn instances(shared: &Shared, yaml: &str) -> Fallible<[Arc<Limiter<Backend>>; 2]> {
    let config = Config::from_yaml(yaml, "hot-key")?;
    let mut made = Vec::new();
    for n in 0..2 {
        let keys = KeySet {
            current: Keyer::new("slbench", &Pepper::parse(&[b'h'; 32])?),
            previous: None,
        };
        let options = ConnectOptions::with_timeout(Duration::from_millis(500));
        let store = match shared {
            Shared::Redis(url) => {
                Backend::Redis(Box::new(RedisStore::connect(url, keys, &options).await?))
            }
            Shared::Cluster(nodes) => Backend::Cluster(Box::new(
                ClusterStore::connect(nodes, keys, &options, 1).await?,
            )),
        };
        let mut limiter_options = LimiterOptions::new(OnError::Deny);
        limiter_options.denial_cache = true;
        limiter_options.timeout = Some(Duration::from_millis(500));
        let policy = Policy::compile_for(&config.limits, true);
        let limiter = Arc::new(Limiter::with_options(policy, store, limiter_options));
        let weak = Arc::downgrade(&limiter);
        let instance = format!("bench-{}-{n}", std::process::id());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            while let Some(limiter) = {
                every.tick().await;
                weak.upgrade()
            } {
                if let Ok(beat) = limiter
                    .store()
                    .heartbeat(&instance, Duration::from_secs(3))
                    .await
                {
                    limiter.set_live_instances(beat.live);
                }
            }
        });
        made.push(limiter);
    }
    let second = made.pop().expect("two");
    let first = made.pop().expect("two");
    Ok([first, second])
}

/// Decides for `tenant` from [`TASKS`] tasks on each instance until
/// `until`, `per_second` in all (each task its share every 10 ms), and
/// for ten cold tenants at 20/s each beside it: the hot
/// tenant's decisions and admissions (those decided before `window_end`
/// when given), and the cold ones' decisions with how many of them found a
/// slice held.
async fn hammer(
    instances: &[Arc<Limiter<Backend>>; 2],
    tenant: &str,
    until: Instant,
    per_second: u64,
    window_end: Option<u64>,
) -> Fallible<(u64, u64, (u64, u64))> {
    let mut hot = Vec::new();
    let per_tick = (per_second / 100 / (2 * TASKS) as u64).max(1);
    for limiter in instances {
        for _ in 0..TASKS {
            let limiter = limiter.clone();
            let tenant = tenant.to_owned();
            hot.push(tokio::spawn(async move {
                let policy = limiter.policy();
                let request = Request::new(&tenant, "GET /", None, 1).expect("valid");
                let (mut decided, mut admitted) = (0u64, 0u64);
                let mut tick = tokio::time::interval(Duration::from_millis(10));
                while Instant::now() < until {
                    tick.tick().await;
                    for _ in 0..per_tick {
                        let allowed = limiter.decide(&policy, &request).await.allowed;
                        decided += 1;
                        if allowed && window_end.is_none_or(|end| wall_ms() < end) {
                            admitted += 1;
                        }
                    }
                }
                (decided, admitted)
            }));
        }
    }
    let cold = {
        let instances = instances.clone();
        let tenant = tenant.to_owned();
        tokio::spawn(async move {
            let (mut decided, mut from_slices) = (0u64, 0u64);
            let mut every = tokio::time::interval(Duration::from_millis(5));
            let mut n = 0usize;
            while Instant::now() < until {
                every.tick().await;
                n += 1;
                let limiter = &instances[n % 2];
                let cold = format!("{tenant}-cold-{}", n % 10);
                let policy = limiter.policy();
                let request = Request::new(&cold, "GET /", None, 1).expect("valid");
                from_slices += u64::from(!limiter.slices_of(&cold).is_empty());
                limiter.decide(&policy, &request).await;
                decided += 1;
            }
            (decided, from_slices)
        })
    };
    let (mut decided, mut admitted) = (0, 0);
    for task in hot {
        let (d, a) = task.await?;
        decided += d;
        admitted += a;
    }
    Ok((decided, admitted, cold.await?))
}

/// What clients call, counted in `INFO commandstats`: the commands a
/// script runs inside are counted there too, and are not calls.
const CLIENT_CALLS: [&str; 12] = [
    "fcall", "eval", "function", "script", "ping", "hello", "client", "cluster", "auth", "select",
    "readonly", "command",
];

/// Every call the store's nodes were sent so far, of any kind (`INFO
/// commandstats`: scripts, heartbeats, pings, cluster topology; its own
/// `INFO` left out).
async fn store_calls(shared: &Shared) -> Fallible<u64> {
    let nodes = match shared {
        Shared::Redis(url) => vec![url.clone()],
        Shared::Cluster(nodes) => nodes.clone(),
    };
    let mut total = 0;
    for node in nodes {
        let client = redis::Client::open(node.as_str())?;
        let mut connection = client.get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut connection)
            .await?;
        total += info
            .lines()
            .filter(|l| {
                l.strip_prefix("cmdstat_")
                    .is_some_and(|name| CLIENT_CALLS.iter().any(|c| name.starts_with(c)))
            })
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum::<u64>();
    }
    Ok(total)
}
