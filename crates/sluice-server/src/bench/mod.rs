//! Load generation against a running service (`sluice bench`).
//!
//! Closed-loop: `concurrency` workers each send one request, wait for the
//! answer, and send the next, for `duration`. Latencies go into an HDR
//! histogram (microseconds) and are reported as percentiles.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use hdrhistogram::Histogram;

use crate::Fallible;

/// What a load run measured.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// Answers received.
    pub requests: u64,
    /// Of which over the limit.
    pub over_limit: u64,
    /// Calls that failed.
    pub errors: u64,
    /// How long the run took.
    pub elapsed: Duration,
    /// Every answer's latency, in microseconds (1 µs to 60 s, 3
    /// significant digits: a run of any length takes the same memory).
    pub latencies: Histogram<u64>,
}

impl Default for LoadReport {
    fn default() -> LoadReport {
        LoadReport {
            requests: 0,
            over_limit: 0,
            errors: 0,
            elapsed: Duration::ZERO,
            latencies: Histogram::new_with_bounds(1, 60_000_000, 3)
                .expect("valid histogram bounds"),
        }
    }
}

impl LoadReport {
    /// Answers per second.
    pub fn per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }

    /// The `p`-th percentile latency (0 < p ≤ 100), in microseconds.
    pub fn percentile_us(&self, p: f64) -> u64 {
        self.latencies.value_at_quantile(p / 100.0)
    }

    /// One line: rate and percentiles.
    pub fn summary(&self) -> String {
        let (p50, p90, p99, max) = (
            self.percentile_us(50.0),
            self.percentile_us(90.0),
            self.percentile_us(99.0),
            self.latencies.max(),
        );
        format!(
            "{:.0} decisions/s over {:.1}s ({} answers, {} over limit, {} errors); latency p50 {p50}µs p90 {p90}µs p99 {p99}µs max {max}µs",
            self.per_second(),
            self.elapsed.as_secs_f64(),
            self.requests,
            self.over_limit,
            self.errors,
        )
    }
}

/// Drives `ShouldRateLimit` at `target` (e.g. `http://127.0.0.1:8081`):
/// one descriptor `[key=<one of values distinct values>]` per request.
pub async fn rls(
    target: &str,
    domain: &str,
    key: &str,
    values: usize,
    concurrency: usize,
    duration: Duration,
) -> Fallible<LoadReport> {
    let channel = tonic::transport::Channel::from_shared(target.to_owned())?
        .connect_timeout(open::REQUEST_TIMEOUT)
        .timeout(open::REQUEST_TIMEOUT)
        .connect()
        .await?;
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let workers: Vec<_> = (0..concurrency.max(1))
        .map(|worker| {
            let mut client = RateLimitServiceClient::new(channel.clone());
            let (domain, key) = (domain.to_owned(), key.to_owned());
            tokio::spawn(async move {
                let mut report = LoadReport::default();
                let mut i = worker * 7_919;
                while Instant::now() < deadline {
                    i = (i + 1) % values.max(1);
                    let request = RateLimitRequest {
                        domain: domain.clone(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: key.clone(),
                                value: format!("value-{i}"),
                            }],
                            ..Default::default()
                        }],
                        hits_addend: 1,
                    };
                    let sent = Instant::now();
                    match client.should_rate_limit(request).await {
                        Ok(answer) => {
                            let us = sent.elapsed().as_micros() as u64;
                            let _ = report.latencies.record(us.clamp(1, 60_000_000));
                            report.requests += 1;
                            if answer.into_inner().overall_code == Code::OverLimit as i32 {
                                report.over_limit += 1;
                            }
                        }
                        Err(_) => report.errors += 1,
                    }
                }
                report
            })
        })
        .collect();
    let mut total = LoadReport::default();
    for worker in workers {
        let report = worker.await?;
        total.requests += report.requests;
        total.over_limit += report.over_limit;
        total.errors += report.errors;
        let _ = total.latencies.add(&report.latencies);
    }
    total.elapsed = started.elapsed();
    Ok(total)
}

pub mod adaptive;
pub mod file;
pub mod hot_key;
pub mod open;
pub mod regions;
pub mod scenario;
mod settle;
