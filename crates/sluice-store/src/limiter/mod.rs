//! The limiter: request → applicable rules → one store call → decision.
//!
//! This is where a decision gets made, and where store trouble is absorbed:
//!
//! 1. the over-limit cache answers requests for buckets known to be
//!    exhausted, without a store call;
//! 2. the circuit breaker skips a store that keeps failing;
//! 3. every store call is bounded by the time budget;
//! 4. when the store cannot decide, the failure policy does: `allow`,
//!    `deny`, or `local` — the memory engine enforcing each limit divided by
//!    the number of live sluice instances.
//!
//! The policy is swapped atomically on reload; a decision holds the policy
//! it started with until it is done.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use sluice_core::config::OnError;
use sluice_core::decision::Outcomes;
use sluice_core::policy::Applicable;
use sluice_core::{Decision, Policy, Request};

use crate::clock::{Clock, SystemClock};
use crate::memory::MemoryStore;
use crate::store::{Batch, Store, StoreError};
use crate::telemetry::{NoTelemetry, Telemetry};

pub mod breaker;
pub mod dedupe;
pub mod denials;
mod fair;
pub mod lease;
mod shard;

pub use fair::ValveLevel;

use breaker::{Breaker, BreakerConfig, BreakerState};
use denials::DenialCache;
pub use lease::Lease;

/// How a limiter copes with its store.
#[derive(Clone)]
pub struct LimiterOptions {
    /// The failure policy of plans that do not set their own.
    pub on_error: OnError,
    /// Budget for one store call; `None` for a store that cannot be slow
    /// (the memory store).
    pub timeout: Option<Duration>,
    /// When the circuit breaker opens and closes.
    pub breaker: BreakerConfig,
    /// Whether to remember denials (worth it for remote stores only).
    pub denial_cache: bool,
    /// Live instances assumed for `local` until heartbeats tell.
    pub fallback_instances: u64,
    /// Most keys the local fallback store holds.
    pub local_max_entries: usize,
    /// Most keys one tenant holds in it.
    pub local_tenant_share: usize,
    /// Where store events are reported.
    pub telemetry: Arc<dyn Telemetry>,
    /// The clock the breaker, the caches and the local fallback use.
    pub clock: Arc<dyn Clock>,
}

impl LimiterOptions {
    /// Defaults for a store that never fails (the memory store).
    pub fn new(on_error: OnError) -> LimiterOptions {
        LimiterOptions {
            on_error,
            timeout: None,
            breaker: BreakerConfig::default(),
            denial_cache: false,
            fallback_instances: 1,
            local_max_entries: 100_000,
            local_tenant_share: 100_000,
            telemetry: Arc::new(NoTelemetry),
            clock: Arc::new(SystemClock::default()),
        }
    }
}

impl std::fmt::Debug for LimiterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterOptions")
            .field("on_error", &self.on_error)
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .field("denial_cache", &self.denial_cache)
            .finish_non_exhaustive()
    }
}

/// Decides requests against the current policy and a store.
pub struct Limiter<S> {
    policy: ArcSwap<Policy>,
    store: S,
    options: LimiterOptions,
    breaker: Breaker,
    denials: Option<DenialCache>,
    local: MemoryStore,
    live_instances: AtomicU64,
    /// Spreads sharded tenants' decisions over their shards in turn.
    turns: shard::Turns,
    /// Each fair valve's level, as this instance knows it.
    fair: fair::FairShares,
    /// Whether [`keep_healthy`](Self::keep_healthy) runs for it.
    maintained: std::sync::atomic::AtomicBool,
}

impl<S> std::fmt::Debug for Limiter<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("options", &self.options)
            .field("breaker", &self.breaker.state())
            .finish_non_exhaustive()
    }
}

impl<S: Store> Limiter<S> {
    /// A limiter over a store that never fails; `on_error` still applies to
    /// a full memory store.
    pub fn new(policy: Policy, store: S, on_error: OnError) -> Limiter<S> {
        Limiter::with_options(policy, store, LimiterOptions::new(on_error))
    }

    /// A limiter with explicit failure handling.
    pub fn with_options(policy: Policy, store: S, options: LimiterOptions) -> Limiter<S> {
        Limiter {
            policy: ArcSwap::from_pointee(policy),
            store,
            breaker: Breaker::new(options.breaker),
            denials: options.denial_cache.then(DenialCache::default),
            local: MemoryStore::with_clock(options.local_max_entries, options.clock.clone())
                .with_tenant_share(options.local_tenant_share),
            live_instances: AtomicU64::new(options.fallback_instances.max(1)),
            turns: shard::Turns::default(),
            fair: fair::FairShares::default(),
            maintained: std::sync::atomic::AtomicBool::new(false),
            options,
        }
    }

    /// The current policy. Decisions borrow from it, so hold the `Arc` for
    /// as long as the decision is used.
    pub fn policy(&self) -> Arc<Policy> {
        self.policy.load_full()
    }

    /// Replaces the policy; decisions already under way finish on the old
    /// one. Remembered denials are forgotten: limits may have changed.
    pub fn set_policy(&self, policy: Policy) {
        self.policy.store(Arc::new(policy));
        if let Some(denials) = &self.denials {
            denials.clear();
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Each fair valve this instance has decided for: whether it is
    /// saturated, and its fair-share level.
    pub fn valve_levels(&self) -> Vec<ValveLevel> {
        self.fair.levels(self.options.clock.now_ms())
    }

    /// The circuit breaker's state.
    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// How many sluice instances share the store, as last learned.
    pub fn live_instances(&self) -> u64 {
        self.live_instances.load(Ordering::Relaxed)
    }

    /// Sets how many instances share the store (from heartbeats); `local`
    /// divides every limit by it.
    pub fn set_live_instances(&self, instances: u64) {
        self.live_instances
            .store(instances.max(1), Ordering::Relaxed);
    }

    /// Drops expired remembered denials, idle local-fallback keys and the
    /// in-process store's idle keys, and lets the clocks follow the wall
    /// clock's drift. The server calls it every `storage.sweep_interval`;
    /// an embedded limiter calls it through
    /// [`keep_healthy`](Self::keep_healthy).
    pub fn sweep(&self) {
        self.options.clock.resync();
        let now = self.options.clock.now_ms();
        if let Some(denials) = &self.denials {
            denials.sweep(now);
        }
        self.local.sweep();
        self.store.maintain();
    }

    /// Keeps an embedded limiter healthy without a server: a thread of its
    /// own (`sluice-sweeper`) calls [`sweep`](Self::sweep) every `every`
    /// until the limiter is dropped. Without it a memory store holding its
    /// `max_entries` keys would refuse new tenants for ever. Calling it
    /// again for the same limiter does nothing.
    pub fn keep_healthy(limiter: &Arc<Limiter<S>>, every: Duration)
    where
        S: 'static,
    {
        if limiter.maintained.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(limiter);
        let spawned = std::thread::Builder::new()
            .name("sluice-sweeper".to_owned())
            .spawn(move || {
                loop {
                    std::thread::sleep(every);
                    match weak.upgrade() {
                        Some(limiter) => limiter.sweep(),
                        None => return,
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the limiter's sweeper");
            limiter.maintained.store(false, Ordering::Release);
        }
    }

    /// Decides one request under `policy`. Concurrency rules only check
    /// here (a slot is free or not): [`acquire`](Self::acquire) takes one.
    pub async fn decide<'p>(&self, policy: &'p Policy, request: &Request<'_>) -> Decision<'p> {
        // The common path, without `acquire`'s lease bookkeeping. Only the
        // boxed rest is held across the await, so this future stays small
        // (the locals of a decision held in it made it 192 bytes, copied
        // with `memcpy` wherever it moved).
        let rest = match self.begin(policy, request) {
            Ok(decided) => return decided,
            Err(rest) => rest,
        };
        match rest {
            Rest::Plain(rest) => rest.await,
            Rest::Gated(rest) => rest.await,
        }
    }

    /// [`decide`](Self::decide) of a request with fair valves' gates.
    async fn decide_gated<'p>(&self, policy: &'p Policy, request: &Request<'_>) -> Decision<'p> {
        self.decide_leasing(policy, request, false).await.0
    }

    /// [`decide`](Self::decide)'s decision when it needs no waiting (an
    /// invalid request, or a store in this process), else the rest of it,
    /// boxed (for a request with fair valves' gates, the general way).
    #[inline]
    #[allow(clippy::type_complexity)]
    fn begin<'a, 'p: 'a, 'r: 'a>(
        &'a self,
        policy: &'p Policy,
        request: &'a Request<'r>,
    ) -> Result<
        Decision<'p>,
        Rest<
            impl Future<Output = Decision<'p>> + use<'a, 'p, 'r, S>,
            impl Future<Output = Decision<'p>> + use<'a, 'p, 'r, S>,
        >,
    > {
        let applicable = match prepare(policy, request) {
            Ok(applicable) => applicable,
            Err(decided) => return Ok(decided),
        };
        if applicable.gated {
            return Err(Rest::Gated(Box::pin(self.decide_gated(policy, request))));
        }
        let batch: Batch<'a> = Batch::new(
            request.tenant,
            request.subject,
            request.cost,
            applicable.rules,
        );
        let guarded = dedupe::Guarded::of(&batch, request);
        if let Some(decision) = self.in_process(applicable, &batch, &guarded) {
            return Ok(decision);
        }
        Err(Rest::Plain(Box::pin(
            self.decide_guarded(applicable, batch, guarded),
        )))
    }

    /// Decides one request under `policy` and, when it is admitted, takes a
    /// lease of every concurrency rule that applies: the decision, and the
    /// lease when one was taken (`None` when denied, or when no
    /// concurrency rule applies). Give it back with
    /// [`release`](Self::release), whatever the policy is by then;
    /// unreleased, it expires after the rule's `lease`.
    pub async fn acquire<'p>(
        &self,
        policy: &'p Policy,
        request: &Request<'_>,
    ) -> (Decision<'p>, Option<Lease>) {
        self.decide_leasing(policy, request, true).await
    }

    async fn decide_leasing<'p>(
        &self,
        policy: &'p Policy,
        request: &Request<'_>,
        leasing: bool,
    ) -> (Decision<'p>, Option<Lease>) {
        let applicable = match prepare(policy, request) {
            Ok(applicable) => applicable,
            Err(decided) => return (decided, None),
        };
        let gated = applicable.gated.then(|| {
            let now = self.options.clock.now_ms();
            self.fair
                .gate(&applicable, applicable.rules, request.cost, now)
        });
        let rules = gated
            .as_ref()
            .map_or(applicable.rules, |(rules, _)| &rules[..]);
        let mut batch = Batch::new(request.tenant, request.subject, request.cost, rules);
        batch.valve_turn = gated.as_ref().map(|(_, gates)| gates.turn);
        if leasing && applicable.rules.iter().any(|r| r.rule().is_concurrency()) {
            batch.lease = Some(new_lease_id());
        }
        let rules = applicable.rules;
        let mut decision = self.decide_prepared(applicable, batch, request).await;
        if let Some((_, gates)) = &gated {
            self.learn(gates, &mut decision, request.cost);
        }
        let lease = batch
            .lease
            .filter(|_| decision.allowed)
            .map(|id| Lease::taken(id, rules));
        (decision, lease)
    }

    /// What `decision`, of a request of `cost`, tells of its fair valves'
    /// levels.
    /// It also makes the wait a tenant past its share is given at least a
    /// second (see `fair::at_least_a_second`).
    fn learn(&self, gates: &fair::Gates, decision: &mut Decision<'_>, cost: u64) {
        let now = self.options.clock.now_ms();
        self.fair
            .observe(gates, decision, cost, self.store.valve_parts(), now);
        fair::at_least_a_second(decision);
    }

    async fn decide_prepared<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: Batch<'_>,
        request: &Request<'_>,
    ) -> Decision<'p> {
        let guarded = dedupe::Guarded::of(&batch, request);
        if let Some(decision) = self.in_process(applicable, &batch, &guarded) {
            return decision;
        }
        // Boxed, so that this future stays small for the in-process path
        // (moving a large future costs more than the decision itself).
        Box::pin(self.decide_guarded(applicable, batch, guarded)).await
    }

    /// The store's answer in process, without entering the remote path's
    /// state machine, when the store can give one and neither shards nor a
    /// duplicate guard need that path.
    #[inline]
    fn in_process<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
        guarded: &dedupe::Guarded,
    ) -> Option<Decision<'p>> {
        if applicable.shards > 1 || guarded.any() {
            return None;
        }
        // One rule, most often: its outcome alone, no vector of one (a
        // store without that shortcut decides it as several).
        if let [_] = batch.rules
            && let Some(one) = self.store.decide_one_in_process(batch)
        {
            return Some(match one {
                Ok(outcome) => Decision::from_outcome(applicable, outcome),
                Err(error) => self.conclude(applicable, batch, Err(error)),
            });
        }
        let result = self.store.decide_in_process(batch)?;
        Some(self.conclude(applicable, batch, result))
    }

    /// The rest of [`decide`](Self::decide): duplicate guards placed, then
    /// every shard the tenant has, through the time budget.
    async fn decide_guarded<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: Batch<'_>,
        guarded: dedupe::Guarded,
    ) -> Decision<'p> {
        let partitions = guarded.partitions(&batch);
        let batch = Batch {
            partitions: &partitions,
            ..batch
        };
        self.decide_batch_waiting(applicable, &batch).await
    }

    /// Decides a batch prepared by the caller: the rules of `applicable`,
    /// with the partitions and costs `batch` gives them, on the tenant's
    /// shards when it has several (`batch.shard` is chosen here; see
    /// `shard`). Envoy descriptors come this way; [`decide`](Self::decide)
    /// is the usual entry. The whole decision, every shard tried, stays
    /// within one time budget.
    pub async fn decide_batch<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
    ) -> Decision<'p> {
        // Decided on the spot by a store in this process; otherwise only
        // the boxed rest is held across the await, so that this future
        // stays small (the RLS handler holding it is itself boxed per
        // request: 3.9 KB moved into the box, where 2.8 KB of it was this
        // future's room for a Redis call).
        if applicable.gated {
            return Box::pin(self.decide_batch_gated(applicable, batch)).await;
        }
        if let Some(index) = cost_exceeds_capacity(batch) {
            return Decision::cost_exceeds_capacity_at(applicable, index);
        }
        if applicable.shards <= 1
            && let Some(result) = self.store.decide_in_process(batch)
        {
            return self.conclude(applicable, batch, result);
        }
        Box::pin(self.decide_batch_waiting(applicable, batch)).await
    }

    /// [`decide_batch`](Self::decide_batch) of a batch with fair valves'
    /// gates, their rates set for this request.
    async fn decide_batch_gated<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
    ) -> Decision<'p> {
        let now = self.options.clock.now_ms();
        let (rules, gates) = self.fair.gate(&applicable, batch.rules, batch.cost, now);
        let batch = Batch {
            rules: &rules,
            valve_turn: Some(gates.turn),
            ..*batch
        };
        let mut decision = self.decide_batch_waiting(applicable, &batch).await;
        self.learn(&gates, &mut decision, batch.cost);
        decision
    }

    /// [`decide_batch`](Self::decide_batch) through the store's wait, the
    /// time budget and the tenant's shards.
    async fn decide_batch_waiting<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
    ) -> Decision<'p> {
        if let Some(index) = cost_exceeds_capacity(batch) {
            return Decision::cost_exceeds_capacity_at(applicable, index);
        }
        let deadline = self
            .options
            .timeout
            .map(|budget| tokio::time::Instant::now() + budget);
        let shards = applicable.shards;
        if shards <= 1 {
            return self.decide_shard(applicable, batch, deadline).await;
        }
        let first = self.turns.first(shards);
        let mut best = None;
        for k in 0..shards {
            let on = Batch {
                shard: (first + k) % shards,
                ..*batch
            };
            let decision = self.decide_shard(applicable, &on, deadline).await;
            if !shard::worth_another(&decision) {
                return decision;
            }
            best = Some(shard::sooner(best, decision));
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                break;
            }
        }
        best.expect("a tenant has at least one shard")
    }

    /// Decides a batch on the shard it names, the store call ending by
    /// `deadline`.
    async fn decide_shard<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
        deadline: Option<tokio::time::Instant>,
    ) -> Decision<'p> {
        if let Some(result) = self.store.decide_in_process(batch) {
            return self.conclude(applicable, batch, result);
        }
        let now = self.options.clock.now_ms();
        if let Some(denials) = &self.denials
            && let Some((index, retry)) = denials.check(batch, now)
        {
            self.options.telemetry.denial_cache_hit();
            return Decision::remembered_denial(applicable, index, retry);
        }
        // Held across the store call: dropped with this future, a probe
        // gives its turn back.
        let Some(attempt) = self.breaker.attempt(now) else {
            return self.fail_over(applicable, batch, None);
        };
        let epoch = self.denials.as_ref().map(DenialCache::epoch);
        let started = Instant::now();
        let result = match (self.options.timeout, deadline) {
            (Some(budget), Some(deadline)) => {
                match tokio::time::timeout_at(deadline, self.store.decide(batch)).await {
                    Ok(result) => result,
                    Err(_) => Err(StoreError::Timeout(budget.as_millis() as u64)),
                }
            }
            _ => self.store.decide(batch).await,
        };
        self.options
            .telemetry
            .store_call(started.elapsed(), result.as_ref().err());
        let ok = !matches!(
            result,
            Err(StoreError::Timeout(_) | StoreError::Unavailable(_) | StoreError::Refused(_))
        );
        let answered = self.options.clock.now_ms();
        if let Some(to) = attempt.finish(answered, ok) {
            self.options.telemetry.breaker_changed(to);
        }
        match result {
            Ok(outcomes) => {
                if let (Some(denials), Some(epoch)) = (&self.denials, epoch) {
                    // Shadow rules that denied do not deny the request.
                    let admitted = batch
                        .rules
                        .iter()
                        .zip(&outcomes)
                        .all(|(r, o)| o.allowed || r.shadow());
                    if admitted {
                        denials.forget(batch, &outcomes);
                        denials.record_guards(epoch, batch, answered);
                    } else {
                        let split = self.store.valve_parts() > 1;
                        denials.record(epoch, batch, &outcomes, answered, split);
                    }
                }
                Decision::from_outcomes(applicable, outcomes, batch.cost, batch.costs)
            }
            Err(error) => self.fail_over(applicable, batch, Some(&error)),
        }
    }

    /// The decision from an in-process store's answer.
    #[inline]
    fn conclude<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
        result: Result<Outcomes, StoreError>,
    ) -> Decision<'p> {
        match result {
            Ok(outcomes) => Decision::from_outcomes(applicable, outcomes, batch.cost, batch.costs),
            Err(error) => {
                self.options.telemetry.store_error(&error);
                self.fail_over(applicable, batch, Some(&error))
            }
        }
    }

    /// The decision when the store could not make it.
    fn fail_over<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: &Batch<'_>,
        error: Option<&StoreError>,
    ) -> Decision<'p> {
        // A full memory store can only refuse new keys.
        if let Some(StoreError::Full(_) | StoreError::TenantFull(_)) = error {
            return Decision::without_store(applicable, OnError::Deny);
        }
        let policy = applicable.on_error().unwrap_or(self.options.on_error);
        self.options.telemetry.failure_policy(policy);
        match policy {
            OnError::Allow | OnError::Deny => Decision::without_store(applicable, policy),
            OnError::Local => match self.local.decide_parts(batch, self.live_instances()) {
                Ok(outcomes) => {
                    let mut decision =
                        Decision::from_outcomes(applicable, outcomes, batch.cost, batch.costs);
                    decision.degraded = Some(OnError::Local);
                    if let Some(denials) = self.denials.as_ref().filter(|_| decision.allowed) {
                        // Known here after the store is back too.
                        let now = self.options.clock.now_ms();
                        denials.record_guards(denials.epoch(), batch, now);
                    }
                    decision
                }
                Err(error) => {
                    // The local fallback store is full.
                    self.options.telemetry.store_error(&error);
                    Decision::without_store(applicable, OnError::Deny)
                }
            },
        }
    }
}

impl Limiter<MemoryStore> {
    /// Decides one request on the memory store, synchronously: the
    /// in-process path, for callers that are not async.
    pub fn decide_now<'p>(&self, policy: &'p Policy, request: &Request<'_>) -> Decision<'p> {
        let applicable = match prepare(policy, request) {
            Err(decided) => return decided,
            Ok(applicable) => applicable,
        };
        if applicable.gated {
            let now = self.options.clock.now_ms();
            let (rules, gates) = self
                .fair
                .gate(&applicable, applicable.rules, request.cost, now);
            let batch = Batch::new(request.tenant, request.subject, request.cost, &rules);
            let mut decision = self.decide_now_sharded(applicable, batch, request);
            self.learn(&gates, &mut decision, request.cost);
            return decision;
        }
        let batch = Batch::new(
            request.tenant,
            request.subject,
            request.cost,
            applicable.rules,
        );
        let guarded = dedupe::Guarded::of(&batch, request);
        if applicable.shards <= 1 && !guarded.any() {
            // The common case: one shard, no duplicate guard; most often
            // one rule.
            if let [_] = batch.rules {
                return match self.store.decide_one(&batch, 1) {
                    Ok(outcome) => Decision::from_outcome(applicable, outcome),
                    Err(error) => self.conclude(applicable, &batch, Err(error)),
                };
            }
            let result = self.store.decide_now(&batch);
            return self.conclude(applicable, &batch, result);
        }
        self.decide_now_sharded(applicable, batch, request)
    }

    /// [`decide_now`](Self::decide_now) through duplicate guards and the
    /// tenant's shards.
    fn decide_now_sharded<'p>(
        &self,
        applicable: Applicable<'p>,
        batch: Batch<'_>,
        request: &Request<'_>,
    ) -> Decision<'p> {
        let guarded = dedupe::Guarded::of(&batch, request);
        let partitions = guarded.partitions(&batch);
        let batch = Batch {
            partitions: &partitions,
            ..batch
        };
        let shards = applicable.shards.max(1);
        let first = if shards > 1 {
            self.turns.first(shards)
        } else {
            0
        };
        let mut best = None;
        for k in 0..shards {
            let on = Batch {
                shard: (first + k) % shards,
                ..batch
            };
            let result = self.store.decide_now(&on);
            let decision = self.conclude(applicable, &on, result);
            if !shard::worth_another(&decision) {
                return decision;
            }
            best = Some(shard::sooner(best, decision));
        }
        best.expect("a tenant has at least one shard")
    }
}

/// The rest of a decision that waits: the common path, or the general one
/// a request with fair valves' gates takes.
enum Rest<A, B> {
    Plain(Pin<Box<A>>),
    Gated(Pin<Box<B>>),
}

/// The first rule of `batch` whose cost is above its capacity: such a
/// request can never pass.
fn cost_exceeds_capacity(batch: &Batch<'_>) -> Option<usize> {
    (0..batch.rules.len()).find(|&i| batch.cost_of(i) > batch.rules[i].rule().capacity())
}

/// A fresh lease id: 128 random bits, so that a lease cannot be guessed
/// (holding its id is what allows releasing it).
fn new_lease_id() -> u128 {
    let mut bytes = [0u8; 16];
    if getrandom::fill(&mut bytes).is_err() {
        // No entropy source: still unique within this process.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        return t ^ (u128::from(n) << 64);
    }
    u128::from_le_bytes(bytes)
}

/// Everything decided before the store is asked: the applicable rules, or
/// the answer itself when no store call is needed (no rule applies, or the
/// cost can never pass). The batch for the store is
/// [`Batch::new`] of the request and these rules.
#[inline]
fn prepare<'p>(policy: &'p Policy, request: &Request<'_>) -> Result<Applicable<'p>, Decision<'p>> {
    let applicable = policy.applicable(request.tenant, request.route, request.subject.is_some());
    if let Some(decision) = Decision::cost_exceeds_capacity(applicable, request.cost) {
        return Err(decision);
    }
    if applicable.rules.is_empty() {
        return Err(Decision::from_outcomes(
            applicable,
            Outcomes::new(),
            request.cost,
            &[],
        ));
    }
    Ok(applicable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use sluice_core::{Config, Reason};

    /// A store that always fails, to exercise the failure handling alone.
    struct Broken;

    impl Store for Broken {
        async fn decide(&self, _: &Batch<'_>) -> Result<Outcomes, StoreError> {
            Err(StoreError::Unavailable("down".to_owned()))
        }

        async fn release(&self, _: &Batch<'_>) -> Result<bool, StoreError> {
            Err(StoreError::Unavailable("down".to_owned()))
        }
    }

    const PLANS: &str = r#"
default_plan: strict
plans:
  strict:
    on_error: deny
    tenant: [{ limit: 10, per: 1h }]
  lenient:
    on_error: allow
    tenant: [{ limit: 10, per: 1h }]
  careful:
    tenant: [{ limit: 10, per: 1h }]
tenants:
  l: { plan: lenient }
  c: { plan: careful }
"#;

    fn limiter() -> Limiter<Broken> {
        let policy = Policy::compile(&Config::from_yaml(PLANS, "t.yaml").unwrap().limits);
        let mut options = LimiterOptions::new(OnError::Local);
        options.clock = Arc::new(ManualClock::new(1_000_000));
        options.breaker.failures = 1_000;
        Limiter::with_options(policy, Broken, options)
    }

    async fn decide(
        limiter: &Limiter<Broken>,
        tenant: &str,
    ) -> (bool, Option<Reason>, Option<OnError>) {
        let policy = limiter.policy();
        let d = limiter
            .decide(&policy, &Request::new(tenant, "GET /", None, 1).unwrap())
            .await;
        (d.allowed, d.reason, d.degraded)
    }

    #[tokio::test]
    async fn each_plan_fails_over_by_its_own_policy() {
        let limiter = limiter();
        assert_eq!(
            decide(&limiter, "anyone").await,
            (false, Some(Reason::StoreUnavailable), Some(OnError::Deny))
        );
        assert_eq!(
            decide(&limiter, "l").await,
            (true, None, Some(OnError::Allow))
        );
        assert_eq!(
            decide(&limiter, "c").await,
            (true, None, Some(OnError::Local))
        );
    }

    #[tokio::test]
    async fn local_divides_each_limit_by_the_live_instances() {
        let limiter = limiter();
        limiter.set_live_instances(4);
        let mut admitted = 0;
        for _ in 0..20 {
            admitted += u32::from(decide(&limiter, "c").await.0);
        }
        assert_eq!(admitted, 2, "⌊10 / 4⌋ per instance");
    }

    /// A store told what to do: fail, hang, or admit.
    #[derive(Default)]
    struct Scripted(std::sync::atomic::AtomicU8);

    const FAIL: u8 = 0;
    const HANG: u8 = 1;
    const ADMIT: u8 = 2;

    impl Store for Scripted {
        async fn release(&self, _: &Batch<'_>) -> Result<bool, StoreError> {
            Ok(false)
        }

        async fn decide(&self, batch: &Batch<'_>) -> Result<Outcomes, StoreError> {
            match self.0.load(Ordering::SeqCst) {
                FAIL => Err(StoreError::Unavailable("down".to_owned())),
                HANG => std::future::pending().await,
                _ => Ok(batch
                    .rules
                    .iter()
                    .map(|_| sluice_core::Outcome {
                        allowed: true,
                        ..Default::default()
                    })
                    .collect()),
            }
        }
    }

    #[tokio::test]
    async fn a_probe_dropped_at_its_await_does_not_wedge_the_breaker() {
        let policy = Policy::compile(&Config::from_yaml(PLANS, "t.yaml").unwrap().limits);
        let clock = Arc::new(ManualClock::new(0));
        let mut options = LimiterOptions::new(OnError::Local);
        options.clock = clock.clone();
        options.timeout = Some(Duration::from_secs(60));
        let limiter = Limiter::with_options(policy, Scripted::default(), options);
        let decide = |tenant| {
            let limiter = &limiter;
            async move {
                let policy = limiter.policy();
                let d = limiter
                    .decide(&policy, &Request::new(tenant, "GET /", None, 1).unwrap())
                    .await;
                d.degraded
            }
        };
        for _ in 0..5 {
            decide("c").await;
        }
        assert_eq!(limiter.breaker_state(), BreakerState::Open);
        // The cool-down passes; the probe's caller goes away mid-call.
        clock.advance(1_000);
        limiter.store().0.store(HANG, Ordering::SeqCst);
        let probe = tokio::time::timeout(Duration::from_millis(20), decide("c")).await;
        assert!(probe.is_err(), "the probe hung and was dropped");
        assert_eq!(limiter.breaker_state(), BreakerState::HalfOpen);
        // The store recovers: the next decisions probe it and close the
        // breaker, instead of using the failure policy forever.
        limiter.store().0.store(ADMIT, Ordering::SeqCst);
        for _ in 0..3 {
            assert_eq!(decide("c").await, None, "decided by the store");
        }
        assert_eq!(limiter.breaker_state(), BreakerState::Closed);
    }

    #[tokio::test]
    async fn the_breaker_opens_and_stops_calling_the_store() {
        let policy = Policy::compile(&Config::from_yaml(PLANS, "t.yaml").unwrap().limits);
        let mut options = LimiterOptions::new(OnError::Local);
        options.clock = Arc::new(ManualClock::new(0));
        let limiter = Limiter::with_options(policy, Broken, options);
        for _ in 0..5 {
            decide(&limiter, "c").await;
        }
        assert_eq!(limiter.breaker_state(), BreakerState::Open);
    }

    #[tokio::test]
    async fn a_full_memory_store_denies_new_keys_whatever_the_number_of_rules() {
        // One rule takes the single-rule path, two rules the general one;
        // the synchronous and the async decision alike.
        for tenant_rules in [
            "[{ limit: 10, per: 1h }]",
            "[{ limit: 10, per: 1h }, { limit: 20, per: 1d }]",
        ] {
            let yaml = format!("default_plan: p\nplans:\n  p:\n    tenant: {tenant_rules}\n");
            let policy = Policy::compile(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits);
            let rules = policy.applicable("a", "GET /", false).rules.len();
            let limiter = Limiter::new(policy, MemoryStore::new(2 * rules), OnError::Allow);
            let policy = limiter.policy();
            let request = |t: &'static str| Request::new(t, "GET /", None, 1).unwrap();
            assert!(limiter.decide_now(&policy, &request("a")).allowed);
            assert!(limiter.decide(&policy, &request("b")).await.allowed);
            for denied in [
                limiter.decide_now(&policy, &request("c")),
                limiter.decide(&policy, &request("c")).await,
            ] {
                assert!(!denied.allowed, "{rules} rules: a new key on a full store");
                assert_eq!(denied.reason, Some(Reason::StoreUnavailable));
                assert_eq!(denied.degraded, Some(OnError::Deny), "not the plan's allow");
            }
            assert!(
                limiter.decide_now(&policy, &request("a")).allowed,
                "held keys work"
            );
            assert!(limiter.decide(&policy, &request("b")).await.allowed);
        }
    }

    /// `decide`'s future holds across its await only the boxed rest of a
    /// decision: with the decision's locals in it, it was 192 bytes,
    /// copied (`memcpy`) wherever the future moved; in an axum handler or
    /// the tower layer it is part of every request's future.
    #[test]
    fn the_decide_future_stays_small() {
        let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 10, per: 1h }]\n";
        let policy = Policy::compile(&Config::from_yaml(yaml, "t.yaml").unwrap().limits);
        let limiter = Limiter::new(policy, MemoryStore::new(10), OnError::Allow);
        let policy = limiter.policy();
        let request = Request::new("a", "GET /", None, 1).unwrap();
        let future = limiter.decide(&policy, &request);
        let size = std::mem::size_of_val(&future);
        assert!(size <= 64, "the decide future is {size} bytes");
    }
}
