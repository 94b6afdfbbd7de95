//! What every request handler shares, and how it is built from a
//! configuration.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::config::tracing::TraceAttributes;
use sluice_core::config::{
    Backend as BackendConfig, Config, EnvoyServiceConfig, ForwardAuthConfig, Limits,
};
use sluice_core::descriptors::DescriptorPolicy;
use sluice_core::{Decision, Policy, Request};
use sluice_store::trace::{self, Disclosure};
use sluice_store::{BreakerConfig, Limiter, LimiterOptions, StoreError};
use tracing::warn;

use crate::Fallible;
use crate::backend::Backend;
use crate::metrics::Metrics;

/// What a decision hands back for its answer: the decision, alone or with
/// what came with it (a lease, the Envoy service's per-descriptor view).
pub trait HasDecision<'p> {
    /// The decision itself.
    fn decision(&self) -> &Decision<'p>;
}

impl<'p> HasDecision<'p> for Decision<'p> {
    fn decision(&self) -> &Decision<'p> {
        self
    }
}

impl<'p, T> HasDecision<'p> for (Decision<'p>, T) {
    fn decision(&self) -> &Decision<'p> {
        &self.0
    }
}

/// Shared state of a running service.
#[derive(Debug)]
pub struct App {
    /// Policy + store.
    pub limiter: Limiter<Backend>,
    /// Header names `/v1/forward-auth` reads.
    pub forward_auth: ForwardAuthConfig,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Whether the store answered its last health check.
    pub store_reachable: AtomicBool,
    /// Live instances on the same store and prefix with another pepper, as
    /// the last heartbeat saw (their keys never meet ours: every limit
    /// would count twice).
    pub other_peppers: AtomicU64,
    /// What the region link knows of each peer region, once it runs
    /// (`storage.regions`).
    pub regions: std::sync::OnceLock<crate::regions::PeerStatuses>,
    /// How Envoy rate-limit requests map onto sluice.
    pub envoy: EnvoyServiceConfig,
    /// The admin API and the overrides it keeps.
    pub admin: crate::admin::Admin,
    /// The usage ledger, when on.
    pub ledger: Option<crate::ledger::Ledger>,
    /// Reservation ids, and this instance's reservations until they
    /// expire.
    pub reservations: crate::reservation::Reservations,
    /// Whether traces are exported (`tracing:` or the `OTEL_*`
    /// variables): requests to decision endpoints get server spans.
    pub traced: bool,
    /// What a decision's span tells of who asked (`tracing.attributes`).
    pub disclosure: Disclosure,
}

impl App {
    /// Wraps a limiter for the handlers (the admin API off).
    pub fn new(
        limiter: Limiter<Backend>,
        forward_auth: ForwardAuthConfig,
        metrics: Arc<Metrics>,
    ) -> Arc<App> {
        App::new_with(limiter, forward_auth, metrics, crate::admin::Admin::off())
    }

    /// [`App::new`] with `admin`; install the configuration's limits in it
    /// next ([`Admin::install`](crate::admin::Admin::install)).
    pub fn new_with(
        limiter: Limiter<Backend>,
        forward_auth: ForwardAuthConfig,
        metrics: Arc<Metrics>,
        admin: crate::admin::Admin,
    ) -> Arc<App> {
        Arc::new(App {
            limiter,
            forward_auth,
            metrics,
            store_reachable: AtomicBool::new(true),
            other_peppers: AtomicU64::new(0),
            regions: std::sync::OnceLock::new(),
            envoy: EnvoyServiceConfig {
                domain: sluice_core::config::defaults::ENVOY_DOMAIN.to_owned(),
                tenant_key: "tenant".to_owned(),
                route_key: "route".to_owned(),
                subject_key: "subject".to_owned(),
                fingerprint_key: "fingerprint".to_owned(),
                config_path: None,
                all_files: true,
                merge_domains: false,
                shadow_mode: false,
                tolerance: sluice_core::tolerance::Tolerance::EXACT,
            },
            admin,
            ledger: None,
            reservations: crate::reservation::Reservations::new(
                None,
                sluice_core::config::defaults::RESERVATION_TTL_MS,
            ),
            traced: false,
            disclosure: Disclosure::Nothing,
        })
    }

    /// Connects the configured store and builds the limiter around it, with
    /// the failure handling `storage` asks for.
    pub async fn build(config: &Config) -> Fallible<Arc<App>> {
        App::build_with(config, Arc::new(Metrics::new()), None).await
    }

    /// [`App::build`] with `metrics`, and with traces exported as
    /// `traces` says (`None`: off).
    pub async fn build_with(
        config: &Config,
        metrics: Arc<Metrics>,
        traces: Option<&crate::traces::Settings>,
    ) -> Fallible<Arc<App>> {
        let storage = &config.storage;
        let backend = Backend::connect(storage, &config.keys).await?;
        let disclosure = match traces.map(|t| t.attributes) {
            None | Some(TraceAttributes::None) => Disclosure::Nothing,
            Some(TraceAttributes::Plain) => Disclosure::Plain,
            Some(TraceAttributes::Derived) => match backend.keyer() {
                Some(keyer) => Disclosure::Derived(keyer.clone()),
                None => {
                    return Err("tracing.attributes: derived needs a pepper (keys.pepper_env or keys.pepper_file) and a Redis store".into());
                }
            },
        };
        let remote = !matches!(storage.backend, BackendConfig::Memory);
        let mut options = LimiterOptions::new(storage.on_error);
        options.timeout = remote.then(|| Duration::from_millis(storage.timeout_ms));
        options.breaker = BreakerConfig {
            failures: storage.breaker_failures,
            cool_down_ms: storage.breaker_cool_down_ms,
            probes: storage.breaker_probes,
        };
        options.denial_cache = remote && storage.denial_cache;
        options.fallback_instances = storage.fallback_instances;
        options.local_max_entries = storage.max_entries as usize;
        options.local_tenant_share = storage.max_entries_per_tenant as usize;
        options.telemetry = metrics.clone();
        let policy = Policy::compile_for(&config.limits, backend.shards_tenants());
        let reachable = match backend.check().await {
            Ok(()) => true,
            Err(StoreError::Refused(e)) => {
                return Err(format!("Redis refused the credentials in storage.url: {e}").into());
            }
            Err(e) => {
                warn!(error = %e, "the store does not answer yet; decisions follow on_error until it does");
                false
            }
        };
        let policy = policy.with_descriptors(crate::source::descriptors(config)?);
        let token = match &config.admin_token {
            None => None,
            Some(source) => Some(crate::admin::read_token(source)?),
        };
        let admin = crate::admin::Admin::new(token, &backend);
        let ledger = match &config.ledger {
            Some(ledger) => Some(crate::ledger::Ledger::open(
                ledger,
                backend.keyer().cloned(),
            )?),
            None => None,
        };
        let sharded = backend.shards_tenants();
        let reservations =
            crate::reservation::Reservations::new(backend.keyer(), config.reservation_ttl_ms)
                .with_attempt_ttl(config.attempt_ttl_ms)
                .opening_under(backend.previous_keyer());
        let limiter = Limiter::with_options(policy, backend, options);
        let app = Arc::new(App {
            limiter,
            forward_auth: config.server.forward_auth.clone(),
            metrics,
            store_reachable: AtomicBool::new(reachable),
            other_peppers: AtomicU64::new(0),
            regions: std::sync::OnceLock::new(),
            envoy: config.envoy.clone(),
            admin,
            ledger,
            reservations,
            traced: traces.is_some(),
            disclosure,
        });
        app.admin.install(&app.limiter, &config.limits, sharded);
        // Overrides already stored by other instances apply from the start.
        app.admin.sync(&app.limiter, true).await;
        Ok(app)
    }

    /// The one tail of every decision, whatever asked for it (HTTP
    /// `/v1/check`, `/v1/acquire`, forward-auth, the Envoy Rate Limit
    /// Service on either kind of domain): `decide` (one of the limiter's
    /// doors) awaited within the decision's span, then the decision
    /// recorded on that span and counted once in the metrics, with the
    /// time since `started` (and its trace as the exemplar), and, for a
    /// tenant's `request`, once in
    /// heavy hitters and the usage ledger. envoyproxy/ratelimit's
    /// descriptors carry no tenant: `None` there. Hands back what `decide`
    /// gave, for the answer.
    pub async fn decide<'p, D: HasDecision<'p>>(
        &self,
        request: Option<&Request<'_>>,
        started: Instant,
        decide: impl Future<Output = D>,
    ) -> D {
        self.decide_counting(request, started, decide, Ledger::Now)
            .await
    }

    /// [`decide`](Self::decide), the usage ledger told of an admitted
    /// request when it is settled (or expires), not now: for a
    /// reservation, whose cost is an estimate.
    pub async fn decide_reserving<'p, D: HasDecision<'p>>(
        &self,
        request: &Request<'_>,
        started: Instant,
        decide: impl Future<Output = D>,
    ) -> D {
        self.decide_counting(Some(request), started, decide, Ledger::AtSettle)
            .await
    }

    async fn decide_counting<'p, D: HasDecision<'p>>(
        &self,
        request: Option<&Request<'_>>,
        started: Instant,
        decide: impl Future<Output = D>,
        ledger: Ledger,
    ) -> D {
        // A child of the request's server span when traced (and nothing
        // when not: the span is disabled, the future awaited as it is).
        let span = trace::decision(request.map(|r| r.cost));
        // Not through `trace::within`: one layer less to move per decision.
        let decided = if span.is_disabled() {
            decide.await
        } else {
            tracing::Instrument::instrument(decide, span.clone()).await
        };
        let decision = decided.decision();
        // Recorded only on a sampled span: the others are never exported.
        let trace_id = if span.is_disabled() {
            None
        } else {
            crate::traces::sampled_trace_id(&span)
        };
        if trace_id.is_some() {
            trace::decided(&span, decision);
            if let Some(request) = request {
                trace::disclose(&span, &self.disclosure, request, decision.class.route());
            }
        }
        self.metrics.decision(decision, started.elapsed(), trace_id);
        if let Some(request) = request {
            self.account(request, decision, ledger);
        }
        decided
    }

    /// Accounts for one decided request: heavy hitters, and the usage
    /// ledger when on (an admitted reservation later, at its settle).
    fn account(&self, request: &Request<'_>, decision: &Decision<'_>, when: Ledger) {
        // A shadow rule's would-be denial counts as a denial here: heavy
        // hitters show whom a dark-launched limit would deny.
        self.admin.record(
            request.tenant,
            decision.allowed && !decision.shadow_denied,
            decision.fair_share_denials().next().is_some(),
        );
        if let Some(ledger) = self
            .ledger
            .as_ref()
            .filter(|_| when == Ledger::Now || !decision.allowed)
        {
            ledger.record(
                request.tenant,
                crate::ledger::route_of(decision.class.route()),
                request.cost,
                decision.allowed,
                self.now_ms(),
            );
        }
    }

    /// Keeps the admin API's overrides in step: every 500 ms, forever.
    pub fn spawn_admin_sync(app: &Arc<App>) {
        if !app.admin.needs_sync() {
            return;
        }
        let app = app.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for n in 0u64.. {
                tick.tick().await;
                app.admin.sync(&app.limiter, false).await;
                if n % 2 == 0 {
                    app.admin.publish_heavy(&app.limiter).await;
                }
            }
        });
    }

    /// Whether the service can decide with its store: the store answers,
    /// the circuit breaker is closed, and no instance on the store uses
    /// another pepper.
    pub fn ready(&self) -> bool {
        self.store_reachable.load(Ordering::Relaxed)
            && self.limiter.breaker_state() == sluice_store::BreakerState::Closed
            && self.other_peppers.load(Ordering::Relaxed) == 0
    }
}

/// When a decided request goes into the usage ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ledger {
    /// With the decision.
    Now,
    /// A denial now; an admission when its reservation is settled or
    /// expires.
    AtSettle,
}

/// A reload installs its limits in the limiter, the admin API's overrides
/// kept over them, and is counted in the metrics.
impl crate::source::Reloadable for App {
    fn install(&self, limits: &Limits, descriptors: DescriptorPolicy) {
        let sharded = self.limiter.store().shards_tenants();
        self.limiter
            .set_policy(Policy::compile_for(limits, sharded).with_descriptors(descriptors));
        // Overrides stay in force over the new limits.
        self.admin.install(&self.limiter, limits, sharded);
    }

    fn reloaded(&self, applied: bool) {
        self.metrics.reload(applied);
    }
}
