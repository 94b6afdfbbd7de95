//! The native domain (`envoy.domain`): descriptor entries name the
//! tenant, route and subject, sluice's plans decide, and each descriptor
//! answers for the scope its deepest entry names.

use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use sluice_core::config::EnvoyServiceConfig;
use sluice_core::descriptors::DescriptorLimit;
use sluice_core::policy::Applicable;
use sluice_core::{BoundRule, Request, Scope};
use sluice_store::Keyed;
use tonic::Status;

use super::RateLimiter;
use super::descriptor::{descriptor_partition, override_limit};
use super::request::Descriptor;
use super::verdict::{Answering, Verdict};
use super::zero_limit;

/// What a descriptor naming a subject answers for.
const SUBJECT: &[Scope] = &[Scope::Subject];
/// What a descriptor naming a route (and no subject) answers for: the
/// route's rules, valves, their gates and the duplicate guard.
const ROUTE: &[Scope] = &[Scope::Route, Scope::Global, Scope::Share, Scope::Dedupe];
/// What a subject descriptor answers for when no descriptor answers for
/// the route: the route's hidden rules too.
const SUBJECT_AND_ROUTE_HIDDEN: &[Scope] =
    &[Scope::Subject, Scope::Global, Scope::Share, Scope::Dedupe];

impl RateLimiter {
    pub(super) async fn decide_native(
        &self,
        policy: &sluice_core::Policy,
        native: &EnvoyServiceConfig,
        descriptors: &[Descriptor<'_>],
        hits: u64,
        started: Instant,
    ) -> Result<RateLimitResponse, Status> {
        let value_of = |key: &str| {
            descriptors
                .iter()
                .flat_map(|d| d.entries.iter())
                .find(|(k, _)| *k == key)
                .map(|(_, v)| *v)
        };
        let tenant = value_of(&native.tenant_key).ok_or_else(|| {
            Status::invalid_argument(format!(
                "domain `{}` needs a descriptor entry `{}` carrying the tenant",
                native.domain, native.tenant_key
            ))
        })?;
        let route = sluice_core::route::normalize(value_of(&native.route_key).unwrap_or("*"));
        let subject = value_of(&native.subject_key);
        let request = Request::new(tenant, &route, subject, hits)
            .and_then(|r| r.with_fingerprint(value_of(&native.fingerprint_key)))
            .map_err(|e| Status::invalid_argument(format!("descriptor entry {e}")))?;
        let applicable =
            policy.applicable(request.tenant, request.route, request.subject.is_some());
        // Each descriptor answers for the scope its deepest entry names.
        // The route's valves, their gates and its duplicate guard are the
        // route descriptor's, so that it says over when one of them
        // denies (never what they hold: see `answer`); without a route
        // descriptor, the subject descriptors' (they name the route too).
        let has = |d: &Descriptor<'_>, key: &str| d.entries.iter().any(|(k, _)| *k == key);
        let route_level =
            |d: &Descriptor<'_>| has(d, &native.route_key) && !has(d, &native.subject_key);
        let route_answered = descriptors.iter().any(route_level);
        let level = |d: &Descriptor<'_>| {
            if has(d, &native.subject_key) {
                Some(if route_answered {
                    SUBJECT
                } else {
                    SUBJECT_AND_ROUTE_HIDDEN
                })
            } else if has(d, &native.route_key) {
                Some(ROUTE)
            } else if has(d, &native.tenant_key) {
                Some(&[Scope::Tenant][..])
            } else {
                None
            }
        };
        let overrides: Vec<(usize, DescriptorLimit)> = descriptors
            .iter()
            .enumerate()
            .filter(|(_, d)| d.limit_override.is_some() && d.cost > 0)
            .map(|(i, d)| {
                let limit =
                    override_limit(&native.domain, d, policy.near_limit(), applicable.shards);
                (i, limit)
            })
            .collect();
        let unanswered =
            || -> Vec<Answering<'_>> { descriptors.iter().map(|_| Answering::default()).collect() };
        // More hits than a rule can ever hold: decided as a zero limit is
        // (below), so that the descriptor that cannot fit says so.
        let fits = request.cost <= applicable.max_cost;
        let decided = if overrides.is_empty() && fits {
            let mut answering = unanswered();
            for (a, d) in answering.iter_mut().zip(descriptors) {
                if let Some(scopes) = level(d) {
                    a.owned = (0..applicable.rules.len())
                        .filter(|&r| scopes.contains(&applicable.rules[r].scope()))
                        .collect();
                }
            }
            let decision = self
                .app
                .decide(
                    Some(&request),
                    started,
                    self.app.limiter.decide(policy, &request),
                )
                .await;
            let attempt = self.app.attempt(policy, &request, &decision);
            (Verdict::new(decision, answering, 0), attempt)
        } else {
            // Overrides add descriptor rules to the plan's, decided
            // together; a request that cannot fit reads every rule's
            // standing: the rare paths, boxed so that what they hold
            // across the store call does not size every request's future.
            return Box::pin(async move {
                let mut answering = unanswered();
                let mut rules: Vec<BoundRule> = applicable.rules.to_vec();
                // The plan's rules keyed as the limiter keys them, then
                // each override's rules in its descriptor's bucket.
                let mut keyed = Keyed::request(&request, applicable.rules);
                for (i, limit) in &overrides {
                    answering[*i].limit = Some(limit);
                    for rule in limit.rules.iter() {
                        answering[*i].owned.push(rules.len());
                        keyed.push(
                            descriptor_partition(&native.domain, &descriptors[*i].entries),
                            descriptors[*i].cost,
                        );
                        rules.push(rule.clone());
                    }
                }
                for (a, d) in answering.iter_mut().zip(descriptors) {
                    if d.limit_override.is_none()
                        && let Some(scopes) = level(d)
                    {
                        a.owned = (0..applicable.rules.len())
                            .filter(|&r| scopes.contains(&applicable.rules[r].scope()))
                            .collect();
                    }
                }
                let combined = Applicable {
                    rules: &rules[..],
                    max_cost: u64::MAX,
                    ..applicable
                };
                let enforced_block = answering.iter().any(Answering::blocked)
                    || zero_limit::never_fits(&rules, &keyed);
                let limiter = &self.app.limiter;
                let decide = async {
                    if enforced_block {
                        let decision = zero_limit::decide(limiter, combined, &keyed).await;
                        (decision, zero_limit::now_ms(limiter.store()))
                    } else {
                        (limiter.decide_keyed(combined, &keyed).await, 0)
                    }
                };
                let (decision, now_ms) = self.app.decide(Some(&request), started, decide).await;
                let attempt = self.app.attempt(policy, &request, &decision);
                let answer = self.answer(Verdict::new(decision, answering, now_ms));
                Ok(with_attempt(answer, attempt))
            })
            .await;
        };
        let (verdict, attempt) = decided;
        Ok(with_attempt(self.answer(verdict), attempt))
    }
}

/// `answer`, asking Envoy to add `attempt` to the request it forwards.
fn with_attempt(mut answer: RateLimitResponse, attempt: Option<String>) -> RateLimitResponse {
    if let Some(attempt) = attempt {
        answer.request_headers_to_add.push(HeaderValue {
            key: crate::usage::ATTEMPT_HEADER.to_owned(),
            value: attempt,
            ..Default::default()
        });
    }
    answer
}
