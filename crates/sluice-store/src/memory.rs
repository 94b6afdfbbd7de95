//! The embedded store: per-key state in a concurrent map.
//!
//! # Concurrency
//!
//! The map is `papaya`'s: lookups take no lock. Each key's state sits
//! behind its own small mutex. A decision locks the entries of all its rules
//! in address order (so two decisions can never deadlock), decides every
//! rule, commits all or none, and unlocks. Decisions on unrelated keys never
//! contend; decisions on the same key serialise on that key only.
//!
//! # Forgetting idle keys
//!
//! Each entry records when its state becomes indistinguishable from a fresh
//! one ([`Rule::idle_at`](sluice_core::Rule::idle_at)). [`MemoryStore::sweep`]
//! drops entries past that moment, which loses nothing. An entry being swept
//! is marked dead under its lock first; a decision that finds a dead entry
//! looks it up again, so no admission is ever committed to a removed entry.
//!
//! # Overflow
//!
//! The store holds at most `max_entries` keys, and one tenant at most its
//! share of them ([`MemoryStore::with_tenant_share`]): a tenant naming a
//! new subject on every request fills its share, never the store, so other
//! tenants' new keys keep being taken. When either is full, a decision that
//! needs a new key fails with [`StoreError::Full`] or
//! [`StoreError::TenantFull`] (the limiter denies it with reason
//! `store_unavailable`); keys already held keep working. Sweeping frees
//! room as keys go idle. Denying is the only safe overflow behaviour:
//! evicting live keys would reset budgets, and admitting unrecorded would
//! let a flood of fresh ids through unlimited.
//!
//! # Memory per key
//!
//! A key costs its map slot, one allocation holding the key header and the
//! entry (gcra, token_bucket and window states are inline; sliding_log is
//! boxed), and one for the tenant and subject bytes. `docs/BENCHMARKS.md`
//! gives the measured figure (`cargo run --release -p sluice-store
//! --example memory_per_key`).

use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use foldhash::fast::RandomState;
use papaya::Guard;
use parking_lot::{Mutex, MutexGuard};

use sluice_core::decision::Outcomes;
use sluice_core::{Outcome, State, Step};

use crate::adjust::{Adjusted, Change, Marker};
use crate::bucket::{Key, KeyRef, PassThrough};
use crate::clock::{Clock, SystemClock};
use crate::store::{Batch, Decided, Peeked, PeekedRule, Store, StoreError};
use slot::{Entry, Markers, Slot, repair};

/// The embedded in-memory store.
pub struct MemoryStore {
    map: papaya::HashMap<Key, Entry, BuildHasherDefault<PassThrough>>,
    hasher: RandomState,
    clock: Arc<dyn Clock>,
    max_entries: usize,
    /// Keys held or being inserted: the cap is checked on this, not on
    /// the map's length, so concurrent inserts cannot overshoot it.
    held: AtomicUsize,
    /// The most keys one tenant may hold (global valves count as the
    /// tenant "").
    tenant_share: usize,
    /// Keys held or being inserted per tenant, when `tenant_share` is
    /// below `max_entries`: taken when a key is inserted, given back when
    /// the sweeper removes one (the only way a key goes), never on the
    /// path of a decision whose keys exist. Tenants are counted by a
    /// 64-bit hash of their id under this store's random seed, not by the
    /// id: some 35 bytes a tenant with the table's slack, not 85 (two
    /// tenants whose hashes meet would share one count; among n tenants
    /// the chance of any such pair is about n² / 2^65).
    per_tenant: Mutex<std::collections::HashMap<u64, u32, BuildHasherDefault<PassThrough>>>,
    /// Settle markers: per reservation id and the tenant's shard whose
    /// slot keeps it on Redis, what was settled and until when the marker
    /// is kept.
    markers: Mutex<Markers>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("entries", &self.map.len())
            .field("max_entries", &self.max_entries)
            .finish()
    }
}

impl MemoryStore {
    /// A store holding at most `max_entries` keys, on the system clock.
    pub fn new(max_entries: usize) -> MemoryStore {
        MemoryStore::with_clock(max_entries, Arc::new(SystemClock::default()))
    }

    /// A store on the given clock.
    pub fn with_clock(max_entries: usize, clock: Arc<dyn Clock>) -> MemoryStore {
        MemoryStore {
            map: papaya::HashMap::builder()
                .hasher(BuildHasherDefault::default())
                // Small to start with, growing as keys come: a table sized
                // for the cap spreads a few thousand keys over more cache
                // lines than they fill (measured: 90 → 71 ns a decision at
                // 10,000 keys when presized for 65,536 rather than 1,024).
                .capacity(max_entries.min(1 << 10))
                .collector(crate::bucket::collector())
                .build(),
            hasher: RandomState::default(),
            clock,
            max_entries,
            held: AtomicUsize::new(0),
            tenant_share: max_entries,
            per_tenant: Mutex::new(std::collections::HashMap::default()),
            markers: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The same store, one tenant holding at most `share` of its keys.
    pub fn with_tenant_share(mut self, share: usize) -> MemoryStore {
        // A count is a u32; `storage.max_entries` is at most 10^9.
        self.tenant_share = share.min(self.max_entries).min(u32::MAX as usize);
        self
    }

    /// Takes a place for a new key of `tenant` under its share.
    fn take_tenant_place(&self, tenant: &[u8]) -> Result<(), StoreError> {
        if self.tenant_share >= self.max_entries {
            return Ok(());
        }
        let id = self.hasher.hash_one(tenant);
        let mut counts = self.per_tenant.lock();
        let held = counts.entry(id).or_insert(0);
        if *held as usize >= self.tenant_share {
            return Err(StoreError::TenantFull(self.tenant_share));
        }
        *held += 1;
        Ok(())
    }

    /// Gives back a place of `tenant` (a key removed, or not inserted).
    fn give_tenant_place(&self, tenant: &[u8]) {
        if self.tenant_share >= self.max_entries {
            return;
        }
        let id = self.hasher.hash_one(tenant);
        let mut counts = self.per_tenant.lock();
        if let Some(held) = counts.get_mut(&id) {
            *held -= 1;
            if *held == 0 {
                counts.remove(&id);
            }
        }
    }

    /// Keys currently held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The clock decisions are made on.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Decides a batch now; the synchronous core of [`Store::decide`].
    pub fn decide_now(&self, batch: &Batch<'_>) -> Result<Outcomes, StoreError> {
        self.decide_parts(batch, 1)
    }

    /// [`decide_now`](Self::decide_now), with the time it decided at (a
    /// give-back of what it admitted names that time).
    pub(crate) fn decided(&self, batch: &Batch<'_>) -> Result<Decided, StoreError> {
        let now = self.clock.now_ms();
        self.decide_parts_at(batch, 1, now).map(|outcomes| Decided {
            outcomes,
            at_ms: now,
            first_shard_at_ms: None,
        })
    }

    /// [`decided`](Self::decided) for a batch of one rule: its outcome
    /// alone, and the time.
    #[inline]
    pub(crate) fn decided_one(&self, batch: &Batch<'_>) -> Result<(Outcome, u64), StoreError> {
        let now = self.clock.now_ms();
        self.decide_one_at(batch, 1, now)
            .map(|outcome| (outcome, now))
    }

    /// Decides a batch against one of `parts` equal shares of every rule
    /// (see [`Rule::share`](sluice_core::Rule::share)): how each of `parts`
    /// sluice instances enforces limits locally while the shared store is
    /// unreachable.
    pub fn decide_parts(&self, batch: &Batch<'_>, parts: u64) -> Result<Outcomes, StoreError> {
        self.decide_parts_at(batch, parts, self.clock.now_ms())
    }

    /// [`decide_parts`](Self::decide_parts) at `now`, read by the caller.
    fn decide_parts_at(
        &self,
        batch: &Batch<'_>,
        parts: u64,
        now: u64,
    ) -> Result<Outcomes, StoreError> {
        if let [_] = batch.rules {
            return self
                .decide_one_at(batch, parts, now)
                .map(|outcome| smallvec::smallvec![outcome]);
        }
        let guard = self.map.guard();
        let n = batch.rules.len();
        loop {
            // A few rules (most requests: tenant, route, subject) are
            // decided in arrays on the stack: `SmallVec`s check where their
            // items live on every push, index and drop (a three-rule
            // decision: 3,062 → 2,919 instructions; BENCHMARKS.md).
            let decided = if n <= FEW {
                let first = self.entry(&self.key(batch, 0), &guard)?;
                let mut entries = [first; FEW];
                for (i, entry) in entries.iter_mut().enumerate().take(n).skip(1) {
                    *entry = self.entry(&self.key(batch, i), &guard)?;
                }
                let mut order = [(0, 0); FEW];
                let mut owner = [0; FEW];
                let mut guards: [_; FEW] = std::array::from_fn(|_| None);
                let mut outcomes = [Outcome::default(); FEW];
                let mut steps: [_; FEW] = std::array::from_fn(|_| Step::Keep);
                let scratch = Scratch {
                    order: &mut order[..n],
                    owner: &mut owner[..n],
                    guards: &mut guards[..n],
                    outcomes: &mut outcomes[..n],
                    steps: &mut steps[..n],
                };
                decide_locked(batch, &entries[..n], now, parts, scratch)
            } else {
                let entries = (0..n)
                    .map(|i| self.entry(&self.key(batch, i), &guard))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut guards: Vec<_> = (0..n).map(|_| None).collect();
                let mut steps: Vec<_> = (0..n).map(|_| Step::Keep).collect();
                let scratch = Scratch {
                    order: &mut vec![(0, 0); n],
                    owner: &mut vec![0; n],
                    guards: &mut guards,
                    outcomes: &mut vec![Outcome::default(); n],
                    steps: &mut steps,
                };
                decide_locked(batch, &entries, now, parts, scratch)
            };
            if let Some(outcomes) = decided {
                return Ok(outcomes);
            }
            // An entry was swept between lookup and lock: look up again.
        }
    }

    /// The key of rule `i` of `batch`.
    #[inline]
    fn key<'b>(&self, batch: &Batch<'b>, i: usize) -> KeyRef<'b> {
        let rule = &batch.rules[i];
        KeyRef::new(&self.hasher, rule, batch.partition(i, rule), batch.shard)
    }

    /// [`decide_parts`](Self::decide_parts) for a batch of one rule, at
    /// `now`: one lookup, one lock, nothing to order, and the outcome
    /// alone.
    #[inline]
    fn decide_one_at(
        &self,
        batch: &Batch<'_>,
        parts: u64,
        now: u64,
    ) -> Result<Outcome, StoreError> {
        debug_assert_eq!(batch.rules.len(), 1);
        let guard = self.map.guard();
        let bound = &batch.rules[0];
        let key = KeyRef::new(&self.hasher, bound, batch.partition(0, bound), batch.shard);
        let rule = bound.rule().share(parts);
        let cost = batch.cost_of(0);
        loop {
            let entry = self.entry(&key, &guard)?;
            let mut slot = entry.slot.lock();
            if slot.dead {
                continue;
            }
            repair(&rule, &mut slot, now);
            let outcome = rule.admit_repaired_lease(&mut slot.state, now, cost, batch.lease);
            if outcome.allowed {
                slot.idle_at = rule.idle_at(&slot.state);
            }
            return Ok(outcome);
        }
    }

    fn entry<'g>(&self, key: &KeyRef<'_>, guard: &'g impl Guard) -> Result<&'g Entry, StoreError> {
        if let Some(entry) = self.map.get(key, guard) {
            return Ok(entry);
        }
        // Take a place under the cap first, give it back if the key was
        // inserted meanwhile by another decision.
        if self.held.fetch_add(1, Ordering::AcqRel) >= self.max_entries {
            self.held.fetch_sub(1, Ordering::AcqRel);
            return Err(StoreError::Full(self.max_entries));
        }
        if let Err(full) = self.take_tenant_place(key.tenant()) {
            self.held.fetch_sub(1, Ordering::AcqRel);
            return Err(full);
        }
        match self.map.try_insert(key.to_key(), Entry::fresh(), guard) {
            Ok(entry) => Ok(entry),
            Err(occupied) => {
                self.held.fetch_sub(1, Ordering::AcqRel);
                self.give_tenant_place(key.tenant());
                Ok(occupied.current)
            }
        }
    }

    /// Gives back what an admitted decision of `batch` at `at` consumed,
    /// from every rule of the batch, with the arithmetic of the Redis
    /// refund script (`Rule::refund`), and releases `batch.lease` from its
    /// concurrency rules (`Rule::release`). Returns how many concurrency
    /// rules still held that lease.
    pub fn refund(&self, batch: &Batch<'_>, at: u64) -> u64 {
        let now = self.clock.now_ms();
        let guard = self.map.guard();
        let mut released = 0;
        for (i, rule) in batch.rules.iter().enumerate() {
            let key = KeyRef::new(&self.hasher, rule, batch.partition(i, rule), batch.shard);
            let Some(entry) = self.map.get(&key, &guard) else {
                continue;
            };
            let mut slot = entry.slot.lock();
            let next = match batch.lease {
                Some(lease) if rule.rule().is_concurrency() => {
                    let (held, next) = rule.rule().release(&slot.state, now, lease);
                    released += u64::from(held);
                    next
                }
                _ => rule.rule().refund(&slot.state, at, batch.cost_of(i)),
            };
            if next.is_some() && rule.rule().algorithm().has_burst() {
                slot.given_back_ms = slot.given_back_ms.max(now);
            }
            if let Some(state) = next {
                slot.state = state;
                slot.idle_at = rule.rule().idle_at(&slot.state);
            }
        }
        released
    }

    /// [`Store::release`], synchronously.
    pub fn release_now(&self, batch: &Batch<'_>) -> bool {
        debug_assert!(batch.rules.iter().all(|r| r.rule().is_concurrency()));
        batch.lease.is_some() && self.refund(batch, 0) > 0
    }

    /// The state stored for rule `index` of a request, without changing it
    /// ([`Store::peek`] of one rule, synchronously).
    pub fn peek_rule(&self, batch: &Batch<'_>, index: usize) -> State {
        let rule = &batch.rules[index];
        let key = KeyRef::new(
            &self.hasher,
            rule,
            batch.partition(index, rule),
            batch.shard,
        );
        let guard = self.map.guard();
        self.map
            .get(&key, &guard)
            .map_or(State::Fresh, |entry| entry.slot.lock().state.clone())
    }

    /// [`Store::peek`], synchronously.
    pub fn peek_now(&self, batch: &Batch<'_>) -> Peeked {
        // Keys here are not strings: a row names where it lives.
        let rows = (0..batch.rules.len())
            .map(|i| PeekedRule {
                key: "(in this process)".to_owned(),
                state: self.peek_rule(batch, i),
                enforced: *batch.rules[i].rule(),
            })
            .collect();
        Peeked {
            now: self.clock.now_ms(),
            rows,
        }
    }

    /// Drops every key whose state is as good as fresh, and every settle
    /// marker past its life; returns how many keys.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now_ms();
        self.markers.lock().retain(|_, (_, until)| *until > now);
        let guard = self.map.guard();
        let mut removed = 0;
        for (key, entry) in self.map.iter(&guard) {
            {
                let mut slot = entry.slot.lock();
                if slot.dead || slot.idle_at > now {
                    continue;
                }
                slot.dead = true;
            }
            if let Ok(Some(_)) = self
                .map
                .remove_if(key, |_, v| std::ptr::eq(v, entry), &guard)
            {
                removed += 1;
                self.held.fetch_sub(1, Ordering::AcqRel);
                self.give_tenant_place(key.tenant());
            }
        }
        removed
    }
}

/// Rules a decision takes in arrays on the stack; more take vectors.
const FEW: usize = 4;

/// Where a decision of several rules keeps its working state, one place
/// per rule: in arrays for a few rules, in vectors for more.
struct Scratch<'s, 'e> {
    /// `(entry address, rule)`, to be sorted.
    order: &'s mut [(usize, usize)],
    /// Which rule holds the lock of each rule's entry.
    owner: &'s mut [usize],
    /// The locks, each held by the first rule (in address order) of its
    /// entry.
    guards: &'s mut [Option<MutexGuard<'e, Slot>>],
    outcomes: &'s mut [Outcome],
    steps: &'s mut [Step],
}

/// Locks the entries in address order, decides every rule, commits all or
/// none. `None` when an entry turned out to be dead.
fn decide_locked<'e>(
    batch: &Batch<'_>,
    entries: &[&'e Entry],
    now: u64,
    parts: u64,
    scratch: Scratch<'_, 'e>,
) -> Option<Outcomes> {
    let Scratch {
        order,
        owner,
        guards,
        outcomes,
        steps,
    } = scratch;
    // Address order makes concurrent multi-key decisions deadlock-free. Two
    // rules rarely share an entry (an Envoy request naming one descriptor
    // twice), and then the entry is locked once and both rules read it.
    for (i, (place, entry)) in order.iter_mut().zip(entries).enumerate() {
        *place = (std::ptr::from_ref::<Entry>(entry) as usize, i);
    }
    order.sort_unstable();
    let mut holder = 0;
    for (k, &(address, i)) in order.iter().enumerate() {
        if k == 0 || address != order[k - 1].0 {
            let slot = entries[i].slot.lock();
            if slot.dead {
                return None;
            }
            guards[i] = Some(slot);
            holder = i;
        }
        owner[i] = holder;
    }
    // Repairs first, all of them: they are kept whatever the decision, and
    // a rule decides on its state repaired.
    for (rule, &holder) in batch.rules.iter().zip(&*owner) {
        let slot = guards[holder].as_mut().expect("the holder holds the lock");
        repair(&rule.rule().share(parts), slot, now);
    }
    // Shadow rules never block the others; they consume only when they
    // admit, as an enforced rule would.
    let mut enforced_admit = true;
    for (i, ((rule, &holder), (outcome, step))) in batch
        .rules
        .iter()
        .zip(&*owner)
        .zip(outcomes.iter_mut().zip(steps.iter_mut()))
        .enumerate()
    {
        let slot = guards[holder].as_ref().expect("the holder holds the lock");
        (*outcome, *step) = rule.rule().share(parts).decide_repaired_lease(
            &slot.state,
            now,
            batch.cost_of(i),
            batch.lease,
        );
        enforced_admit &= outcome.allowed || rule.shadow();
    }
    if enforced_admit {
        for (((rule, outcome), step), &holder) in
            batch.rules.iter().zip(&*outcomes).zip(steps).zip(&*owner)
        {
            if outcome.allowed {
                let slot = guards[holder].as_mut().expect("the holder holds the lock");
                let rule = rule.rule().share(parts);
                rule.commit(&mut slot.state, std::mem::replace(step, Step::Keep));
                slot.idle_at = rule.idle_at(&slot.state);
            }
        }
    }
    Some(Outcomes::from_slice(outcomes))
}

impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn in_process(&self) -> bool {
        true
    }

    fn decide(
        &self,
        batch: &Batch<'_>,
    ) -> impl Future<Output = Result<Decided, StoreError>> + Send {
        std::future::ready(self.decided(batch))
    }

    fn decide_in_process(&self, batch: &Batch<'_>) -> Option<Result<Decided, StoreError>> {
        Some(self.decided(batch))
    }

    #[inline]
    fn decide_one_in_process(
        &self,
        batch: &Batch<'_>,
    ) -> Option<Result<(Outcome, u64), StoreError>> {
        Some(self.decided_one(batch))
    }

    fn release(&self, batch: &Batch<'_>) -> impl Future<Output = Result<bool, StoreError>> + Send {
        std::future::ready(Ok(self.release_now(batch)))
    }

    fn peek(&self, batch: &Batch<'_>) -> impl Future<Output = Result<Peeked, StoreError>> + Send {
        std::future::ready(Ok(self.peek_now(batch)))
    }

    fn adjust(
        &self,
        batch: &Batch<'_>,
        change: Change,
        marker: Option<&Marker>,
    ) -> impl Future<Output = Result<Adjusted, StoreError>> + Send {
        std::future::ready(self.adjust_now(batch, change, marker))
    }

    fn maintain(&self) {
        self.clock.resync();
        self.sweep();
    }
}

mod adjust;
mod slot;
#[cfg(test)]
mod tests;
