//! The store chosen by `storage.backend`, and the pepper it needs.

use std::time::Duration;

use sluice_core::Outcome;
use sluice_core::config::{Backend as BackendConfig, KeysConfig, SecretSource, StorageConfig};
use sluice_core::keys::{Keyer, Pepper};
use sluice_store::{
    Adjusted, Batch, Change, ClusterStore, ConnectOptions, Decided, Heartbeat, KeySet, Marker,
    MemoryStore, Peeked, RedisStore, Store, StoreError,
};

use sluice_store::redis::regions::{RegionPart, Regions};

use crate::Fallible;

/// One of the storage backends.
#[derive(Debug)]
pub enum Backend {
    /// The embedded memory store.
    Memory(MemoryStore),
    /// One Redis node.
    Redis(Box<RedisStore>),
    /// Redis Cluster.
    Cluster(Box<ClusterStore>),
}

impl Backend {
    /// Builds the backend a configuration names: reads the pepper (Redis
    /// backends refuse to start without one) and connects.
    pub async fn connect(storage: &StorageConfig, keys: &KeysConfig) -> Fallible<Backend> {
        let timeout = Duration::from_millis(storage.timeout_ms);
        match &storage.backend {
            BackendConfig::Memory => Ok(Backend::Memory(
                MemoryStore::new(storage.max_entries as usize)
                    .with_tenant_share(storage.max_entries_per_tenant as usize),
            )),
            BackendConfig::Redis { url } => {
                let keys = key_set(keys)?;
                let options = connect_options(storage, timeout)?;
                let mut store = RedisStore::connect(url, keys, &options)
                    .await
                    .map_err(|e| format!("cannot connect to Redis (storage.url): {e}"))?;
                if let Some(regions) = linked_regions(storage) {
                    store = store.with_regions(regions);
                }
                Ok(Backend::Redis(Box::new(store)))
            }
            BackendConfig::RedisCluster {
                nodes,
                global_shards,
            } => {
                let keys = key_set(keys)?;
                let options = connect_options(storage, timeout)?;
                let mut store = ClusterStore::connect(nodes, keys, &options, *global_shards)
                    .await
                    .map_err(|e| format!("cannot use Redis Cluster (storage.nodes): {e}"))?;
                if let Some(regions) = linked_regions(storage) {
                    store = store.with_regions(regions);
                }
                Ok(Backend::Cluster(Box::new(store)))
            }
        }
    }

    /// The regions shared rules are one budget across (`storage.regions`).
    pub fn regions(&self) -> Option<&std::sync::Arc<Regions>> {
        match self {
            Backend::Redis(store) => store.regions(),
            Backend::Cluster(store) => store.regions(),
            Backend::Memory(_) => None,
        }
    }

    /// Each region's part of every shared rule of `batch` (in rule order;
    /// `None` for a rule that is not shared, or with regions off).
    pub async fn region_parts(
        &self,
        batch: &Batch<'_>,
    ) -> Result<Vec<Option<Vec<RegionPart>>>, StoreError> {
        match self {
            Backend::Redis(store) => store.region_parts(batch).await,
            Backend::Cluster(store) => store.region_parts(batch).await,
            Backend::Memory(_) => Ok(vec![None; batch.rules.len()]),
        }
    }

    /// The key derivation of a shared backend (`None` for memory).
    pub fn keyer(&self) -> Option<&sluice_core::keys::Keyer> {
        match self {
            Backend::Memory(_) => None,
            Backend::Redis(store) => Some(&store.keys().current),
            Backend::Cluster(store) => Some(&store.keys().current),
        }
    }

    /// The key derivation under the pepper being rotated away from, if
    /// any.
    pub fn previous_keyer(&self) -> Option<&sluice_core::keys::Keyer> {
        match self {
            Backend::Memory(_) => None,
            Backend::Redis(store) => store.keys().previous.as_ref(),
            Backend::Cluster(store) => store.keys().previous.as_ref(),
        }
    }

    /// Whether the backend spreads sharded tenants over several keys (see
    /// `Policy::compile_for`).
    pub fn shards_tenants(&self) -> bool {
        !matches!(self, Backend::Memory(_))
    }

    /// Whether the store answers now (always, for memory).
    pub async fn check(&self) -> Result<(), StoreError> {
        match self {
            Backend::Memory(_) => Ok(()),
            Backend::Redis(store) => store.ping().await,
            Backend::Cluster(store) => store.ping().await,
        }
    }

    /// Refreshes this instance's heartbeat; returns how many instances share
    /// the store (1 for memory), and how many use it with another pepper.
    pub async fn heartbeat(&self, instance: &str, ttl: Duration) -> Result<Heartbeat, StoreError> {
        match self {
            Backend::Memory(_) => Ok(Heartbeat {
                live: 1,
                other_peppers: 0,
            }),
            Backend::Redis(store) => store.heartbeat(instance, ttl.as_millis() as u64).await,
            Backend::Cluster(store) => store.heartbeat(instance, ttl.as_millis() as u64).await,
        }
    }

    /// The memory store, when that is the backend.
    pub fn memory(&self) -> Option<&MemoryStore> {
        match self {
            Backend::Memory(store) => Some(store),
            Backend::Redis(_) | Backend::Cluster(_) => None,
        }
    }
}

impl Store for Backend {
    fn name(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
            Backend::Redis(_) => "redis",
            Backend::Cluster(_) => "redis-cluster",
        }
    }

    fn in_process(&self) -> bool {
        matches!(self, Backend::Memory(_))
    }

    async fn decide(&self, batch: &Batch<'_>) -> Result<Decided, StoreError> {
        match self {
            Backend::Memory(store) => store.decide(batch).await,
            Backend::Redis(store) => store.decide(batch).await,
            Backend::Cluster(store) => store.decide(batch).await,
        }
    }

    async fn release(&self, batch: &Batch<'_>) -> Result<bool, StoreError> {
        match self {
            Backend::Memory(store) => store.release(batch).await,
            Backend::Redis(store) => store.release(batch).await,
            Backend::Cluster(store) => store.release(batch).await,
        }
    }

    async fn peek(&self, batch: &Batch<'_>) -> Result<Peeked, StoreError> {
        match self {
            Backend::Memory(store) => store.peek(batch).await,
            Backend::Redis(store) => store.peek(batch).await,
            Backend::Cluster(store) => store.peek(batch).await,
        }
    }

    async fn adjust(
        &self,
        batch: &Batch<'_>,
        change: Change,
        marker: Option<&Marker>,
    ) -> Result<Adjusted, StoreError> {
        match self {
            Backend::Memory(store) => store.adjust(batch, change, marker).await,
            Backend::Redis(store) => store.adjust(batch, change, marker).await,
            Backend::Cluster(store) => store.adjust(batch, change, marker).await,
        }
    }

    fn decide_in_process(&self, batch: &Batch<'_>) -> Option<Result<Decided, StoreError>> {
        match self {
            Backend::Memory(store) => store.decide_in_process(batch),
            Backend::Redis(_) | Backend::Cluster(_) => None,
        }
    }

    fn decide_one_in_process(
        &self,
        batch: &Batch<'_>,
    ) -> Option<Result<(Outcome, u64), StoreError>> {
        match self {
            Backend::Memory(store) => store.decide_one_in_process(batch),
            Backend::Redis(_) | Backend::Cluster(_) => None,
        }
    }

    fn valve_parts(&self) -> u64 {
        match self {
            Backend::Cluster(store) => store.valve_parts(),
            Backend::Memory(_) | Backend::Redis(_) => 1,
        }
    }

    fn region(&self) -> Option<&str> {
        match self {
            Backend::Redis(store) => store.region(),
            Backend::Cluster(store) => store.region(),
            Backend::Memory(_) => None,
        }
    }

    fn regions_sync_every_ms(&self) -> Option<u64> {
        match self {
            Backend::Redis(store) => store.regions_sync_every_ms(),
            Backend::Cluster(store) => store.regions_sync_every_ms(),
            Backend::Memory(_) => None,
        }
    }

    fn asked(&self, batch: &Batch<'_>) {
        match self {
            Backend::Redis(store) => store.asked(batch),
            Backend::Cluster(store) => store.asked(batch),
            Backend::Memory(_) => {}
        }
    }

    async fn adapt(
        &self,
        valve: &sluice_core::BoundRule,
        terms: sluice_core::adaptive::Adaptive,
        seen: sluice_core::adaptive::law::Seen,
    ) -> Result<Option<sluice_core::adaptive::law::Law>, StoreError> {
        match self {
            Backend::Redis(store) => store.adapt(valve, terms, seen).await,
            Backend::Cluster(store) => store.adapt(valve, terms, seen).await,
            Backend::Memory(_) => Ok(None),
        }
    }

    fn maintain(&self) {
        if let Backend::Memory(store) = self {
            store.maintain();
        }
    }
}

/// Timeouts and TLS settings for the Redis backends.
pub(crate) fn connect_options(
    storage: &StorageConfig,
    timeout: Duration,
) -> Fallible<ConnectOptions> {
    let tls_ca_pem = match &storage.tls_ca_file {
        Some(path) => Some(
            std::fs::read(path)
                .map_err(|e| format!("cannot read storage.tls_ca_file {}: {e}", path.display()))?,
        ),
        None => None,
    };
    Ok(ConnectOptions {
        timeout,
        tls_ca_pem,
    })
}

const GENERATE: &str = "generate one with `openssl rand -hex 32`";

/// The keyers for the configured pepper (required) and previous pepper.
pub fn key_set(keys: &KeysConfig) -> Fallible<KeySet> {
    let Some(source) = &keys.pepper else {
        return Err(format!(
            "the Redis backends need a pepper to derive opaque keys: set keys.pepper_env (e.g. SLUICE_PEPPER) or keys.pepper_file; {GENERATE}"
        )
        .into());
    };
    let current = Keyer::new(&keys.prefix, &read_pepper(source, "keys.pepper")?);
    let previous = match &keys.previous_pepper {
        Some(source) => Some(Keyer::new(
            &keys.prefix,
            &read_pepper(source, "keys.previous_pepper")?,
        )),
        None => None,
    };
    Ok(KeySet { current, previous })
}

/// Reads a pepper. Errors name where it was looked for, never its value.
fn read_pepper(source: &SecretSource, field: &str) -> Fallible<Pepper> {
    let bytes = match source {
        SecretSource::Env(name) => match std::env::var_os(name) {
            Some(value) => value.into_encoded_bytes(),
            None => {
                return Err(format!(
                    "{field}_env names the environment variable {name}, which is not set; {GENERATE} and export {name}"
                )
                .into());
            }
        },
        SecretSource::File(path) => std::fs::read(path)
            .map_err(|e| format!("cannot read {field}_file {}: {e}", path.display()))?,
    };
    Pepper::parse(&bytes).map_err(|e| format!("{field}: {e}").into())
}

/// The regions of `storage.regions`, if set.
fn linked_regions(storage: &StorageConfig) -> Option<std::sync::Arc<Regions>> {
    let regions = storage.regions.as_ref()?;
    let linked = Regions::new(&regions.in_order(), &regions.this, regions.sync_every_ms)
        .expect("validation puts this region among the regions");
    Some(std::sync::Arc::new(linked))
}

#[cfg(test)]
mod tests {
    use sluice_core::{Config, Policy};
    use sluice_store::{Batch, MemoryStore, Store};

    use super::Backend;

    /// The memory backend answers in process for one rule and for several,
    /// as the memory store does: the limiter then skips the remote path
    /// (a boxed future, the time budget, the breaker).
    #[test]
    fn the_memory_backend_decides_in_process() {
        let yaml = r#"
default_plan: p
plans:
  p:
    tenant: [{ limit: 10, per: 1s }]
    routes:
      "*": [{ limit: 10, per: 1s }]
"#;
        let config = Config::from_yaml(yaml, "t.yaml").unwrap();
        let policy = Policy::compile(&config.limits);
        let backend = Backend::Memory(MemoryStore::new(100));
        let both = policy.applicable("acme", "GET /", false).rules;
        assert_eq!(both.len(), 2);
        let one = &both[..1];
        let outcome = backend
            .decide_one_in_process(&Batch::new("acme", None, 1, one))
            .expect("one rule in process")
            .unwrap();
        assert!(outcome.0.allowed);
        assert_eq!(outcome.0.remaining, 9);
        let outcomes = backend
            .decide_in_process(&Batch::new("acme", None, 1, both))
            .expect("several rules in process")
            .unwrap();
        assert_eq!(
            outcomes
                .outcomes
                .iter()
                .map(|o| o.remaining)
                .collect::<Vec<_>>(),
            [8, 9]
        );
    }
}
