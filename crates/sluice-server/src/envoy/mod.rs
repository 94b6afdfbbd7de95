//! The Envoy Rate Limit Service: `envoy.service.ratelimit.v3.RateLimitService`.
//!
//! One `ShouldRateLimit` is one sluice decision: every descriptor's rules
//! are decided together and committed all or none, in one store round trip.
//! A request's domain selects how its descriptors are read:
//!
//! - a domain of the envoyproxy/ratelimit configuration (`envoy.config`,
//!   `--envoy-config`): descriptors match that configuration's tree, each
//!   matched limit counting per request descriptor, as envoyproxy/ratelimit
//!   does ([`envoyproxy`]);
//! - the native domain (`envoy.domain`): descriptor entries name the tenant,
//!   route and subject, and sluice's plans decide; each descriptor's status
//!   reports the scope its deepest entry names (subject, route or tenant)
//!   (`native`);
//! - any other domain: no limits (every descriptor OK).
//!
//! A descriptor's `limit` override replaces what the configuration says for
//! it; `hits_addend` is honoured per request and per descriptor. Answers
//! carry `RateLimit-Policy`, `RateLimit` and, when over the limit,
//! `Retry-After` in `response_headers_to_add`.
//!
//! Files, one role each: `request` reads and bounds a request,
//! `descriptor` what one descriptor counts in, `envoyproxy` and `native`
//! decide, `zero_limit` answers limits of zero, `answer` builds the
//! response, `units` maps Envoy's units, and `stats` counts
//! envoyproxy/ratelimit's per-descriptor statistics. The transport is
//! `crate::grpc`'s (and `/json`'s, in `crate::http`).

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::Status;

use crate::app::App;
use crate::grpc::request::RequestView;

mod answer;
mod descriptor;
pub mod envoyproxy;
mod native;
mod request;
mod stats;
mod units;
mod verdict;
mod zero_limit;

use request::read_request;

/// Longest a read that consumes nothing (a `hits_addend: 0` check, the
/// standing beside a zero limit) waits for the store: past it the answer
/// goes without what the read would have added.
const CHECK_ONLY_BUDGET: std::time::Duration = std::time::Duration::from_millis(100);

/// The gRPC service.
#[derive(Debug, Clone)]
pub struct RateLimiter {
    app: Arc<App>,
}

impl RateLimiter {
    /// The service over a running app.
    pub fn new(app: Arc<App>) -> RateLimiter {
        RateLimiter { app }
    }
}

impl RateLimiter {
    /// `ShouldRateLimit`: one decision over every descriptor of `request`.
    pub async fn should_rate_limit(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, Status> {
        self.should_rate_limit_view(RequestView::of(&request)).await
    }

    /// [`should_rate_limit`](Self::should_rate_limit) for a request read
    /// in place ([`RequestView::decode`]).
    pub async fn should_rate_limit_view(
        &self,
        request: RequestView<'_>,
    ) -> Result<RateLimitResponse, Status> {
        let started = Instant::now();
        let domain = request.domain;
        let (hits, descriptors) = read_request(request)?;
        let policy = self.app.limiter.policy();
        if policy.descriptors().has_domain(domain) {
            return Ok(self
                .decide_envoyproxy(&policy, domain, &descriptors, started)
                .await);
        }
        let native = &self.app.envoy;
        if domain == native.domain {
            return self
                .decide_native(&policy, native, &descriptors, hits, started)
                .await;
        }
        // Unknown domain: no limits, as envoyproxy/ratelimit answers.
        Ok(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: descriptors
                .iter()
                .map(|_| DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
    }
}
