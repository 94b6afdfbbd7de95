//! A Redis connection per thread, for the decisions made on it.
//!
//! A Redis connection of the `redis` crate is driven by a task on the
//! runtime where it connected. sluice-server runs its listeners on one
//! single-threaded runtime per core: with one shared connection every
//! decision would cross from its listener thread to the connection's and
//! back, two wake-ups per call. Each thread that decides gets a connection
//! of its own instead, driven on its own runtime, made on the thread's
//! first decision and given up when that runtime goes away. Both stores
//! keep theirs here: Redis a connection manager (made at once, connecting
//! lazily), Redis Cluster a slot its connection is put in once connected.

use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// One store's connections, one per thread.
#[derive(Clone)]
pub(crate) struct LocalConnections {
    /// Which store the connections are for (never reused).
    id: u64,
}

struct Local {
    store: u64,
    /// The store's connection type.
    connection: Box<dyn Any>,
    /// Closed once the runtime that drives `connection` is gone: its
    /// receiver waits in a task there.
    alive: tokio::sync::oneshot::Sender<()>,
}

thread_local! {
    static LOCAL: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl LocalConnections {
    pub(crate) fn new() -> LocalConnections {
        LocalConnections {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// This thread's connection, made by `make` on the current runtime
    /// when the thread has none there yet; `None` off a runtime or when
    /// `make` gives none.
    pub(crate) fn get<C: Clone + 'static>(
        &self,
        make: impl FnOnce(&tokio::runtime::Handle) -> Option<C>,
    ) -> Option<C> {
        LOCAL.with_borrow_mut(|locals| {
            locals.retain(|l| !l.alive.is_closed());
            if let Some(local) = locals.iter().find(|l| l.store == self.id) {
                return local.connection.downcast_ref::<C>().cloned();
            }
            let runtime = tokio::runtime::Handle::try_current().ok()?;
            let connection = make(&runtime)?;
            let (alive, gone) = tokio::sync::oneshot::channel::<()>();
            runtime.spawn(async move {
                let _ = gone.await;
            });
            locals.push(Local {
                store: self.id,
                connection: Box::new(connection.clone()),
                alive,
            });
            Some(connection)
        })
    }
}
