//! The limiter: request → applicable rules → one store call → decision.
//!
//! This is where a decision gets made, and where store trouble is absorbed:
//!
//! 1. the over-limit cache answers requests for buckets known to be
//!    exhausted, without a store call ([`denials`]), and a hot key of a
//!    rule with a `tolerance` is decided from a slice of its budget taken
//!    ahead ([`slice`]);
//! 2. the circuit breaker skips a store that keeps failing ([`breaker`]);
//! 3. every store call is bounded by the time budget (`budget`);
//! 4. when the store cannot decide, the failure policy does: `allow`,
//!    `deny`, or `local` — the memory engine enforcing each limit divided by
//!    the number of live sluice instances (`fallback`).
//!
//! A decision reads top to bottom: the doors (`door`: [`Limiter::decide`],
//! [`Limiter::acquire`], [`Limiter::decide_keyed`] for rules that count
//! where the caller names, and `decide_now` on the memory store) each
//! build one prepared request (`prepared`: the rules, a cost no rule can
//! hold, fair valves' gates, duplicate guards, named buckets, the lease)
//! and send it down one path (`path`: the store in this process at once,
//! else the tenant's shards within one time budget, `shard`, each shard's
//! call through `budget`). A new step of every decision goes into
//! `prepared` or `path`, never into a door. After the decision: leases
//! ([`Limiter::release`], [`lease`]), reservations and attempts
//! ([`Limiter::reserve`], [`Limiter::settle`], [`Limiter::attempt`],
//! [`Limiter::conclude_attempt`], [`Limiter::report`]: `after`), reads
//! ([`Limiter::peek`], [`Limiter::peek_keyed`]). Beside them: fair valves'
//! levels (`gate`, `fair`), adaptive valves' limits and what their
//! downstream shows (`adaptive`, [`Limiter::observe`]), duplicate guards'
//! buckets (`dedupe`) and the options ([`LimiterOptions`]).
//!
//! The policy is swapped atomically on reload; a decision holds the policy
//! it started with until it is done.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use sluice_core::Policy;
use sluice_core::config::OnError;

use crate::memory::MemoryStore;
use crate::store::{Batch, Peeked, Store, StoreError};

mod adaptive;
mod after;
mod attempt;
pub mod breaker;
mod budget;
mod dedupe;
pub mod denials;
mod door;
mod fair;
mod fallback;
mod gate;
mod keyed;
pub mod lease;
mod options;
mod path;
mod prepared;
mod shard;
pub mod slice;
#[cfg(test)]
mod tests;

pub use adaptive::AdaptiveLevel;
pub use after::{Adjustment, AfterError, Reservation};
pub use fair::ValveLevel;
pub use keyed::Keyed;
pub use lease::Lease;
pub use options::LimiterOptions;

use breaker::{Breaker, BreakerState};
use denials::DenialCache;
/// Decides requests against the current policy and a store.
pub struct Limiter<S> {
    policy: ArcSwap<Policy>,
    store: S,
    options: LimiterOptions,
    breaker: Breaker,
    denials: Option<DenialCache>,
    /// Hot keys' slices, for rules with a tolerance.
    slices: slice::Slices,
    /// What shadow rules' tolerances would admit (`slice::WhatIfs`).
    what_ifs: slice::WhatIfs,
    local: MemoryStore,
    live_instances: AtomicU64,
    /// Spreads sharded tenants' decisions over their shards in turn.
    turns: shard::Turns,
    /// Each fair valve's level, as this instance knows it.
    fair: fair::FairShares,
    /// Each adaptive valve's effective limit and what was seen of its
    /// downstream.
    adaptive: adaptive::Adaptives,
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
        options.telemetry.policy_installed(&policy);
        Limiter {
            policy: ArcSwap::from_pointee(policy),
            store,
            breaker: Breaker::new(options.breaker),
            denials: options.denial_cache.then(DenialCache::default),
            slices: slice::Slices::default(),
            what_ifs: slice::WhatIfs::default(),
            local: MemoryStore::with_clock(options.local_max_entries, options.clock.clone())
                .with_tenant_share(options.local_tenant_share),
            live_instances: AtomicU64::new(options.fallback_instances.max(1)),
            turns: shard::Turns::default(),
            fair: fair::FairShares::default(),
            adaptive: adaptive::Adaptives::default(),
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
    /// Hot keys' slices (and shadow what-ifs) of the rules it changes are
    /// dropped, those of the others kept (see `slice`).
    pub fn set_policy(&self, policy: Policy) {
        self.policy.store(Arc::new(policy));
        // What is stored now (another swap may have raced this one).
        self.options.telemetry.policy_installed(&self.policy.load());
        if let Some(denials) = &self.denials {
            denials.clear();
        }
        // Slices of the rules whose limits or tolerances changed go at
        // once (given back by `give_back_dropped_slices`); the others stay.
        let policy = self.policy.load();
        self.slices.keep_unchanged(&policy);
        self.what_ifs.keep_unchanged(&policy);
    }

    /// The limiter's clock: ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.options.clock.now_ms()
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

    /// Every adaptive valve this instance knows: its effective limit, its
    /// downstream's latency, what it shed by priority.
    pub fn adaptive_levels(&self) -> Vec<AdaptiveLevel> {
        self.adaptive.levels()
    }

    /// The slices of hot keys this instance holds, per rule, with each
    /// rule's declared bound (`tolerance × limit`).
    pub fn slice_levels(&self) -> Vec<slice::SliceLevel> {
        self.slices.levels(self.options.clock.now_ms())
    }

    /// Gives back what this instance's slices still hold (call it when
    /// the instance stops: `sluice serve` does, after its last request),
    /// each to the bucket it was taken from, within the time budget: the
    /// store then counts only what was admitted. Returns the units given
    /// back; a store that cannot be reached keeps them (under-admission,
    /// as after a crash). No decision is answered from slices after it.
    pub async fn give_back_slices(&self) -> u64 {
        self.give_back(self.slices.drain()).await
    }

    /// Gives back what slices no longer spent here held: dropped by a
    /// change of their rule (a reload, an override) or a store error,
    /// replaced by a newer take, or expired unspent (the key cooled).
    /// Returns the units given back. Never called on a decision's path:
    /// `sluice serve` calls it whenever [`slices_dropped`](Self::slices_dropped)
    /// resolves and every [`GIVE_BACK_EVERY`](slice::GIVE_BACK_EVERY); an
    /// embedded limiter on a remote store does the same from a task of its
    /// own (else what they held is lost: under-admission only).
    pub async fn give_back_dropped_slices(&self) -> u64 {
        self.slices.expire(self.options.clock.now_ms());
        self.give_back(self.slices.take_dropped()).await
    }

    /// Resolves once a slice was dropped since the last
    /// [`give_back_dropped_slices`](Self::give_back_dropped_slices).
    pub async fn slices_dropped(&self) {
        self.slices.dropped().await;
    }

    /// Gives `unspent` back, each to its bucket, within the time budget:
    /// the units given back. After the first failure the rest is not
    /// tried now (the store is in trouble, each would wait out the
    /// budget): it is queued again, for the next pass, as long as a
    /// give-back could still return something of it (else it is lost,
    /// under-admission only), and logged once.
    async fn give_back(&self, unspent: Vec<slice::Unspent>) -> u64 {
        let mut given = 0;
        let mut pieces = unspent.into_iter();
        while let Some(unspent) = pieces.next() {
            let rules = std::slice::from_ref(&unspent.rule);
            let whole_at = [unspent.whole_at_ms];
            let batch = Batch {
                shard: unspent.shard,
                whole_at: &whole_at,
                ..Batch::new(
                    &unspent.tenant,
                    unspent.subject.as_deref(),
                    unspent.units,
                    rules,
                )
            };
            let change = crate::adjust::Change::GiveBack {
                at: unspent.at_ms,
                first_shard_at: unspent.at_ms,
            };
            match self.adjust_within_budget(&batch, change, None).await {
                Ok(_) => given += unspent.units,
                Err(error) => {
                    let now = self.options.clock.now_ms();
                    let rest: Vec<_> = std::iter::once(unspent).chain(pieces).collect();
                    let units: u64 = rest.iter().map(|u| u.units).sum();
                    let kept = self.slices.requeue(rest, now);
                    tracing::warn!(%error, units, kept, "slices could not be given back now; those a later give-back can still return are kept for it, the others are lost, as after a crash");
                    break;
                }
            }
        }
        given
    }

    /// The slices this instance holds for `tenant`'s keys.
    pub fn slices_of(&self, tenant: &str) -> Vec<slice::HeldSlice> {
        self.slices.of_tenant(tenant, self.options.clock.now_ms())
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
        self.slices.sweep(now);
        self.what_ifs.sweep(now);
        self.local.sweep();
        self.store.maintain();
    }

    /// Replays an admitted `batch` on its shadow rules with a tolerance,
    /// where the batch would take slices were they enforced: what their
    /// tolerance would over-admit, reported to the telemetry (see
    /// [`slice::WhatIfs`]). Nothing to do for other batches.
    #[inline]
    fn what_if(&self, batch: &Batch<'_>, admitted: bool) {
        if admitted && slice::replayed(batch) {
            self.replay_shadows(batch);
        }
    }

    #[cold]
    fn replay_shadows(&self, batch: &Batch<'_>) {
        let now = self.options.clock.now_ms();
        let parts = self.live_instances();
        self.what_ifs.replay(batch, now, parts, |i, units| {
            self.options
                .telemetry
                .slice_shadow_over(&batch.rules[i], units);
        });
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

    /// The stored state of every rule of `batch`, read without changing
    /// anything ([`Store::peek`]). Not bounded here: a caller answering a
    /// request bounds it by what that request can wait (the Envoy checks
    /// that consume nothing wait 100 ms at most), `sluice inspect` does not.
    pub async fn peek(&self, batch: &Batch<'_>) -> Result<Peeked, StoreError> {
        self.store.peek(batch).await
    }
}

/// The first rule of `batch` whose cost is above its capacity: such a
/// request can never pass.
fn cost_exceeds_capacity(batch: &Batch<'_>) -> Option<usize> {
    // (An adaptive valve's rule here holds the request's priority's part
    // of it: a cost above that waits for the part to grow, never refused
    // for good; `prepare` checked the cost against the whole valve.)
    (0..batch.rules.len()).find(|&i| {
        !batch.rules[i].adaptive() && batch.cost_of(i) > batch.rules[i].rule().capacity()
    })
}
