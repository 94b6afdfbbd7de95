//! The Redis backends and their wire layer: what the Lua scripts are sent
//! and what they answer, each script beside its Rust encoder and reply
//! parser.
//!
//! - [`node`]: the store on one Redis node; [`cluster`]: the store on Redis
//!   Cluster (slot grouping, reserve then valve).
//! - [`keys`]: which key and record each rule of a batch uses.
//! - [`args`]: the argument layout the decision and the refund share (a
//!   rule packed, the call's header).
//! - [`decide`] (`decide.lua`): one batch decided in one call; [`function`]
//!   sends it as a Redis Function where it can, a script elsewhere.
//! - [`refund`] (`refund.lua`): gives back what an admission consumed;
//!   releases leases.
//! - [`adjust`] (`adjust.lua`): debits and give-backs after the fact, once
//!   per settle marker.
//! - [`heartbeat`] (`heartbeat.lua`): instances counting themselves.
//! - [`adapt`] (`adapt.lua`): an adaptive valve's law, in its own key.
//! - [`inspect`]: a key's stored state read back and decoded.
//! - `store`: the Redis store both backends are, generic over how Redis is
//!   reached (one node, a cluster): pings, heartbeats, peeks, refunds.
//!
//! `common.lua` holds the helpers every script starts with.

pub mod adapt;
pub mod adjust;
pub mod args;
pub mod cluster;
pub mod decide;
pub mod function;
pub mod heartbeat;
pub mod inspect;
pub mod keys;
pub mod node;
pub mod refund;
pub mod regions;
pub(crate) mod store;

pub use adjust::{ADJUST_LUA, AdjustCall, AdjustReply, adjust_reply};
pub use args::{PackedRules, Selection, TimeSource, lease_arg};
pub use decide::{COMMON_LUA, DECIDE_LUA, DecideCall, Reply, reply};
pub use function::Decide;
pub use heartbeat::{HEARTBEAT_LUA, Heartbeat, instances_key};
pub use inspect::{RECORD_BYTES, Raw, decode, find_record, raw, read_command, time_ms};
pub use keys::{Buckets, KeySet, Keys, Valve, is_sorted_set, own_key};
pub use refund::{REFUND_LUA, RefundCall};

pub(crate) use args::enforced;

use crate::store::StoreError;

/// A Redis failure as the limiter sees it. The message never contains a
/// key's plain inputs (keys are opaque) nor credentials.
pub fn store_error(error: &redis::RedisError, timeout_ms: u64) -> StoreError {
    if error.is_timeout() {
        StoreError::Timeout(timeout_ms)
    } else if error.kind() == redis::ErrorKind::AuthenticationFailed {
        StoreError::Refused(error.to_string())
    } else {
        StoreError::Unavailable(error.to_string())
    }
}
