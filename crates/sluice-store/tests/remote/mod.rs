//! The memory store behind the remote path: decided as Redis is (through
//! the time budget, the over-limit cache and slices), not on the spot in
//! process. For the tests that need that path without a Redis.

// Each test file uses part of it.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub mod fleet;

use sluice_store::{
    Adjusted, Batch, Change, Decided, Marker, MemoryStore, Peeked, Store, StoreError,
};

/// A [`MemoryStore`] that the limiter takes for a store across the
/// network.
pub struct Remote {
    pub store: Arc<MemoryStore>,
    /// Decisions and adjustments asked of it.
    pub calls: Arc<AtomicU64>,
    /// Decisions fail while it is set: the store is unreachable.
    pub down: Arc<AtomicBool>,
    /// Adjustments that still succeed, when counted: the ones after fail.
    pub adjusts_left: Option<Arc<AtomicU64>>,
    /// Reads asked of it (peeks).
    pub peeks: Arc<AtomicU64>,
}

impl Remote {
    pub fn new(store: impl Into<Arc<MemoryStore>>) -> Remote {
        Remote {
            store: store.into(),
            calls: Arc::default(),
            down: Arc::default(),
            adjusts_left: None,
            peeks: Arc::default(),
        }
    }

    /// The same store, whose adjustments fail after the first `n`.
    pub fn failing_adjustments_after(self, n: u64) -> Remote {
        Remote {
            adjusts_left: Some(Arc::new(AtomicU64::new(n))),
            ..self
        }
    }
}

fn unreachable() -> StoreError {
    StoreError::Unavailable("down".to_owned())
}

impl Store for Remote {
    async fn decide(&self, batch: &Batch<'_>) -> Result<Decided, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if self.down.load(Ordering::Relaxed) {
            return Err(unreachable());
        }
        Store::decide(&*self.store, batch).await
    }

    async fn release(&self, batch: &Batch<'_>) -> Result<bool, StoreError> {
        Ok(self.store.release_now(batch))
    }

    async fn adjust(
        &self,
        batch: &Batch<'_>,
        change: Change,
        marker: Option<&Marker>,
    ) -> Result<Adjusted, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Some(left) = &self.adjusts_left {
            let spent =
                left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
            if spent.is_err() {
                return Err(unreachable());
            }
        }
        self.store.adjust_now(batch, change, marker)
    }

    async fn peek(&self, batch: &Batch<'_>) -> Result<Peeked, StoreError> {
        self.peeks.fetch_add(1, Ordering::Relaxed);
        self.store.peek(batch).await
    }
}
