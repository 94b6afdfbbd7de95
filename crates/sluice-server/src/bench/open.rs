//! Open-loop load: requests sent on a schedule, whatever the answers do.
//!
//! Each class of tenants sends `rate` requests per second per tenant,
//! spread evenly, tenants in turn. A request's latency is measured from
//! the moment the schedule meant to send it, not from when it was sent, so
//! a service (or client) that falls behind shows it in the percentiles
//! instead of hiding it by slowing the load (coordinated omission).
//! Latencies go into an HDR histogram per class (1 µs to 60 s, 3
//! significant digits). The schedule sleeps on the operating system's
//! timer, and how late it sent (its own lag) is reported beside them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use hdrhistogram::Histogram;
use std::sync::Mutex;

use serde::Serialize;
use std::time::Instant;

use crate::Fallible;

/// Where the load goes. A target may list several instances,
/// comma-separated: each tenant's requests take turns over them.
#[derive(Debug, Clone)]
pub enum Api {
    /// `POST {base}/v1/check`.
    Http(String),
    /// `POST {base}/v1/check` reserving, then `POST {base}/v1/settle`
    /// (see [`super::settle`]).
    Reserve(String),
    /// `ShouldRateLimit` on the native domain (one descriptor of `tenant`
    /// and `route` entries).
    Grpc {
        /// `http://host:port`.
        target: String,
        /// The native domain (`envoy.domain`).
        domain: String,
    },
}

/// Tenants that behave alike.
#[derive(Debug, Clone)]
pub struct Class {
    /// Shown in reports; also the tenants' name prefix.
    pub name: String,
    /// How many tenants.
    pub tenants: usize,
    /// Requests per second per tenant.
    pub rate: f64,
}

/// What one class saw.
#[derive(Debug, Clone, Serialize)]
pub struct ClassReport {
    /// The class.
    pub class: String,
    /// Tenants in it.
    pub tenants: usize,
    /// Requests sent.
    pub sent: u64,
    /// Admitted.
    pub allowed: u64,
    /// Denied (429, or `OVER_LIMIT`).
    pub denied: u64,
    /// Failed (no answer, or another status).
    pub errors: u64,
    /// The most any one tenant of the class had admitted.
    pub most_admitted_per_tenant: u64,
    /// The fewest any one tenant of the class had admitted.
    pub least_admitted_per_tenant: u64,
    /// Each tenant's admitted requests, in the order of their names'
    /// numbers (classes of at most [`LISTED_TENANTS`] tenants; empty for
    /// larger ones).
    pub admitted_per_tenant: Vec<u64>,
    /// The limit the service answered with (its tightest rule), if any.
    pub limit: Option<u64>,
    /// The most one tenant of the class may be admitted over the run by
    /// the policies the service advertised (`RateLimit-Policy`, on both
    /// APIs): the least over them of `q × (⌈run / (w − 1)⌉ + 1)` (`w`
    /// itself when it is 1), a bound every algorithm keeps: a window
    /// admits up to `q` in each window the run touches, a bucket `q` at
    /// once and then `q` per its refill time, which `w` rounds up by less
    /// than a second. Not for a bucket that refills in under a second
    /// (`w=1` while `burst × per / limit` is below 1 s); `None` when no
    /// policy was advertised.
    pub allowance: Option<u64>,
    /// Latency percentiles from the intended send time, in µs.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// The slowest.
    pub max_us: u64,
    /// How late the load itself sent (99th percentile of the time from the
    /// intended send time to the request's dispatch, in µs): when this is
    /// a large part of p99, the generator, not the service, fell behind.
    pub send_lag_p99_us: u64,
}

impl ClassReport {
    /// The share of requests denied, in percent.
    pub fn denied_percent(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            100.0 * self.denied as f64 / self.sent as f64
        }
    }

    /// One human line.
    pub fn line(&self) -> String {
        format!(
            "{:<10} {:>5} tenants  sent {:>8}  allowed {:>8}  denied {:>8} ({:>5.1}%)  errors {:>5}  p50 {:>7}µs p90 {:>7}µs p99 {:>7}µs p99.9 {:>7}µs max {:>7}µs  (send lag p99 {}µs)",
            self.class,
            self.tenants,
            self.sent,
            self.allowed,
            self.denied,
            self.denied_percent(),
            self.errors,
            self.p50_us,
            self.p90_us,
            self.p99_us,
            self.p999_us,
            self.max_us,
            self.send_lag_p99_us
        )
    }
}

/// The most tenants of a class whose admitted counts a report lists one by
/// one.
pub const LISTED_TENANTS: usize = 16;

/// Counters of one class while it runs.
struct Tally {
    sent: AtomicU64,
    allowed: AtomicU64,
    denied: AtomicU64,
    errors: AtomicU64,
    limit: AtomicU64,
    /// `(q, w)` of each advertised policy with a window, read once.
    policies: Mutex<Option<Vec<(u64, u64)>>>,
    per_tenant: Vec<AtomicU64>,
    latencies: Mutex<Histogram<u64>>,
    send_lag: Mutex<Histogram<u64>>,
}

impl Tally {
    fn new(tenants: usize) -> Tally {
        Tally {
            sent: AtomicU64::new(0),
            allowed: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            limit: AtomicU64::new(0),
            policies: Mutex::new(None),
            per_tenant: (0..tenants).map(|_| AtomicU64::new(0)).collect(),
            latencies: Mutex::new(latency_histogram()),
            send_lag: Mutex::new(latency_histogram()),
        }
    }

    fn report(&self, class: &Class, run: Duration) -> ClassReport {
        let h = self.latencies.lock().expect("histogram lock");
        let admitted: Vec<u64> = self
            .per_tenant
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect();
        let limit = self.limit.load(Ordering::Relaxed);
        ClassReport {
            class: class.name.clone(),
            tenants: class.tenants,
            sent: self.sent.load(Ordering::Relaxed),
            allowed: self.allowed.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            most_admitted_per_tenant: admitted.iter().copied().max().unwrap_or(0),
            least_admitted_per_tenant: admitted.iter().copied().min().unwrap_or(0),
            admitted_per_tenant: if admitted.len() <= LISTED_TENANTS {
                admitted.clone()
            } else {
                Vec::new()
            },
            limit: (limit > 0).then_some(limit),
            allowance: self
                .policies
                .lock()
                .expect("policies lock")
                .as_deref()
                .and_then(|policies| allowance(policies, run)),
            p50_us: h.value_at_quantile(0.5),
            p90_us: h.value_at_quantile(0.9),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
            send_lag_p99_us: self
                .send_lag
                .lock()
                .expect("histogram lock")
                .value_at_quantile(0.99),
        }
    }
}

/// `(q, w)` of each item of a `RateLimit-Policy` field value that has a
/// window (`"name";q=50;w=1`; concurrency items have none).
fn windowed_policies(field: &str) -> Vec<(u64, u64)> {
    field
        .split(',')
        .filter_map(|item| {
            let (mut q, mut w) = (None, None);
            for param in item.split(';').skip(1) {
                match param.trim().split_once('=') {
                    Some(("q", v)) => q = v.parse().ok(),
                    Some(("w", v)) => w = v.parse().ok(),
                    _ => {}
                }
            }
            Some((q?, w.filter(|&w| w > 0)?))
        })
        .collect()
}

/// The most one tenant may be admitted over `run` under `policies` (see
/// [`ClassReport::allowance`]).
fn allowance(policies: &[(u64, u64)], run: Duration) -> Option<u64> {
    let seconds = run.as_secs().max(1);
    policies
        .iter()
        .map(|&(q, w)| q.saturating_mul(seconds.div_ceil(w.saturating_sub(1).max(1)) + 1))
        .min()
}

/// 1 µs to 60 s, 3 significant digits.
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

/// How long a request may wait for its answer before it counts as failed:
/// a service that stops answering ends the run on time, with errors, and
/// does not hang it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// One answer, as the load sees it.
enum Answer {
    Allowed(Read),
    Denied(Read),
    Failed,
}

/// What an answer said of the limits, when asked to read them: its
/// tightest limit and the `RateLimit-Policy` field.
type Read = Option<(Option<u64>, Option<String>)>;

/// A client for `api`.
#[derive(Clone)]
enum Client {
    Http(reqwest::Client, String),
    Reserve(super::settle::Settling),
    Grpc(RateLimitServiceClient<tonic::transport::Channel>, String),
}

impl Client {
    /// A client per target `api` lists.
    async fn connect(api: &Api) -> Fallible<Vec<Client>> {
        let mut clients = Vec::new();
        match api {
            Api::Http(bases) => {
                let http = reqwest::Client::builder()
                    .pool_max_idle_per_host(1024)
                    .timeout(REQUEST_TIMEOUT)
                    .build()?;
                for base in bases.split(',').map(str::trim) {
                    let url = format!("{}/v1/check", base.trim_end_matches('/'));
                    clients.push(Client::Http(http.clone(), url));
                }
            }
            Api::Reserve(bases) => {
                let http = reqwest::Client::builder()
                    .pool_max_idle_per_host(1024)
                    .timeout(REQUEST_TIMEOUT)
                    .build()?;
                for base in bases.split(',').map(str::trim) {
                    clients.push(Client::Reserve(super::settle::Settling::new(&http, base)));
                }
            }
            Api::Grpc { target, domain } => {
                for target in target.split(',').map(str::trim) {
                    let channel = tonic::transport::Channel::from_shared(target.to_owned())?
                        .connect_timeout(REQUEST_TIMEOUT)
                        .timeout(REQUEST_TIMEOUT)
                        .connect()
                        .await?;
                    clients.push(Client::Grpc(
                        RateLimitServiceClient::new(channel),
                        domain.clone(),
                    ));
                }
            }
        }
        Ok(clients)
    }

    async fn ask(&mut self, tenant: &str, route: &str, read_limit: bool) -> Answer {
        match self {
            Client::Reserve(settling) => match settling.reserve_and_settle(tenant, route).await {
                Some(200) => Answer::Allowed(None),
                Some(429) => Answer::Denied(None),
                _ => Answer::Failed,
            },
            Client::Http(http, url) => {
                let body = serde_json::json!({ "tenant": tenant, "route": route });
                let Ok(response) = http.post(url.as_str()).json(&body).send().await else {
                    return Answer::Failed;
                };
                let status = response.status().as_u16();
                let read = if read_limit {
                    let policy = response
                        .headers()
                        .get("ratelimit-policy")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    let limit = response
                        .json::<serde_json::Value>()
                        .await
                        .ok()
                        .and_then(|v| v["limit"].as_u64());
                    Some((limit, policy))
                } else {
                    // Read to the end so the connection is reused.
                    let _ = response.bytes().await;
                    None
                };
                match status {
                    200 => Answer::Allowed(read),
                    429 => Answer::Denied(read),
                    _ => Answer::Failed,
                }
            }
            Client::Grpc(grpc, domain) => {
                let entry = |key: &str, value: &str| Entry {
                    key: key.to_owned(),
                    value: value.to_owned(),
                };
                let request = RateLimitRequest {
                    domain: domain.clone(),
                    // One descriptor, as one Envoy rate-limit action with
                    // the tenant and the route makes it: the plan's rules
                    // for that route, as `/v1/check` decides them.
                    descriptors: vec![RateLimitDescriptor {
                        entries: vec![entry("tenant", tenant), entry("route", route)],
                        ..Default::default()
                    }],
                    hits_addend: 1,
                };
                let Ok(answer) = grpc.should_rate_limit(request).await else {
                    return Answer::Failed;
                };
                let answer = answer.into_inner();
                let read = read_limit.then(|| {
                    let limit = answer
                        .statuses
                        .iter()
                        .filter_map(|s| s.current_limit.as_ref())
                        .map(|l| u64::from(l.requests_per_unit))
                        .min();
                    let policy = answer
                        .response_headers_to_add
                        .iter()
                        .find(|h| h.key.eq_ignore_ascii_case("ratelimit-policy"))
                        .map(|h| h.value.clone());
                    (limit, policy)
                });
                if answer.overall_code == Code::OverLimit as i32 {
                    Answer::Denied(read)
                } else {
                    Answer::Allowed(read)
                }
            }
        }
    }
}

/// How a run is shaped.
#[derive(Debug, Clone)]
pub struct Load {
    /// Where it goes.
    pub api: Api,
    /// The route of every request.
    pub route: String,
    /// Who sends.
    pub classes: Vec<Class>,
    /// For how long.
    pub duration: Duration,
    /// The most requests in flight at once; the schedule waits for a free
    /// one (and the wait counts in the latencies).
    pub max_in_flight: usize,
    /// A prefix making this run's tenants its own (fresh budgets).
    pub run: String,
    /// Print a progress line to stderr every second.
    pub progress: bool,
}

/// Runs `load` and reports each class.
pub async fn run(load: &Load) -> Fallible<Vec<ClassReport>> {
    let clients = Arc::new(Client::connect(&load.api).await?);
    let permits = u32::try_from(load.max_in_flight.clamp(1, 1 << 20)).unwrap_or(1 << 20);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(permits as usize));
    let started = Instant::now();
    let deadline = started + load.duration;
    let tallies: Vec<Arc<Tally>> = load
        .classes
        .iter()
        .map(|c| Arc::new(Tally::new(c.tenants)))
        .collect();
    let mut schedulers = Vec::new();
    for (class, tally) in load.classes.iter().zip(&tallies) {
        let total_rate = class.rate * class.tenants as f64;
        if total_rate <= 0.0 || class.tenants == 0 {
            continue;
        }
        let gap = Duration::from_secs_f64(1.0 / total_rate);
        let tenants: Arc<Vec<String>> = Arc::new(
            (0..class.tenants)
                .map(|i| format!("{}-{}-{i}", load.run, class.name))
                .collect(),
        );
        let (clients, in_flight, tally, route) = (
            clients.clone(),
            in_flight.clone(),
            tally.clone(),
            load.route.clone(),
        );
        // The schedule runs on a thread of its own, sleeping with the
        // operating system's timer (tens of µs late) rather than the
        // runtime's (rounded up to the next millisecond): latencies count
        // from the intended send time, so a late timer would add to every
        // one of them. Requests whose time has come when it wakes go out
        // together.
        let runtime = tokio::runtime::Handle::current();
        schedulers.push(tokio::task::spawn_blocking(move || {
            let mut lag = latency_histogram();
            let mut k: u64 = 0;
            loop {
                let intended = started + gap.mul_f64(k as f64);
                // The run ends at its deadline, also when the load could
                // not keep to its schedule: what it did not send by then
                // shows as sent short of offered (and in the send lag).
                if intended >= deadline || Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(intended.saturating_duration_since(Instant::now()));
                let Ok(permit) = runtime.block_on(in_flight.clone().acquire_owned()) else {
                    break;
                };
                // Waiting for a free place may have taken it past the end.
                if Instant::now() >= deadline {
                    break;
                }
                let which = (k % tenants.len() as u64) as usize;
                // Each round over the tenants goes to the next target, so
                // that every tenant's requests take turns over them.
                let target = (k / tenants.len() as u64 % clients.len() as u64) as usize;
                let (mut client, tally, tenants, route) = (
                    clients[target].clone(),
                    tally.clone(),
                    tenants.clone(),
                    route.clone(),
                );
                let read_limit = tally.limit.load(Ordering::Relaxed) == 0;
                tally.sent.fetch_add(1, Ordering::Relaxed);
                let late = intended.elapsed().as_micros() as u64;
                let _ = lag.record(late.clamp(1, 60_000_000));
                // Nothing keeps the task once it is done (a handle per
                // request kept every finished task's memory to the end of
                // the run: 2.3 KB a request); its permit, given back when
                // it has counted its answer, is how the end is awaited.
                runtime.spawn(async move {
                    let _permit = permit;
                    let answer = client.ask(&tenants[which], &route, read_limit).await;
                    let waited = intended.elapsed().as_micros() as u64;
                    let read = match answer {
                        Answer::Allowed(read) => {
                            tally.allowed.fetch_add(1, Ordering::Relaxed);
                            tally.per_tenant[which].fetch_add(1, Ordering::Relaxed);
                            read
                        }
                        Answer::Denied(read) => {
                            tally.denied.fetch_add(1, Ordering::Relaxed);
                            read
                        }
                        Answer::Failed => {
                            tally.errors.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    };
                    if let Some((limit, policy)) = read {
                        if let Some(limit) = limit {
                            tally.limit.store(limit, Ordering::Relaxed);
                        }
                        if let Some(policy) = policy {
                            *tally.policies.lock().expect("policies lock") =
                                Some(windowed_policies(&policy));
                        }
                    }
                    let mut h = tally.latencies.lock().expect("histogram lock");
                    let _ = h.record(waited.clamp(1, 60_000_000));
                });
                k += 1;
            }
            // Every permit back: every request of the run has answered
            // and been counted (the permits are shared by the classes,
            // which all end at the same deadline).
            drop(runtime.block_on(in_flight.acquire_many(permits)));
            let _ = tally.send_lag.lock().expect("histogram lock").add(&lag);
        }));
    }
    let progress = load.progress.then(|| {
        let (tallies, classes) = (tallies.clone(), load.classes.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let line: Vec<String> = classes
                    .iter()
                    .zip(&tallies)
                    .map(|(c, t)| {
                        format!(
                            "{}: {} sent, {} allowed, {} denied, {} errors",
                            c.name,
                            t.sent.load(Ordering::Relaxed),
                            t.allowed.load(Ordering::Relaxed),
                            t.denied.load(Ordering::Relaxed),
                            t.errors.load(Ordering::Relaxed)
                        )
                    })
                    .collect();
                eprintln!("[{:>3}s] {}", started.elapsed().as_secs(), line.join(" | "));
            }
        })
    });
    for scheduler in schedulers {
        scheduler.await?;
    }
    if let Some(progress) = progress {
        progress.abort();
    }
    Ok(load
        .classes
        .iter()
        .zip(&tallies)
        .map(|(c, t)| t.report(c, load.duration))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allowance_is_the_tightest_policy_over_every_window_the_run_touches() {
        let field =
            r#""tenant-0";q=100;w=60, "route-0";q=50;w=1, "slots";q=4;qu="concurrent-requests""#;
        assert_eq!(windowed_policies(field), [(100, 60), (50, 1)]);
        // 3 s: 100 × (1 + 1) against 50 × (3 + 1).
        assert_eq!(
            allowance(&windowed_policies(field), Duration::from_secs(3)),
            Some(200)
        );
        // 10 s: the minute's 200 against the second's 550.
        assert_eq!(
            allowance(&windowed_policies(field), Duration::from_secs(10)),
            Some(200)
        );
        // Nothing with a window, or nothing readable: no allowance.
        assert_eq!(
            allowance(
                &windowed_policies(r#""slots";q=4;qu="concurrent-requests""#),
                Duration::from_secs(3)
            ),
            None
        );
        assert_eq!(windowed_policies("junk, \"a\";q=x;w=1, \"b\";q=1;w=0"), []);
    }
}
