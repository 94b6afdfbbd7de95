//! The Envoy Rate Limit Service: `envoy.service.ratelimit.v3.RateLimitService`.
//!
//! One `ShouldRateLimit` is one sluice decision: every descriptor's rules
//! are decided together and committed all or none, in one store round trip.
//! A request's domain selects how its descriptors are read:
//!
//! - a domain of the envoyproxy/ratelimit configuration (`envoy.config`,
//!   `--envoy-config`): descriptors match that configuration's tree, each
//!   matched limit counting per request descriptor, as envoyproxy/ratelimit
//!   does;
//! - the native domain (`envoy.domain`): descriptor entries name the tenant,
//!   route and subject, and sluice's plans decide; each descriptor's status
//!   reports the scope its deepest entry names (subject, route or tenant);
//! - any other domain: no limits (every descriptor OK).
//!
//! A descriptor's `limit` override replaces what the configuration says for
//! it; `hits_addend` is honoured per request and per descriptor. Answers
//! carry `RateLimit-Policy`, `RateLimit` and, when over the limit,
//! `Retry-After` in `response_headers_to_add`.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use sluice_core::config::envoy::{EnvoyDomain, Unit};
use sluice_core::config::{EnvoyServiceConfig, NamedRule};
use sluice_core::descriptors::DescriptorLimit;
use sluice_core::headers::{retry_after_seconds, write_ratelimit};
use sluice_core::policy::Applicable;
use sluice_core::request::MAX_COST;
use sluice_core::{Algorithm, BoundRule, Decision, Reason, Request, Rule, Scope};
use sluice_store::{Batch, Partition, PeekedRule};
use tonic::Status;

use crate::Fallible;
use crate::app::App;
use crate::grpc::request::{DescriptorView, MAX_DESCRIPTORS, MAX_ENTRIES, RequestView};
use crate::grpc::{GrpcServices, RLS};
use crate::metrics::UpstreamStatus;

pub mod files;
mod units;
mod zero_limit;

use units::{proto_unit, unit_of_proto};

/// Longest entry key or value, in bytes (the other bounds of a request,
/// `MAX_DESCRIPTORS` and `MAX_ENTRIES`, are where it is read).
const MAX_ENTRY_BYTES: usize = 16 * 1024;

/// Reads envoyproxy/ratelimit configuration from `path` (a file, or a
/// directory: its `*.yaml` files, or with `all_files` every file but dot
/// files, read through the one directory it resolves to: see
/// [`EnvoyFiles`](crate::source::envoy_files::EnvoyFiles)), with split
/// domains merged when `merge` is set.
pub fn load_envoy_files(path: &Path, all_files: bool, merge: bool) -> Fallible<Vec<EnvoyDomain>> {
    crate::source::envoy_files::EnvoyFiles::read(path, all_files)?.domains(merge)
}

/// Serves the Rate Limit Service and `grpc.health.v1` on `listener` until
/// `shutdown` resolves.
pub async fn serve_grpc(
    app: Arc<App>,
    listener: tokio::net::TcpListener,
    limits: sluice_core::config::ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Fallible<()> {
    let routes = grpc_routes(app, &limits).await;
    crate::listen::serve(
        listener,
        routes,
        &limits,
        crate::listen::Protocols::Http2,
        shutdown,
        crate::listen::places(&limits),
    )
    .await;
    Ok(())
}

/// The Rate Limit Service and `grpc.health.v1`, reporting serving.
pub async fn grpc_routes(
    app: Arc<App>,
    limits: &sluice_core::config::ConnectionLimits,
) -> GrpcServices<
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status(RLS, tonic_health::ServingStatus::Serving)
        .await;
    let max_message = usize::try_from(limits.grpc_max_message_bytes).unwrap_or(usize::MAX);
    GrpcServices::new(
        RateLimiter::new(app),
        max_message,
        std::time::Duration::from_millis(limits.request_timeout_ms),
        health_service,
    )
}

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

/// One request descriptor, read and bounded.
struct Descriptor<'r> {
    entries: Vec<(&'r str, &'r str)>,
    /// Units it consumes (`hits_addend` of the descriptor, else of the
    /// request); 0 counts nothing.
    cost: u64,
    /// A `limit` override from Envoy's route configuration.
    limit_override: Option<(u32, Unit)>,
}

fn read_request(request: RequestView<'_>) -> Result<(u64, Vec<Descriptor<'_>>), Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument("`domain` must not be empty"));
    }
    if request.descriptors_sent == 0 || request.descriptors_sent > MAX_DESCRIPTORS {
        return Err(Status::invalid_argument(format!(
            "`descriptors` must hold 1 to {MAX_DESCRIPTORS} descriptors, got {}",
            request.descriptors_sent
        )));
    }
    let hits = match request.hits_addend {
        0 => 1,
        n => u64::from(n),
    };
    if hits > MAX_COST {
        return Err(Status::invalid_argument(format!(
            "`hits_addend` must be at most {MAX_COST}, got {hits}"
        )));
    }
    let descriptors = request
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| read_descriptor(i, d, hits))
        .collect::<Result<_, _>>()?;
    Ok((hits, descriptors))
}

fn read_descriptor(
    index: usize,
    d: DescriptorView<'_>,
    hits: u64,
) -> Result<Descriptor<'_>, Status> {
    // An empty descriptor matches no limit (OK), as upstream answers it.
    if d.entries.len() > MAX_ENTRIES {
        return Err(Status::invalid_argument(format!(
            "`descriptors[{index}].entries` must hold at most {MAX_ENTRIES} entries"
        )));
    }
    if d.is_negative_hits {
        return Err(Status::invalid_argument(format!(
            "`descriptors[{index}].is_negative_hits` is not supported"
        )));
    }
    // An empty key is taken, as upstream takes it: no configured key is
    // empty, so it matches nothing.
    for (key, value) in &d.entries {
        if key.len() > MAX_ENTRY_BYTES || value.len() > MAX_ENTRY_BYTES {
            return Err(Status::invalid_argument(format!(
                "`descriptors[{index}].entries`: keys and values must be at most {MAX_ENTRY_BYTES} bytes"
            )));
        }
    }
    let cost = match d.hits_addend {
        None => hits,
        Some(value) if value <= MAX_COST => value,
        Some(value) => {
            return Err(Status::invalid_argument(format!(
                "`descriptors[{index}].hits_addend` must be at most {MAX_COST}, got {value}"
            )));
        }
    };
    let limit_override = match d.limit {
        None => None,
        Some((requests_per_unit, unit)) => match unit_of_proto(unit) {
            Some(unit) => Some((requests_per_unit, unit)),
            None => {
                return Err(Status::invalid_argument(format!(
                    "`descriptors[{index}].limit.unit` must be a known unit"
                )));
            }
        },
    };
    Ok(Descriptor {
        entries: d.entries,
        cost,
        limit_override,
    })
}

/// Where the bucket of a request descriptor lives: the domain and every
/// entry, length-prefixed (the store hashes it; it is never stored plain).
fn descriptor_partition(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut key = String::with_capacity(domain.len() + 16 * entries.len());
    for part in std::iter::once(domain).chain(entries.iter().flat_map(|(k, v)| [*k, *v])) {
        key.push_str(&part.len().to_string());
        key.push(':');
        key.push_str(part);
    }
    key
}

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

/// A limit built from a descriptor's `limit` override: a calendar-aligned
/// fixed window, as envoyproxy/ratelimit enforces overrides.
fn override_limit(
    domain: &str,
    d: &Descriptor<'_>,
    near_limit: f64,
    shards: u16,
) -> DescriptorLimit {
    let (requests_per_unit, unit) = d.limit_override.expect("an override");
    let path = format!("{domain}.override.{}", descriptor_partition("", &d.entries));
    // A sharded tenant's override is spread over its shards like its
    // plan's rules: each shard holds its share (an override below the
    // shard count is kept whole on shard 0, exact).
    let rules: Box<[BoundRule]> = match Rule::new(
        Algorithm::FixedWindow,
        requests_per_unit.into(),
        unit.ms(),
        None,
        true,
    )
    .map(|rule| rule.for_shards(u64::from(shards.max(1))))
    {
        Ok(rule) => Box::new([BoundRule::new(
            Scope::Descriptor,
            &path,
            &NamedRule {
                name: "override".to_owned(),
                rule,
                shadow: false,
            },
            near_limit,
        )]),
        Err(_) => Box::new([]),
    };
    DescriptorLimit {
        key: path,
        blocks: rules.is_empty(),
        rules,
        unlimited: false,
        shadow: false,
        quota: false,
        name: None,
        replaces: Vec::new(),
        requests_per_unit,
        unit: Some(unit),
    }
}

/// A descriptor's entries as its bucket counts them: values matched by a
/// `share_threshold` wildcard are replaced by the pattern.
fn counted_entries<'e>(
    entries: &[(&'e str, &'e str)],
    shared: &[(usize, &'e str)],
) -> Vec<(&'e str, &'e str)> {
    let mut counted = entries.to_vec();
    for &(i, pattern) in shared {
        if let Some(entry) = counted.get_mut(i) {
            entry.1 = pattern;
        }
    }
    counted
}

/// The configured form of a descriptor's limit: requests per unit, unit,
/// name.
type Configured = Option<(u32, Option<Unit>, Option<String>)>;

/// Everything decided about one request, ready to become an answer.
struct Verdict<'p> {
    decision: Decision<'p>,
    /// The rules each descriptor answers for (indices into the decision's
    /// rules).
    owners: Vec<Vec<usize>>,
    /// Per descriptor: in quota mode.
    quota: Vec<bool>,
    /// Per descriptor: `unlimited: true` matched (answered with the largest
    /// remaining, as envoyproxy/ratelimit answers).
    unlimited: Vec<bool>,
    /// Per descriptor: at a zero limit (`requests_per_unit: 0`).
    blocked: Vec<bool>,
    /// Per descriptor: in shadow mode (empty: none is).
    shadow: Vec<bool>,
    /// The time zero limits reset from.
    now_ms: u64,
    /// Per descriptor: the configured form of its limit, for `current_limit`.
    configured: Vec<Configured>,
    /// Per descriptor of an envoyproxy/ratelimit domain: its limit's key,
    /// whether it is in shadow mode, and its hits, for upstream's stats.
    stats: Vec<Option<(String, bool, u64)>>,
}

impl<'p> Verdict<'p> {
    /// A decision on the native domain: no quota, unlimited or upstream
    /// stats there.
    fn native(
        decision: Decision<'p>,
        owners: Vec<Vec<usize>>,
        blocked: Vec<bool>,
        configured: Vec<Configured>,
        now_ms: u64,
    ) -> Verdict<'p> {
        Verdict {
            decision,
            owners,
            quota: Vec::new(),
            unlimited: Vec::new(),
            blocked,
            shadow: Vec::new(),
            now_ms,
            configured,
            stats: Vec::new(),
        }
    }
}

impl<'p> crate::app::Decided<'p> for Verdict<'p> {
    fn decision(&self) -> &Decision<'p> {
        &self.decision
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
        let envoy = policy.descriptors();
        let near_limit = policy.near_limit();
        if envoy.has_domain(domain) {
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
            let (rules, owner) = compat_rules(&found);
            // Boxed: what it holds across the store call would otherwise
            // size every request's future, the native domain's too.
            // envoyproxy/ratelimit's descriptors carry no tenant to account.
            let decided = self
                .app
                .decide(
                    None,
                    started,
                    Box::pin(self.decide_compat(domain, &descriptors, &found, &rules, &owner)),
                )
                .await;
            let mut response = self.answer(decided, descriptors.len());
            // `hits_addend: 0` checks without consuming (Envoy's check now,
            // debit later): the descriptor's buckets are read, not written.
            for (i, d) in descriptors.iter().enumerate() {
                if d.cost != 0 || d.limit_override.is_some() {
                    continue;
                }
                // Boxed: a peek at a remote store is a large future, and
                // this path is rare; unboxed, it sized every request's.
                if let Some(found) = envoy.find(domain, &d.entries)
                    && let Some(status) = Box::pin(self.check_only(domain, d, &found)).await
                {
                    response.statuses[i] = status;
                }
            }
            return Ok(response);
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

/// The rules to decide, once `replaces` has dropped the limits other matched
/// limits replace, and the descriptor each rule belongs to.
fn compat_rules(found: &[Found<'_>]) -> (Vec<BoundRule>, Vec<usize>) {
    let replaced: Vec<&str> = found
        .iter()
        .filter_map(Found::limit)
        .flat_map(|l| l.replaces.iter().map(String::as_str))
        .collect();
    found
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.limit().map(|l| (i, l)))
        .filter(|(_, l)| !l.name.as_deref().is_some_and(|n| replaced.contains(&n)))
        .filter(|(_, l)| !l.unlimited)
        .flat_map(|(i, l)| l.rules.iter().map(move |r| (r.clone(), i)))
        .unzip()
}

impl RateLimiter {
    /// The status of a descriptor that consumes nothing (`hits_addend: 0`):
    /// its buckets as they stand, OK (a denied request consumes nothing in
    /// sluice, so a bucket is never past its limit), with what remains.
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
        let partition = descriptor_partition(domain, &counted);
        let partitions = vec![Partition::Tenant(&partition); limit.rules.len()];
        let batch = Batch {
            partitions: &partitions,
            ..Batch::new(domain, None, 1, &limit.rules)
        };
        let peeked = self.app.limiter.peek(&batch).await.ok()?;
        let now = peeked.now;
        let tightest = peeked
            .rows
            .iter()
            .map(
                |PeekedRule {
                     state,
                     enforced: rule,
                     ..
                 }| {
                    let state = rule.repair(state, now).unwrap_or_else(|| state.clone());
                    let (outcome, _) = rule.decide(&state, now, 1);
                    let before = if outcome.allowed {
                        u64::from(outcome.remaining) + 1
                    } else {
                        u64::from(outcome.remaining)
                    };
                    (before.min(rule.capacity()), outcome.reset_after_ms)
                },
            )
            .min_by_key(|(remaining, _)| *remaining)?;
        Some(DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(RateLimit {
                name: limit.name.clone().unwrap_or_default(),
                requests_per_unit: limit.requests_per_unit,
                unit: limit.unit.map_or(ProtoUnit::Unknown, proto_unit) as i32,
            }),
            limit_remaining: u32::try_from(tightest.0).unwrap_or(u32::MAX),
            duration_until_reset: Some(ProtoDuration {
                seconds: tightest.1.div_ceil(1_000) as i64,
                nanos: 0,
            }),
            ..Default::default()
        })
    }

    async fn decide_compat<'p>(
        &self,
        domain: &str,
        descriptors: &[Descriptor<'_>],
        found: &[Found<'_>],
        rules: &'p [BoundRule],
        owner: &[usize],
    ) -> Verdict<'p> {
        // A replaced limit does not apply at all, a blocking one included.
        let replaced: Vec<&str> = found
            .iter()
            .filter_map(Found::limit)
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();
        let applies =
            |l: &DescriptorLimit| !l.name.as_deref().is_some_and(|n| replaced.contains(&n));
        let blocked: Vec<bool> = found
            .iter()
            .map(|f| {
                f.limit()
                    .is_some_and(|l| l.blocks && !l.unlimited && applies(l))
            })
            .collect();
        let quota: Vec<bool> = found
            .iter()
            .map(|f| f.limit().is_some_and(|l| l.quota && applies(l)))
            .collect();
        let unlimited: Vec<bool> = found
            .iter()
            .map(|f| f.limit().is_some_and(|l| l.unlimited && applies(l)))
            .collect();
        let shadow: Vec<bool> = found
            .iter()
            .map(|f| f.limit().is_some_and(|l| l.shadow))
            .collect();
        let stats = found
            .iter()
            .zip(descriptors)
            .map(|(f, d)| {
                let key = match f {
                    Found::Config(found) => found.stats_key.clone(),
                    _ => f.limit()?.key.clone(),
                };
                f.limit()
                    .filter(|l| applies(l) && !l.unlimited)
                    .map(|l| (key, l.shadow, d.cost))
            })
            .collect();
        let configured: Vec<_> = found
            .iter()
            .map(|f| {
                f.limit()
                    .map(|l| (l.requests_per_unit, l.unit, l.name.clone()))
            })
            .collect();
        let enforced_block = found
            .iter()
            .zip(&blocked)
            .any(|(f, b)| *b && !f.limit().is_some_and(|l| l.shadow || l.quota));
        let mut owners = vec![Vec::new(); descriptors.len()];
        for (index, descriptor) in owner.iter().enumerate() {
            owners[*descriptor].push(index);
        }
        let decision = if rules.is_empty() {
            if enforced_block {
                Decision::blocked()
            } else {
                Decision::from_outcomes(Applicable::adhoc(&[]), Default::default(), 1, &[])
            }
        } else {
            let partitions_text: Vec<String> = owner
                .iter()
                .map(|&d| {
                    let shared = match &found[d] {
                        Found::Config(found) => &found.shared[..],
                        _ => &[],
                    };
                    descriptor_partition(domain, &counted_entries(&descriptors[d].entries, shared))
                })
                .collect();
            let partitions: Vec<Partition<'_>> = partitions_text
                .iter()
                .map(|p| Partition::Tenant(p))
                .collect();
            let costs: Vec<u64> = owner.iter().map(|d| descriptors[*d].cost).collect();
            let batch = Batch {
                partitions: &partitions,
                costs: &costs,
                ..Batch::new(domain, None, 1, rules)
            };
            if enforced_block {
                // Denied by `requests_per_unit: 0`: nothing counted.
                zero_limit::decide(&self.app.limiter, Applicable::adhoc(rules), &batch, &costs)
                    .await
            } else {
                self.app
                    .limiter
                    .decide_batch(Applicable::adhoc(rules), &batch)
                    .await
            }
        };
        let now_ms = if blocked.contains(&true) {
            zero_limit::now_ms(self.app.limiter.store())
        } else {
            0
        };
        Verdict {
            decision,
            owners,
            blocked,
            shadow,
            now_ms,
            quota,
            unlimited,
            configured,
            stats,
        }
    }

    async fn decide_native(
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
        let level = |d: &Descriptor<'_>| {
            let has = |key: &str| d.entries.iter().any(|(k, _)| *k == key);
            if has(&native.subject_key) {
                Some(&[Scope::Subject][..])
            } else if has(&native.route_key) {
                Some(&[Scope::Route, Scope::Global][..])
            } else if has(&native.tenant_key) {
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
        let mut owners = vec![Vec::new(); descriptors.len()];
        let mut configured = vec![None; descriptors.len()];
        let mut blocked = vec![false; descriptors.len()];
        let decided = if overrides.is_empty() {
            for (i, d) in descriptors.iter().enumerate() {
                if let Some(scopes) = level(d) {
                    owners[i] = (0..applicable.rules.len())
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
            Verdict::native(decision, owners, blocked, configured, 0)
        } else {
            // Overrides add descriptor rules to the plan's, decided
            // together: the rare path, boxed so that what it holds across
            // the store call does not size every request's future.
            return Box::pin(async move {
                let mut rules: Vec<BoundRule> = applicable.rules.to_vec();
                let mut partitions_text: Vec<String> = Vec::new();
                let mut extra: Vec<(usize, usize)> = Vec::new();
                for (i, limit) in &overrides {
                    blocked[*i] = limit.blocks;
                    configured[*i] = Some((limit.requests_per_unit, limit.unit, None));
                    for rule in limit.rules.iter() {
                        extra.push((*i, rules.len()));
                        partitions_text.push(descriptor_partition(
                            &native.domain,
                            &descriptors[*i].entries,
                        ));
                        rules.push(rule.clone());
                    }
                }
                for (i, d) in descriptors.iter().enumerate() {
                    if d.limit_override.is_none()
                        && let Some(scopes) = level(d)
                    {
                        owners[i] = (0..applicable.rules.len())
                            .filter(|&r| scopes.contains(&applicable.rules[r].scope()))
                            .collect();
                    }
                }
                for (i, r) in &extra {
                    owners[*i].push(*r);
                }
                let probe = Batch::new(request.tenant, request.subject, hits, applicable.rules);
                // A duplicate guard counts per subject and fingerprint, as in
                // `Limiter::decide`.
                let guard = sluice_store::limiter::dedupe::partition_text(
                    request.subject,
                    request.fingerprint,
                );
                let mut partitions: Vec<Partition<'_>> = (0..applicable.rules.len())
                    .map(|r| match applicable.rules[r].scope() {
                        Scope::Dedupe => Partition::Subject(request.tenant, &guard),
                        _ => probe.partition(r, &applicable.rules[r]),
                    })
                    .collect();
                partitions.extend(partitions_text.iter().map(|p| Partition::Tenant(p)));
                let mut costs = vec![hits; applicable.rules.len()];
                costs.extend(extra.iter().map(|(i, _)| descriptors[*i].cost));
                let rules = &rules[..];
                let combined = Applicable {
                    rules,
                    max_cost: u64::MAX,
                    ..applicable
                };
                let batch = Batch {
                    partitions: &partitions,
                    costs: &costs,
                    ..Batch::new(request.tenant, request.subject, hits, rules)
                };
                let enforced_block = blocked.iter().any(|b| *b);
                let store = self.app.limiter.store();
                let decide = async {
                    if enforced_block {
                        let decision =
                            zero_limit::decide(&self.app.limiter, combined, &batch, &costs).await;
                        (decision, zero_limit::now_ms(store))
                    } else {
                        (self.app.limiter.decide_batch(combined, &batch).await, 0)
                    }
                };
                let (decision, now_ms) = self.app.decide(Some(&request), started, decide).await;
                Ok(self.answer(
                    Verdict::native(decision, owners, blocked, configured, now_ms),
                    descriptors.len(),
                ))
            })
            .await;
        };
        Ok(self.answer(decided, descriptors.len()))
    }

    /// The gRPC answer for a decision.
    fn answer(&self, decided: Verdict<'_>, descriptors: usize) -> RateLimitResponse {
        let Verdict {
            decision,
            owners,
            blocked,
            shadow,
            now_ms,
            quota,
            unlimited,
            configured,
            stats,
        } = decided;
        for (i, stat) in stats.iter().enumerate() {
            let Some((key, shadow, hits)) = stat else {
                continue;
            };
            let known = || {
                owners[i]
                    .iter()
                    .filter_map(|&r| decision.outcome(r).map(|o| (r, o)))
            };
            let over = blocked[i] || known().any(|(_, o)| !o.allowed);
            let status = if over {
                UpstreamStatus::Over { shadow: *shadow }
            } else {
                let near = known().any(|(r, o)| decision.rules[r].is_near(o.remaining.into()));
                UpstreamStatus::Within { near }
            };
            self.app.metrics.upstream_descriptor(key, *hits, status);
        }
        if decision.shadow_denied {
            tracing::debug!("a shadow-mode descriptor would have denied this request");
        }
        let statuses: Vec<DescriptorStatus> = (0..descriptors)
            .map(|i| {
                if unlimited.get(i).copied().unwrap_or(false) {
                    return DescriptorStatus {
                        code: Code::Ok as i32,
                        limit_remaining: u32::MAX,
                        ..Default::default()
                    };
                }
                if blocked[i] {
                    let shadow = shadow.get(i).copied().unwrap_or(false);
                    return zero_limit::status(&configured[i], shadow, now_ms);
                }
                let quota = quota.get(i).copied().unwrap_or(false);
                descriptor_status(&decision, &owners[i], quota, &configured[i])
            })
            .collect();
        // Quota descriptors never block alone: the request is over when
        // every one of them is (as envoyproxy/ratelimit answers).
        let quotas = statuses
            .iter()
            .zip(&quota)
            .filter(|(_, q)| **q)
            .map(|(s, _)| s.code == Code::OverLimit as i32);
        let (quota_count, quota_over) =
            quotas.fold((0, 0), |(n, o), over| (n + 1, o + usize::from(over)));
        let over = (!decision.allowed || (quota_count > 0 && quota_count == quota_over))
            && !self.app.envoy.shadow_mode;
        // RateLimit-Policy, RateLimit and Retry-After at most.
        let mut headers = Vec::with_capacity(3);
        let policy_header = if decision.policy_header().is_empty() {
            decision
                .rules
                .iter()
                .filter(|r| r.advertised())
                .map(BoundRule::policy_item)
                .collect::<Vec<_>>()
                .join(", ")
        } else {
            decision.policy_header().to_owned()
        };
        if !policy_header.is_empty() {
            headers.push(header("RateLimit-Policy", policy_header));
        }
        let mut ratelimit = String::new();
        write_ratelimit(&decision, &mut ratelimit);
        if !ratelimit.is_empty() {
            headers.push(header("RateLimit", ratelimit));
        }
        if over && let Some(ms) = decision.retry_after_ms() {
            headers.push(header("Retry-After", retry_after_seconds(ms).to_string()));
        }
        RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            statuses,
            response_headers_to_add: headers,
            ..Default::default()
        }
    }
}

fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    }
}

/// The status of one descriptor: over the limit when one of its enforced
/// rules denied, with the tightest of its rules as
/// `current_limit`.
fn descriptor_status(
    decision: &Decision<'_>,
    owned: &[usize],
    quota: bool,
    configured: &Configured,
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
    let tightest = known().min_by_key(|(_, o)| o.remaining);
    let current_limit = tightest.map(|(r, _)| {
        let rule = decision.rules[r].rule();
        let (rpu, unit) = match configured {
            Some((rpu, unit, _)) => (*rpu, *unit),
            None => (
                u32::try_from(rule.limit()).unwrap_or(u32::MAX),
                Unit::of_ms(rule.period_ms()),
            ),
        };
        RateLimit {
            name: decision.rules[r].name().to_owned(),
            requests_per_unit: rpu,
            unit: unit.map_or(ProtoUnit::Unknown, proto_unit) as i32,
        }
    });
    DescriptorStatus {
        code: if denied || failed_closed {
            Code::OverLimit
        } else {
            Code::Ok
        } as i32,
        current_limit,
        limit_remaining: tightest.map_or(0, |(_, o)| o.remaining),
        // Whole seconds, rounded up, as envoyproxy/ratelimit reports them
        // (never before the window actually resets).
        duration_until_reset: tightest.map(|(_, o)| ProtoDuration {
            seconds: o.reset_after_ms.div_ceil(1_000) as i64,
            nanos: 0,
        }),
        ..Default::default()
    }
}
