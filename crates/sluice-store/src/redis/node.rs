//! The Redis backend: one Redis 7+ node shared by a fleet of sluice
//! instances.
//!
//! Every decision is one call of `redis/decide.lua` (an `FCALL` of it as a
//! Redis Function, or `EVALSHA` where functions are unavailable) over a
//! multiplexed connection that reconnects on its own: concurrent decisions
//! are pipelined on one socket. The function is loaded when the store
//! connects and reloaded transparently when the node lacks it (a restart, a
//! failover, `FUNCTION FLUSH`; `NOSCRIPT` for the script).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::adjust::{Adjusted, Change, Marker};
use crate::local_connection::LocalConnections;
use crate::redis::regions::shared::{RegionPart, Regions};
use crate::redis::store::{Reach, Redis};
use crate::redis::{self as script, Buckets, Heartbeat, KeySet, TimeSource, Valve};
use crate::store::{Batch, Decided, Peeked, Store, StoreError};

/// A store on one Redis node.
#[derive(Clone)]
pub struct RedisStore {
    redis: Redis<Node>,
}

/// One node: a connection manager that reconnects on its own, and what
/// makes each thread's own.
#[derive(Clone)]
pub(crate) struct Node {
    connection: ConnectionManager,
    client: redis::Client,
    config: ConnectionManagerConfig,
}

impl Reach for Node {
    type Connection = ConnectionManager;
    const PIPELINES_ANY_KEYS: bool = true;

    fn shared(&self) -> Result<ConnectionManager, StoreError> {
        Ok(self.connection.clone())
    }

    fn own(&self, local: &LocalConnections) -> Option<ConnectionManager> {
        local.get(|_| {
            ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone()).ok()
        })
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("keys", &self.redis.keys)
            .finish_non_exhaustive()
    }
}

/// How to reach Redis, beyond its URL.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Budget for one call.
    pub timeout: Duration,
    /// For `rediss://` with a private CA: the CA certificate(s), PEM, to
    /// trust instead of the system's roots.
    pub tls_ca_pem: Option<Vec<u8>>,
}

impl ConnectOptions {
    /// Calls bounded by `timeout`, TLS (if any) verified against the
    /// system's roots.
    pub fn with_timeout(timeout: Duration) -> ConnectOptions {
        ConnectOptions {
            timeout,
            tls_ca_pem: None,
        }
    }

    /// A client for `url`. Errors never echo the URL: it may carry a
    /// password.
    pub(crate) fn client(&self, url: &str) -> Result<redis::Client, StoreError> {
        install_tls_provider();
        let client = match &self.tls_ca_pem {
            None => redis::Client::open(url),
            Some(pem) => redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem.clone()),
                },
            ),
        };
        client.map_err(|e| {
            StoreError::Unavailable(format!(
                "invalid Redis URL or TLS settings ({})",
                e.category()
            ))
        })
    }
}

impl ConnectOptions {
    /// A client for the cluster the `nodes` (seed URLs) belong to, each call
    /// bounded by the time budget (at least 250 ms) and tried again up to
    /// `retries` times (`MOVED`, `TRYAGAIN`, a node that failed over).
    /// Errors never echo the URLs.
    pub(crate) fn cluster_client(
        &self,
        nodes: &[String],
        retries: u32,
    ) -> Result<redis::cluster::ClusterClient, StoreError> {
        install_tls_provider();
        let timeout = self.timeout.max(Duration::from_millis(250));
        let mut builder = redis::cluster::ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .retries(retries)
            .min_retry_wait(10)
            .max_retry_wait(200);
        if let Some(pem) = &self.tls_ca_pem {
            builder = builder.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem.clone()),
            });
        }
        builder.build().map_err(|e| {
            StoreError::Unavailable(format!(
                "invalid Redis Cluster nodes or TLS settings ({})",
                e.category()
            ))
        })
    }
}

/// Installs the TLS crypto provider `rediss://` connections use (once).
pub(crate) fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl RedisStore {
    /// Prepares a store for `url` (`redis://`, `rediss://` or `unix://`, ACL
    /// user and password included). The connection is made lazily and
    /// remade on its own: a store can be created while Redis is down (its
    /// calls fail until Redis is back). Fails only for a malformed URL or TLS
    /// settings.
    pub async fn connect(
        url: &str,
        keys: KeySet,
        options: &ConnectOptions,
    ) -> Result<RedisStore, StoreError> {
        let timeout = options.timeout;
        let client = options.client(url)?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(250))))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let connection = ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
            .map_err(|e| script::store_error(&e, timeout.as_millis() as u64))?;
        let node = Node {
            connection,
            client,
            config,
        };
        let store = RedisStore {
            redis: Redis::new(node, keys, timeout),
        };
        // Preload the function when Redis is there; when it is not, the
        // first call after it comes back loads it (see script::Decide).
        let mut connection = store.redis.reach.connection.clone();
        let load = store.redis.decide.load(&mut connection);
        let _ = tokio::time::timeout(timeout.max(Duration::from_secs(1)), load).await;
        Ok(store)
    }

    /// Checks that Redis answers (`PING`), within the time budget (at least
    /// 250 ms).
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.redis.ping().await
    }

    /// Refreshes this instance's heartbeat (lasting `ttl_ms`) and returns
    /// how many instances are live, and how many of them with another
    /// pepper.
    pub async fn heartbeat(&self, instance: &str, ttl_ms: u64) -> Result<Heartbeat, StoreError> {
        self.redis.heartbeat(instance, ttl_ms).await
    }

    /// Sets where the script's "now" comes from (tests only; see
    /// [`TimeSource`]).
    pub fn with_time(mut self, time: TimeSource) -> RedisStore {
        self.redis.time = time;
        self
    }

    /// Makes shared rules one budget across `regions` (SPEC appendix H):
    /// each decides against this region's part, and notes what it asked
    /// for the region link (see [`Link`](crate::redis::regions::Link)).
    pub fn with_regions(mut self, regions: Arc<Regions>) -> RedisStore {
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

    /// How keys are derived.
    pub fn keys(&self) -> &KeySet {
        &self.redis.keys
    }

    /// Where the scripts' "now" comes from.
    pub fn time(&self) -> &TimeSource {
        &self.redis.time
    }

    /// The shared connection (the region link's, the admin API's).
    pub(crate) fn connection(&self) -> ConnectionManager {
        self.redis.reach.connection.clone()
    }

    /// Every rule of a batch, each shared one as this region's part.
    fn selection(&self) -> script::Selection<'_> {
        self.redis.in_region(script::Selection::ALL)
    }

    async fn run(&self, batch: &Batch<'_>) -> Result<Decided, StoreError> {
        let redis = &self.redis;
        let (buckets, previous) = self.redis.whole_keys(batch);
        redis.note_shared(batch, &buckets, previous.as_ref());
        let call = script::DecideCall::new(
            batch,
            self.selection(),
            buckets.keys.into_vec(),
            &buckets.records,
            previous.as_ref(),
            &redis.time,
        );
        let reply: Vec<u8> = redis
            .decide
            .call(&mut redis.deciding()?, |cmd| call.fill(cmd))
            .await
            .map_err(|e| redis.error(&e))?;
        let reply = script::reply(&reply, batch.rules.len())?;
        Ok(Decided {
            outcomes: reply.outcomes,
            at_ms: reply.admitted_at,
            first_shard_at_ms: None,
        })
    }

    /// Gives back what an admitted decision of `batch` at `at` (the
    /// admission time its reply named) consumed, with the refund script
    /// Redis Cluster uses; every rule of the batch is refunded, and
    /// `batch.lease` released from its concurrency rules. Returns how many
    /// concurrency rules still held that lease.
    pub async fn refund(&self, batch: &Batch<'_>, at: u64) -> Result<u64, StoreError> {
        let Buckets { keys, records } = KeySet::keys(&self.redis.keys.current, batch, Valve::WHOLE);
        self.redis
            .refund(batch, self.selection(), keys.into_vec(), &records, at)
            .await
    }

    /// Runs one command on this Redis (the admin API's own keys).
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T, StoreError> {
        self.redis.query(cmd).await
    }
}

impl Store for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn decide(
        &self,
        batch: &Batch<'_>,
    ) -> impl Future<Output = Result<Decided, StoreError>> + Send {
        self.run(batch)
    }

    async fn release(&self, batch: &Batch<'_>) -> Result<bool, StoreError> {
        if batch.lease.is_none() || batch.rules.is_empty() {
            return Ok(false);
        }
        Ok(self.refund(batch, 0).await? > 0)
    }

    async fn peek(&self, batch: &Batch<'_>) -> Result<Peeked, StoreError> {
        self.redis.peek(batch, self.selection()).await
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

    async fn adjust(
        &self,
        batch: &Batch<'_>,
        change: Change,
        marker: Option<&Marker>,
    ) -> Result<Adjusted, StoreError> {
        let (Buckets { keys, records }, previous) = self.redis.whole_keys(batch);
        let marker = marker.map(|m| self.redis.marker(batch, m));
        let reply = self
            .redis
            .adjust(
                batch,
                self.selection(),
                (keys.into_vec(), &records, previous.as_ref()),
                change,
                marker,
            )
            .await?;
        Ok(Adjusted {
            now: reply.now,
            marker: reply.marker,
            outcomes: reply.outcomes,
            forgiven: reply.forgiven,
            unfinished: None,
        })
    }
}
