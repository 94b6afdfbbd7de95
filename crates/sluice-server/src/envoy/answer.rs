//! The `ShouldRateLimit` answer: each descriptor's status, the overall
//! code (quota descriptors over only together) and the `RateLimit`
//! headers.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use sluice_core::decision::Known;
use sluice_core::descriptors::DescriptorLimit;
use sluice_core::headers::Fields;
use sluice_core::{Decision, Reason};

use super::RateLimiter;
use super::verdict::{Verdict, reported_limit};
use super::{stats, zero_limit};

impl RateLimiter {
    /// The gRPC answer for a decision.
    pub(super) fn answer(&self, decided: Verdict<'_>) -> RateLimitResponse {
        let Verdict {
            decision,
            descriptors,
            policy,
            now_ms,
        } = decided;
        stats::count(&self.app.metrics, &decision, &descriptors);
        if decision.shadow_denied {
            tracing::debug!("a shadow-mode descriptor would have denied this request");
        }
        let statuses: Vec<DescriptorStatus> = descriptors
            .iter()
            .map(|d| {
                if d.unlimited() {
                    return DescriptorStatus {
                        code: Code::Ok as i32,
                        limit_remaining: u32::MAX,
                        ..Default::default()
                    };
                }
                if d.blocked() {
                    return zero_limit::status(d.limit, d.shadow(), now_ms);
                }
                descriptor_status(&decision, &d.owned, d.quota(), d.limit)
            })
            .collect();
        // Quota descriptors never block alone: the request is over when
        // every one of them is (as envoyproxy/ratelimit answers).
        let quotas = statuses
            .iter()
            .zip(&descriptors)
            .filter(|(_, d)| d.quota())
            .map(|(s, _)| s.code == Code::OverLimit as i32);
        let (quota_count, quota_over) =
            quotas.fold((0, 0), |(n, o), over| (n + 1, o + usize::from(over)));
        let over = (!decision.allowed || (quota_count > 0 && quota_count == quota_over))
            && !self.app.envoy.shadow_mode;
        // The fields HTTP answers with, as headers for Envoy to add.
        let fields = Fields::with_policy(&decision, &policy, over);
        let headers = [
            ("RateLimit-Policy", fields.policy.to_owned()),
            ("RateLimit", fields.ratelimit),
            (
                "Retry-After",
                fields
                    .retry_after
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
            ),
        ]
        .into_iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(key, value)| HeaderValue {
            key: key.to_owned(),
            value,
            ..Default::default()
        })
        .collect();
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers,
            ..Default::default()
        }
    }
}

/// The status of one descriptor: over the limit when one of its enforced
/// rules denied, with the tightest of its rules as
/// `current_limit`.
fn descriptor_status(
    decision: &Decision<'_>,
    owned: &[usize],
    quota: bool,
    limit: Option<&DescriptorLimit>,
) -> DescriptorStatus {
    // Walked twice rather than collected: no allocation per descriptor.
    let known = || {
        owned
            .iter()
            .filter_map(|&r| decision.outcome(r).map(|o| (r, o)))
    };
    // A quota descriptor's rules are decided as shadow rules, but its
    // status still says when it is over.
    let denied = known().any(|(r, o)| !o.allowed && (quota || !decision.rules[r].shadow()));
    // The store was unreachable and the failure policy denied: every
    // descriptor with rules is over.
    let failed_closed = decision.reason == Some(Reason::StoreUnavailable) && !owned.is_empty();
    // A denial decided without any outcome (the store too slow to read
    // the standing of a request that can never fit) names its rule.
    let named = (!decision.allowed && decision.known() == Known::Nothing)
        .then(|| decision.policy())
        .flatten()
        .and_then(|p| {
            owned
                .iter()
                .copied()
                .find(|&r| std::ptr::eq(p, &decision.rules[r]))
        });
    let over = denied || failed_closed || named.is_some();
    // What a hidden rule holds (a valve's capacity, a fair share) is never
    // shown, as in the `RateLimit` headers: it would show other tenants'
    // traffic. Its denial still makes the descriptor over.
    let tightest = known()
        .filter(|&(r, _)| !decision.rules[r].hidden())
        .min_by_key(|(_, o)| o.remaining);
    DescriptorStatus {
        code: if over { Code::OverLimit } else { Code::Ok } as i32,
        current_limit: tightest
            .map(|(r, _)| r)
            .or(named.filter(|&r| !decision.rules[r].hidden()))
            // Over by a hidden rule alone, whose outcome is the only one
            // known (a fair-share denial the over-limit cache remembered):
            // the descriptor's own first rule, with nothing remaining.
            .or_else(|| {
                let visible = |&r: &usize| !decision.rules[r].hidden();
                over.then(|| owned.iter().copied().find(visible)).flatten()
            })
            .map(|r| reported_limit(limit, &decision.rules[r])),
        // Over, nothing remains for this descriptor now, as
        // envoyproxy/ratelimit answers (a bucket may still hold less than
        // the hits asked for).
        limit_remaining: if over {
            0
        } else {
            tightest.map_or(0, |(_, o)| o.remaining)
        },
        // Whole seconds, rounded up, as envoyproxy/ratelimit reports them
        // (never before the window actually resets).
        duration_until_reset: tightest.map(|(_, o)| ProtoDuration {
            seconds: o.reset_after_ms.div_ceil(1_000) as i64,
            nanos: 0,
        }),
        ..Default::default()
    }
}
