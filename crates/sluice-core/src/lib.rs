//! The pure core of sluice: what a limit is and how a decision is made.
//!
//! Nothing here performs I/O or reads a clock; time is always passed in.
//!
//! The words every module uses sit at the bottom and import nothing above
//! them: [`scope`] (where a rule applies), [`reason`] (why a request was
//! denied), [`bound`] (a rule bound to its place in the policy),
//! [`number`] (numbers as errors show them). Above them:
//!
//! - [`duration`]: `500ms`, `1s`, `1m`… as milliseconds.
//! - [`rule`]: an algorithm with its validated parameters.
//! - [`algorithm`]: each algorithm as a pure state transition.
//! - [`config`]: the YAML configuration, parsed and validated with
//!   `file:line:column` errors.
//! - [`request`]: a request's bounds, checked once at the edge.
//! - [`route`]: one spelling per route, so no spelling escapes a limit.
//! - [`policy`]: the configuration compiled into a lookup structure: which
//!   rules apply to a tenant, route and subject, and the class a decision
//!   is counted under; [`valve`]: a fair valve's reserves, compiled.
//! - [`decision`]: per-rule outcomes combined into one all-or-nothing
//!   decision with its reason.
//! - [`descriptors`]: Envoy descriptors matched against an
//!   envoyproxy/ratelimit configuration ([`config::envoy`] reads it).
//! - [`headers`]: the IETF `RateLimit` and `RateLimit-Policy` fields.
//! - [`keys`]: opaque storage keys derived with HMAC-SHA256.
//! - [`bytes`]: byte comparisons for short ids, without libc's `memcmp`.
//! - [`adaptive`]: valves that follow their downstream: their terms,
//!   priorities, and the law that moves their effective limit.
//! - [`regions`]: one budget across regions: each region's part of a
//!   shared rule's window, and the grants that move parts between them.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod adaptive;
pub mod algorithm;
pub mod bound;
pub mod bytes;
pub mod config;
pub mod decision;
pub mod descriptors;
pub mod duration;
pub mod headers;
pub mod keys;
pub mod number;
pub mod policy;
pub mod reason;
pub mod regions;
pub mod request;
pub mod route;
pub mod rule;
pub mod scope;
pub mod status;
pub mod tolerance;
pub mod valve;

pub use algorithm::{Outcome, State, Step};
pub use config::Config;
pub use decision::{Decision, Reason};
pub use policy::{BoundRule, Policy, Scope};
pub use request::{Request, RequestError};
pub use rule::{Algorithm, Rule};
