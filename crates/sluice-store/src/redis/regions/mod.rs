//! One budget across regions on Redis (SPEC appendix H; the arithmetic
//! and its bound are `sluice_core::regions`).
//!
//! - [`shared`] ([`Regions`]): what a region's store knows of the regions
//!   (their order and weights, its own place), and the shared rules its
//!   decisions touched since the link last ran. A decision of a shared rule sends
//!   the script this region's share of the rule's pool as its limit (see
//!   `shared_window` in shared.lua) and notes the key here: nothing else
//!   on the decision's path, and nothing at all when regions are off.
//! - `local`: what the region's own store (one node or a cluster) does
//!   for shared rules.
//! - [`ledger`] (`ledger.lua`): a shared rule's part as the link reads and
//!   moves it.
//! - `reach`: how the link reaches a store, one node or a cluster.
//! - [`link`]: the background task that moves budget between regions,
//!   store to store; `ship`: its shipping to one peer, on a task of its
//!   own; `peer`: a peer and what the link knows of it; `live`: the keys
//!   the link keeps beside the rules'.
//! - [`replica`] (`replica.lua`): entries the link keeps alike in every
//!   region, last writer wins (the admin API's overrides).

pub mod ledger;
pub mod link;
pub mod live;
mod local;
mod peer;
mod reach;
pub mod replica;
pub mod shared;
mod ship;

pub use ledger::{Hearing, LEDGER_LUA, Own, Steps, ledger_key, ledger_script, snapshot};
pub use link::{Link, LinkOptions};
pub use live::{identity_key, received_key};
pub use peer::{Address, Peer, PeerStatus};
pub use reach::Local;
pub use replica::{REPLICA_LUA, Replicated, replica_script};
pub use shared::{Kind, Noted, RegionPart, Regions, Shared};
