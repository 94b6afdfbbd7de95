//! `storage.regions`: this region, its peers and how usage moves between
//! them (SPEC appendix H).

use super::Validator;
use crate::config::raw::{RawPeer, RawRegions, S};
use crate::config::{Backend, PeerRegion, PeerStore, RegionsConfig};

/// Most peers a region links to.
const MAX_PEERS: usize = 15;
/// `sync_every`'s default, 250 ms, and its bounds.
const SYNC_EVERY_MS: u64 = 250;
const SYNC_EVERY_RANGE: std::ops::RangeInclusive<u64> = 10..=60_000;
/// `peer_timeout`'s default, 5 s, and its longest.
const PEER_TIMEOUT_MS: u64 = 5_000;
const MAX_PEER_TIMEOUT_MS: u64 = 3_600_000;
/// A region's weight: from 1 to this.
const MAX_WEIGHT: u64 = 1_000;

/// Whether `name` is a region name: 1 to 32 lowercase letters, digits,
/// `-` or `_`, starting with a letter or digit (it goes into store keys
/// and metric labels as it is).
fn region_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && (b == b'-' || b == b'_'))
        })
}

const NAME_RULE: &str =
    "1 to 32 lowercase letters, digits, `-` or `_`, starting with a letter or digit";

impl Validator<'_> {
    pub(super) fn regions(&mut self, raw: S<RawRegions>, backend: &Backend) -> RegionsConfig {
        let at = raw.referenced;
        let raw = raw.value;
        match backend {
            Backend::Redis { .. } | Backend::RedisCluster { .. } => {}
            Backend::Memory => self.push(
                at,
                "`storage.regions` needs this region's shared store: `storage.backend: redis` or `redis-cluster` (the memory store has no peers)",
            ),
        }
        let this = match raw.this {
            Some(this) if region_name(&this.value) => this.value,
            Some(this) => {
                self.push(
                    this.referenced,
                    format!(
                        "`storage.regions.self` must be {NAME_RULE}, got `{}`",
                        this.value
                    ),
                );
                this.value
            }
            None => {
                self.push(at, "`storage.regions` needs `self`: this region's name");
                String::new()
            }
        };
        let weight = self.integer_in(
            raw.weight.as_ref(),
            "storage.regions.weight",
            1,
            1..=MAX_WEIGHT,
        ) as u32;
        let peers = match raw.peers {
            Some(peers) if !peers.value.is_empty() && peers.value.len() <= MAX_PEERS => peers
                .value
                .into_iter()
                .filter_map(|(name, peer)| self.peer(&this, name, peer))
                .collect(),
            Some(peers) => {
                self.push(
                    peers.referenced,
                    format!(
                        "`storage.regions.peers` must name from 1 to {MAX_PEERS} regions, got {}",
                        peers.value.len()
                    ),
                );
                Vec::new()
            }
            None => {
                self.push(
                    at,
                    "`storage.regions` needs `peers`: each other region's name and store",
                );
                Vec::new()
            }
        };
        let sync_every_ms = self.duration_in(
            raw.sync_every.as_ref(),
            "storage.regions.sync_every",
            SYNC_EVERY_MS,
            SYNC_EVERY_RANGE,
        );
        // At least two syncs: a peer is not cut off for one late sync.
        let peer_timeout_ms = self.duration_in(
            raw.peer_timeout.as_ref(),
            "storage.regions.peer_timeout",
            PEER_TIMEOUT_MS.max(2 * sync_every_ms),
            2 * sync_every_ms..=MAX_PEER_TIMEOUT_MS,
        );
        RegionsConfig {
            this,
            weight,
            peers,
            sync_every_ms,
            peer_timeout_ms,
        }
    }

    fn peer(&mut self, this: &str, name: String, raw: S<RawPeer>) -> Option<PeerRegion> {
        let at = raw.referenced;
        let raw = raw.value;
        let field = format!("storage.regions.peers.{name}");
        if !region_name(&name) {
            self.push(
                at,
                format!("`storage.regions.peers` names `{name}`: a region name is {NAME_RULE}"),
            );
            return None;
        }
        if name == this {
            self.push(
                at,
                format!("`{field}` is this region (`storage.regions.self`): list only the others"),
            );
            return None;
        }
        let store = match (raw.url, raw.nodes) {
            (Some(url), None) => {
                self.redis_url(&url, &format!("{field}.url"));
                PeerStore::Redis(url.value)
            }
            (None, Some(nodes)) if nodes.value.is_empty() => {
                self.push(
                    nodes.referenced,
                    format!(
                        "`{field}.nodes` is empty: give the peer's Redis Cluster seed URLs, such as [redis://10.0.0.1:7000]"
                    ),
                );
                return None;
            }
            (None, Some(nodes)) => {
                for node in &nodes.value {
                    self.redis_url(node, &format!("{field}.nodes"));
                }
                PeerStore::Cluster(nodes.value.into_iter().map(|n| n.value).collect())
            }
            (Some(url), Some(_)) => {
                self.push(
                    url.referenced,
                    format!(
                        "`{field}` takes `url` (one Redis) or `nodes` (a Redis Cluster), not both"
                    ),
                );
                return None;
            }
            (None, None) => {
                self.push(
                    at,
                    format!(
                        "`{field}` needs `url` (the peer region's Redis) or `nodes` (its Redis Cluster)"
                    ),
                );
                return None;
            }
        };
        let weight = self.integer_in(
            raw.weight.as_ref(),
            &format!("{field}.weight"),
            1,
            1..=MAX_WEIGHT,
        ) as u32;
        Some(PeerRegion {
            name,
            store,
            weight,
        })
    }
}
