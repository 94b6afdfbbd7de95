//! What the two Redis stores share: one generic store over how Redis is
//! reached ([`Reach`]: one node, or a cluster), holding the keys, the
//! scripts, the time source and the time budget, and doing everything that
//! does not depend on slots — `PING`, heartbeats, the admin API's own
//! commands, peeks and refunds. [`RedisStore`](crate::RedisStore) adds the
//! one-call decision; [`ClusterStore`](crate::ClusterStore) adds slot
//! grouping, reserve-then-valve and the refunds of what a denied decision
//! reserved.

use sluice_core::BoundRule;
use std::time::Duration;

use super::adjust::{ADJUST_LUA, AdjustCall, AdjustReply, adjust_reply};
use super::function::Decide;
use super::heartbeat::Heartbeat;
use super::inspect::find_numbers;
use super::keys::{KeySet, Valve};
use super::refund::{REFUND_LUA, RefundCall};
use super::{
    Raw, Selection, TimeSource, decode, enforced, raw, read_command, store_error, time_ms,
};
use crate::local_connection::LocalConnections;
use crate::store::{Batch, Peeked, PeekedRule, StoreError};

/// How a store reaches Redis.
pub(crate) trait Reach: Send + Sync + 'static {
    /// A connection, cheap to clone (a handle on a multiplexed socket).
    type Connection: redis::aio::ConnectionLike + Clone + Send + Sync + 'static;

    /// Whether one pipeline may carry commands for any key (one node); a
    /// cluster's keys live on different slots, so they are read one by one.
    const PIPELINES_ANY_KEYS: bool;

    /// The shared connection (heartbeats, admin, inspection).
    fn shared(&self) -> Result<Self::Connection, StoreError>;

    /// The calling thread's own connection (see `local_connection`), or
    /// `None` where it has none (off a runtime, or not connected yet).
    fn own(&self, local: &LocalConnections) -> Option<Self::Connection>;
}

/// A store on Redis, however it is reached.
#[derive(Clone)]
pub(crate) struct Redis<R> {
    pub(crate) reach: R,
    /// Decisions, refunds and releases go over a connection of the calling
    /// thread's own where it has one.
    local: LocalConnections,
    pub(crate) decide: Decide,
    pub(crate) refund: redis::Script,
    pub(crate) adjust: redis::Script,
    pub(crate) keys: KeySet,
    pub(crate) time: TimeSource,
    pub(crate) timeout_ms: u64,
    /// The regions shared rules are one budget across (`None`: off; see
    /// `regions::local`).
    pub(crate) regions: Option<std::sync::Arc<super::regions::shared::Regions>>,
}

impl<R: Reach> Redis<R> {
    pub(crate) fn new(reach: R, keys: KeySet, timeout: Duration) -> Redis<R> {
        Redis {
            reach,
            local: LocalConnections::new(),
            decide: Decide::new(),
            refund: redis::Script::new(REFUND_LUA),
            adjust: redis::Script::new(ADJUST_LUA),
            keys,
            time: TimeSource::Server,
            timeout_ms: timeout.as_millis() as u64,
            regions: None,
        }
    }

    /// A Redis failure as the limiter sees it.
    pub(crate) fn error(&self, e: &redis::RedisError) -> StoreError {
        store_error(e, self.timeout_ms)
    }

    /// For decisions, refunds and releases: the calling thread's own
    /// connection, else the shared one.
    pub(crate) fn deciding(&self) -> Result<R::Connection, StoreError> {
        match self.reach.own(&self.local) {
            Some(connection) => Ok(connection),
            None => self.reach.shared(),
        }
    }

    /// Checks that Redis answers (`PING`), within the time budget (at least
    /// 250 ms).
    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        let mut connection = self.reach.shared()?;
        let command = redis::cmd("PING");
        let ping = command.query_async::<String>(&mut connection);
        match tokio::time::timeout(Duration::from_millis(self.timeout_ms.max(250)), ping).await {
            Ok(result) => result.map(drop).map_err(|e| self.error(&e)),
            Err(_) => Err(StoreError::Timeout(self.timeout_ms)),
        }
    }

    /// Refreshes this instance's heartbeat (lasting `ttl_ms`) and returns
    /// how many instances are live, and how many of them with another
    /// pepper.
    pub(crate) async fn heartbeat(
        &self,
        instance: &str,
        ttl_ms: u64,
    ) -> Result<Heartbeat, StoreError> {
        let mut connection = self.reach.shared()?;
        self.keys
            .heartbeat(&mut connection, instance, ttl_ms, self.timeout_ms)
            .await
    }

    /// Runs one command (the admin API's own keys, which share one slot).
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> Result<T, StoreError> {
        let mut connection = self.reach.shared()?;
        cmd.query_async(&mut connection)
            .await
            .map_err(|e| self.error(&e))
    }

    /// The stored state of every rule of `batch`, read without changing
    /// anything, with a node's time; a global valve split over the
    /// selection's `valve_parts` keys is read at its key 0, and enforced as
    /// its share; a rule shared across its `regions`, as this region's part
    /// ([`Regions::standing`](super::regions::shared::Regions::standing)).
    pub(crate) async fn peek(
        &self,
        batch: &Batch<'_>,
        selection: Selection<'_>,
    ) -> Result<Peeked, StoreError> {
        let mut connection = self.reach.shared()?;
        let keys = KeySet::keys(&self.keys.current, batch, Valve::WHOLE);
        // While rotating, the keys under the previous pepper too: a bucket
        // not yet under the new one is read there, as a decision reads it.
        let previous = self
            .keys
            .previous
            .as_ref()
            .map(|keyer| KeySet::keys(keyer, batch, Valve::WHOLE));
        let reads: Vec<(&String, &BoundRule)> = keys
            .keys
            .iter()
            .chain(previous.iter().flat_map(|p| p.keys.iter()))
            .zip(batch.rules.iter().cycle())
            .collect();
        let (time, values) = if R::PIPELINES_ANY_KEYS {
            let mut pipe = redis::pipe();
            pipe.cmd("TIME");
            for (key, rule) in &reads {
                pipe.add_command(read_command(key, rule));
            }
            let mut values: Vec<redis::Value> = pipe
                .query_async(&mut connection)
                .await
                .map_err(|e| self.error(&e))?;
            if values.is_empty() {
                return Err(StoreError::Unavailable("empty reply".to_owned()));
            }
            let time = values.remove(0);
            (time, values)
        } else {
            let time: redis::Value = redis::cmd("TIME")
                .query_async(&mut connection)
                .await
                .map_err(|e| self.error(&e))?;
            let mut values = Vec::with_capacity(reads.len());
            for (key, rule) in &reads {
                let value: redis::Value = read_command(key, rule)
                    .query_async(&mut connection)
                    .await
                    .map_err(|e| self.error(&e))?;
                values.push(value);
            }
            (time, values)
        };
        // The clock the scripts are sent (tests drive one), as a decision
        // reads it.
        let now = match &self.time {
            TimeSource::Server => time_ms(&time)?,
            TimeSource::Client(clock) => clock.now_ms(),
        };
        let n = batch.rules.len();
        let rows = keys
            .keys
            .into_iter()
            .zip(keys.records)
            .zip(batch.rules)
            .enumerate()
            .map(|(i, ((key, record), rule))| {
                let before = previous.as_ref().map(|p| p.records[i]);
                let mut read = raw(rule, &values[i]);
                if read == Raw::Missing
                    && let Some(value) = values.get(n + i)
                {
                    read = raw(rule, value);
                }
                // A record under its name, else (while rotating) under
                // its previous one.
                let record = match (&read, before) {
                    (Raw::Records(value), Some(before))
                        if find_numbers(value, record).is_none() =>
                    {
                        before
                    }
                    _ => record,
                };
                let (state, own) = match selection.regions {
                    Some(regions) if rule.shared_across_regions() => {
                        let numbers = match &read {
                            Raw::Records(value) => find_numbers(value, record),
                            _ => None,
                        };
                        regions.standing(rule, numbers, now)
                    }
                    _ => (decode(rule, &read, record), None),
                };
                PeekedRule {
                    state,
                    key,
                    enforced: own.unwrap_or_else(|| enforced(rule, selection.valve_parts)),
                }
            })
            .collect();
        Ok(Peeked { now, rows })
    }

    /// Gives back what an admitted decision of `batch` at `at` (the
    /// admission time its reply named) consumed, every rule of `batch` in
    /// one call (they must share a slot), and releases `batch.lease` from
    /// its concurrency rules. Returns how many concurrency rules still held
    /// that lease.
    pub(crate) async fn refund(
        &self,
        batch: &Batch<'_>,
        selection: Selection<'_>,
        keys: Vec<String>,
        records: &[sluice_core::keys::Record],
        at: u64,
    ) -> Result<u64, StoreError> {
        let (evalsha, eval) =
            RefundCall::new(batch, selection, keys, records, &self.time, at).commands(&self.refund);
        send(self.deciding()?, evalsha, eval)
            .await
            .map_err(|e| self.error(&e))
    }
}

impl<R: Reach> Redis<R> {
    /// Changes the selected rules of `batch` (they must share a slot) in
    /// one call, with the settle marker `marker` (its key, value and life)
    /// when given.
    pub(crate) async fn adjust(
        &self,
        batch: &Batch<'_>,
        selection: Selection<'_>,
        bucket: (
            Vec<String>,
            &[sluice_core::keys::Record],
            Option<&super::keys::Buckets>,
        ),
        change: crate::adjust::Change,
        marker: Option<(String, String, u64)>,
    ) -> Result<AdjustReply, StoreError> {
        let rules = bucket.0.len();
        let (evalsha, eval) = AdjustCall::new(batch, selection, bucket, change, marker, &self.time)
            .commands(&self.adjust);
        let reply: Vec<u8> = send(self.deciding()?, evalsha, eval)
            .await
            .map_err(|e| self.error(&e))?;
        adjust_reply(&reply, rules)
    }

    /// A settle marker's key (in the slot of the tenant's shard the
    /// marker names: where its reservation was admitted), value and life.
    pub(crate) fn marker(
        &self,
        batch: &Batch<'_>,
        marker: &crate::adjust::Marker,
    ) -> (String, String, u64) {
        let tag = self.keys.tenant_tag(batch.tenant, marker.shard);
        (
            self.keys.current.marker_key(&tag, &marker.id),
            marker.value.clone(),
            marker.ttl_ms.max(1),
        )
    }
}

/// Sends a script call; a node that does not know the script yet gets it
/// as `EVAL`. Scripts are cached per node and not replicated, so a node
/// that restarted or took over slots (failover) may not know it; `EVAL`
/// runs it there and caches it.
pub(crate) async fn send<C, T>(
    mut connection: C,
    evalsha: redis::Cmd,
    eval: redis::Cmd,
) -> redis::RedisResult<T>
where
    C: redis::aio::ConnectionLike + Send,
    T: redis::FromRedisValue,
{
    match evalsha.query_async::<T>(&mut connection).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            eval.query_async::<T>(&mut connection).await
        }
        other => other,
    }
}
