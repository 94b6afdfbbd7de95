//! A peer region: how the link reaches it, and what it knows of it.

use std::time::Duration;

/// A peer region as the link reaches it.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Its name.
    pub name: String,
    /// Its store, credentials included.
    pub address: Address,
}

/// Where a peer region's store is.
#[derive(Debug, Clone)]
pub enum Address {
    /// One Redis node: its URL.
    Node(String),
    /// A Redis Cluster: its seed nodes' URLs.
    Cluster(Vec<String>),
}

/// What the link knows of one peer, for metrics, `/readyz` and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerStatus {
    /// The peer's name.
    pub name: String,
    /// When the peer last shipped to this region (ms since the epoch, by
    /// the peer's clock).
    pub last_heard_ms: Option<u64>,
    /// When this region last shipped to it (ms since the epoch).
    pub last_shipped_ms: Option<u64>,
    /// How long the last shipping to it took.
    pub lag: Duration,
    /// Units granted to it, in all (this instance, while it led).
    pub units_shipped: u64,
    /// Units it granted here that were added here, in all (as it counted
    /// them when it shipped).
    pub units_received: u64,
    /// Whether it is cut off (not heard from for `peer_timeout`).
    pub cut_off: bool,
    /// Why it is never merged with (another pepper, other regions), if so.
    pub foreign: Option<String>,
    /// Shippings to it that failed, in all.
    pub failures: u64,
}
