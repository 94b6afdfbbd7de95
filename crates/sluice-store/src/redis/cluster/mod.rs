//! The Redis Cluster backend.
//!
//! The same scripts as on one node, through the `redis` crate's async
//! cluster client, which routes each call by its keys' slot and follows
//! `MOVED`/`ASK` (and waits out `TRYAGAIN`/`CLUSTERDOWN`) during resharding
//! and failover.
//!
//! # Key layout
//!
//! - A tenant's keys (tenant, route and subject scopes) share the hash tag
//!   of the tenant (`{T}`), so they are in one slot and one call
//!   decides them all. A tenant with `shards: N` has N tags, on N slots.
//! - A global valve would be one hot key; it is split over
//!   `storage.global_shards` keys with tags of their own (spread over the
//!   slots), each enforcing `⌊limit / global_shards⌋`. A decision uses one
//!   of them, in turn.
//!
//! # Several slots: reserve, then refund
//!
//! A decision whose keys are on several slots (a valve's key is never on the
//! tenant's; Envoy descriptors each have their own tag) is one call per
//! slot. The non-valve groups go first, concurrently (the tenant's rules
//! deny far more often than valves, and then the valves are never asked);
//! if they all admit, the valves are asked, concurrently. If any group
//! denies or fails, what the groups that admitted consumed is given back by
//! the refund script, and the decision answers once it has landed. So a
//! denied request still consumes nothing, and the next decision already
//! sees the budgets whole; an admitted request waits for at most two round
//! trips, a denied one for three.
//!
//! What a group consumed is held by a `Hold`, which refunds it when
//! dropped unless the whole decision admitted. Each group's call runs as a
//! task of its own, so a caller that goes away at any `.await` (its time
//! budget ran out, the client hung up) leaves nothing consumed: calls under
//! way finish, and their holds, collected by nobody, are dropped and
//! refunded.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use sluice_core::Scope;
use sluice_core::decision::Outcomes;
use sluice_core::keys::Record;

use smallvec::SmallVec;

mod adjust;
mod hold;

use hold::{Hold, RefundPlan, refund_all};

use super::node::ConnectOptions;
use super::regions::shared::{RegionPart, Regions};
use crate::adjust::{Adjusted, Change, Marker};
use crate::local_connection::LocalConnections;
use crate::redis::store::{Reach, Redis, send};
use crate::redis::{
    self as script, Buckets, Heartbeat, KeySet, RefundCall, Selection, TimeSource, Valve,
};
use crate::store::{Batch, Decided, Partition, Peeked, Store, StoreError};

/// How often a store that could not connect tries again.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);

/// A store on Redis Cluster.
#[derive(Clone)]
pub struct ClusterStore {
    redis: Redis<Cluster>,
    valve_shards: u16,
    next_valve: Arc<AtomicU64>,
}

/// A cluster: its client, and the shared connection once one is made.
#[derive(Clone)]
pub(crate) struct Cluster {
    client: ClusterClient,
    connection: Arc<ArcSwapOption<ClusterConnection>>,
    /// Longest one attempt to connect may take.
    budget: Duration,
}

impl Reach for Cluster {
    type Connection = ClusterConnection;
    const PIPELINES_ANY_KEYS: bool = false;

    fn shared(&self) -> Result<ClusterConnection, StoreError> {
        self.connection
            .load_full()
            .map(|c| (*c).clone())
            .ok_or_else(|| StoreError::Unavailable("not connected to the cluster yet".to_owned()))
    }

    fn own(&self, local: &LocalConnections) -> Option<ClusterConnection> {
        let slot = local.get(|runtime| {
            let slot = Arc::new(ArcSwapOption::empty());
            self.keep_connecting(runtime, slot.clone());
            Some(slot)
        })?;
        slot.load_full().map(|c| (*c).clone())
    }
}

impl Cluster {
    /// Puts a connection in `slot` once one is made on `runtime` (which
    /// then drives it), trying every second until then. (Once connected,
    /// the client follows failovers and resharding by itself.)
    fn keep_connecting(
        &self,
        runtime: &tokio::runtime::Handle,
        slot: Arc<ArcSwapOption<ClusterConnection>>,
    ) {
        let (client, budget) = (self.client.clone(), self.budget);
        runtime.spawn(async move {
            loop {
                if let Ok(Ok(connection)) =
                    tokio::time::timeout(budget, client.get_async_connection()).await
                {
                    slot.store(Some(Arc::new(connection)));
                    return;
                }
                tokio::time::sleep(RECONNECT_EVERY).await;
            }
        });
    }
}

impl std::fmt::Debug for ClusterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterStore")
            .field("keys", &self.redis.keys)
            .field("valve_shards", &self.valve_shards)
            .finish_non_exhaustive()
    }
}

impl ClusterStore {
    /// Prepares a store for the cluster the `nodes` (seed URLs) belong to,
    /// with each global valve split over `valve_shards` keys. Connecting is
    /// bounded by the time budget (at least 1 s) and, when it fails, retried
    /// in the background every second: the store exists while the cluster
    /// is down, and its calls fail until it is up.
    pub async fn connect(
        nodes: &[String],
        keys: KeySet,
        options: &ConnectOptions,
        valve_shards: u16,
    ) -> Result<ClusterStore, StoreError> {
        let timeout = options.timeout;
        let client = options.cluster_client(nodes, 8)?;
        let cluster = Cluster {
            client: client.clone(),
            connection: Arc::new(ArcSwapOption::empty()),
            budget: timeout.max(Duration::from_secs(1)),
        };
        let store = ClusterStore {
            redis: Redis::new(cluster.clone(), keys, timeout),
            valve_shards: valve_shards.max(1),
            // Instances start their turns at different shards.
            next_valve: Arc::new(AtomicU64::new(first_turn())),
        };
        // The crate can hang connecting to a cluster that is half up: bound
        // every attempt; when it fails, connect in the background.
        match tokio::time::timeout(cluster.budget, client.get_async_connection()).await {
            Ok(Ok(connection)) => cluster.connection.store(Some(Arc::new(connection))),
            _ => cluster.keep_connecting(
                &tokio::runtime::Handle::current(),
                cluster.connection.clone(),
            ),
        }
        Ok(store)
    }

    /// Sets where the scripts' "now" comes from (tests only; see
    /// [`TimeSource`]).
    pub fn with_time(mut self, time: TimeSource) -> ClusterStore {
        self.redis.time = time;
        self
    }

    /// How keys are derived.
    pub fn keys(&self) -> &KeySet {
        &self.redis.keys
    }

    /// Where the scripts' "now" comes from.
    pub fn time(&self) -> &TimeSource {
        &self.redis.time
    }

    /// Makes shared rules one budget across `regions` (SPEC appendix H):
    /// each decides against this region's part, and notes what it asked
    /// for the region link (see [`Link`](crate::redis::regions::Link)).
    pub fn with_regions(mut self, regions: Arc<Regions>) -> ClusterStore {
        self.redis.link_regions(regions);
        self
    }

    /// The regions, when shared rules are one budget across them.
    pub fn regions(&self) -> Option<&Arc<Regions>> {
        self.redis.regions.as_ref()
    }

    /// Each region's part of every shared rule of `batch` (in rule order;
    /// `None` for a rule that is not shared, or with regions off), as this
    /// region's store has it now.
    pub async fn region_parts(
        &self,
        batch: &Batch<'_>,
    ) -> Result<Vec<Option<Vec<RegionPart>>>, StoreError> {
        self.redis.region_parts(batch).await
    }

    /// The shared connection (the region link's), once connected.
    pub(crate) fn connection(&self) -> Result<ClusterConnection, StoreError> {
        self.redis.reach.shared()
    }

    /// How many keys each global valve is split over.
    pub fn valve_shards(&self) -> u16 {
        self.valve_shards
    }

    async fn run(&self, batch: &Batch<'_>) -> Result<Decided, StoreError> {
        let valve_parts = u64::from(self.valve_shards);
        let valve = Valve {
            turn: batch.valve_turn.unwrap_or_else(|| {
                crate::store::scatter(self.next_valve.fetch_add(1, Ordering::Relaxed))
            }),
            shards: valve_parts,
        };
        let buckets = KeySet::keys(&self.redis.keys.current, batch, valve);
        self.redis.note_shared(batch, &buckets, None);
        let (first, valves) = slot_groups(batch, &buckets.keys);
        if first.len() + valves.len() == 1 {
            // One slot: one script call, atomic on its own.
            let group = first.into_iter().chain(valves).next().expect("one group");
            let connection = self.redis.deciding()?;
            let selection = self.redis.in_region(Selection {
                indices: Some(&group),
                valve_parts,
                regions: None,
            });
            let (group_keys, records) = select(&buckets, &group);
            let call = script::DecideCall::new(
                batch,
                selection,
                group_keys,
                &records,
                None,
                &self.redis.time,
            );
            let reply: Vec<u8> = self
                .redis
                .decide
                .call(&mut connection.clone(), |cmd| call.fill(cmd))
                .await
                .map_err(|e| self.redis.error(&e))?;
            let reply = script::reply(&reply, group.len())?;
            let mut outcomes: Outcomes = batch.rules.iter().map(|_| Default::default()).collect();
            for (&i, outcome) in group.iter().zip(reply.outcomes) {
                outcomes[i] = outcome;
            }
            return Ok(Decided {
                outcomes,
                at_ms: reply.admitted_at,
                first_shard_at_ms: None,
            });
        }
        // The time of the node of the tenant's divided rules (its shard's
        // slot), where a give-back of this decision goes; else the first
        // group's. The rules a sharded tenant keeps whole on shard 0 may
        // sit in another slot, whose call ran apart (another millisecond,
        // perhaps another clock): their give-back names that slot's time.
        let tenants = |rule: &sluice_core::BoundRule| {
            matches!(
                rule.scope(),
                Scope::Tenant | Scope::Route | Scope::Subject | Scope::Descriptor
            )
        };
        let divided = |group: &[usize]| {
            group
                .iter()
                .any(|&i| !batch.rules[i].on_first_shard() && tenants(&batch.rules[i]))
        };
        let kept_whole = |group: &[usize]| {
            group
                .iter()
                .any(|&i| batch.rules[i].on_first_shard() && tenants(&batch.rules[i]))
        };
        let mut at_ms = None;
        let mut first_at = None;
        let mut first_shard_at = None;
        let mut outcomes: Outcomes = batch.rules.iter().map(|_| Default::default()).collect();
        // What the groups that admitted consumed: given back when dropped
        // unconfirmed (a denial, a failure, or the caller going away).
        let mut held: Vec<Hold> = Vec::new();
        let mut admitted = true;
        for phase in [first, valves] {
            if phase.is_empty() {
                continue;
            }
            if !admitted {
                // Denied before the valves were asked: they consumed nothing
                // and report their share's capacity.
                for &i in phase.iter().flatten() {
                    outcomes[i] = sluice_core::Outcome {
                        allowed: true,
                        remaining: u32::try_from(
                            script::enforced(&batch.rules[i], valve_parts).capacity(),
                        )
                        .unwrap_or(u32::MAX),
                        ..Default::default()
                    };
                }
                break;
            }
            let calls = self.hold_all(batch, &phase, &buckets, valve_parts)?;
            let mut failed = None;
            for (group, call) in phase.into_iter().zip(calls) {
                let decided = match call.await {
                    Ok(decided) => decided,
                    Err(e) => Err(StoreError::Unavailable(format!(
                        "script call task failed: {e}"
                    ))),
                };
                match decided {
                    Ok((decided, admitted_at, hold)) => {
                        first_at.get_or_insert(admitted_at);
                        if divided(&group) {
                            at_ms.get_or_insert(admitted_at);
                        }
                        if kept_whole(&group) {
                            first_shard_at.get_or_insert(admitted_at);
                        }
                        for (&i, outcome) in group.iter().zip(decided) {
                            outcomes[i] = outcome;
                        }
                        match hold {
                            Some(hold) => held.push(hold),
                            None => admitted = false,
                        }
                    }
                    Err(e) => {
                        admitted = false;
                        failed = Some(e);
                    }
                }
            }
            if let Some(e) = failed {
                refund_all(held).await;
                return Err(e);
            }
        }
        if admitted {
            held.iter_mut().for_each(Hold::confirm);
        } else {
            refund_all(held).await;
        }
        Ok(Decided {
            outcomes,
            at_ms: at_ms.or(first_at).unwrap_or_default(),
            first_shard_at_ms: first_shard_at,
        })
    }

    /// Starts the decision script for every group of one phase, each as a
    /// task of its own (concurrent, and finished even if the caller goes
    /// away). A task that admits returns its group's [`Hold`]: a
    /// result nobody collects is dropped, and the hold with it,
    /// which gives the consumption back.
    #[allow(clippy::type_complexity)]
    fn hold_all(
        &self,
        batch: &Batch<'_>,
        phase: &[Group],
        buckets: &Buckets,
        valve_parts: u64,
    ) -> Result<
        Vec<tokio::task::JoinHandle<Result<(Outcomes, u64, Option<Hold>), StoreError>>>,
        StoreError,
    > {
        let connection = self.redis.deciding()?;
        Ok(phase
            .iter()
            .map(|group| {
                let selection = self.redis.in_region(Selection {
                    indices: Some(group),
                    valve_parts,
                    regions: None,
                });
                let (group_keys, records) = select(buckets, group);
                let call = script::DecideCall::new(
                    batch,
                    selection,
                    group_keys,
                    &records,
                    None,
                    &self.redis.time,
                );
                // The refund sends the call's own rules, with the admission
                // time of the reply.
                let refund = RefundPlan {
                    shadow: group.iter().map(|&i| batch.rules[i].shadow()).collect(),
                    lease: batch.lease,
                    time: self.redis.time.clone(),
                };
                let (connection, decide, script, timeout_ms) = (
                    connection.clone(),
                    self.redis.decide.clone(),
                    self.redis.refund.clone(),
                    self.redis.timeout_ms,
                );
                tokio::spawn(async move {
                    let reply: Vec<u8> = decide
                        .call(&mut connection.clone(), |cmd| call.fill(cmd))
                        .await
                        .map_err(|e| script::store_error(&e, timeout_ms))?;
                    let reply = script::reply(&reply, refund.shadow.len())?;
                    let hold = refund.hold(&reply, call, connection, script);
                    Ok((reply.outcomes, reply.admitted_at, hold))
                })
            })
            .collect())
    }

    /// Runs one command on the cluster, routed by its key (the admin API's
    /// own keys, which share one slot).
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        self.redis.query(cmd).await
    }

    /// Checks that the cluster answers (`PING` on a node), within the budget
    /// (at least 250 ms).
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.redis.ping().await
    }

    /// Refreshes this instance's heartbeat (lasting `ttl_ms`) and returns
    /// how many instances are live, and how many of them with another
    /// pepper.
    pub async fn heartbeat(&self, instance: &str, ttl_ms: u64) -> Result<Heartbeat, StoreError> {
        self.redis.heartbeat(instance, ttl_ms).await
    }
}

/// A turn that differs between processes (and runs).
fn first_turn() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    u64::from(nanos ^ std::process::id())
}

/// Indices of a batch's rules that share one slot.
type Group = SmallVec<[usize; 4]>;

/// The batch's rules grouped by hash tag (so by slot): first every group
/// that is not a global valve (the tenant's rules; with Envoy descriptors,
/// one group per descriptor), then the valves' groups. The store call's
/// span (`trace.rs`) is told how many.
fn slot_groups(batch: &Batch<'_>, keys: &[String]) -> (Vec<Group>, Vec<Group>) {
    let mut first: Vec<(&str, Group)> = Vec::new();
    let mut valves: Vec<(&str, Group)> = Vec::new();
    for (i, (rule, key)) in batch.rules.iter().zip(keys).enumerate() {
        let phase = if batch.partition(i, rule) == Partition::Global {
            &mut valves
        } else {
            &mut first
        };
        let tag = hash_tag(key);
        match phase.iter_mut().find(|(t, _)| *t == tag) {
            Some((_, group)) => group.push(i),
            None => phase.push((tag, smallvec::smallvec![i])),
        }
    }
    crate::trace::slots(first.len() + valves.len());
    let groups = |phase: Vec<(&str, Group)>| phase.into_iter().map(|(_, g)| g).collect();
    (groups(first), groups(valves))
}

/// The `{…}` part of a key, which decides its slot.
fn hash_tag(key: &str) -> &str {
    let open = key.find('{').unwrap_or(0);
    let close = key[open..].find('}').map_or(key.len(), |c| open + c + 1);
    &key[open..close]
}

/// The keys and records of a group's rules, in its order.
fn select(buckets: &Buckets, group: &[usize]) -> (Vec<String>, Vec<Record>) {
    group
        .iter()
        .map(|&i| (buckets.keys[i].clone(), buckets.records[i]))
        .unzip()
}

impl Store for ClusterStore {
    fn name(&self) -> &'static str {
        "redis-cluster"
    }

    async fn adjust(
        &self,
        batch: &Batch<'_>,
        change: Change,
        marker: Option<&Marker>,
    ) -> Result<Adjusted, StoreError> {
        self.adjust_groups(batch, change, marker).await
    }

    async fn peek(&self, batch: &Batch<'_>) -> Result<Peeked, StoreError> {
        let selection = Selection {
            valve_parts: u64::from(self.valve_shards),
            ..Selection::ALL
        };
        self.redis
            .peek(batch, self.redis.in_region(selection))
            .await
    }

    fn region(&self) -> Option<&str> {
        self.regions().map(|r| r.names[r.index].as_str())
    }

    fn regions_sync_every_ms(&self) -> Option<u64> {
        self.regions().map(|r| r.sync_every_ms)
    }

    fn asked(&self, batch: &Batch<'_>) {
        self.redis.note_asked(batch);
    }

    async fn adapt(
        &self,
        valve: &sluice_core::BoundRule,
        terms: sluice_core::adaptive::Adaptive,
        seen: sluice_core::adaptive::law::Seen,
    ) -> Result<Option<sluice_core::adaptive::law::Law>, StoreError> {
        self.redis.adapt(valve, terms, seen).await.map(Some)
    }

    fn valve_parts(&self) -> u64 {
        u64::from(self.valve_shards)
    }

    async fn decide(&self, batch: &Batch<'_>) -> Result<Decided, StoreError> {
        self.run(batch).await
    }

    async fn release(&self, batch: &Batch<'_>) -> Result<bool, StoreError> {
        if batch.lease.is_none() || batch.rules.is_empty() {
            return Ok(false);
        }
        let valve_parts = u64::from(self.valve_shards);
        let buckets = KeySet::keys(&self.redis.keys.current, batch, Valve::WHOLE);
        let (first, valves) = slot_groups(batch, &buckets.keys);
        let connection = self.redis.deciding()?;
        // One refund per slot, concurrently; each is idempotent.
        let calls: Vec<_> = first
            .into_iter()
            .chain(valves)
            .map(|group| {
                let selection = self.redis.in_region(Selection {
                    indices: Some(&group),
                    valve_parts,
                    regions: None,
                });
                let (group_keys, records) = select(&buckets, &group);
                let (evalsha, eval) =
                    RefundCall::new(batch, selection, group_keys, &records, &self.redis.time, 0)
                        .commands(&self.redis.refund);
                tokio::spawn(send::<_, u64>(connection.clone(), evalsha, eval))
            })
            .collect();
        let mut released = 0;
        for call in calls {
            match call.await {
                Ok(Ok(n)) => released += n,
                Ok(Err(e)) => return Err(self.redis.error(&e)),
                Err(e) => return Err(StoreError::Unavailable(format!("release task failed: {e}"))),
            }
        }
        Ok(released > 0)
    }
}
