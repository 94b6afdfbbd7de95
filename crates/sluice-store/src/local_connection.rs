//! A Redis connection per thread, for the decisions made on it.
//!
//! A multiplexed connection is driven by a task on the runtime where it
//! connected. sluice-server runs its listeners on one single-threaded
//! runtime per core: with one shared connection every decision would cross
//! from its listener thread to the connection's and back, two wake-ups per
//! call. Each thread that decides gets a connection of its own instead,
//! driven on its own runtime, made lazily on the thread's first decision
//! and given up when that runtime goes away.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// Makes this thread's connection for one store.
#[derive(Clone)]
pub(crate) struct LocalConnections {
    /// Which store the connections are for (never reused).
    id: u64,
    client: redis::Client,
    config: ConnectionManagerConfig,
}

struct Local {
    store: u64,
    connection: ConnectionManager,
    /// Closed once the runtime that drives `connection` is gone: its
    /// receiver waits in a task there.
    alive: tokio::sync::oneshot::Sender<()>,
}

thread_local! {
    static LOCAL: RefCell<Vec<Local>> = const { RefCell::new(Vec::new()) };
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

impl LocalConnections {
    pub(crate) fn new(client: redis::Client, config: ConnectionManagerConfig) -> LocalConnections {
        LocalConnections {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            client,
            config,
        }
    }

    /// This thread's connection, made now if it has none on the current
    /// runtime; `shared` where one cannot be made.
    pub(crate) fn get(&self, shared: &ConnectionManager) -> ConnectionManager {
        LOCAL.with_borrow_mut(|locals| {
            locals.retain(|l| !l.alive.is_closed());
            if let Some(local) = locals.iter().find(|l| l.store == self.id) {
                return local.connection.clone();
            }
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return shared.clone();
            };
            let Ok(connection) =
                ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())
            else {
                return shared.clone();
            };
            let (alive, gone) = tokio::sync::oneshot::channel::<()>();
            runtime.spawn(async move {
                let _ = gone.await;
            });
            locals.push(Local {
                store: self.id,
                connection: connection.clone(),
                alive,
            });
            connection
        })
    }
}
