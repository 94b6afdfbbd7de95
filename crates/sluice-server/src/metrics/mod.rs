//! Prometheus metrics, served as text on `/metrics`.
//!
//! Every handle is resolved once (when the service starts, or for
//! decisions the first time a class of requests is seen, kept with the
//! compiled policy), so a decision only increments counters it already
//! holds. Labels are closed sets: outcome, reason, error kind, failure
//! policy, breaker state, and a decision's plan and route pattern, which
//! come from the configuration. No tenant, subject or raw route ever becomes
//! a label — that would be unbounded and a privacy leak.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use sluice_core::Policy;
use sluice_core::config::OnError;
use sluice_core::policy::{ADHOC, Class, ClassId};
use sluice_core::{Decision, Reason};
use sluice_store::{BreakerState, StoreError, Telemetry};
use tracing::warn;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    outcome: &'static str,
    reason: &'static str,
    plan: String,
    route: String,
}

/// The decision counters of one class of requests, in one registry.
struct ClassCounters {
    allowed: Counter,
    denied: [Counter; REASONS.len()],
}

impl ClassCounters {
    fn count(&self, reason: Option<Reason>) {
        match reason {
            None => self.allowed.inc(),
            Some(reason) => self.denied[reason_index(reason)].inc(),
        };
    }
}

/// The decision counters of the installed policy's classes, by
/// [`ClassId::index`]: the table is built when a policy is installed, and
/// each slot resolved on the class's first decision (so that `/metrics`
/// shows only classes that decided), after which a decision only
/// increments.
#[derive(Default)]
struct ClassTable {
    /// The policy's number ([`Policy::id`]).
    policy: u64,
    counters: Box<[OnceLock<ClassCounters>]>,
}

impl ClassTable {
    fn of(policy: &Policy) -> ClassTable {
        ClassTable {
            policy: policy.id(),
            counters: policy.classes().map(|_| OnceLock::new()).collect(),
        }
    }

    /// The slot of class `id`, when it belongs to this table's policy.
    fn slot(&self, id: ClassId) -> Option<&OnceLock<ClassCounters>> {
        (id.policy == self.policy)
            .then(|| self.counters.get(id.index as usize))
            .flatten()
    }
}

mod adaptive;
mod envoyproxy;
mod regions;
mod slices;
mod traces;
mod usage;

use adaptive::AdaptiveStats;
use envoyproxy::EnvoyproxyStats;
pub use envoyproxy::EnvoyproxyStatus;
use regions::RegionStats;
use slices::SliceStats;
pub use traces::SpanCounters;
pub use usage::{AttemptResult, SettleResult, UsageMetrics};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyLabel {
    policy: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ValveLabel {
    valve: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

/// Where `reason` is in [`REASONS`]: a match, so that a new reason does
/// not compile until it has its counter.
fn reason_index(reason: Reason) -> usize {
    match reason {
        Reason::TenantLimit => 0,
        Reason::RouteLimit => 1,
        Reason::SubjectLimit => 2,
        Reason::GlobalCapacity => 3,
        Reason::DescriptorLimit => 4,
        Reason::CostExceedsCapacity => 5,
        Reason::StoreUnavailable => 6,
        Reason::Duplicate => 7,
    }
}

const REASONS: [Reason; 8] = [
    Reason::TenantLimit,
    Reason::RouteLimit,
    Reason::SubjectLimit,
    Reason::GlobalCapacity,
    Reason::DescriptorLimit,
    Reason::CostExceedsCapacity,
    Reason::StoreUnavailable,
    Reason::Duplicate,
];

/// How often a run of failure-policy decisions is logged, at most.
const LOG_EVERY_MS: u64 = 10_000;

/// The service's metrics.
pub struct Metrics {
    registry: Registry,
    decisions: Family<DecisionLabels, Counter>,
    /// The installed policy's decision counters.
    classes: ArcSwap<ClassTable>,
    /// Those of decisions outside a plan (Envoy descriptors).
    adhoc: OnceLock<ClassCounters>,
    decision_seconds: traces::DecisionSeconds,
    /// Spans exported and dropped, when tracing is on.
    pub spans: SpanCounters,
    store_seconds: Histogram,
    store_errors: [Counter; 4],
    failure_policy: [Counter; 3],
    breaker_state: Gauge,
    breaker_transitions: [Counter; 3],
    denial_cache_hits: Counter,
    shadow_denials: Counter,
    reloads: [Counter; 2],
    live_instances: Gauge,
    fair_share_denials: Family<ValveLabel, Counter>,
    valve_saturated: Family<ValveLabel, Gauge>,
    valve_share_level: Family<ValveLabel, Gauge<f64, AtomicU64>>,
    /// Reservations, settles and debits.
    pub usage: UsageMetrics,
    slices: SliceStats,
    regions: RegionStats,
    adaptive: AdaptiveStats,
    /// envoyproxy/ratelimit's names, which have no `sluice_` prefix.
    envoyproxy_registry: Registry,
    envoyproxy: EnvoyproxyStats,
    unlogged_failovers: AtomicU64,
    last_failover_log_ms: AtomicU64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        Metrics::with_exemplars(false)
    }

    /// [`Metrics::new`], the decision latency histogram carrying
    /// exemplars when `exemplars` (tracing is on).
    pub fn with_exemplars(exemplars: bool) -> Metrics {
        let mut registry = Registry::with_prefix("sluice");
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "decisions",
            "Decisions by outcome, reason, plan and route pattern",
            decisions.clone(),
        );
        let decision_seconds = traces::DecisionSeconds::register(&mut registry, exemplars);
        let spans = SpanCounters::default();
        spans.register(&mut registry);
        let store_seconds = Histogram::new(exponential_buckets(0.000_05, 2.0, 16));
        registry.register(
            "store_call_duration_seconds",
            "Time of one store call (one per decision)",
            store_seconds.clone(),
        );
        let errors = Family::<KindLabel, Counter>::default();
        registry.register(
            "store_errors",
            "Store calls that failed, by kind",
            errors.clone(),
        );
        let store_errors =
            StoreError::KINDS.map(|kind| errors.get_or_create(&KindLabel { kind }).clone());
        let policies = Family::<PolicyLabel, Counter>::default();
        registry.register(
            "failure_policy_decisions",
            "Decisions made by the failure policy because the store could not decide",
            policies.clone(),
        );
        let failure_policy = [OnError::Local, OnError::Allow, OnError::Deny].map(|p| {
            policies
                .get_or_create(&PolicyLabel { policy: p.name() })
                .clone()
        });
        let breaker_state = Gauge::default();
        registry.register(
            "breaker_state",
            "Circuit breaker: 0 closed, 1 open, 2 half-open",
            breaker_state.clone(),
        );
        let transitions = Family::<StateLabel, Counter>::default();
        registry.register(
            "breaker_transitions",
            "Circuit breaker changes, by new state",
            transitions.clone(),
        );
        let breaker_transitions = [
            BreakerState::Closed,
            BreakerState::Open,
            BreakerState::HalfOpen,
        ]
        .map(|s| {
            transitions
                .get_or_create(&StateLabel { state: s.as_str() })
                .clone()
        });
        let denial_cache_hits = Counter::default();
        registry.register(
            "denial_cache_hits",
            "Denials answered by the over-limit cache without a store call",
            denial_cache_hits.clone(),
        );
        let shadow_denials = Counter::default();
        registry.register(
            "shadow_denials",
            "Requests a shadow-mode rule would have denied (not enforced)",
            shadow_denials.clone(),
        );
        let reload_family = Family::<ResultLabel, Counter>::default();
        registry.register(
            "config_reloads",
            "Configuration reloads, by result",
            reload_family.clone(),
        );
        let reloads = ["ok", "error"]
            .map(|result| reload_family.get_or_create(&ResultLabel { result }).clone());
        let live_instances = Gauge::default();
        registry.register(
            "live_instances",
            "sluice instances sharing the store, from heartbeats",
            live_instances.clone(),
        );
        let fair_share_denials = Family::<ValveLabel, Counter>::default();
        registry.register(
            "valve_fair_share_denials",
            "Requests a fair valve denied because their tenant was past its share (shadow valves: would have denied)",
            fair_share_denials.clone(),
        );
        let valve_saturated = Family::<ValveLabel, Gauge>::default();
        registry.register(
            "valve_saturated",
            "Whether a fair valve is saturated (its shares enforced), as this instance last saw it",
            valve_saturated.clone(),
        );
        let valve_share_level = Family::<ValveLabel, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "valve_fair_share_level",
            "A saturated fair valve's share level: units per second a tenant of weight 1 may have (+Inf while not saturated)",
            valve_share_level.clone(),
        );
        let usage = UsageMetrics::register(&mut registry);
        let slices = SliceStats::register(&mut registry);
        let regions = RegionStats::register(&mut registry);
        let adaptive = AdaptiveStats::register(&mut registry);
        let mut envoyproxy_registry = Registry::default();
        let envoyproxy = EnvoyproxyStats::register(&mut envoyproxy_registry);
        Metrics {
            usage,
            registry,
            envoyproxy_registry,
            envoyproxy,
            decisions,
            classes: ArcSwap::default(),
            adhoc: OnceLock::new(),
            decision_seconds,
            spans,
            store_seconds,
            store_errors,
            failure_policy,
            breaker_state,
            breaker_transitions,
            denial_cache_hits,
            shadow_denials,
            reloads,
            live_instances,
            fair_share_denials,
            valve_saturated,
            valve_share_level,
            slices,
            regions,
            adaptive,
            unlogged_failovers: AtomicU64::new(0),
            last_failover_log_ms: AtomicU64::new(0),
        }
    }

    /// Counts a decision and how long it took, sampled in `trace_id`'s
    /// trace when tracing is on (an exemplar).
    pub fn decision(&self, decision: &Decision<'_>, elapsed: Duration, trace_id: Option<String>) {
        self.decision_seconds
            .observe(elapsed.as_secs_f64(), trace_id);
        if decision.shadow_denied {
            self.shadow_denials.inc();
        }
        if decision.reason == Some(Reason::GlobalCapacity) || decision.shadow_denied {
            for valve in decision.fair_share_denials() {
                self.fair_share_denials
                    .get_or_create(&ValveLabel {
                        valve: valve.name().to_owned(),
                    })
                    .inc();
            }
        }
        let class = decision.class;
        let id = class.id();
        let classes = self.classes.load();
        let slot = if id == ADHOC.id() {
            Some(&self.adhoc)
        } else {
            classes.slot(id)
        };
        match slot {
            Some(slot) => slot
                .get_or_init(|| self.class_counters(class))
                .count(decision.reason),
            // Decided under a policy no longer installed (under way across
            // a reload): its counters looked up by label.
            None => self.class_counters(class).count(decision.reason),
        }
    }

    fn class_counters(&self, class: &Class) -> ClassCounters {
        let labels = |outcome: &'static str, reason: &'static str| DecisionLabels {
            outcome,
            reason,
            plan: class.plan().to_owned(),
            route: class.route().to_owned(),
        };
        // One statement each: a family's guard lives to the end of its
        // statement, and a second `get_or_create` that must write would wait
        // for it for ever.
        let allowed = self
            .decisions
            .get_or_create(&labels("allowed", "none"))
            .clone();
        let denied = REASONS.map(|reason| {
            self.decisions
                .get_or_create(&labels("denied", reason.as_str()))
                .clone()
        });
        ClassCounters { allowed, denied }
    }

    /// Counts one descriptor of an envoyproxy/ratelimit domain under its
    /// limit's key (`domain.key_value…`), as that project's stats do.
    pub fn envoyproxy_descriptor(&self, key: &str, hits: u64, status: EnvoyproxyStatus) {
        self.envoyproxy.count(key, hits, status);
    }

    /// Counts a configuration reload.
    pub fn reload(&self, ok: bool) {
        self.reloads[usize::from(!ok)].inc();
    }

    /// Records what this instance knows of its fair valves.
    pub fn valves(&self, levels: &[sluice_store::ValveLevel]) {
        for level in levels {
            let label = ValveLabel {
                valve: level.valve.to_string(),
            };
            self.valve_saturated
                .get_or_create(&label)
                .set(i64::from(level.saturated));
            self.valve_share_level
                .get_or_create(&label)
                .set(level.level_per_second);
        }
    }

    /// Records what this instance knows of its adaptive valves.
    pub fn adaptive(&self, levels: &[sluice_store::limiter::AdaptiveLevel]) {
        self.adaptive.levels(levels);
    }

    /// Records the slices of hot keys this instance holds.
    pub fn slices(&self, levels: &[sluice_store::limiter::slice::SliceLevel]) {
        self.slices.levels(levels);
    }

    /// Records what the region link knows of each peer region.
    pub fn regions(&self, peers: &[sluice_store::redis::regions::PeerStatus]) {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.regions.peers(peers, now_ms);
    }

    /// Records the live instance count.
    pub fn set_live_instances(&self, n: u64) {
        self.live_instances
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The metrics in the Prometheus/OpenMetrics text format.
    pub fn encode(&self) -> String {
        use prometheus_client::encoding::text;
        let mut out = String::with_capacity(8 * 1024);
        let _ = text::encode_registry(&mut out, &self.registry);
        let _ = text::encode_registry(&mut out, &self.envoyproxy_registry);
        let _ = text::encode_eof(&mut out);
        out
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Telemetry for Metrics {
    fn policy_installed(&self, policy: &Policy) {
        // Policies are numbered as compiled: a late report of an older one
        // (two swaps racing) does not replace a newer table.
        self.classes.rcu(|current| {
            if current.policy > policy.id() {
                current.clone()
            } else {
                Arc::new(ClassTable::of(policy))
            }
        });
        self.slices.installed(policy);
    }

    fn store_call(&self, elapsed: Duration, error: Option<&StoreError>) {
        self.store_seconds.observe(elapsed.as_secs_f64());
        if let Some(error) = error {
            self.store_error(error);
        }
    }

    fn store_error(&self, error: &StoreError) {
        self.store_errors[error.kind_index()].inc();
    }

    fn breaker_changed(&self, to: BreakerState) {
        self.breaker_state.set(to as i64);
        self.breaker_transitions[to as usize].inc();
        warn!(state = to.as_str(), "store circuit breaker changed");
    }

    fn failure_policy(&self, policy: OnError) {
        let i = match policy {
            OnError::Local => 0,
            OnError::Allow => 1,
            OnError::Deny => 2,
        };
        self.failure_policy[i].inc();
        // One log line per LOG_EVERY_MS at most, with how many decisions it
        // stands for.
        let pending = self.unlogged_failovers.fetch_add(1, Ordering::Relaxed) + 1;
        let now = now_ms();
        let last = self.last_failover_log_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= LOG_EVERY_MS
            && self
                .last_failover_log_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let decisions = self
                .unlogged_failovers
                .swap(0, Ordering::Relaxed)
                .max(pending);
            warn!(
                on_error = policy.name(),
                decisions, "the store could not decide; the failure policy did"
            );
        }
    }

    fn denial_cache_hit(&self) {
        self.denial_cache_hits.inc();
    }

    fn slice_taken(&self, rule: &sluice_core::BoundRule, units: u64) {
        self.slices.taken(rule, units);
    }

    fn slice_decision(&self) {
        self.slices.decision();
    }

    fn slice_shadow_over(&self, rule: &sluice_core::BoundRule, units: u64) {
        self.slices.shadow_over(rule, units);
    }
}

#[cfg(test)]
mod tests;
