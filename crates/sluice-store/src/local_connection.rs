//! A Redis connection per thread, for the decisions made on it.
//!
//! A Redis connection of the `redis` crate is driven by a task on the
//! runtime where it connected. sluice-server runs its listeners on one
//! single-threaded runtime per core: with one shared connection every
//! decision would cross from its listener thread to the connection's and
//! back, two wake-ups per call. Each thread that decides gets a connection
//! of its own instead, driven on its own runtime, made on the thread's
//! first decision and given up when that runtime goes away, or on the
//! thread's next call to any store once its store is dropped. Both stores
//! keep theirs here: Redis a connection manager (made at once, connecting
//! lazily), Redis Cluster a slot its connection is put in once connected.

use std::any::Any;
use std::cell::RefCell;
use std::sync::{Arc, Weak};

/// One store's connections, one per thread.
#[derive(Clone)]
pub(crate) struct LocalConnections {
    /// Which store the connections are for: shared by the store's clones,
    /// gone with the last of them.
    store: Arc<()>,
}

struct Local {
    /// Its store, while that lives: a thread gives up the connections of
    /// stores dropped since its last call.
    store: Weak<()>,
    /// The store's connection type.
    connection: Box<dyn Any>,
    /// Closed once the runtime that drives `connection` is gone: its
    /// receiver waits in a task there.
    alive: tokio::sync::oneshot::Sender<()>,
}

thread_local! {
    static LOCAL: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

impl LocalConnections {
    pub(crate) fn new() -> LocalConnections {
        LocalConnections {
            store: Arc::new(()),
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
            locals.retain(|l| !l.alive.is_closed() && l.store.strong_count() > 0);
            let store = Arc::as_ptr(&self.store);
            if let Some(local) = locals.iter().find(|l| l.store.as_ptr() == store) {
                return local.connection.downcast_ref::<C>().cloned();
            }
            let runtime = tokio::runtime::Handle::try_current().ok()?;
            let connection = make(&runtime)?;
            let (alive, gone) = tokio::sync::oneshot::channel::<()>();
            runtime.spawn(async move {
                let _ = gone.await;
            });
            locals.push(Local {
                store: Arc::downgrade(&self.store),
                connection: Box::new(connection.clone()),
                alive,
            });
            Some(connection)
        })
    }
}
