//! sluice next to its peers. See `benches/embedded.rs` (in process) and
//! `src/bin/redis_peers.rs` (on one Redis), and docs/BENCHMARKS.md.
