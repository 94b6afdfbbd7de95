//! Offered load replayed request by request on a hand-set clock: each
//! tenant's arrivals (Poisson from a fixed seed, or evenly spaced, in step
//! with every other such sender of its rate), decided in time order by one
//! limiter, the clock set to each arrival. What fair valves are tested
//! with, on the memory store and on a real Redis alike.

// Each test file uses part of it.
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use sluice_core::config::OnError;
use sluice_core::{Config, Policy, Reason, Request};
use sluice_store::{Limiter, LimiterOptions, ManualClock, MemoryStore, Store};

pub mod edges;

pub const START_MS: u64 = 1_764_460_800_000;

/// A valve on `POST /v1/orders`, each tenant inside a ceiling of 60/s;
/// `extra` is appended to the plans (more plans, weights).
pub fn config(valve: &str, extra: &str) -> String {
    format!(
        r#"
default_plan: p
plans:
  p:
    tenant: [{{ name: ceiling, algorithm: gcra, limit: 60, per: 1s }}]
{extra}
tenants:
  heavy: {{ plan: heavy }}
global:
  "POST /v1/orders": [{valve}]
"#
    )
}

/// The valve: 100 a second, fair (the default).
pub const VALVE: &str = "{ name: orders, algorithm: gcra, limit: 100, per: 1s }";

pub const HEAVY: &str = r#"  heavy:
    weight: 2
    tenant: [{ name: ceiling, algorithm: gcra, limit: 60, per: 1s }]"#;

/// One tenant's offered load: `rate` per second from `from_ms` to
/// `until_ms` (run time), at random (Poisson) or evenly spaced (`steady`:
/// the first at `from_ms`, so steady senders of one rate from one time
/// arrive in step, on the same millisecond).
#[derive(Clone)]
pub struct Sender {
    pub tenant: String,
    pub rate: f64,
    pub from_ms: u64,
    pub until_ms: u64,
    pub steady: bool,
}

pub fn sender(tenant: &str, rate: f64) -> Sender {
    Sender {
        tenant: tenant.into(),
        rate,
        from_ms: 0,
        until_ms: u64::MAX,
        steady: false,
    }
}

/// [`sender`], evenly spaced.
pub fn steady(tenant: &str, rate: f64) -> Sender {
    Sender {
        steady: true,
        ..sender(tenant, rate)
    }
}

/// One sender's requests counted from the run's `measure_from_ms` on.
#[derive(Debug, Clone, Copy, Default)]
pub struct Count {
    pub sent: u64,
    pub admitted: u64,
    /// Denied by the valve or its gate.
    pub denied: u64,
    /// The longest wait such a denial gave, in ms.
    pub longest_retry_ms: u64,
    /// The shortest, if any.
    pub shortest_retry_ms: Option<u64>,
}

/// Per sender, what it was answered; per second of the run, admitted by
/// all; per sender and second of the run, what it was answered then.
pub struct Run {
    pub counts: Vec<Count>,
    pub admitted_per_second: Vec<u64>,
    pub seconds: Vec<Vec<Count>>,
    /// Decisions over the whole run.
    pub decided: u64,
}

impl Run {
    /// Admitted per second on average by sender `i` over `seconds`.
    pub fn rate(&self, i: usize, seconds: f64) -> f64 {
        self.counts[i].admitted as f64 / seconds
    }
}

/// The options of a limiter on `clock`.
pub fn options(clock: &Arc<ManualClock>) -> LimiterOptions {
    LimiterOptions {
        clock: clock.clone(),
        ..LimiterOptions::new(OnError::Deny)
    }
}

pub fn policy(yaml: &str) -> Policy {
    Policy::compile(&Config::from_yaml(yaml, "fair.yaml").unwrap().limits)
}

/// A limiter on the memory store for `yaml`, on a hand-set clock.
pub fn limiter_on(yaml: &str) -> (Limiter<MemoryStore>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(START_MS));
    let limiter = Limiter::with_options(
        policy(yaml),
        MemoryStore::with_clock(100_000, clock.clone()),
        options(&clock),
    );
    (limiter, clock)
}

/// Runs `senders` for `run_ms` against `yaml` on one limiter and its
/// memory store, the clock set to each request's arrival.
pub fn run(yaml: &str, senders: &[Sender], run_ms: u64, measure_from_ms: u64) -> Run {
    run_reloading(yaml, senders, run_ms, measure_from_ms, None)
}

/// [`run`], with the configuration replaced by `reload.1` at `reload.0`
/// ms into the run (as a reload or an override does).
pub fn run_reloading(
    yaml: &str,
    senders: &[Sender],
    run_ms: u64,
    measure_from_ms: u64,
    reload: Option<(u64, &str)>,
) -> Run {
    let (limiter, clock) = limiter_on(yaml);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(run_on(
        &limiter,
        &clock,
        senders,
        run_ms,
        measure_from_ms,
        reload,
    ))
}

/// [`run_reloading`] on `limiter` (of any store) and its `clock`, which
/// starts at [`START_MS`].
pub async fn run_on<S: Store>(
    limiter: &Limiter<S>,
    clock: &ManualClock,
    senders: &[Sender],
    run_ms: u64,
    measure_from_ms: u64,
    reload: Option<(u64, &str)>,
) -> Run {
    let mut policy = limiter.policy();
    let mut reload = reload;
    // Poisson arrivals in µs (exponential gaps from a fixed seed): what
    // many independent clients look like, and what makes first come, first
    // served starve the one who asks least often.
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut gap_us = |s: &Sender| {
        if s.steady {
            return (1e6 / s.rate) as u64;
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let uniform = (seed >> 11) as f64 / (1u64 << 53) as f64;
        (-(1.0 - uniform).ln() * 1e6 / s.rate) as u64
    };
    let mut arrivals = BinaryHeap::new();
    for (i, s) in senders.iter().enumerate() {
        let first = if s.steady { 0 } else { gap_us(s) };
        arrivals.push(Reverse((s.from_ms * 1_000 + first, i)));
    }
    let mut counts = vec![Count::default(); senders.len()];
    let mut admitted_per_second = vec![0; (run_ms / 1_000) as usize + 1];
    let mut seconds = vec![vec![Count::default(); admitted_per_second.len()]; senders.len()];
    let mut decided = 0;
    while let Some(Reverse((at_us, i))) = arrivals.pop() {
        let s = &senders[i];
        if at_us >= run_ms * 1_000 || at_us >= s.until_ms.saturating_mul(1_000) {
            continue;
        }
        arrivals.push(Reverse((at_us + gap_us(s), i)));
        if let Some((at_ms, yaml)) = reload
            && at_us / 1_000 >= at_ms
        {
            limiter.set_policy(self::policy(yaml));
            policy = limiter.policy();
            reload = None;
        }
        clock.set(START_MS + at_us / 1_000);
        let request = Request::new(&s.tenant, "POST /v1/orders", None, 1).unwrap();
        let decision = limiter.decide(&policy, &request).await;
        decided += 1;
        let second = (at_us / 1_000_000) as usize;
        if decision.allowed {
            admitted_per_second[second] += 1;
        }
        let tally = |c: &mut Count| {
            c.sent += 1;
            if decision.allowed {
                c.admitted += 1;
            } else if decision.reason == Some(Reason::GlobalCapacity) {
                c.denied += 1;
                let retry = decision.retry_after_ms().unwrap_or(0);
                c.longest_retry_ms = c.longest_retry_ms.max(retry);
                c.shortest_retry_ms = Some(c.shortest_retry_ms.map_or(retry, |s| s.min(retry)));
            }
        };
        tally(&mut seconds[i][second]);
        if at_us / 1_000 >= measure_from_ms {
            tally(&mut counts[i]);
        }
    }
    Run {
        counts,
        admitted_per_second,
        seconds,
        decided,
    }
}

/// [`run`] on a real Redis at `url` (each run under keys of its own), the
/// scripts told the time by the hand-set clock.
pub fn run_redis(
    url: &str,
    yaml: &str,
    senders: &[Sender],
    run_ms: u64,
    measure_from_ms: u64,
) -> Run {
    run_remote(Remote::Redis(url), yaml, senders, run_ms, measure_from_ms)
}

/// [`run`] on a real Redis Cluster of seed `urls`, each valve split as
/// `storage.global_shards` splits it by default (16), the scripts told the
/// time by the hand-set clock.
pub fn run_cluster(
    urls: &[String],
    yaml: &str,
    senders: &[Sender],
    run_ms: u64,
    measure_from_ms: u64,
) -> Run {
    run_remote(
        Remote::Cluster(urls),
        yaml,
        senders,
        run_ms,
        measure_from_ms,
    )
}

/// Where [`run_remote`] runs.
enum Remote<'a> {
    Redis(&'a str),
    Cluster(&'a [String]),
}

fn run_remote(
    remote: Remote<'_>,
    yaml: &str,
    senders: &[Sender],
    run_ms: u64,
    measure_from_ms: u64,
) -> Run {
    use sluice_core::keys::{Keyer, Pepper};
    use sluice_store::{ClusterStore, ConnectOptions, KeySet, RedisStore, TimeSource};
    static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let prefix = format!(
        "fair{}",
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let clock = Arc::new(ManualClock::new(START_MS));
        let keys = KeySet {
            current: Keyer::new(&prefix, &Pepper::parse(&[b'q'; 32]).unwrap()),
            previous: None,
        };
        let connect = ConnectOptions::with_timeout(std::time::Duration::from_secs(5));
        let time = TimeSource::Client(clock.clone());
        match remote {
            Remote::Redis(url) => {
                let store = RedisStore::connect(url, keys, &connect).await.unwrap();
                let limiter =
                    Limiter::with_options(policy(yaml), store.with_time(time), options(&clock));
                run_on(&limiter, &clock, senders, run_ms, measure_from_ms, None).await
            }
            Remote::Cluster(urls) => {
                let store = ClusterStore::connect(urls, keys, &connect, 16)
                    .await
                    .unwrap();
                let limiter =
                    Limiter::with_options(policy(yaml), store.with_time(time), options(&clock));
                run_on(&limiter, &clock, senders, run_ms, measure_from_ms, None).await
            }
        }
    })
}
