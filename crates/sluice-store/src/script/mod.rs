//! The Lua script that decides a batch inside Redis, and how a batch becomes
//! one invocation of it.
//!
//! `decide.lua` implements every algorithm of `sluice-core` with the same
//! integer arithmetic; a decision is one `EVALSHA` whatever the number of
//! rules. Keys are opaque (see `sluice_core::keys`); the script never sees
//! a tenant id, subject, route or plan name.

use std::sync::Arc;

use sluice_core::algorithm::{
    State, fixed_window, gcra, sliding_log, sliding_window, token_bucket,
};
use sluice_core::decision::Outcomes;
use sluice_core::keys::{Keyer, Tag};
use sluice_core::{Algorithm, BoundRule, Outcome};
use smallvec::SmallVec;

use crate::clock::Clock;
use crate::store::{Batch, Partition, StoreError};

/// The decision script's source.
pub const DECIDE_LUA: &str = include_str!("decide.lua");

/// The heartbeat script's source: instances count themselves so that
/// `on_error: local` can divide limits among them.
pub const HEARTBEAT_LUA: &str = include_str!("heartbeat.lua");

/// The key of the live-instances set.
pub fn instances_key(prefix: &str) -> String {
    format!("{prefix}:instances")
}

/// Keys for one decision, one per rule.
pub type Keys = SmallVec<[String; 4]>;

/// How keys are derived: the current pepper, and the previous one while
/// rotating.
#[derive(Debug, Clone)]
pub struct KeySet {
    /// Keys under the current pepper.
    pub current: Keyer,
    /// Keys under the pepper being rotated away from.
    pub previous: Option<Keyer>,
}

impl KeySet {
    /// The keys of every rule of `batch` under `keyer`.
    pub fn keys(keyer: &Keyer, batch: &Batch<'_>) -> Keys {
        // Most rules of a batch share the request's tenant tag: compute it
        // once, and others (Envoy descriptors) as they come.
        let tenant_tag = keyer.tenant_tag(batch.tenant, batch.shard);
        let tag_of = |tenant: &str| {
            if tenant == batch.tenant {
                tenant_tag
            } else {
                keyer.tenant_tag(tenant, batch.shard)
            }
        };
        batch
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| match batch.partition(i, rule) {
                Partition::Global => keyer.key(&keyer.global_tag(rule, 0), rule, None),
                Partition::Tenant(tenant) => keyer.key(&tag_of(tenant), rule, None),
                Partition::Subject(tenant, subject) => {
                    keyer.key(&tag_of(tenant), rule, Some(subject))
                }
            })
            .collect()
    }

    /// The hash tag of a tenant's keys in `shard`.
    pub fn tenant_tag(&self, tenant: &str, shard: u16) -> Tag {
        self.current.tenant_tag(tenant, shard)
    }
}

/// Where the script's "now" comes from.
#[derive(Clone, Default)]
pub enum TimeSource {
    /// Redis's own clock (`TIME`): application clocks may drift freely.
    #[default]
    Server,
    /// A clock of the caller's, sent with every call. For tests only: it
    /// lets a test drive Redis and the memory store through the same times.
    Client(Arc<dyn Clock>),
}

impl std::fmt::Debug for TimeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimeSource::Server => "Server",
            TimeSource::Client(_) => "Client",
        })
    }
}

fn algorithm_code(algorithm: Algorithm) -> u8 {
    match algorithm {
        Algorithm::Gcra => 1,
        Algorithm::TokenBucket => 2,
        Algorithm::SlidingLog => 3,
        Algorithm::SlidingWindow => 4,
        Algorithm::FixedWindow => 5,
    }
}

/// Adds a batch's keys and arguments to an invocation of the script.
pub fn prepare<'s>(
    script: &'s redis::Script,
    batch: &Batch<'_>,
    keys: &[String],
    previous: Option<&[String]>,
    time: &TimeSource,
) -> redis::ScriptInvocation<'s> {
    let mut invocation = script.prepare_invoke();
    for key in keys {
        invocation.key(key);
    }
    if let Some(previous) = previous {
        for key in previous {
            invocation.key(key);
        }
    }
    match time {
        TimeSource::Server => invocation.arg(""),
        TimeSource::Client(clock) => invocation.arg(clock.now_ms()),
    };
    invocation
        .arg(batch.rules.len())
        .arg(u8::from(previous.is_some()));
    for (i, rule) in batch.rules.iter().enumerate() {
        let r = rule.rule();
        invocation
            .arg(algorithm_code(r.algorithm()))
            .arg(r.limit())
            .arg(r.period_ms())
            .arg(r.burst())
            .arg(u8::from(r.aligned()))
            .arg(batch.cost_of(i))
            .arg(u8::from(rule.shadow()));
    }
    invocation
}

/// Reads the script's reply: four integers per rule.
pub fn outcomes(reply: &[i64], rules: usize) -> Result<Outcomes, StoreError> {
    if reply.len() != 4 * rules {
        return Err(StoreError::Unavailable(format!(
            "unexpected script reply: {} values for {rules} rules",
            reply.len()
        )));
    }
    let nonneg = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(reply
        .chunks_exact(4)
        .map(|v| Outcome {
            allowed: v[0] == 1,
            remaining: u32::try_from(nonneg(v[1])).unwrap_or(u32::MAX),
            reset_after_ms: nonneg(v[2]),
            retry_after_ms: nonneg(v[3]),
        })
        .collect())
}

/// What `GET` (or `ZRANGE … WITHSCORES` for sliding_log) returned for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Raw {
    /// The key does not exist.
    Missing,
    /// A string value.
    Value(String),
    /// Sorted-set members with their scores.
    Log(Vec<(String, u64)>),
}

/// Decodes a stored value into the state `sluice-core` decides on; a value
/// that does not parse reads as fresh.
pub fn decode(rule: &BoundRule, raw: &Raw) -> State {
    let numbers = |v: &str| -> Vec<u64> { v.split(':').filter_map(|p| p.parse().ok()).collect() };
    match (rule.rule().algorithm(), raw) {
        (_, Raw::Missing) => State::Fresh,
        (Algorithm::SlidingLog, Raw::Log(members)) => {
            let mut entries: Vec<(u64, u64)> = Vec::new();
            for (_, at) in members {
                match entries.last_mut() {
                    Some((last, units)) if last == at => *units += 1,
                    _ => entries.push((*at, 1)),
                }
            }
            State::SlidingLog(Box::new(sliding_log::Log::from_entries(entries)))
        }
        (algorithm, Raw::Value(v)) => match (algorithm, numbers(v).as_slice()) {
            (Algorithm::Gcra, [ms]) => State::Gcra(gcra::Tat { ms: *ms, frac: 0 }),
            (Algorithm::Gcra, [ms, frac]) => State::Gcra(gcra::Tat {
                ms: *ms,
                frac: *frac,
            }),
            (Algorithm::TokenBucket, [scaled_tokens, last_ms]) => {
                State::TokenBucket(token_bucket::Bucket {
                    scaled_tokens: *scaled_tokens,
                    last_ms: *last_ms,
                })
            }
            (Algorithm::FixedWindow, [start_ms, count]) => {
                State::FixedWindow(fixed_window::Window {
                    start_ms: *start_ms,
                    count: *count,
                })
            }
            (Algorithm::SlidingWindow, [start_ms, prev, cur]) => {
                State::SlidingWindow(sliding_window::Windows {
                    start_ms: *start_ms,
                    prev: *prev,
                    cur: *cur,
                })
            }
            _ => State::Fresh,
        },
        _ => State::Fresh,
    }
}

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
