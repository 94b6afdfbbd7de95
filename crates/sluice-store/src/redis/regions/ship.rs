//! Shipping to one peer region: what the link's lead sends a peer's store
//! each sync, on a connection of the peer's own, as a task of its own, so
//! that a slow or black-holed peer holds up neither the decisions nor the
//! other peers.
//!
//! A shipping carries only the keys whose totals or view changed since the
//! last one (all of them every 20 syncs, and after a failure), and marks
//! them changed in the peer's store (its lead reads them next). First the
//! peer's identity (pepper and regions): nothing is sent before it has
//! been seen to match. Then each key's `hear` (which counts what it added
//! there), their place in the peer's live set, and when this region
//! shipped (by the peer's Redis clock): on a node, one pipeline per 512
//! keys (a round trip each), where each `hear` applies only while the
//! identity still matches, in the same call; on a cluster, whose `hear`s
//! are each in their tenant's slot, the identity is read again at every
//! shipping, and the calls go 512 at a time to their nodes (see `reach`).
//! Then the replicated entries (overrides) that changed here since the
//! last shipping (all of them every 20 syncs), merged there. It gives up
//! after
//! `peer_timeout`; after a failure the peer is not tried again until a
//! backoff has passed (from `sync_every`, doubling, at most
//! `peer_timeout`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::ScriptInvocation;

use super::ledger::{Hearing, Own, Steps};
use super::live::{heard_key, identity_key, marked_live, received_key};
use super::peer::{Peer, PeerStatus};
use super::reach::PeerReach;
use super::replica::{Replicated, replica_script};
use super::shared::{Regions, Shared};
use crate::redis::TimeSource;
use sluice_core::regions::Heard;
use sluice_core::regions::replica::Entry;
use sluice_core::regions::stored::Snapshot;

/// Every this many syncs, every live key is read and shipped again, not
/// only what changed: a peer whose store lost it (a flush, a failover)
/// learns it again, and grants follow time as well as changes.
pub(super) const REFRESH: u64 = 20;

/// One peer as the link ships to it.
pub(super) struct PeerLink {
    pub(super) peer: Peer,
    /// Its place among the regions.
    pub(super) index: usize,
    /// Its place in the link's status.
    slot: usize,
    reach: PeerReach,
    /// The shipping under way, if any.
    pub(super) shipping: Option<tokio::task::AbortHandle>,
    state: Arc<Mutex<Backoff>>,
    /// What was last shipped of each live key.
    shipped: HashMap<Shared, Hearing>,
    /// The change counter of the replicated entries last shipped.
    replica_shipped: HashMap<String, u64>,
}

/// What a shipping leaves for the next.
#[derive(Debug, Default)]
struct Backoff {
    /// Not tried again before this.
    until: Option<Instant>,
    /// The last backoff (zero after a success).
    last: Duration,
    /// The peer's identity, once seen to match ours.
    seen: Option<String>,
    /// Keys the peer dropped (their window is not the peer's yet, or no
    /// more): shipped again next time.
    dropped: Vec<Shared>,
}

/// What a shipping needs of its peer, detached from the link.
pub(super) struct Shipped {
    slot: usize,
    peer: String,
    reach: PeerReach,
    state: Arc<Mutex<Backoff>>,
}

impl PeerLink {
    pub(super) fn new(peer: Peer, index: usize, slot: usize, reach: PeerReach) -> PeerLink {
        PeerLink {
            peer,
            index,
            slot,
            reach,
            shipping: None,
            state: Arc::default(),
            shipped: HashMap::new(),
            replica_shipped: HashMap::new(),
        }
    }

    /// Of the replicated entries, those this peer was not shipped at
    /// their version (all of them when `full`, every [`REFRESH`] syncs: a
    /// peer whose store lost them learns them again; and after a
    /// failure).
    pub(super) fn unshipped_replica(&mut self, entries: &[Entry], full: bool) -> Vec<Entry> {
        let failing = !self
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last
            .is_zero();
        if full || failing {
            self.replica_shipped.clear();
        }
        let mut unshipped = Vec::new();
        for entry in entries {
            if self.replica_shipped.get(&entry.field) != Some(&entry.version) {
                self.replica_shipped
                    .insert(entry.field.clone(), entry.version);
                unshipped.push(entry.clone());
            }
        }
        unshipped
    }

    /// Of what is owed to this peer now, what it was not shipped as it is
    /// (all of it when `full`, every [`REFRESH`] syncs, and after a
    /// failure; keys not owed then are forgotten).
    pub(super) fn unshipped(
        &mut self,
        owed: impl Iterator<Item = (Shared, Hearing)>,
        full: bool,
    ) -> Vec<(Shared, Hearing)> {
        let failing = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            for shared in state.dropped.drain(..) {
                self.shipped.remove(&shared);
            }
            !state.last.is_zero()
        };
        let full = full || failing;
        if full {
            self.shipped.clear();
        }
        let mut unshipped = Vec::new();
        for (shared, hearing) in owed {
            if self.shipped.get(&shared) != Some(&hearing) {
                unshipped.push((shared.clone(), hearing));
                self.shipped.insert(shared, hearing);
            }
        }
        unshipped
    }

    /// Whether a shipping may start: none under way, no backoff running.
    pub(super) fn ready(&self) -> bool {
        let busy = self.shipping.as_ref().is_some_and(|s| !s.is_finished());
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        !busy && state.until.is_none_or(|until| Instant::now() >= until)
    }

    pub(super) fn shared(&self) -> Shipped {
        Shipped {
            slot: self.slot,
            peer: self.peer.name.clone(),
            reach: self.reach.clone(),
            state: self.state.clone(),
        }
    }
}

/// One shipping to one peer.
pub(super) struct Shipment {
    pub(super) link: Shipped,
    pub(super) time: TimeSource,
    /// How many regions.
    pub(super) regions: usize,
    pub(super) prefix: String,
    /// This region's name and identity.
    pub(super) name: String,
    pub(super) identity: String,
    pub(super) hearings: Vec<(Shared, Hearing)>,
    /// The replicated entries to merge into the peer's, when owed.
    pub(super) replica: Option<(Replicated, Vec<Entry>)>,
    pub(super) status: Arc<Mutex<Vec<PeerStatus>>>,
    /// `sync_every` and `peer_timeout`.
    pub(super) options: (Duration, Duration),
}

/// Why shipping to a peer did not happen.
#[derive(Debug)]
enum Failure {
    /// The peer's store announces another pepper or other regions.
    Foreign(String),
    /// It could not be reached, or failed.
    Failed(String),
    /// Its pepper is the other one of a rotation under way (not foreign;
    /// not merged with until both derive keys from the same one).
    Rotating(String),
}

/// A failure of Redis's, or of its answer.
fn failed(e: impl std::fmt::Display) -> Failure {
    Failure::Failed(e.to_string())
}

impl Shipment {
    /// Ships, then records how it went.
    pub(super) async fn run(mut self) {
        let (sync_every, peer_timeout) = self.options;
        let started = Instant::now();
        let shipped = match tokio::time::timeout(peer_timeout, self.ship()).await {
            Ok(shipped) => shipped,
            Err(_) => Err(Failure::Failed(format!(
                "no answer within {} ms",
                peer_timeout.as_millis()
            ))),
        };
        let mut state = self.link.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut status[self.link.slot];
        s.lag = started.elapsed();
        let peer = &self.link.peer;
        match shipped {
            Ok(()) => {
                s.last_shipped_ms = Some(self.time.now_ms());
                s.foreign = None;
                state.last = Duration::ZERO;
                state.until = None;
            }
            Err(failure) => {
                s.failures += 1;
                match failure {
                    Failure::Foreign(why) => {
                        if s.foreign.as_deref() != Some(&why) {
                            tracing::error!(%peer, "region link: {why}; never merged with it");
                        }
                        s.foreign = Some(why);
                        state.seen = None;
                    }
                    Failure::Rotating(why) => {
                        if s.foreign.take().is_some() || state.last.is_zero() {
                            tracing::warn!(%peer, "region link: {why}");
                        }
                        state.seen = None;
                    }
                    Failure::Failed(why) if state.last.is_zero() => {
                        tracing::warn!(%peer, "region link: shipping failed ({why}); backing off");
                    }
                    Failure::Failed(_) => {}
                }
                state.last = (state.last * 2).max(sync_every).min(peer_timeout);
                state.until = Some(Instant::now() + state.last);
            }
        }
    }

    /// Whether `theirs` (the peer's identity) may be merged with.
    fn check(&self, theirs: Option<&str>) -> Result<(), Failure> {
        mergeable(&self.identity, theirs)
    }

    /// The shipping itself.
    async fn ship(&mut self) -> Result<(), Failure> {
        let (_, peer_timeout) = self.options;
        let mut connection = self
            .link
            .reach
            .reached(peer_timeout)
            .await
            .map_err(failed)?;
        let cluster = connection.is_cluster();
        let identity = identity_key(&self.prefix);
        let seen = self
            .link
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .seen
            .clone();
        let seen = match seen {
            // On a node, each call checks it still holds.
            Some(seen) if !cluster => seen,
            seen => {
                let theirs: Option<String> = redis::cmd("GET")
                    .arg(&identity)
                    .query_async(&mut connection)
                    .await
                    .map_err(failed)?;
                self.check(theirs.as_deref())?;
                let theirs = theirs.unwrap_or_default();
                if seen.is_some_and(|seen| seen != theirs) {
                    return Err(self.identity_changed());
                }
                self.link
                    .state
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .seen = Some(theirs.clone());
                theirs
            }
        };
        let received = received_key(&self.prefix);
        let steps = Steps {
            time: &self.time,
            regions: self.regions,
            // On a node, each hear applies only while the peer's store
            // still announces the identity checked, and counts what it
            // added there; on a cluster, the shipping counts it after.
            own: (!cluster).then_some(Own {
                received: &received,
                identity: (&identity, &seen),
            }),
        };
        // A cluster carries nothing over from a previous pepper (its keys
        // under it are in other slots): a rotating region's keys go there
        // without it.
        let shipped: Vec<(Shared, &Hearing)> = self
            .hearings
            .iter()
            .map(|(shared, hearing)| {
                let mut shared = shared.clone();
                if cluster {
                    shared.previous = None;
                }
                (shared, hearing)
            })
            .collect();
        let calls: Vec<ScriptInvocation<'static>> = shipped
            .iter()
            .map(|(shared, hearing)| shared.hear_call(steps, hearing))
            .collect();
        let live = shipped
            .iter()
            .map(|(shared, hearing)| (hearing.window + shared.kind.span(shared.per_ms), shared));
        let mut then = marked_live(&self.prefix, live);
        // When this region shipped, by the peer's Redis clock.
        let mut heard = redis::cmd("EVAL");
        heard
            .arg(HEARD_LUA)
            .arg(1)
            .arg(heard_key(&self.prefix))
            .arg(&self.name);
        then.push(heard);
        let replies: Vec<redis::RedisResult<i64>> = connection
            .ledger_calls(&calls, then, peer_timeout)
            .await
            .map_err(failed)?;
        // Dropped there (its window not begun, or over), or not answered
        // (a cluster's node stalled): shipped again next time.
        let dropped = self
            .hearings
            .iter()
            .zip(&replies)
            .filter(|&(_, reply)| matches!(reply, Ok(-1) | Err(_)))
            .map(|((shared, _), _)| shared.clone());
        self.link
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .dropped
            .extend(dropped);
        if replies.iter().any(|r| matches!(r, Ok(-2))) {
            return Err(self.identity_changed());
        }
        let added: i64 = replies
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .filter(|&&r| r > 0)
            .sum();
        if cluster && added > 0 {
            let from = self.hearings[0].1.from;
            redis::cmd("HINCRBY")
                .arg(&received)
                .arg(from)
                .arg(added)
                .query_async::<i64>(&mut connection)
                .await
                .map_err(failed)?;
        }
        if let Some((replicated, entries)) = &self.replica {
            let mut pipe = redis::pipe();
            pipe.load_script(replica_script()).ignore();
            for call in replicated.merge_calls(entries, (&identity, &seen)) {
                pipe.invoke_script(&call);
            }
            let replies: Vec<i64> = pipe.query_async(&mut connection).await.map_err(failed)?;
            if replies.contains(&-2) {
                return Err(self.identity_changed());
            }
        }
        Ok(())
    }

    /// The peer's store announces another identity than the one checked:
    /// checked again next time.
    fn identity_changed(&self) -> Failure {
        self.link
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .seen = None;
        Failure::Failed("its identity changed; checked again at the next shipping".into())
    }
}

/// What region `me` ships to region `to` of one part.
pub(super) fn hearing(regions: &Regions, to: usize, part: &Snapshot) -> Hearing {
    Hearing {
        window: part.window_ms,
        pool: part.pool,
        share: regions.share_of(part.pool, to),
        from: regions.index,
        total: part.part.given[to],
        view: Heard {
            cap: part.part.cap(),
            used: part.part.used,
            wanted: part.part.wanted,
            heard_from_you: part.part.heard[to],
        },
        yours: part.views[to].map_or(0, |v| v.heard.used),
    }
}

/// Whether a store announcing `theirs` may be merged with by a region
/// whose identity is `ours`.
fn mergeable(ours: &str, theirs: Option<&str>) -> Result<(), Failure> {
    match theirs {
        // A peer whose link has not run yet: nothing is shipped until
        // it has said who it is.
        None => Err(Failure::Failed(
            "its link has not announced itself yet (is it running, with the same keys.prefix?)"
                .into(),
        )),
        Some(theirs) => {
            // "sluice-regions v5 PEPPERS REGIONS", PEPPERS the current
            // pepper's fingerprint and, while rotating, the previous'.
            let fields = |identity: &str| -> (Vec<String>, String) {
                let mut parts = identity.splitn(4, ' ').skip(2);
                let peppers = parts.next().unwrap_or("").split(',').map(str::to_owned);
                (peppers.collect(), parts.next().unwrap_or("").to_owned())
            };
            let (ours, our_regions) = fields(ours);
            let (peppers, regions) = fields(theirs);
            if !theirs.starts_with("sluice-regions v5 ") {
                Err(Failure::Foreign(
                    "its store runs another version of the region link; run one sluice version in every region".into(),
                ))
            } else if !peppers.iter().any(|p| ours.contains(p)) {
                Err(Failure::Foreign(
                    "its store announces another pepper".into(),
                ))
            } else if regions != our_regions {
                Err(Failure::Foreign(
                    "its store lists other regions or weights".into(),
                ))
            } else if peppers.first() != ours.first() {
                // A rolling rotation: keys differ until both derive
                // them from the same pepper, and a grant made from one
                // key must not be heard on another.
                Err(Failure::Rotating(
                    "it derives keys from another of the two peppers being rotated; linked again once both use the new one"
                        .into(),
                ))
            } else {
                Ok(())
            }
        }
    }
}

/// Stamps when a region shipped (KEYS[1] the hash, ARGV[1] its name) with
/// the receiving Redis's clock, in ms.
const HEARD_LUA: &str = "local t = redis.call('TIME') \
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000))) \
return 1";

#[cfg(test)]
mod tests {
    use sluice_core::keys::Record;
    use sluice_core::regions::Heard;

    use redis::aio::ConnectionManager;

    use super::super::shared::Kind;

    use super::*;

    #[tokio::test]
    async fn only_what_changed_is_shipped_but_everything_now_and_then() {
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let connection =
            ConnectionManager::new_lazy_with_config(client, Default::default()).unwrap();
        let peer = Peer {
            name: "us".into(),
            address: super::super::peer::Address::Node(String::new()),
        };
        let mut link = PeerLink::new(peer, 1, 0, PeerReach::Node(connection));
        let key = |n: u8| Shared {
            key: format!("sl:{{t}}:{n}"),
            record: Record([n; 8]),
            per_ms: 60_000,
            kind: Kind::Window,
            max_debt: 0,
            previous: None,
        };
        let hearing = |total: u64| Hearing {
            window: 60_000,
            pool: 100,
            from: 0,
            total,
            view: Heard::default(),
            share: 50,
            yours: 0,
        };
        let owed = |totals: [u64; 3]| (0..3u8).map(move |n| (key(n), hearing(totals[n as usize])));
        assert_eq!(
            link.unshipped(owed([1, 2, 3]), true).len(),
            3,
            "a full sync: all"
        );
        assert!(link.unshipped(owed([1, 2, 3]), false).is_empty());
        let changed = link.unshipped(owed([1, 5, 3]), false);
        assert_eq!(changed, [(key(1), hearing(5))]);
        // Only some keys read: the others stay as shipped.
        assert!(
            link.unshipped(owed([1, 5, 3]).skip(1).take(1), false)
                .is_empty()
        );
        assert!(link.unshipped(owed([1, 5, 3]), false).is_empty());
        // A key the peer dropped (its window not begun there) goes again.
        link.state.lock().unwrap().dropped.push(key(2));
        assert_eq!(
            link.unshipped(owed([1, 5, 3]), false),
            [(key(2), hearing(3))]
        );
        assert_eq!(
            link.unshipped(owed([1, 5, 3]), true).len(),
            3,
            "a full sync: all"
        );
        // After a failure, all again.
        link.state.lock().unwrap().last = Duration::from_secs(1);
        assert_eq!(link.unshipped(owed([1, 5, 3]), false).len(), 3);
    }

    #[tokio::test]
    async fn only_overrides_that_changed_are_shipped_but_all_now_and_then() {
        let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
        let connection =
            ConnectionManager::new_lazy_with_config(client, Default::default()).unwrap();
        let peer = Peer {
            name: "us".into(),
            address: super::super::peer::Address::Node(String::new()),
        };
        let mut link = PeerLink::new(peer, 1, 0, PeerReach::Node(connection));
        let entry = |field: &str, version: u64| Entry {
            field: field.into(),
            version,
            value: Some("0a".into()),
        };
        let all = [entry("a", 1), entry("b", 1)];
        assert_eq!(link.unshipped_replica(&all, false).len(), 2);
        assert!(link.unshipped_replica(&all, false).is_empty());
        let changed = [entry("a", 1), entry("b", 2)];
        assert_eq!(link.unshipped_replica(&changed, false), [entry("b", 2)]);
        assert_eq!(
            link.unshipped_replica(&changed, true).len(),
            2,
            "a full sync"
        );
        link.state.lock().unwrap().last = Duration::from_secs(1);
        assert_eq!(
            link.unshipped_replica(&changed, false).len(),
            2,
            "after a failure"
        );
    }

    #[test]
    fn a_peer_is_merged_with_only_on_the_same_version_pepper_and_regions() {
        let ours = "sluice-regions v5 aa eu:1,us:1";
        let why = |theirs: &str| match mergeable(ours, Some(theirs)) {
            Ok(()) => "merged".to_owned(),
            Err(Failure::Foreign(why) | Failure::Rotating(why) | Failure::Failed(why)) => why,
        };
        assert_eq!(why(ours), "merged");
        assert!(why("sluice-regions v2 aa eu:1,us:1").contains("another version"));
        assert!(why("sluice-regions v5 bb eu:1,us:1").contains("another pepper"));
        assert!(why("sluice-regions v5 aa eu:1,us:2").contains("other regions"));
        assert!(why("sluice-regions v5 bb,aa eu:1,us:1").contains("rotated"));
        assert!(mergeable(ours, None).is_err());
    }
}
