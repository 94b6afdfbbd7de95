//! The region link of this instance (`storage.regions`, SPEC appendix H):
//! started with the server, reported by `/readyz` and `/metrics`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_core::config::{PeerStore, StorageConfig};
use sluice_store::redis::regions::{Address, Link, LinkOptions, Local, Peer, PeerStatus};

use crate::Fallible;
use crate::admin::persist::Persist;
use crate::backend::{Backend, connect_options};

/// What the link knows of each peer region.
#[derive(Debug, Clone)]
pub struct PeerStatuses(Arc<Mutex<Vec<PeerStatus>>>);

impl PeerStatuses {
    /// Each peer as last seen.
    pub fn snapshot(&self) -> Vec<PeerStatus> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Starts the region link when `storage.regions` is set (on Redis or
/// Redis Cluster: validation refuses it on memory); it runs as long as the
/// runtime does. Returns what it knows of its peers.
pub fn spawn(
    backend: &Backend,
    storage: &StorageConfig,
    instance: &str,
) -> Fallible<Option<PeerStatuses>> {
    let Some(regions) = &storage.regions else {
        return Ok(None);
    };
    let store: Local = match backend {
        Backend::Redis(store) => (**store).clone().into(),
        Backend::Cluster(store) => (**store).clone().into(),
        Backend::Memory(_) => {
            return Err("storage.regions needs storage.backend: redis or redis-cluster".into());
        }
    };
    let peers = regions
        .peers
        .iter()
        .map(|p| Peer {
            name: p.name.clone(),
            address: match &p.store {
                PeerStore::Redis(url) => Address::Node(url.clone()),
                PeerStore::Cluster(nodes) => Address::Cluster(nodes.clone()),
            },
        })
        .collect();
    let options = LinkOptions {
        sync_every: Duration::from_millis(regions.sync_every_ms),
        peer_timeout: Duration::from_millis(regions.peer_timeout_ms),
        instance: instance.to_owned(),
        connect: connect_options(storage, Duration::from_millis(storage.timeout_ms))?,
    };
    let mut link =
        Link::new(store, peers, options).map_err(|e| format!("storage.regions.peers: {e}"))?;
    // Overrides (the admin API's) are kept alike in every region.
    if let Some(persist) = Persist::for_backend(backend) {
        link = link.with_replicated(persist.replicated());
    }
    let status = PeerStatuses(link.status());
    link.spawn();
    Ok(Some(status))
}
