//! The `Store` abstraction: one call per decision, all rules at once.
//!
//! A store receives every rule that applies to a request in one [`Batch`]
//! and must decide them together: check every rule, then commit all of them
//! or none. That is what makes a denied request consume nothing, and it is
//! what lets the Redis backend make one round trip per decision however many
//! rules apply.

pub use crate::error::StoreError;
use std::future::Future;

use sluice_core::decision::Outcomes;
use sluice_core::{BoundRule, Outcome, Rule, Scope, State};

use crate::adjust::{Adjusted, Change, Marker};

/// Every rule of one decision, with what identifies its buckets.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The tenant.
    pub tenant: &'a str,
    /// The subject, for subject-scope rules.
    pub subject: Option<&'a str>,
    /// Which of the tenant's shards this decision uses (0 when unsharded).
    pub shard: u16,
    /// Units to consume from every rule.
    pub cost: u64,
    /// The rules, in policy order; outcomes come back in the same order.
    pub rules: &'a [BoundRule],
    /// Per rule, the partition it counts in, overriding the one its scope
    /// gives (Envoy descriptors count per descriptor). Empty: by scope.
    pub partitions: &'a [Partition<'a>],
    /// Per rule, the units it consumes, overriding `cost` (Envoy
    /// descriptors carry their own `hits_addend`). Empty: `cost` for all.
    pub costs: &'a [u64],
    /// Per rule, for a give-back ([`Change::GiveBack`](crate::Change)):
    /// when the units given back, as their admission left the rule, would
    /// have refilled had nothing else happened (the admission's time plus
    /// its outcome's `reset_after_ms`; 0: not known). Only what the
    /// admission still holds is given back
    /// ([`Rule::returnable`](sluice_core::Rule::returnable)). Empty: none
    /// known.
    pub whole_at: &'a [u64],
    /// The lease an admission takes of every `concurrency` rule (random,
    /// chosen by the caller); `None`: concurrency rules only check.
    pub lease: Option<u128>,
    /// Which key of each split valve this decision uses (the valve's
    /// shards taken modulo their number); `None`: the store chooses.
    pub valve_turn: Option<u64>,
    /// Whether the store was already asked something for this request
    /// (another of the tenant's shards): a
    /// decision from slices is then not one "without a store call"
    /// (`Telemetry::slice_decision`). Stores ignore it.
    pub asked_before: bool,
}

/// The valve turn of the decision numbered `n` (see
/// [`Batch::valve_turn`]): spread like random over a split valve's keys
/// (splitmix64), so that no two instances' choices fall into step with each
/// other or with their load. (A fair valve's level is read from the key a
/// decision used: keys taken in turn, in step with a load balancer's own
/// turns, had each instance read only the keys the other had just
/// drained.)
pub fn scatter(n: u64) -> u64 {
    let mut z = n.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Whose bucket a rule counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Partition<'a> {
    /// One bucket per tenant (tenant and route scopes).
    Tenant(&'a str),
    /// One bucket per subject within a tenant.
    Subject(&'a str, &'a str),
    /// One bucket across all tenants.
    Global,
}

impl<'a> Batch<'a> {
    /// A batch of `rules` for one request, every rule costing `cost`, on
    /// shard 0.
    #[inline]
    pub fn new(
        tenant: &'a str,
        subject: Option<&'a str>,
        cost: u64,
        rules: &'a [BoundRule],
    ) -> Batch<'a> {
        Batch {
            tenant,
            subject,
            shard: 0,
            cost,
            rules,
            partitions: &[],
            costs: &[],
            whole_at: &[],
            lease: None,
            valve_turn: None,
            asked_before: false,
        }
    }

    /// The partition rule `index` counts in for this request.
    pub fn partition(&self, index: usize, rule: &BoundRule) -> Partition<'a> {
        if let Some(partition) = self.partitions.get(index) {
            return *partition;
        }
        match (rule.scope(), self.subject) {
            (Scope::Global, _) => Partition::Global,
            (Scope::Subject, Some(subject)) => Partition::Subject(self.tenant, subject),
            _ => Partition::Tenant(self.tenant),
        }
    }

    /// The units rule `index` consumes (one slot of a concurrency rule,
    /// one admission of a duplicate guard).
    pub fn cost_of(&self, index: usize) -> u64 {
        let cost = self.costs.get(index).copied().unwrap_or(self.cost);
        match self.rules.get(index) {
            Some(rule) => rule.units(cost),
            None => cost,
        }
    }
}

/// What [`Store::decide`] answered: each rule's outcome, and when the
/// store decided on its own clock (a give-back of what it admitted names
/// that time: `sliding_log` finds its entries by it, windows their window).
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// Per rule of the batch, in its order.
    pub outcomes: Outcomes,
    /// The store's time, in ms since the Unix epoch.
    pub at_ms: u64,
    /// On Redis Cluster, where a sharded tenant's rules kept whole on
    /// shard 0 sit in another slot than its divided ones: the time that
    /// slot's node admitted them (its call ran apart, perhaps in another
    /// millisecond, on another clock). `None`: `at_ms` for every rule.
    pub first_shard_at_ms: Option<u64>,
}

/// What [`Store::peek`] read: the store's time and every rule's bucket.
#[derive(Debug, Clone)]
pub struct Peeked {
    /// The store's time, in ms since the Unix epoch.
    pub now: u64,
    /// Per rule of the batch, in its order.
    pub rows: Vec<PeekedRule>,
}

/// One rule's bucket as [`Store::peek`] read it.
#[derive(Debug, Clone)]
pub struct PeekedRule {
    /// Its key (opaque), or where it lives for a store without string
    /// keys.
    pub key: String,
    /// Its stored state (fresh when the key does not exist).
    pub state: State,
    /// The rule as the store enforces it (on Redis Cluster, a split global
    /// valve's key holds its share of the limit; across regions, a shared
    /// `gcra` or `token_bucket` is this region's bucket: its rate and
    /// capacity now).
    pub enforced: Rule,
}

/// Where rate-limit state lives.
pub trait Store: Send + Sync {
    /// The backend's name, as logs and traces show it (`memory`, `redis`,
    /// `redis-cluster`).
    fn name(&self) -> &'static str {
        "custom"
    }

    /// Whether the store is in this process (the memory store): its calls
    /// are not timed, nor traced as calls.
    fn in_process(&self) -> bool {
        false
    }

    /// Decides every rule of `batch` at once and commits all or none:
    /// either every outcome is allowed and every rule consumed `cost`, or
    /// nothing changed. Outcomes come back in the order of `batch.rules`.
    fn decide(&self, batch: &Batch<'_>)
    -> impl Future<Output = Result<Decided, StoreError>> + Send;

    /// The same decision made on the spot, by a store in this process (the
    /// memory store); `None` for a store across the network. An in-process
    /// decision cannot time out or be unreachable, so the limiter skips the
    /// time budget, the breaker and the over-limit cache for it.
    fn decide_in_process(&self, batch: &Batch<'_>) -> Option<Result<Decided, StoreError>> {
        let _ = batch;
        None
    }

    /// [`decide_in_process`](Self::decide_in_process) for a batch of
    /// exactly one rule, its outcome alone with the store's time (the
    /// common case, without a vector of one to carry). `None` where the
    /// store has no such shortcut: the limiter then asks
    /// `decide_in_process`.
    fn decide_one_in_process(
        &self,
        batch: &Batch<'_>,
    ) -> Option<Result<(Outcome, u64), StoreError>> {
        let _ = batch;
        None
    }

    /// Releases `batch.lease` from every concurrency rule of `batch` (the
    /// other rules are left alone): true when one of them still held it,
    /// false when it had expired, was released already or was never taken
    /// here. Releasing is idempotent, so it needs no atomicity across
    /// rules.
    fn release(&self, batch: &Batch<'_>) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// The stored state of every rule of `batch`, read without changing
    /// anything, with the store's time (`sluice inspect`, checks that
    /// consume nothing). On Redis Cluster a split global valve is read at
    /// its key 0.
    fn peek(&self, batch: &Batch<'_>) -> impl Future<Output = Result<Peeked, StoreError>> + Send;

    /// Changes every rule of `batch` by its cost after the fact (see
    /// [`Change`]), atomically per slot; with a `marker`, only if no marker
    /// of its id is stored (the store keeps it, in the tenant's slot, with
    /// the change). Answers what a request of one unit would get after.
    /// Concurrency rules are never changed. On Redis Cluster the rules
    /// sharing the marker's slot change with it, the others after it.
    fn adjust(
        &self,
        batch: &Batch<'_>,
        change: Change,
        marker: Option<&Marker>,
    ) -> impl Future<Output = Result<Adjusted, StoreError>> + Send;

    /// How many keys each global valve is split over (Redis Cluster's
    /// `global_shards`); each enforces its share of the valve.
    fn valve_parts(&self) -> u64 {
        1
    }

    /// With `storage.regions` (shared rules one budget across regions),
    /// this region's name.
    fn region(&self) -> Option<&str> {
        None
    }

    /// With `storage.regions`, how often the region link moves budget: a
    /// denial of a shared rule may turn into an admission as soon as that,
    /// when a peer region grants budget.
    fn regions_sync_every_ms(&self) -> Option<u64> {
        None
    }

    /// Steps adaptive `valve`'s law (`sluice_core::adaptive::law`) with
    /// what this instance has `seen`, in the valve's own keys at the
    /// store's time, and answers the law as stepped; `None` from a store
    /// in this process, for which the limiter keeps the law itself.
    fn adapt(
        &self,
        valve: &sluice_core::BoundRule,
        terms: sluice_core::adaptive::Adaptive,
        seen: sluice_core::adaptive::law::Seen,
    ) -> impl Future<Output = Result<Option<sluice_core::adaptive::law::Law>, StoreError>> + Send
    {
        let _ = (valve, terms, seen);
        async { Ok(None) }
    }

    /// A request was answered without asking the store (a remembered
    /// denial): what it asked of shared rules still counts as demand.
    fn asked(&self, batch: &Batch<'_>) {
        let _ = batch;
    }

    /// Periodic upkeep of a store that lives in this process (the memory
    /// store drops keys that are as good as fresh and follows the wall
    /// clock's drift); nothing for a store across the network, whose keys
    /// expire there. [`Limiter::sweep`](crate::Limiter::sweep) calls it.
    fn maintain(&self) {}
}
