//! The region link: moves shared rules' budget between regions in the
//! background, store to store (SPEC appendix H; the arithmetic and its
//! bound are `sluice_core::regions`).
//!
//! Every `sync_every`, each instance of a region:
//!
//! 1. adds what its decisions asked of shared rules to their ledgers, and
//!    their keys to the region's set of live shared keys (scored by the
//!    end of their window);
//! 2. takes the region's lead for a while when no other instance holds it
//!    (`SET NX PX`): one instance per region moves the budget.
//!
//! The lead then, for every live shared key:
//!
//! 3. reads its part, and grants what the region holds beyond what its
//!    demand needs to the peers that need it ([`grants`]), each grant
//!    checked by the store against what is left;
//! 4. ships to each peer, on the peer's own Redis, the totals granted it
//!    and the region's view of itself (`hear`, applied as a maximum), and
//!    the key into the peer's live set, so that the peer's lead sees it.
//!
//! With [`Link::with_replicated`], the lead also ships the entries kept
//! alike in every region (the admin API's overrides) to each peer: those
//! that changed since its last shipping, and all of them every 20 syncs
//! (see [`replica`](super::replica)).
//!
//! The region's store and its peers' may each be one Redis node or a Redis
//! Cluster (see `reach`).
//!
//! Nothing here is on a decision's path: a decision reads and writes only
//! the region's own store, in its one call. Each peer is reached over its
//! own connection, within the link's time budget (`sync_every`), and after
//! a failure not again until a backoff has passed (doubling, at most
//! `peer_timeout`); a peer not heard from for `peer_timeout` is cut off:
//! nothing is granted to it and what it last said is not used. A peer
//! whose store announces another pepper, or other regions or weights, is
//! never shipped to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::ScriptInvocation;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use sluice_core::regions::replica::Entry;
use sluice_core::regions::stored::Snapshot;
use sluice_core::regions::{Heard, grants};

use super::ledger::Steps;
use super::live::{
    changed_key, heard_key, identity_key, lead_key, live_key, live_keys, marked_live, received_key,
};
use super::peer::{Address, Peer, PeerStatus};
use super::reach::{Local, PeerReach, Reached};
use super::replica::Replicated;
use super::shared::Shared;
use super::shared::{Noted, Regions};
use super::ship::REFRESH;
use super::ship::{PeerLink, Shipment, hearing};
use crate::redis::TimeSource;
use crate::redis::node::ConnectOptions;
use crate::store::StoreError;

/// Most live shared keys the lead moves budget for in one sync.
const MOST_KEYS: usize = 100_000;

/// How the link runs.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// How often it syncs.
    pub sync_every: Duration,
    /// A peer not heard from for this long is cut off.
    pub peer_timeout: Duration,
    /// This instance's name (who holds the lead).
    pub instance: String,
    /// How peers are reached (TLS).
    pub connect: ConnectOptions,
}

/// The region link of one instance (see the module's documentation).
pub struct Link {
    store: Local,
    regions: Arc<Regions>,
    peers: Vec<PeerLink>,
    options: LinkOptions,
    identity: String,
    status: Arc<Mutex<Vec<PeerStatus>>>,
    /// The shippings under way: stopped with the link.
    shipping: tokio::task::JoinSet<()>,
    /// Syncs led so far.
    syncs: u64,
    /// Where the entries kept alike in every region are (overrides), if
    /// any; and as last read, with their change counter.
    replicated: Option<Replicated>,
    replica: Option<(u64, Arc<Vec<Entry>>)>,
    /// Each live shared key's pool, as last noted or read: its part is
    /// read against this region's share of it (a record of an earlier
    /// window is moved on against the share, as a decision moves it).
    pools: Mutex<HashMap<Shared, u64>>,
}

impl Link {
    /// A link for the region `store` is in, with `peers` (each named among
    /// the regions). Fails for a peer's malformed URL or TLS settings.
    pub fn new(
        store: impl Into<Local>,
        peers: Vec<Peer>,
        options: LinkOptions,
    ) -> Result<Link, StoreError> {
        let store = store.into();
        let regions = store
            .regions()
            .cloned()
            .ok_or_else(|| StoreError::Refused("the store has no regions".into()))?;
        let timeout = options.peer_timeout;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(timeout))
            .set_connection_timeout(Some(timeout))
            .set_number_of_retries(0);
        let mut links = Vec::with_capacity(peers.len());
        for peer in peers {
            let index = regions
                .names
                .iter()
                .position(|n| *n == peer.name)
                .ok_or_else(|| StoreError::Refused(format!("region `{}` unknown", peer.name)))?;
            let reach = match &peer.address {
                Address::Node(url) => {
                    let client = options.connect.client(url)?;
                    let connection =
                        ConnectionManager::new_lazy_with_config(client, config.clone())
                            .map_err(|e| StoreError::Unavailable(e.category().to_string()))?;
                    PeerReach::Node(connection)
                }
                Address::Cluster(nodes) => {
                    let connect = ConnectOptions {
                        timeout,
                        ..options.connect.clone()
                    };
                    PeerReach::Cluster {
                        client: Box::new(connect.cluster_client(nodes, 1)?),
                        connection: Arc::default(),
                    }
                }
            };
            links.push(PeerLink::new(peer, index, links.len(), reach));
        }
        let described: Vec<String> = regions
            .names
            .iter()
            .zip(&regions.weights)
            .map(|(n, w)| format!("{n}:{w}"))
            .collect();
        // While rotating, both peppers: a peer that shares either is not
        // foreign (a rolling rotation), and is merged with once its
        // current pepper is this region's.
        let keys = store.keys();
        let peppers: Vec<String> = std::iter::once(&keys.current)
            .chain(&keys.previous)
            .map(|k| k.fingerprint())
            .collect();
        let identity = format!(
            "sluice-regions v5 {} {}",
            peppers.join(","),
            described.join(",")
        );
        let status = links
            .iter()
            .map(|l| PeerStatus {
                name: l.peer.name.clone(),
                ..PeerStatus::default()
            })
            .collect();
        Ok(Link {
            store,
            regions,
            peers: links,
            options,
            identity,
            status: Arc::new(Mutex::new(status)),
            shipping: tokio::task::JoinSet::new(),
            syncs: 0,
            replicated: None,
            replica: None,
            pools: Mutex::default(),
        })
    }

    /// Also keeps the entries in `replicated` alike in every region (the
    /// admin API's overrides; see [`replica`](super::replica)): the lead
    /// ships each peer those that changed, and all of them every 20 syncs.
    pub fn with_replicated(mut self, replicated: Replicated) -> Link {
        self.replicated = Some(replicated);
        self
    }

    /// What the link knows of each peer, shared with whoever reports it.
    pub fn status(&self) -> Arc<Mutex<Vec<PeerStatus>>> {
        self.status.clone()
    }

    /// Runs the link until the returned handle is dropped or aborted.
    pub fn spawn(mut self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut every = tokio::time::interval(self.options.sync_every);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                every.tick().await;
                if let Err(error) = self.sync().await {
                    tracing::warn!(%error, "region link: this region's store failed; retrying next sync");
                }
            }
        })
    }

    fn prefix(&self) -> String {
        self.store.keys().current.prefix().to_owned()
    }

    fn time(&self) -> TimeSource {
        self.store.time().clone()
    }

    /// One sync (see the module's documentation): whether this instance
    /// led it.
    pub async fn sync(&mut self) -> Result<bool, StoreError> {
        let mut local = self.store.reached()?;
        let prefix = self.prefix();
        let error = |e: redis::RedisError| StoreError::Unavailable(e.to_string());
        self.note(&mut local, &prefix).await.map_err(error)?;
        let lead: bool = redis::Script::new(LEAD_LUA)
            .key(lead_key(&prefix))
            .arg(&self.options.instance)
            .arg(3 * self.options.sync_every.as_millis() as u64)
            .invoke_async::<i64>(&mut local)
            .await
            .map_err(error)?
            == 1;
        let now = self.read_peers(&mut local, &prefix).await.map_err(error)?;
        if !lead {
            return Ok(false);
        }
        // Every REFRESH syncs every live key; in between, those whose part
        // changed (noted here, or shipped by a peer) since the last read.
        let full = self.syncs.is_multiple_of(REFRESH);
        self.syncs += 1;
        let (live, changed): (Vec<String>, Vec<String>) = redis::pipe()
            .cmd("SET")
            .arg(identity_key(&prefix))
            .arg(&self.identity)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(live_key(&prefix))
            .arg("-inf")
            .arg(now)
            .ignore()
            .cmd("ZRANGEBYSCORE")
            .arg(live_key(&prefix))
            .arg(now)
            .arg("+inf")
            .arg("LIMIT")
            .arg(0)
            .arg(if full { MOST_KEYS } else { 0 })
            .cmd("EVAL")
            .arg(TAKE_LUA)
            .arg(1)
            .arg(changed_key(&prefix))
            .query_async(&mut local)
            .await
            .map_err(error)?;
        let read = if full { live } else { changed };
        let keys = live_keys(&read, local.is_cluster());
        if full {
            // Forget the pools of keys no longer live.
            let live: std::collections::HashSet<&Shared> = keys.iter().collect();
            let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
            pools.retain(|shared, _| live.contains(shared));
        }
        let (keys, parts) = self.move_budget(&mut local, keys, now).await?;
        self.read_replica(&mut local).await.map_err(error)?;
        self.ship(&keys, &parts, full);
        Ok(true)
    }

    /// The replicated entries as the store holds them now, read again only
    /// when their change counter moved.
    async fn read_replica(&mut self, local: &mut Reached) -> Result<(), redis::RedisError> {
        let Some(replicated) = &self.replicated else {
            return Ok(());
        };
        let counter: Option<u64> = redis::cmd("GET")
            .arg(&replicated.counter)
            .query_async(local)
            .await?;
        if self.replica.as_ref().map(|(c, _)| *c) != Some(counter.unwrap_or(0)) {
            let (counter, entries) = replicated.read(local).await?;
            self.replica = Some((counter, Arc::new(entries)));
        }
        Ok(())
    }

    /// Step 1: what this instance's decisions asked, into the ledgers and
    /// the live set.
    async fn note(&self, local: &mut Reached, prefix: &str) -> Result<(), redis::RedisError> {
        let noted: Vec<(Shared, Noted)> = self.regions.take_noted().into_iter().collect();
        {
            let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
            for (shared, noted) in &noted {
                pools.insert(shared.clone(), noted.pool);
            }
        }
        if noted.is_empty() {
            return Ok(());
        }
        let time = self.time();
        let steps = self.steps(&time);
        let calls: Vec<ScriptInvocation<'static>> = noted
            .iter()
            .map(|(shared, noted)| {
                let share = self.regions.share(noted.pool);
                shared.note_call(steps, share, (noted.window, noted.pool, noted.wanted))
            })
            .collect();
        let live = noted
            .iter()
            .map(|(shared, noted)| (noted.window + shared.kind.span(shared.per_ms), shared));
        // A note that failed (its node stalled) is lost: demand is noted
        // again by the next decisions.
        local
            .ledger_calls::<()>(&calls, marked_live(prefix, live), self.budget())
            .await?;
        Ok(())
    }

    /// Steps 3: each live key's part read, and grants made from it; the
    /// keys read (on a cluster, a key whose node did not answer is left for
    /// a later sync) and their parts as they are after the grants.
    async fn move_budget(
        &self,
        local: &mut Reached,
        keys: Vec<Shared>,
        now: u64,
    ) -> Result<(Vec<Shared>, Vec<Snapshot>), StoreError> {
        let (time, me) = (self.time(), self.regions.index);
        let steps = self.steps(&time);
        let error = |e: redis::RedisError| StoreError::Unavailable(e.to_string());
        let all: Vec<&Shared> = keys.iter().collect();
        let read = self.read_parts(local, &all, steps).await?;
        let (keys, mut parts): (Vec<Shared>, Vec<Snapshot>) = keys
            .into_iter()
            .zip(read)
            .filter_map(|(key, part)| Some((key, part?)))
            .unzip();
        // A key whose pool was not known here (or changed) is read again
        // against its share: a record of an earlier window moves on
        // against it.
        let again: Vec<usize> = {
            let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
            let mut again = Vec::new();
            for (i, part) in parts.iter_mut().enumerate() {
                if part.pool == 0 {
                    // A ledger not written yet this window: the pool as
                    // last known.
                    part.pool = pools.get(&keys[i]).copied().unwrap_or(0);
                } else if pools.insert(keys[i].clone(), part.pool) != Some(part.pool) {
                    again.push(i);
                }
            }
            again
        };
        let mut unread = Vec::new();
        if !again.is_empty() {
            let keys_again: Vec<&Shared> = again.iter().map(|&i| &keys[i]).collect();
            let read_again = self.read_parts(local, &keys_again, steps).await?;
            for (i, part) in again.into_iter().zip(read_again) {
                match part {
                    Some(part) => parts[i] = part,
                    None => unread.push(i),
                }
            }
        }
        // Read against another share, not read again: left for later.
        let (keys, mut parts): (Vec<Shared>, Vec<Snapshot>) = keys
            .into_iter()
            .zip(parts)
            .enumerate()
            .filter(|(i, _)| !unread.contains(i))
            .map(|(_, kept)| kept)
            .unzip();
        for part in &mut parts {
            part.part.share = self.regions.share(part.pool);
        }
        let reachable = self.reachable();
        let timeout = self.options.peer_timeout.as_millis() as u64;
        let mut grant_calls = Vec::new();
        for (k, part) in parts.iter().enumerate() {
            let heard: Vec<Option<Heard>> = part
                .views
                .iter()
                .enumerate()
                .map(|(r, v)| {
                    v.filter(|v| reachable[r] && now.saturating_sub(v.at_ms) <= timeout)
                        .map(|v| v.heard)
                })
                .collect();
            let span = keys[k].kind.span(keys[k].per_ms);
            let elapsed = now.saturating_sub(part.window_ms) as f64 / span as f64;
            for (to, units) in grants(me, &part.part, &heard, elapsed) {
                grant_calls.push((k, to, units));
            }
        }
        let calls: Vec<ScriptInvocation<'static>> = grant_calls
            .iter()
            .map(|&(k, to, units)| {
                let part = &parts[k];
                let args = (part.window_ms, to, units);
                keys[k].grant_call(steps, part.part.share, args)
            })
            .collect();
        let totals: Vec<redis::RedisResult<i64>> = local
            .ledger_calls(&calls, Vec::new(), self.budget())
            .await
            .map_err(error)?;
        for (&(k, to, _), total) in grant_calls.iter().zip(totals) {
            // Not granted: it did not fit, or its node did not answer.
            if let Some(total) = total.ok().and_then(|t| u64::try_from(t).ok()) {
                let given = &mut parts[k].part.given[to];
                self.count_shipped(to, total.saturating_sub(*given));
                *given = total;
            }
        }
        Ok((keys, parts))
    }

    /// The parts of `keys` read from this region's store, each against
    /// this region's share of its pool as last known here (0 when not
    /// known); `None` for a key whose node did not answer (a cluster's).
    async fn read_parts(
        &self,
        local: &mut Reached,
        keys: &[&Shared],
        steps: Steps<'_>,
    ) -> Result<Vec<Option<Snapshot>>, StoreError> {
        let error = |e: redis::RedisError| StoreError::Unavailable(e.to_string());
        let shares: Vec<u64> = {
            let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
            let pool = |shared: &Shared| pools.get(shared).copied().unwrap_or(0);
            keys.iter().map(|k| self.regions.share(pool(k))).collect()
        };
        let calls: Vec<ScriptInvocation<'static>> = keys
            .iter()
            .zip(shares)
            .map(|(shared, share)| shared.read_call(steps, share))
            .collect();
        let replies: Vec<redis::RedisResult<Vec<u8>>> = local
            .ledger_calls(&calls, Vec::new(), self.budget())
            .await
            .map_err(error)?;
        replies
            .into_iter()
            .map(|reply| match reply {
                Ok(reply) => super::ledger::snapshot(&reply, self.regions.len()).map(Some),
                Err(_) => Ok(None),
            })
            .collect()
    }

    /// How long one call on this region's store may take within a sync.
    fn budget(&self) -> Duration {
        self.options.sync_every.max(Duration::from_millis(250))
    }

    /// What every step on this region's own ledgers is told (none but a
    /// `hear` uses the region's own keys).
    fn steps<'a>(&self, time: &'a TimeSource) -> Steps<'a> {
        Steps {
            time,
            regions: self.regions.len(),
            own: None,
        }
    }

    /// Per region, whether it may be granted to: a peer reached lately,
    /// not foreign.
    fn reachable(&self) -> Vec<bool> {
        let status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        let mut reachable = vec![false; self.regions.len()];
        for (link, s) in self.peers.iter().zip(status.iter()) {
            reachable[link.index] =
                !s.cut_off && s.foreign.is_none() && s.last_shipped_ms.is_some();
        }
        reachable
    }

    fn count_shipped(&self, region: usize, units: u64) {
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = self.peers.iter().position(|l| l.index == region) {
            status[p].units_shipped += units;
        }
    }

    /// When each peer last shipped here (by this region's Redis clock)
    /// and what its totals added, from this region's store, where peers
    /// write it; returns now by that clock.
    async fn read_peers(
        &self,
        local: &mut Reached,
        prefix: &str,
    ) -> Result<u64, redis::RedisError> {
        type Read = (HashMap<String, u64>, HashMap<String, u64>, (u64, u64));
        let (heard, received, (seconds, micros)): Read = redis::pipe()
            .hgetall(heard_key(prefix))
            .hgetall(received_key(prefix))
            .cmd("TIME")
            .query_async(local)
            .await?;
        let now = match self.time() {
            TimeSource::Server => seconds * 1_000 + micros / 1_000,
            TimeSource::Client(clock) => clock.now_ms(),
        };
        let timeout = self.options.peer_timeout.as_millis() as u64;
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        for (link, s) in self.peers.iter().zip(status.iter_mut()) {
            s.last_heard_ms = heard.get(&s.name).copied();
            s.units_received = received.get(&link.index.to_string()).copied().unwrap_or(0);
            s.cut_off = s
                .last_heard_ms
                .is_none_or(|at| now.saturating_sub(at) > timeout);
        }
        Ok(now)
    }

    /// Step 4: each peer shipped what it is owed, each on its own (see
    /// [`ship`](super::ship)): a peer still busy with the last shipping,
    /// or backing off, is skipped this time.
    fn ship(&mut self, keys: &[Shared], parts: &[Snapshot], full: bool) {
        while self.shipping.try_join_next().is_some() {}
        let (me, time, prefix) = (self.regions.index, self.time(), self.prefix());
        for link in &mut self.peers {
            if !link.ready() {
                continue;
            }
            let to = link.index;
            // A part whose pool is not known yet says nothing: shipped,
            // the peer would read what it owes against a share of 0.
            let owed = keys
                .iter()
                .zip(parts)
                .filter(|(_, part)| part.pool > 0)
                .map(|(shared, part)| (shared.clone(), hearing(&self.regions, to, part)));
            let hearings = link.unshipped(owed, full);
            let replica = match (&self.replicated, &self.replica) {
                (Some(replicated), Some((_, entries))) => {
                    let owed = link.unshipped_replica(entries, full);
                    (!owed.is_empty()).then(|| (replicated.clone(), owed))
                }
                _ => None,
            };
            let shipment = Shipment {
                link: link.shared(),
                time: time.clone(),
                regions: self.regions.len(),
                prefix: prefix.clone(),
                name: self.regions.names[me].clone(),
                identity: self.identity.clone(),
                hearings,
                replica,
                status: self.status.clone(),
                options: (self.options.sync_every, self.options.peer_timeout),
            };
            link.shipping = Some(self.shipping.spawn(shipment.run()));
        }
    }
}

/// The members of a set, emptied (KEYS[1]).
const TAKE_LUA: &str =
    "local m = redis.call('SMEMBERS', KEYS[1]) redis.call('DEL', KEYS[1]) return m";

/// Takes or keeps the lead: 1 when this instance holds it (for PX ms).
const LEAD_LUA: &str = r#"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"#;
