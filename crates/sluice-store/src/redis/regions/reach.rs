//! How the region link reaches a store, its own region's or a peer's: one
//! Redis node, where one pipeline carries calls for any keys, or a Redis
//! Cluster, where each call goes to the node of its key's slot.
//!
//! A region's own keys (the live set, the lead, the identity, when peers
//! shipped: [`live`](super::live)) share one slot, the admin API's, so
//! that on a cluster they still go in one pipeline, and the overrides'
//! merge checks the identity in the same call. A shared rule's ledger is
//! beside its key, in the tenant's slot: on a cluster, the calls of one
//! sync are sent 512 at a time, concurrently, each to its node (the
//! cluster connection multiplexes them).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, FromRedisValue, Pipeline, RedisFuture, ScriptInvocation, Value};

use super::ledger::ledger_script;
use super::shared::Regions;
use crate::redis::{KeySet, TimeSource};
use crate::store::StoreError;
use crate::{ClusterStore, RedisStore};

/// Calls per pipeline on a node, or under way at once on a cluster.
const BATCH: usize = 512;

/// A connection to a store the link reaches.
#[derive(Clone)]
pub(crate) enum Reached {
    Node(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Reached {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Reached::Node(c) => c.req_packed_command(cmd),
            Reached::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Reached::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Reached::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Reached::Node(c) => c.get_db(),
            Reached::Cluster(c) => c.get_db(),
        }
    }
}

impl Reached {
    /// Whether it is a cluster (its region's own keys are in another slot
    /// than any rule's).
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Reached::Cluster(_))
    }

    /// Runs `calls` of the ledger script, then `then` (commands on the
    /// region's own keys, whose replies are not read); answers each call's
    /// reply, in order. On a node, one pipeline per 512 calls, `then` in
    /// the last, all failing together. On a cluster, 512 calls at a time,
    /// each within `budget`, then `then` in one pipeline: a call that
    /// fails (its node stalled, failing over) fails alone, so that one
    /// slot's trouble does not stop the link for every tenant.
    pub(super) async fn ledger_calls<T: FromRedisValue>(
        &self,
        calls: &[ScriptInvocation<'static>],
        then: Vec<Cmd>,
        budget: Duration,
    ) -> redis::RedisResult<Vec<redis::RedisResult<T>>> {
        match self {
            Reached::Node(connection) => {
                let mut chunks: Vec<&[ScriptInvocation<'static>]> = calls.chunks(BATCH).collect();
                if chunks.is_empty() {
                    chunks.push(&[]);
                }
                let last = chunks.len() - 1;
                let mut then = Some(then);
                let mut replies = Vec::with_capacity(calls.len());
                for (c, chunk) in chunks.into_iter().enumerate() {
                    let mut pipe = redis::pipe();
                    pipe.load_script(ledger_script()).ignore();
                    for call in chunk {
                        pipe.invoke_script(call);
                    }
                    if c == last {
                        for cmd in then.take().into_iter().flatten() {
                            pipe.add_command(cmd).ignore();
                        }
                    }
                    let answered: Vec<T> = pipe.query_async(&mut connection.clone()).await?;
                    replies.extend(answered.into_iter().map(Ok));
                }
                Ok(replies)
            }
            Reached::Cluster(connection) => {
                let mut replies = Vec::with_capacity(calls.len());
                for chunk in calls.chunks(BATCH) {
                    let chunk = chunk
                        .iter()
                        .map(|call| invoke(call, connection.clone(), budget));
                    replies.extend(futures_util::future::join_all(chunk).await);
                }
                if !then.is_empty() {
                    let mut pipe = redis::pipe();
                    for cmd in then {
                        pipe.add_command(cmd).ignore();
                    }
                    pipe.query_async::<()>(&mut connection.clone()).await?;
                }
                Ok(replies)
            }
        }
    }
}

/// One call on a cluster, routed by its keys, within `budget`.
async fn invoke<T: FromRedisValue>(
    call: &ScriptInvocation<'static>,
    mut connection: ClusterConnection,
    budget: Duration,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(budget, call.invoke_async(&mut connection)).await {
        Ok(reply) => reply,
        Err(_) => Err(redis::RedisError::from((
            redis::ErrorKind::Io,
            "no answer within the link's budget",
        ))),
    }
}

/// How the link reaches a peer: one node's connection, or a cluster's,
/// made on first use (and again after it failed to be made).
#[derive(Clone)]
pub(super) enum PeerReach {
    Node(ConnectionManager),
    Cluster {
        client: Box<ClusterClient>,
        connection: Arc<tokio::sync::OnceCell<ClusterConnection>>,
    },
}

impl PeerReach {
    /// A connection to the peer, made within `budget` on a cluster.
    pub(super) async fn reached(&self, budget: Duration) -> Result<Reached, String> {
        match self {
            PeerReach::Node(connection) => Ok(Reached::Node(connection.clone())),
            PeerReach::Cluster { client, connection } => {
                let made = connection.get_or_try_init(|| async {
                    match tokio::time::timeout(budget, client.get_async_connection()).await {
                        Ok(made) => made.map_err(|e| e.to_string()),
                        Err(_) => Err(format!(
                            "no cluster connection within {} ms",
                            budget.as_millis()
                        )),
                    }
                });
                Ok(Reached::Cluster(made.await?.clone()))
            }
        }
    }
}

/// The region's own store, as its link reaches it.
#[derive(Clone)]
pub enum Local {
    /// One Redis node.
    Node(RedisStore),
    /// A Redis Cluster.
    Cluster(ClusterStore),
}

impl From<RedisStore> for Local {
    fn from(store: RedisStore) -> Local {
        Local::Node(store)
    }
}

impl From<ClusterStore> for Local {
    fn from(store: ClusterStore) -> Local {
        Local::Cluster(store)
    }
}

impl Local {
    /// A connection to it (a cluster's once made).
    pub(super) fn reached(&self) -> Result<Reached, StoreError> {
        Ok(match self {
            Local::Node(store) => Reached::Node(store.connection()),
            Local::Cluster(store) => Reached::Cluster(store.connection()?),
        })
    }

    /// How its keys are derived.
    pub(super) fn keys(&self) -> &KeySet {
        match self {
            Local::Node(store) => store.keys(),
            Local::Cluster(store) => store.keys(),
        }
    }

    /// Where its scripts' "now" comes from.
    pub(super) fn time(&self) -> &TimeSource {
        match self {
            Local::Node(store) => store.time(),
            Local::Cluster(store) => store.time(),
        }
    }

    /// The regions its shared rules are one budget across.
    pub(super) fn regions(&self) -> Option<&Arc<Regions>> {
        match self {
            Local::Node(store) => store.regions(),
            Local::Cluster(store) => store.regions(),
        }
    }
}
