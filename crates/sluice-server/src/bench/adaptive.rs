//! `sluice bench --scenario adaptive`: an adaptive valve before a real
//! downstream (SPEC appendix I).
//!
//! The downstream is the test kit's [`Downstream`]: `workers` workers of
//! 40 ms each, queueing past them, so it serves at most `workers / 40 ms`.
//! Requests arrive at twice that rate (twice what it serves then: halved
//! with its workers), evenly spaced: 30% from a `critical` tenant, 70%
//! from a `low` one. Each takes a lease of the
//! valve (a `concurrency` valve on its route) from one of the instances in
//! turn, calls the downstream, and gives the lease back with the time it
//! held it and the downstream's status ([`Limiter::observe`]). A request
//! whose downstream call takes over 5 s counts as failed.
//!
//! Side by side, on one downstream, each phase a valve of its own:
//!
//! 1. no valve: the downstream's queue grows for as long as it runs;
//! 2. a static valve at ten times the workers;
//! 3. the adaptive valve (`latency_target` 60 ms, `min` 2, `limit` ten
//!    times the workers);
//! 4. the same, the downstream's workers halved as the phase starts.
//!
//! For each, over the phase's measured part (its last `measure_ms`; the
//! halved phase's from 10 s on): the downstream's goodput (calls that
//! succeeded and ended then, per second) against its capacity, its
//! latency as callers saw it (p50, p99, of those calls), and each
//! priority's share denied (of the requests that arrived then).
//!
//! It passes when, with the adaptive valve, before and after the halving:
//! the downstream's p99 stays within 1.5 × `latency_target`, at least 85%
//! of its capacity is used, and the critical tenant is denied at most 2%
//! of its requests; and the static valve's p99 is at least twice the
//! target.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use sluice_core::config::{Config, OnError};
use sluice_core::keys::{Keyer, Pepper};
use sluice_core::{Policy, Request};
use sluice_store::limiter::LimiterOptions;
use sluice_store::{ClusterStore, ConnectOptions, KeySet, Limiter, MemoryStore, RedisStore, Store};
use sluice_testkit::{Downstream, RedisCluster, RedisServer};

use crate::Fallible;

/// The route the valve is on.
const ROUTE: &str = "POST /v1/search";
/// Past this, a downstream call counts as failed.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Where the limiter's state is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Backend {
    /// One instance, its memory store.
    Memory,
    /// Two instances on one redis-server.
    Redis,
    /// Two instances on a three-node Redis Cluster.
    Cluster,
}

/// What the scenario runs with.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// Where the limiter's state is.
    pub backend: Backend,
    /// The downstream's workers.
    pub workers: usize,
    /// Each request's time on a worker (ms).
    pub service_ms: u64,
    /// The adaptive valve's `latency_target` (ms).
    pub latency_target_ms: u64,
    /// How long each phase runs (ms).
    pub phase_ms: u64,
    /// The part of it measured, its last (ms).
    pub measure_ms: u64,
    /// Whether to run the phases without a valve and with a static one
    /// too, for comparison.
    pub compare: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            backend: Backend::Redis,
            workers: 10,
            service_ms: 40,
            latency_target_ms: 60,
            phase_ms: 10_000,
            measure_ms: 5_000,
            compare: true,
        }
    }
}

impl Settings {
    /// What the downstream serves at most, per second.
    pub fn capacity_per_s(&self) -> f64 {
        self.workers as f64 * 1_000.0 / self.service_ms as f64
    }
}

/// What one phase measured.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// What ran.
    pub name: String,
    /// The downstream's capacity then (per second).
    pub capacity_per_s: f64,
    /// Downstream calls that succeeded, per second.
    pub goodput_per_s: f64,
    /// The downstream's median latency as callers saw it.
    pub p50_ms: f64,
    /// Its 99th percentile.
    pub p99_ms: f64,
    /// The critical tenant's requests, and those the valve denied.
    pub critical: (u64, u64),
    /// The low tenant's.
    pub low: (u64, u64),
    /// Downstream calls that failed (timed out).
    pub failed: u64,
    /// The valve's effective limit at the phase's end (as the first
    /// instance last stepped it; 0: no adaptive valve).
    pub effective_limit: u64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// What it ran with.
    pub settings: Settings,
    /// Each phase, in turn.
    pub phases: Vec<Phase>,
}

/// The configuration with `valve` (a rule's flow map, or none) on the
/// route.
fn yaml(valve: Option<String>) -> String {
    let global = valve.map_or_else(String::new, |v| format!("global:\n  \"{ROUTE}\": [{v}]\n"));
    format!(
        "default_plan: low\nplans:\n  low: {{ priority: low, tenant: [{{ name: t, limit: 1000000, per: 1s }}] }}\n  critical: {{ priority: critical, tenant: [{{ name: t, limit: 1000000, per: 1s }}] }}\ntenants:\n  vip: {{ plan: critical }}\n{global}"
    )
}

/// Runs the scenario: one downstream, one store, the phases in turn.
pub async fn run(settings: &Settings) -> Fallible<Report> {
    let downstream =
        Downstream::start(settings.workers, Duration::from_millis(settings.service_ms));
    let keys = KeySet {
        current: Keyer::new(
            "sl",
            &Pepper::parse(&[0x5a; 32]).map_err(|e| format!("{e:?}"))?,
        ),
        previous: None,
    };
    let connect = ConnectOptions::with_timeout(Duration::from_millis(500));
    match settings.backend {
        Backend::Memory => phases(settings, &downstream, || vec![MemoryStore::new(100_000)]).await,
        Backend::Redis => {
            let server = RedisServer::start();
            let mut stores = Vec::new();
            for _ in 0..2 {
                stores.push(RedisStore::connect(&server.url(), keys.clone(), &connect).await?);
            }
            phases(settings, &downstream, || stores.clone()).await
        }
        Backend::Cluster => {
            let cluster = RedisCluster::start(3, 0);
            let mut stores = Vec::new();
            for _ in 0..2 {
                stores
                    .push(ClusterStore::connect(&cluster.urls(), keys.clone(), &connect, 1).await?);
            }
            phases(settings, &downstream, || stores.clone()).await
        }
    }
}

/// The phases in turn, each on the stores `stores` makes (one per
/// instance).
async fn phases<S: Store + 'static>(
    settings: &Settings,
    downstream: &Downstream,
    stores: impl Fn() -> Vec<S>,
) -> Fallible<Report> {
    let w = settings.workers;
    let adaptive = format!(
        "{{ name: search-db, algorithm: concurrency, limit: {}, lease: 30s, adaptive: {{ latency_target: {}ms, min: 2 }} }}",
        10 * w,
        settings.latency_target_ms
    );
    let runs = [
        ("no valve", None, w),
        (
            "static valve (10 x workers)",
            Some(format!(
                "{{ name: search-db, algorithm: concurrency, limit: {}, lease: 30s }}",
                10 * w
            )),
            w,
        ),
        ("adaptive valve", Some(adaptive.clone()), w),
        ("adaptive, workers halved", Some(adaptive), (w / 2).max(1)),
    ];
    let mut report = Report {
        settings: settings.clone(),
        phases: Vec::new(),
    };
    for (name, valve, workers) in runs {
        if !settings.compare && !name.starts_with("adaptive") {
            continue;
        }
        downstream.set_workers(workers);
        let unlimited = valve.is_none();
        let config = Config::from_yaml(&yaml(valve), "adaptive.yaml")?;
        // Each phase afresh: limiters of its own.
        let limiters: Vec<Arc<Limiter<S>>> = stores()
            .into_iter()
            .map(|store| {
                let options = LimiterOptions::new(OnError::Deny);
                let policy = Policy::compile(&config.limits);
                Arc::new(Limiter::with_options(policy, store, options))
            })
            .collect();
        let halved = workers < settings.workers;
        let (length, measured_from) = if halved {
            (settings.phase_ms.max(10_000) + 4_000, 10_000)
        } else if unlimited {
            // Its queue only grows: long enough to show it.
            (
                settings.phase_ms.min(3_000),
                settings.phase_ms.min(3_000) / 3,
            )
        } else {
            (settings.phase_ms, settings.phase_ms - settings.measure_ms)
        };
        let capacity = workers as f64 * 1_000.0 / settings.service_ms as f64;
        let mut phase = load(
            downstream,
            &limiters,
            2.0 * capacity,
            (length, measured_from),
        )
        .await;
        phase.name = name.to_owned();
        phase.capacity_per_s = capacity;
        report.phases.push(phase);
        // The downstream drains before the next phase.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(report)
}

/// What the requests of one phase met in its measured part: calls that
/// ended in it, requests that arrived in it.
struct Counts {
    /// The measured part, from the phase's start.
    measured: std::ops::Range<Duration>,
    started: tokio::time::Instant,
    served: AtomicU64,
    failed: AtomicU64,
    /// (asked, denied) of the critical tenant, then the low one.
    asked: [AtomicU64; 2],
    denied: [AtomicU64; 2],
    /// The downstream's latency of each request served (µs).
    latencies: std::sync::Mutex<Vec<u64>>,
}

/// Requests at `rate` per second for `length_ms`, measured from
/// `measured_from_ms` on.
async fn load<S: Store + 'static>(
    downstream: &Downstream,
    limiters: &[Arc<Limiter<S>>],
    rate: f64,
    (length_ms, measured_from_ms): (u64, u64),
) -> Phase {
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .pool_max_idle_per_host(4_096)
        .build()
        .unwrap_or_default();
    let url = format!("{}/work", downstream.url());
    let interval = Duration::from_secs_f64(1.0 / rate);
    let started = tokio::time::Instant::now();
    let length = Duration::from_millis(length_ms);
    let measured_from = Duration::from_millis(measured_from_ms);
    let counts = Arc::new(Counts {
        measured: measured_from..length,
        started,
        served: AtomicU64::default(),
        failed: AtomicU64::default(),
        asked: Default::default(),
        denied: Default::default(),
        latencies: std::sync::Mutex::default(),
    });
    let mut tasks = tokio::task::JoinSet::new();
    let mut next = started;
    let mut i: usize = 0;
    while next - started < length {
        tokio::time::sleep_until(next).await;
        let critical = i % 10 < 3;
        let limiter = limiters[i % limiters.len()].clone();
        let (client, url, counts) = (client.clone(), url.clone(), counts.clone());
        tasks.spawn(async move {
            one(&limiter, critical, &client, &url, &counts).await;
        });
        while tasks.try_join_next().is_some() {}
        i += 1;
        next += interval;
    }
    while tasks.join_next().await.is_some() {}
    let seconds = (length_ms - measured_from_ms) as f64 / 1_000.0;
    let mut latencies =
        std::mem::take(&mut *counts.latencies.lock().unwrap_or_else(|e| e.into_inner()));
    latencies.sort_unstable();
    let at = |q: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i] as f64 / 1_000.0
    };
    let pair = |k: usize| {
        (
            counts.asked[k].load(Ordering::Relaxed),
            counts.denied[k].load(Ordering::Relaxed),
        )
    };
    Phase {
        name: String::new(),
        capacity_per_s: 0.0,
        goodput_per_s: counts.served.load(Ordering::Relaxed) as f64 / seconds,
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        critical: pair(0),
        low: pair(1),
        failed: counts.failed.load(Ordering::Relaxed),
        effective_limit: limiters[0]
            .adaptive_levels()
            .first()
            .map_or(0, |l| l.effective_limit),
    }
}

/// One request: a lease of the valve, the downstream's call, the lease
/// given back with how long it was held and the downstream's status.
async fn one<S: Store>(
    limiter: &Limiter<S>,
    critical: bool,
    client: &reqwest::Client,
    url: &str,
    counts: &Counts,
) {
    let arrived = counts.started.elapsed();
    let tenant = if critical { "vip" } else { "someone" };
    let k = usize::from(!critical);
    let policy = limiter.policy();
    let Ok(request) = Request::new(tenant, ROUTE, None, 1) else {
        return;
    };
    let (decision, lease) = limiter.acquire(&policy, &request).await;
    let measured = counts.measured.contains(&arrived);
    if measured {
        counts.asked[k].fetch_add(1, Ordering::Relaxed);
    }
    if !decision.allowed {
        if measured {
            counts.denied[k].fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    let started = Instant::now();
    let ok = match client.post(url).body("q").send().await {
        Ok(response) => response.status().is_success() && response.bytes().await.is_ok(),
        Err(_) => false,
    };
    let held = started.elapsed();
    if counts.measured.contains(&counts.started.elapsed()) {
        if ok {
            counts.served.fetch_add(1, Ordering::Relaxed);
            counts
                .latencies
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(held.as_micros() as u64);
        } else {
            counts.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
    if let Some(lease) = lease {
        let _ = limiter.release(tenant, None, &lease).await;
    }
    let status = if ok { 200 } else { 504 };
    limiter
        .observe(
            &policy,
            &request,
            held.as_secs_f64() * 1_000.0,
            Some(status),
        )
        .await;
}

/// The phases by name (the marks look them up).
fn phase<'r>(report: &'r Report, name: &str) -> Option<&'r Phase> {
    report.phases.iter().find(|p| p.name == name)
}

/// Whether the run passed, and why not.
pub fn verdict(report: &Report) -> (bool, String) {
    let target = report.settings.latency_target_ms as f64;
    let mut notes = Vec::new();
    for name in ["adaptive valve", "adaptive, workers halved"] {
        let Some(p) = phase(report, name) else {
            notes.push(format!("{name}: not run"));
            continue;
        };
        if p.p99_ms > 1.5 * target {
            notes.push(format!(
                "{name}: p99 {:.1} ms > 1.5 x {target} ms",
                p.p99_ms
            ));
        }
        if p.goodput_per_s < 0.85 * p.capacity_per_s {
            notes.push(format!(
                "{name}: goodput {:.0}/s < 85% of {:.0}/s",
                p.goodput_per_s, p.capacity_per_s
            ));
        }
        let (asked, denied) = p.critical;
        if asked == 0 || denied as f64 > 0.02 * asked as f64 {
            notes.push(format!("{name}: critical denied {denied} of {asked}"));
        }
    }
    if let Some(p) = phase(report, "static valve (10 x workers)")
        && p.p99_ms < 2.0 * target
    {
        notes.push(format!(
            "the static valve's p99 {:.1} ms is not far above the target",
            p.p99_ms
        ));
    }
    let passed = notes.is_empty();
    let verdict = if passed {
        format!(
            "with the adaptive valve the downstream's p99 stayed within 1.5 x {target} ms at 85% of its capacity or more, before and after its workers halved, and the critical tenant was denied at most 2%"
        )
    } else {
        notes.join("; ")
    };
    (passed, verdict)
}

/// The report as a table.
pub fn table(report: &Report) -> String {
    let s = &report.settings;
    let mut out = format!(
        "downstream: {} workers of {} ms ({:.0}/s), offered twice what it serves (30% critical, 70% low); {:?}; adaptive target {} ms\n",
        s.workers,
        s.service_ms,
        s.capacity_per_s(),
        s.backend,
        s.latency_target_ms
    );
    out.push_str(&format!(
        "{:<28} {:>9} {:>9} {:>9} {:>9} {:>14} {:>14} {:>7} {:>6}\n",
        "phase",
        "capacity",
        "goodput",
        "p50 ms",
        "p99 ms",
        "critical denied",
        "low denied",
        "failed",
        "limit"
    ));
    for p in &report.phases {
        let share = |(asked, denied): (u64, u64)| {
            format!(
                "{:.1}% of {asked}",
                100.0 * denied as f64 / asked.max(1) as f64
            )
        };
        out.push_str(&format!(
            "{:<28} {:>9.0} {:>9.0} {:>9.1} {:>9.1} {:>15} {:>14} {:>7} {:>6}\n",
            p.name,
            p.capacity_per_s,
            p.goodput_per_s,
            p.p50_ms,
            p.p99_ms,
            share(p.critical),
            share(p.low),
            p.failed,
            p.effective_limit
        ));
    }
    out
}
