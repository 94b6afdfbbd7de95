//! The store chosen by `storage.backend`.

use std::future::Future;

use sluice_core::config::{Backend as BackendConfig, StorageConfig};
use sluice_core::decision::Outcomes;
use sluice_store::{Batch, MemoryStore, Store, StoreError};

use crate::Fallible;

/// One of the storage backends.
#[derive(Debug)]
pub enum Backend {
    /// The embedded memory store.
    Memory(MemoryStore),
}

impl Backend {
    /// Builds the backend a configuration names.
    pub async fn connect(storage: &StorageConfig) -> Fallible<Backend> {
        match &storage.backend {
            BackendConfig::Memory => Ok(Backend::Memory(MemoryStore::new(
                storage.max_entries as usize,
            ))),
            other => Err(format!(
                "storage.backend `{}` is not available in this build",
                other.name()
            )
            .into()),
        }
    }

    /// The backend's configuration name.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Memory(_) => "memory",
        }
    }

    /// The memory store, when that is the backend.
    pub fn memory(&self) -> Option<&MemoryStore> {
        match self {
            Backend::Memory(store) => Some(store),
        }
    }
}

impl Store for Backend {
    fn decide(
        &self,
        batch: &Batch<'_>,
    ) -> impl Future<Output = Result<Outcomes, StoreError>> + Send {
        match self {
            Backend::Memory(store) => store.decide(batch),
        }
    }
}
