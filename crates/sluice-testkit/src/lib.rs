//! Real Redis servers, and the other real parts, for sluice's tests.
//!
//! Every test that needs Redis starts its own `redis-server` here, on a free
//! loopback port, with persistence off and its files in a temporary
//! directory, and stops it when dropped. Nothing here touches a Redis the
//! test did not start. When `redis-server` is not installed the test fails
//! with instructions; it never skips.
//!
//! One file per thing a test starts:
//!
//! - `server`: one `redis-server` ([`RedisServer`]), plain or with TLS;
//! - `cluster`: a Redis Cluster of them ([`RedisCluster`]), its topology
//!   ([`SeenNode`]), failover and resharding;
//! - `ports`: free loopback ports for them ([`free_port`],
//!   [`free_node_ports`]);
//! - `replay`: load against a server ([`replay`], [`while_threads_stand`]);
//! - `monitor`: what a server saw ([`Monitor`], [`command_calls`],
//!   [`command_usec`]);
//! - `signal`: a process stopped, waited on until it is, or continued
//!   ([`signal()`]);
//! - `proxy`: a link between regions, delayed and cuttable
//!   ([`DelayProxy`]);
//! - `downstream`: an HTTP service of limited capacity, whose latency
//!   rises past it ([`Downstream`]);
//! - `otlp`: a collector's trace service, over gRPC and HTTP, keeping the
//!   spans it receives ([`OtlpReceiver`]).

#![forbid(unsafe_code)]

mod cluster;
mod downstream;
mod monitor;
mod otlp;
mod ports;
mod proxy;
mod replay;
mod server;
mod signal;

pub use cluster::{RedisCluster, SeenNode};
pub use downstream::Downstream;
pub use monitor::{Monitor, command_calls, command_usec};
pub use otlp::{OtlpReceiver, ReceivedSpan};
pub use ports::{free_node_ports, free_port};
pub use proxy::DelayProxy;
pub use replay::{replay, while_threads_stand};
pub use server::RedisServer;
pub use signal::signal;
