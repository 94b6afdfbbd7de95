//! The domains of the envoyproxy/ratelimit configuration: descriptors
//! matched against its tree, `replaces`, `unlimited`, `shadow_mode`,
//! `quota_mode` and `share_threshold` as envoyproxy/ratelimit reads them, and
//! `hits_addend: 0` checks that consume nothing. A quota descriptor's hits
//! always count, past its limit too (a debit: the bucket owes until it is
//! repaid), and its check is over while it owes; every other descriptor
//! keeps "a denied request consumes nothing".

use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use sluice_core::descriptors::DescriptorLimit;
use sluice_core::policy::Applicable;
use sluice_core::{BoundRule, Decision};
use sluice_store::{Keyed, PeekedRule};

use super::RateLimiter;
use super::descriptor::{counted_entries, descriptor_partition, override_limit};
use super::request::Descriptor;
use super::verdict::{Answering, Verdict, reported_limit};
use super::{CHECK_ONLY_BUDGET, zero_limit};

/// The limit that applies to one descriptor of a request.
enum Found<'p> {
    /// No limit (also: unlimited, replaced, or counting 0 units).
    None,
    /// From the configuration, with the entries a `share_threshold`
    /// wildcard counts under its pattern and its stats key.
    Config(sluice_core::descriptors::Found<'p>),
    /// From the descriptor's `limit` override.
    Override(DescriptorLimit),
}

impl Found<'_> {
    fn limit(&self) -> Option<&DescriptorLimit> {
        match self {
            Found::None => None,
            Found::Config(found) => Some(found.limit),
            Found::Override(limit) => Some(limit),
        }
    }
}

/// One request descriptor as matched, once per request: its limit,
/// whether it applies (no other matched limit `replaces` it) and, when it
/// counts, the bucket it counts in (its entries, the values a
/// `share_threshold` wildcard matched counted under the pattern).
struct Matched<'p> {
    found: Found<'p>,
    applies: bool,
    bucket: String,
}

impl Matched<'_> {
    /// Its limit, when one applies.
    fn limit(&self) -> Option<&DescriptorLimit> {
        self.found.limit().filter(|_| self.applies)
    }

    /// Its limit, when one applies and counts (not `unlimited`).
    fn counted(&self) -> Option<&DescriptorLimit> {
        self.limit().filter(|l| !l.unlimited)
    }
}

/// Each descriptor's match, `replaces` applied (a replaced limit does not
/// apply at all, a blocking one included).
fn matched<'p>(
    domain: &str,
    descriptors: &[Descriptor<'_>],
    found: Vec<Found<'p>>,
) -> Vec<Matched<'p>> {
    // Decided while `found` is borrowed: no name copied per request.
    let applies: Vec<bool> = {
        let replaced: Vec<&str> = found
            .iter()
            .filter_map(Found::limit)
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();
        found
            .iter()
            .map(|f| {
                f.limit()
                    .is_some_and(|l| !l.name.as_deref().is_some_and(|n| replaced.contains(&n)))
            })
            .collect()
    };
    found
        .into_iter()
        .zip(descriptors)
        .zip(applies)
        .map(|((found, d), applies)| {
            let counts = applies && found.limit().is_some_and(|l| !l.unlimited);
            let bucket = if counts {
                let shared = match &found {
                    Found::Config(found) => &found.shared[..],
                    _ => &[],
                };
                descriptor_partition(domain, &counted_entries(&d.entries, shared))
            } else {
                String::new()
            };
            Matched {
                found,
                applies,
                bucket,
            }
        })
        .collect()
}

/// What a descriptor's `cost` counts in `rule`: all of it, but never more
/// than a shadow-mode limit can hold. Past its capacity the request could
/// never pass, and a limit that never denies would deny it; filled, its
/// bucket is over for the rest of its window, as envoyproxy/ratelimit's
/// is. A quota limit's hits all count (its debit, when over).
fn counted_cost(rule: &BoundRule, cost: u64, quota: bool) -> u64 {
    if rule.shadow() && !quota && rule.units(cost) > rule.rule().capacity() {
        rule.rule().capacity()
    } else {
        cost
    }
}

/// The rules to decide (those of every limit that applies and counts),
/// and the descriptor each rule belongs to.
fn matched_rules(matched: &[Matched<'_>]) -> (Vec<BoundRule>, Vec<usize>) {
    matched
        .iter()
        .enumerate()
        .filter_map(|(i, m)| m.counted().map(|l| (i, l)))
        .flat_map(|(i, l)| l.rules.iter().map(move |r| (r.clone(), i)))
        .unzip()
}

/// The quota rules (indices into `rules`) whose hits the decision did not
/// count: decided as shadow rules, they counted what they admitted when
/// the request was admitted; what they denied, or what a denied request
/// left uncounted, is debited (envoyproxy/ratelimit's quota mode counts
/// every hit).
fn quota_debits(decided: &Verdict<'_>, rules: &[BoundRule], owner: &[usize]) -> Vec<usize> {
    let decision = &decided.decision;
    (0..rules.len())
        .filter(|&r| decided.descriptors[owner[r]].quota())
        .filter(|&r| !decision.allowed || decision.outcome(r).is_none_or(|o| !o.allowed))
        .collect()
}

impl RateLimiter {
    /// A request on a domain of the envoyproxy/ratelimit configuration:
    /// descriptors matched against its tree, each matched limit counting
    /// per request descriptor.
    pub(super) async fn decide_envoyproxy(
        &self,
        policy: &sluice_core::Policy,
        domain: &str,
        descriptors: &[Descriptor<'_>],
        started: Instant,
    ) -> RateLimitResponse {
        let envoy = policy.descriptors();
        let near_limit = policy.near_limit();
        let found: Vec<Found<'_>> = descriptors
            .iter()
            .map(|d| {
                if d.cost == 0 {
                    Found::None
                } else if d.limit_override.is_some() {
                    Found::Override(override_limit(domain, d, near_limit, 1))
                } else {
                    envoy
                        .find(domain, &d.entries)
                        .map_or(Found::None, Found::Config)
                }
            })
            .collect();
        let matched = matched(domain, descriptors, found);
        let (rules, owner) = matched_rules(&matched);
        // Boxed: what it holds across the store call would otherwise
        // size every request's future, the native domain's too.
        // envoyproxy/ratelimit's descriptors carry no tenant to account.
        let decided = self
            .app
            .decide(
                None,
                started,
                Box::pin(self.decide_matched(domain, descriptors, &matched, &rules, &owner)),
            )
            .await;
        let debited = quota_debits(&decided, &rules, &owner);
        if !debited.is_empty() {
            Box::pin(self.debit(domain, descriptors, &matched, &rules, &owner, &debited)).await;
        }
        let mut response = self.answer(decided);
        // `hits_addend: 0` checks without consuming (Envoy's check now,
        // debit later): the descriptor's buckets are read, not written.
        let mut quota: Vec<bool> = matched
            .iter()
            .map(|m| m.found.limit().is_some_and(|l| l.quota && !l.unlimited))
            .collect();
        let mut quota_checked = false;
        for (i, d) in descriptors.iter().enumerate() {
            if d.cost != 0 || d.limit_override.is_some() {
                continue;
            }
            // Boxed: a peek at a remote store is a large future, and
            // this path is rare; unboxed, it sized every request's.
            if let Some(found) = envoy.find(domain, &d.entries) {
                if found.limit.quota && !found.limit.unlimited {
                    quota[i] = true;
                    quota_checked = true;
                }
                if let Some(status) = Box::pin(self.check_only(domain, d, &found)).await {
                    response.statuses[i] = status;
                }
            }
        }
        if quota_checked && !self.app.envoy.shadow_mode {
            // A quota check counts with the other quota descriptors: the
            // request is over when a descriptor outside quota mode is, or
            // when every quota descriptor is.
            let over = |s: &DescriptorStatus| s.code == Code::OverLimit as i32;
            let statuses = response.statuses.iter().zip(&quota);
            let others_over = statuses.clone().any(|(s, q)| !q && over(s));
            let quotas: Vec<bool> = statuses
                .filter(|(_, q)| **q)
                .map(|(s, _)| over(s))
                .collect();
            let all_quotas_over = !quotas.is_empty() && quotas.iter().all(|o| *o);
            response.overall_code = if others_over || all_quotas_over {
                Code::OverLimit
            } else {
                Code::Ok
            } as i32;
        }
        response
    }

    /// Charges the quota rules in `debited` (indices into `rules`) the
    /// hits of their descriptors, even past their limit: what a quota
    /// descriptor was sent counts whatever the answer.
    async fn debit(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_>],
        matched: &[Matched<'_>],
        rules: &[BoundRule],
        owner: &[usize],
        debited: &[usize],
    ) {
        let mut keyed = Keyed::named(domain);
        let mut charged = Vec::with_capacity(debited.len());
        let mut units = 0;
        for &r in debited {
            let d = owner[r];
            keyed.push(matched[d].bucket.clone(), descriptors[d].cost);
            charged.push(rules[r].clone());
            units += descriptors[d].cost;
        }
        match self
            .app
            .limiter
            .debit_keyed(Applicable::adhoc(&charged), &keyed)
            .await
        {
            // No tenant owns a descriptor's bucket: no ledger line.
            Ok(debit) => self.app.charged(crate::usage::Charge {
                tenant: None,
                route: "",
                recorded: 0,
                at_ms: 0,
                debited: Some(crate::usage::Debited {
                    units,
                    owing: !debit.decision.allowed,
                    forgiven: debit.forgiven,
                }),
            }),
            Err(error) => {
                tracing::warn!(%error, "a quota descriptor's hits could not be counted");
            }
        }
    }

    /// The status of a descriptor that consumes nothing (`hits_addend: 0`):
    /// its buckets as they stand, with what remains: OK, but for a quota
    /// descriptor past its limit (only a quota's hits, counted whatever
    /// the answer, can take a bucket past it), which is over.
    /// `None` when it has no rules to read or the store does not answer in
    /// time (the descriptor is then answered OK without a limit).
    async fn check_only(
        &self,
        domain: &str,
        d: &Descriptor<'_>,
        found: &sluice_core::descriptors::Found<'_>,
    ) -> Option<DescriptorStatus> {
        let limit = found.limit;
        if limit.rules.is_empty() || limit.unlimited {
            return None;
        }
        let counted = counted_entries(&d.entries, &found.shared);
        let mut keyed = Keyed::named(domain);
        for _ in limit.rules.iter() {
            keyed.push(descriptor_partition(domain, &counted), 1);
        }
        let peek = self.app.limiter.peek_keyed(&limit.rules, &keyed);
        let peeked = tokio::time::timeout(CHECK_ONLY_BUDGET, peek)
            .await
            .ok()?
            .ok()?;
        let now = peeked.now;
        // A quota descriptor past its limit (in debt) is over: the check
        // before a request that will be debited when its stream is done.
        let owing = limit.quota
            && peeked
                .rows
                .iter()
                .any(|row| row.enforced.owes(&row.state, now));
        let tightest = peeked
            .rows
            .iter()
            .zip(&limit.rules)
            .map(
                |(
                    PeekedRule {
                        state,
                        enforced: rule,
                        ..
                    },
                    bound,
                )| {
                    let state = rule.repair(state, now).unwrap_or_else(|| state.clone());
                    let (outcome, _) = rule.decide(&state, now, 1);
                    let before = if outcome.allowed {
                        u64::from(outcome.remaining) + 1
                    } else {
                        u64::from(outcome.remaining)
                    };
                    (before.min(rule.capacity()), outcome.reset_after_ms, bound)
                },
            )
            .min_by_key(|(remaining, ..)| *remaining)?;
        let code = if owing && !limit.shadow {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Some(DescriptorStatus {
            code: code as i32,
            current_limit: Some(reported_limit(Some(limit), tightest.2)),
            limit_remaining: u32::try_from(tightest.0).unwrap_or(u32::MAX),
            duration_until_reset: Some(ProtoDuration {
                seconds: tightest.1.div_ceil(1_000) as i64,
                nanos: 0,
            }),
            ..Default::default()
        })
    }

    async fn decide_matched<'p>(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_>],
        matched: &'p [Matched<'p>],
        rules: &'p [BoundRule],
        owner: &[usize],
    ) -> Verdict<'p> {
        let mut answering: Vec<Answering<'p>> = matched
            .iter()
            .zip(descriptors)
            .map(|(m, d)| {
                let Some(limit) = m.limit() else {
                    return Answering::default();
                };
                let key = match &m.found {
                    Found::Config(found) => found.stats_key.as_str(),
                    _ => limit.key.as_str(),
                };
                Answering {
                    owned: Vec::new(),
                    limit: Some(limit),
                    stats: (!limit.unlimited).then_some((key, d.cost)),
                }
            })
            .collect();
        let enforced_block = answering
            .iter()
            .any(|a| a.blocked() && !a.shadow() && !a.quota());
        for (index, descriptor) in owner.iter().enumerate() {
            answering[*descriptor].owned.push(index);
        }
        let decision = if rules.is_empty() {
            if enforced_block {
                Decision::blocked()
            } else {
                Decision::from_outcomes(Applicable::adhoc(&[]), Default::default(), 1, &[])
            }
        } else {
            let mut keyed = Keyed::named(domain);
            for (rule, &d) in rules.iter().zip(owner) {
                let cost = counted_cost(rule, descriptors[d].cost, answering[d].quota());
                keyed.push(matched[d].bucket.clone(), cost);
            }
            if enforced_block || zero_limit::never_fits(rules, &keyed) {
                // Denied by `requests_per_unit: 0`, or by hits a limit can
                // never hold: nothing counted.
                zero_limit::decide(&self.app.limiter, Applicable::adhoc(rules), &keyed).await
            } else {
                self.app
                    .limiter
                    .decide_keyed(Applicable::adhoc(rules), &keyed)
                    .await
            }
        };
        let now_ms = if answering.iter().any(Answering::blocked) {
            zero_limit::now_ms(self.app.limiter.store())
        } else {
            0
        };
        Verdict::new(decision, answering, now_ms)
    }
}
