//! Where sluice keeps rate-limit state, and the limiter that uses it.
//!
//! - [`store`]: the [`Store`] trait — one call per decision, every rule at
//!   once, all or nothing.
//! - [`memory`]: the embedded backend.
//! - [`standalone`]: the Redis backend (one node); [`cluster`]: the Redis
//!   Cluster backend; [`script`]: the Lua scripts they run, one call per
//!   decision (two with a valve on a cluster).
//! - [`clock`]: the time stores decide on.
//! - [`limiter`]: request → rules → store → decision, with the failure
//!   handling around the store call: [`limiter::breaker`] (circuit
//!   breaker), [`limiter::denials`] (over-limit cache), the time budget and
//!   the failure policy.
//! - [`telemetry`]: the hooks metrics are fed from.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

mod bucket;
pub mod clock;
pub mod cluster;
pub mod limiter;
pub mod memory;
pub mod script;
pub mod standalone;
pub mod store;
pub mod telemetry;

pub use clock::{Clock, ManualClock, SystemClock};
pub use cluster::ClusterStore;
pub use limiter::breaker::{BreakerConfig, BreakerState};
pub use limiter::{Limiter, LimiterOptions};
pub use memory::MemoryStore;
pub use script::{Heartbeat, KeySet, TimeSource, Valve};
pub use standalone::{ConnectOptions, RedisStore};
pub use store::{Batch, Partition, Store, StoreError};
pub use telemetry::{NoTelemetry, Telemetry};
