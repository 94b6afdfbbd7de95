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
//!   of the tenant (`{T}`), so they are in one slot and one `EVALSHA`
//!   decides them all. A tenant with `shards: N` has N tags, on N slots.
//! - A global valve would be one hot key; it is split over
//!   `storage.global_shards` keys with tags of their own (spread over the
//!   slots), each enforcing `⌊limit / global_shards⌋`. A decision uses one
//!   of them, in turn.
//!
//! # Valves: reserve, then refund
//!
//! A valve's key is on another slot than the tenant's, so a decision with a
//! valve is two calls. The tenant's rules go first (they deny far more
//! often, and then the valve is never asked); if they admit, the valve is
//! asked; if it denies, what the tenant's rules consumed is given back by
//! the refund script (sent without waiting). So a denied request still
//! consumes nothing, at most two round trips are waited for, and between
//! the reservation and the refund the tenant's budget is briefly lower.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use sluice_core::decision::Outcomes;
use sluice_core::{BoundRule, Rule, Scope, State};
use smallvec::SmallVec;

use crate::script::{self, KeySet, Raw, Selection, TimeSource, Valve};
use crate::standalone::{ConnectOptions, install_tls_provider};
use crate::store::{Batch, Store, StoreError};

/// How often a store that could not connect tries again.
const RECONNECT_EVERY: Duration = Duration::from_secs(1);

/// A store on Redis Cluster.
#[derive(Clone)]
pub struct ClusterStore {
    client: ClusterClient,
    connection: Arc<ArcSwapOption<ClusterConnection>>,
    decide: redis::Script,
    refund: redis::Script,
    keys: KeySet,
    time: TimeSource,
    timeout_ms: u64,
    valve_shards: u16,
    next_valve: Arc<AtomicU64>,
}

impl std::fmt::Debug for ClusterStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterStore")
            .field("keys", &self.keys)
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
        install_tls_provider();
        let timeout = options.timeout;
        let timeout_ms = timeout.as_millis() as u64;
        let mut builder = ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(timeout.max(Duration::from_millis(250)))
            .response_timeout(timeout.max(Duration::from_millis(250)))
            .retries(8)
            .min_retry_wait(10)
            .max_retry_wait(200);
        if let Some(pem) = &options.tls_ca_pem {
            builder = builder.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            });
        }
        let client = builder.build().map_err(|e| {
            StoreError::Unavailable(format!(
                "invalid Redis Cluster nodes or TLS settings ({})",
                e.category()
            ))
        })?;
        let store = ClusterStore {
            client: client.clone(),
            connection: Arc::new(ArcSwapOption::empty()),
            decide: redis::Script::new(script::DECIDE_LUA),
            refund: redis::Script::new(script::REFUND_LUA),
            keys,
            time: TimeSource::Server,
            timeout_ms,
            valve_shards: valve_shards.max(1),
            // Instances start their turns at different shards.
            next_valve: Arc::new(AtomicU64::new(first_turn())),
        };
        // The crate can hang connecting to a cluster that is half up: bound
        // every attempt.
        match tokio::time::timeout(store.connect_budget(), client.get_async_connection()).await {
            Ok(Ok(connection)) => store.connection.store(Some(Arc::new(connection))),
            _ => store.connect_in_background(),
        }
        Ok(store)
    }

    fn connect_budget(&self) -> Duration {
        Duration::from_millis(self.timeout_ms).max(Duration::from_secs(1))
    }

    /// Connects in the background, retrying every second. (Once connected,
    /// the client follows failovers and resharding by itself.)
    fn connect_in_background(&self) {
        let (client, slot, budget) = (
            self.client.clone(),
            self.connection.clone(),
            self.connect_budget(),
        );
        tokio::spawn(async move {
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

    /// Sets where the scripts' "now" comes from (tests only; see
    /// [`TimeSource`]).
    pub fn with_time(mut self, time: TimeSource) -> ClusterStore {
        self.time = time;
        self
    }

    /// How keys are derived.
    pub fn keys(&self) -> &KeySet {
        &self.keys
    }

    /// How many keys each global valve is split over.
    pub fn valve_shards(&self) -> u16 {
        self.valve_shards
    }

    fn connection(&self) -> Result<ClusterConnection, StoreError> {
        self.connection
            .load_full()
            .map(|c| (*c).clone())
            .ok_or_else(|| StoreError::Unavailable("not connected to the cluster yet".to_owned()))
    }

    fn error(&self, e: &redis::RedisError) -> StoreError {
        script::store_error(e, self.timeout_ms)
    }

    async fn call(
        &self,
        batch: &Batch<'_>,
        selection: Selection<'_>,
        keys: &[String],
    ) -> Result<Vec<i64>, StoreError> {
        let mut connection = self.connection()?;
        let (evalsha, eval) = script::commands(&self.decide, batch, selection, keys, &self.time);
        match evalsha.query_async::<Vec<i64>>(&mut connection).await {
            // Scripts are cached per node, and not replicated: a node that
            // took over slots (failover, resharding) may not know it yet.
            // EVAL runs it on the node that owns the keys, and caches it there.
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                eval.query_async::<Vec<i64>>(&mut connection).await
            }
            other => other,
        }
        .map_err(|e| self.error(&e))
    }

    async fn run(&self, batch: &Batch<'_>) -> Result<Outcomes, StoreError> {
        let valve_parts = u64::from(self.valve_shards);
        let valve = Valve {
            turn: self.next_valve.fetch_add(1, Ordering::Relaxed),
            shards: valve_parts,
        };
        let all_keys = KeySet::keys(&self.keys.current, batch, valve);
        let (valves, tenant): (SmallVec<[usize; 4]>, SmallVec<[usize; 4]>) = (0..batch.rules.len())
            .partition(|&i| batch.rules[i].scope() == Scope::Global && batch.partitions.is_empty());
        let pick = |indices: &[usize]| -> Vec<String> {
            indices.iter().map(|&i| all_keys[i].clone()).collect()
        };
        let mut outcomes: Outcomes = batch.rules.iter().map(|_| Default::default()).collect();
        let place = |outcomes: &mut Outcomes,
                     indices: &[usize],
                     reply: &[i64]|
         -> Result<bool, StoreError> {
            let decided = script::outcomes(reply, indices.len())?;
            let mut admitted = true;
            for (&i, outcome) in indices.iter().zip(decided) {
                admitted &= outcome.allowed || batch.rules[i].shadow();
                outcomes[i] = outcome;
            }
            Ok(admitted)
        };

        // The tenant's rules, then (if they admit) the valves.
        let tenant_keys = pick(&tenant);
        let tenant_reply = if tenant.is_empty() {
            Vec::new()
        } else {
            let selection = Selection {
                indices: Some(&tenant),
                valve_parts,
            };
            self.call(batch, selection, &tenant_keys).await?
        };
        if !place(&mut outcomes, &tenant, &tenant_reply)? || valves.is_empty() {
            // Denied by the tenant's rules: the valves are not consumed, and
            // report nothing (they were not asked).
            for &i in &valves {
                outcomes[i] = sluice_core::Outcome {
                    allowed: true,
                    remaining: u32::try_from(
                        script::enforced(&batch.rules[i], valve_parts).capacity(),
                    )
                    .unwrap_or(u32::MAX),
                    ..Default::default()
                };
            }
            return Ok(outcomes);
        }
        let valve_keys = pick(&valves);
        let selection = Selection {
            indices: Some(&valves),
            valve_parts,
        };
        let valve_result = self.call(batch, selection, &valve_keys).await;
        let valve_admitted = match &valve_result {
            Ok(reply) => place(&mut outcomes, &valves, reply)?,
            Err(_) => false,
        };
        if !valve_admitted && !tenant.is_empty() {
            self.spawn_refund(batch, &tenant, tenant_keys, &tenant_reply);
        }
        valve_result.map(|_| outcomes)
    }

    /// Gives back what the tenant's rules consumed, without waiting.
    fn spawn_refund(&self, batch: &Batch<'_>, indices: &[usize], keys: Vec<String>, reply: &[i64]) {
        let Ok(mut connection) = self.connection() else {
            return;
        };
        let admitted_at: Vec<u64> = script::admission_times(reply).collect();
        let selection = Selection {
            indices: Some(indices),
            valve_parts: u64::from(self.valve_shards),
        };
        let args = script::refund_args(batch, selection, &admitted_at);
        let refund = self.refund.clone();
        tokio::spawn(async move {
            let (evalsha, eval) = script::refund_commands(&refund, &keys, &args);
            let result = match evalsha.query_async::<i64>(&mut connection).await {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    eval.query_async::<i64>(&mut connection).await
                }
                other => other,
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, "refund after a valve denial failed; the tenant's budget recovers with time");
            }
        });
    }

    /// Checks that the cluster answers (`PING` on a node), within the budget
    /// (at least 250 ms).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut connection = self.connection()?;
        let command = redis::cmd("PING");
        let ping = command.query_async::<String>(&mut connection);
        match tokio::time::timeout(Duration::from_millis(self.timeout_ms.max(250)), ping).await {
            Ok(result) => result.map(drop).map_err(|e| self.error(&e)),
            Err(_) => Err(StoreError::Timeout(self.timeout_ms)),
        }
    }

    /// Refreshes this instance's heartbeat (lasting `ttl_ms`) and returns
    /// how many instances are live.
    pub async fn heartbeat(&self, instance: &str, ttl_ms: u64) -> Result<u64, StoreError> {
        let mut connection = self.connection()?;
        let key = script::instances_key(self.keys.current.prefix());
        let call = async {
            let mut eval = redis::cmd("EVAL");
            eval.arg(script::HEARTBEAT_LUA)
                .arg(1)
                .arg(&key)
                .arg(instance)
                .arg(ttl_ms);
            eval.query_async::<u64>(&mut connection).await
        };
        match tokio::time::timeout(Duration::from_millis(self.timeout_ms.max(250)), call).await {
            Ok(result) => result.map_err(|e| self.error(&e)),
            Err(_) => Err(StoreError::Timeout(self.timeout_ms)),
        }
    }

    /// The stored state of every rule of `batch`, read without changing
    /// anything, with a node's time (for `sluice inspect`): per rule its key,
    /// its state and the rule as enforced (a global valve: its shard 0 and
    /// that shard's share).
    pub async fn peek(
        &self,
        batch: &Batch<'_>,
    ) -> Result<(u64, Vec<(String, State, Rule)>), StoreError> {
        let mut connection = self.connection()?;
        let keys = KeySet::keys(&self.keys.current, batch, Valve::WHOLE);
        let time: (u64, u64) = redis::cmd("TIME")
            .query_async(&mut connection)
            .await
            .map_err(|e| self.error(&e))?;
        let now = time.0 * 1_000 + time.1 / 1_000;
        let mut rows = Vec::with_capacity(keys.len());
        for (key, rule) in keys.into_iter().zip(batch.rules) {
            let raw = read_raw(&mut connection, &key, rule)
                .await
                .map_err(|e| self.error(&e))?;
            rows.push((
                key,
                script::decode(rule, &raw),
                script::enforced(rule, u64::from(self.valve_shards)),
            ));
        }
        Ok((now, rows))
    }
}

/// A turn that differs between processes (and runs).
fn first_turn() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    u64::from(nanos ^ std::process::id())
}

async fn read_raw(
    connection: &mut ClusterConnection,
    key: &str,
    rule: &BoundRule,
) -> redis::RedisResult<Raw> {
    if rule.rule().algorithm() == sluice_core::Algorithm::SlidingLog {
        let members: Vec<(String, u64)> = redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(connection)
            .await?;
        Ok(if members.is_empty() {
            Raw::Missing
        } else {
            Raw::Log(members)
        })
    } else {
        let value: Option<String> = redis::cmd("GET").arg(key).query_async(connection).await?;
        Ok(value.map_or(Raw::Missing, Raw::Value))
    }
}

impl Store for ClusterStore {
    async fn decide(&self, batch: &Batch<'_>) -> Result<Outcomes, StoreError> {
        self.run(batch).await
    }
}
