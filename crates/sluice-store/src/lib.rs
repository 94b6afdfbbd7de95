//! Where sluice keeps rate-limit state, and the limiter that uses it.
//!
//! - [`store`]: the [`Store`] trait — one call per decision, every rule at
//!   once, all or nothing.
//! - [`memory`]: the embedded backend.
//! - [`redis`]: the Redis backends — one node ([`RedisStore`]) and Redis
//!   Cluster ([`ClusterStore`]), one generic store underneath — and the Lua
//!   scripts they run, each beside its encoder and reply parser: one call
//!   per decision (two with a valve on a cluster). All three come with the
//!   `redis` feature (on by default): an app that limits in memory only
//!   builds without the Redis client and TLS (`default-features = false`).
//! - [`clock`]: the time stores decide on.
//! - [`limiter`]: request → rules → store → decision, with the failure
//!   handling around the store call: [`limiter::breaker`] (circuit
//!   breaker), [`limiter::denials`] (over-limit cache), the time budget and
//!   the failure policy.
//! - [`adjust`]: changes after the fact (debits, give-backs, settle
//!   markers) as stores apply them.
//! - [`telemetry`]: the hooks metrics are fed from; [`trace`]: the spans
//!   traces are made of.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod adjust;
mod bucket;
pub mod clock;
mod error;
pub mod limiter;
#[cfg(feature = "redis")]
mod local_connection;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
pub mod store;
pub mod telemetry;
pub mod trace;

pub use adjust::{Adjusted, Change, Marker, MarkerAnswer};
pub use clock::{Clock, ManualClock, SystemClock};
pub use limiter::breaker::{BreakerConfig, BreakerState};
pub use limiter::{
    Adjustment, AfterError, Keyed, Limiter, LimiterOptions, Reservation, ValveLevel,
};
pub use memory::MemoryStore;
#[cfg(feature = "redis")]
pub use redis::cluster::ClusterStore;
#[cfg(feature = "redis")]
pub use redis::node::{ConnectOptions, RedisStore};
#[cfg(feature = "redis")]
pub use redis::{Heartbeat, KeySet, TimeSource, Valve};
pub use store::{Batch, Decided, Partition, Peeked, PeekedRule, Store, StoreError};
pub use telemetry::{NoTelemetry, Telemetry};
