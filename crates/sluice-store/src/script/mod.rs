//! The Lua script that decides a batch inside Redis, and how a batch becomes
//! one invocation of it.
//!
//! `decide.lua` implements every algorithm of `sluice-core` with the same
//! integer arithmetic; a decision is one `EVALSHA` whatever the number of
//! rules. Keys are opaque (see `sluice_core::keys`); the script never sees
//! a tenant id, subject, route or plan name.

use std::sync::Arc;

use sluice_core::algorithm::{
    State, concurrency, fixed_window, gcra, sliding_log, sliding_window, token_bucket,
};
use sluice_core::decision::Outcomes;
use sluice_core::keys::{Keyer, Tag};
use sluice_core::{Algorithm, BoundRule, Outcome};
use smallvec::SmallVec;

mod function;

pub use function::Decide;

use crate::clock::Clock;
use crate::store::{Batch, Partition, StoreError};

/// The decision's code: the helpers and `decide(KEYS, ARGV)`.
const DECIDE_BODY: &str = concat!(include_str!("common.lua"), include_str!("decide.lua"));

/// The decision script's source (as `EVAL` runs it; see [`Decide`] for the
/// Redis Function).
pub const DECIDE_LUA: &str = concat!(
    include_str!("common.lua"),
    include_str!("decide.lua"),
    "return decide(KEYS, ARGV)\n"
);

/// The heartbeat script's source: instances count themselves so that
/// `on_error: local` can divide limits among them.
pub const HEARTBEAT_LUA: &str = include_str!("heartbeat.lua");

/// What a heartbeat learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Live instances sharing this one's pepper (this one included).
    pub live: u64,
    /// Live instances on the same store and prefix with another pepper.
    pub other_peppers: u64,
}

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
    /// The keys of every rule of `batch` under `keyer`; global valves in
    /// the shard `valve` picks (the whole valve on one node).
    pub fn keys(keyer: &Keyer, batch: &Batch<'_>, valve: Valve) -> Keys {
        // Most rules of a batch share the request's tenant tag: compute it
        // once, and others (Envoy descriptors) as they come.
        let tenant_tag = keyer.tenant_tag(batch.tenant, batch.shard);
        let tag_of = |tenant: &str, rule: &BoundRule| {
            // A duplicate guard's and a concurrency rule's keys stay on
            // shard 0 (see bucket.rs).
            if (rule.scope() == sluice_core::Scope::Dedupe || rule.rule().is_concurrency())
                && batch.shard != 0
            {
                keyer.tenant_tag(tenant, 0)
            } else if tenant == batch.tenant {
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
                Partition::Global => {
                    keyer.key(&keyer.global_tag(rule, valve.shard(rule)), rule, None)
                }
                Partition::Tenant(tenant) => keyer.key(&tag_of(tenant, rule), rule, None),
                Partition::Subject(tenant, subject) => {
                    keyer.key(&tag_of(tenant, rule), rule, Some(subject))
                }
            })
            .collect()
    }

    /// The hash tag of a tenant's keys in `shard`.
    pub fn tenant_tag(&self, tenant: &str, shard: u16) -> Tag {
        self.current.tenant_tag(tenant, shard)
    }

    /// Refreshes `instance`'s heartbeat (lasting `ttl_ms`, announcing the
    /// pepper fingerprints) on `connection`, within `timeout_ms` (at least
    /// 250 ms).
    pub(crate) async fn heartbeat<C: redis::aio::ConnectionLike + Send>(
        &self,
        connection: &mut C,
        instance: &str,
        ttl_ms: u64,
        timeout_ms: u64,
    ) -> Result<Heartbeat, StoreError> {
        let mut eval = redis::cmd("EVAL");
        eval.arg(HEARTBEAT_LUA)
            .arg(1)
            .arg(instances_key(self.current.prefix()))
            .arg(instance)
            .arg(ttl_ms)
            .arg(self.current.fingerprint())
            .arg(
                self.previous
                    .as_ref()
                    .map(Keyer::fingerprint)
                    .unwrap_or_default(),
            );
        let call = eval.query_async::<(u64, u64)>(connection);
        match tokio::time::timeout(std::time::Duration::from_millis(timeout_ms.max(250)), call)
            .await
        {
            Ok(result) => result
                .map(|(live, other_peppers)| Heartbeat {
                    live,
                    other_peppers,
                })
                .map_err(|e| store_error(&e, timeout_ms)),
            Err(_) => Err(StoreError::Timeout(timeout_ms)),
        }
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
        Algorithm::Concurrency => 6,
    }
}

/// Whether a rule's state is a sorted set (sliding_log's entries,
/// concurrency's leases) rather than a string.
pub fn is_sorted_set(rule: &BoundRule) -> bool {
    matches!(
        rule.rule().algorithm(),
        Algorithm::SlidingLog | Algorithm::Concurrency
    )
}

/// A lease as the scripts name it: 32 hex digits ("" for none).
pub fn lease_arg(lease: Option<u128>) -> String {
    lease.map_or_else(String::new, |id| format!("{id:032x}"))
}

/// The script's "now" argument: "" for the server's clock.
fn now_arg(time: &TimeSource) -> String {
    match time {
        TimeSource::Server => String::new(),
        TimeSource::Client(clock) => clock.now_ms().to_string(),
    }
}

/// The rules of a batch one script call decides: all of them on one Redis
/// node; on Redis Cluster, those sharing a slot.
#[derive(Debug, Clone, Copy)]
pub struct Selection<'s> {
    /// Indices into the batch's rules; `None` for all of them.
    pub indices: Option<&'s [usize]>,
    /// Global valves are split into this many shares (Redis Cluster).
    pub valve_parts: u64,
}

impl Selection<'_> {
    /// Every rule, valves whole.
    pub const ALL: Selection<'static> = Selection {
        indices: None,
        valve_parts: 1,
    };

    fn each(&self, rules: usize) -> impl Iterator<Item = usize> + '_ {
        let all = self.indices.is_none().then_some(0..rules);
        all.into_iter()
            .flatten()
            .chain(self.indices.into_iter().flatten().copied())
    }

    fn len(&self, rules: usize) -> usize {
        self.indices.map_or(rules, <[usize]>::len)
    }
}

/// Which shard of each global valve a call uses: on Redis Cluster a valve
/// is split over up to `shards` keys (fewer when its limit is smaller), and
/// successive calls take turns.
#[derive(Debug, Clone, Copy)]
pub struct Valve {
    /// This call's turn.
    pub turn: u64,
    /// The most shards a valve is split over.
    pub shards: u64,
}

impl Valve {
    /// Valves whole, on one key each (one Redis node).
    pub const WHOLE: Valve = Valve { turn: 0, shards: 1 };

    fn shard(&self, rule: &BoundRule) -> u16 {
        (self.turn % rule.rule().shares(self.shards)) as u16
    }
}

/// The rule as a call enforces it: on Redis Cluster, a valve's share.
pub(crate) fn enforced(rule: &BoundRule, valve_parts: u64) -> sluice_core::Rule {
    if rule.scope() == sluice_core::Scope::Global {
        rule.rule().share(rule.rule().shares(valve_parts))
    } else {
        *rule.rule()
    }
}

/// One decision's keys and arguments for the decision script, owned so
/// that a call can go out from a task of its own.
#[derive(Debug, Clone)]
pub struct DecideCall {
    keys: Vec<String>,
    now: String,
    lease: String,
    /// One packed argument per rule (see [`pack_rule`]).
    rules: SmallVec<[PackedRule; 2]>,
}

/// A rule as the decision script takes it: struct `'<BBBdddd'`.
type PackedRule = [u8; 35];

/// Packs what the decision script takes of a rule: algorithm, aligned and
/// shadow as bytes, then limit, per, burst and cost as little-endian
/// doubles (every one is below 2^53, so exact; see `sluice_core::rule`).
fn pack_rule(values: [u64; 6], shadow: bool) -> PackedRule {
    let [algorithm, limit, per, burst, aligned, cost] = values;
    let mut packed = [0; 35];
    packed[0] = algorithm as u8;
    packed[1] = aligned as u8;
    packed[2] = u8::from(shadow);
    for (slot, v) in packed[3..]
        .chunks_exact_mut(8)
        .zip([limit, per, burst, cost])
    {
        debug_assert!(v < 1 << 53, "{v} is not exact as a double");
        slot.copy_from_slice(&(v as f64).to_le_bytes());
    }
    packed
}

impl DecideCall {
    /// The selected rules of a batch: `keys` are theirs (in selection
    /// order), `previous` the same buckets under the previous pepper when
    /// rotating.
    pub fn new(
        batch: &Batch<'_>,
        selection: Selection<'_>,
        mut keys: Vec<String>,
        previous: Option<&[String]>,
        time: &TimeSource,
    ) -> DecideCall {
        let rules = selection
            .each(batch.rules.len())
            .map(|i| {
                pack_rule(
                    rule_values(batch, i, selection.valve_parts),
                    batch.rules[i].shadow(),
                )
            })
            .collect();
        keys.extend(previous.into_iter().flatten().cloned());
        DecideCall {
            keys,
            now: now_arg(time),
            lease: lease_arg(batch.lease),
            rules,
        }
    }

    /// Appends the key count, the keys and the arguments to `cmd` (an
    /// `FCALL`, `EVALSHA` or `EVAL` named already).
    pub fn fill(&self, cmd: &mut redis::Cmd) {
        cmd.arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.now)
            .arg(&self.lease);
        for rule in &self.rules {
            cmd.arg(&rule[..]);
        }
    }
}

fn evalsha_and_eval(
    script: &redis::Script,
    source: &str,
    keys: &[String],
    args: &[Vec<u8>],
) -> (redis::Cmd, redis::Cmd) {
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha.arg(script.get_hash());
    let mut eval = redis::cmd("EVAL");
    eval.arg(source);
    for cmd in [&mut evalsha, &mut eval] {
        cmd.arg(keys.len()).arg(keys);
        for arg in args {
            cmd.arg(arg.as_slice());
        }
    }
    (evalsha, eval)
}

/// The refund as `EVALSHA` and as `EVAL`, from [`refund_args`], giving
/// back `lease` of the concurrency rules among them.
pub fn refund_commands(
    script: &redis::Script,
    keys: &[String],
    args: &[u64],
    lease: Option<u128>,
    time: &TimeSource,
) -> (redis::Cmd, redis::Cmd) {
    let (n, rules) = args.split_first().expect("refund_args starts with n");
    let mut all: Vec<Vec<u8>> = Vec::with_capacity(args.len() + 2);
    all.push(now_arg(time).into_bytes());
    all.push(n.to_string().into_bytes());
    all.push(lease_arg(lease).into_bytes());
    all.extend(rules.iter().map(|a| a.to_string().into_bytes()));
    evalsha_and_eval(script, REFUND_LUA, keys, &all)
}

/// The refund script's source.
pub const REFUND_LUA: &str = concat!(include_str!("common.lua"), include_str!("refund.lua"));

/// The refund script's arguments giving back what the selected rules
/// consumed, given the admission times the decision returned. Owned, so a
/// refund can be sent after the batch is gone.
pub fn refund_args(batch: &Batch<'_>, selection: Selection<'_>, admitted_at: &[u64]) -> Vec<u64> {
    let mut args = vec![selection.len(batch.rules.len()) as u64];
    for (i, at) in selection.each(batch.rules.len()).zip(admitted_at) {
        args.extend(rule_values(batch, i, selection.valve_parts));
        args.push(*at);
    }
    args
}

/// What both scripts take of rule `i` of a batch: algorithm, limit, per,
/// burst, aligned, cost.
fn rule_values(batch: &Batch<'_>, i: usize, valve_parts: u64) -> [u64; 6] {
    let rule = enforced(&batch.rules[i], valve_parts);
    [
        u64::from(algorithm_code(rule.algorithm())),
        rule.limit(),
        rule.period_ms(),
        rule.burst(),
        u64::from(rule.aligned()),
        batch.cost_of(i),
    ]
}

/// Values per rule in the decision script's reply (after the admission
/// time).
const REPLY_WIDTH: usize = 4;

/// The decision script's reply, read: each rule's outcome, and the
/// admission time (ms) a refund of this decision names.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// One per rule decided, in call order.
    pub outcomes: Outcomes,
    /// When the script decided, on its clock.
    pub admitted_at: u64,
}

/// Reads the decision script's reply (little-endian doubles: the admission
/// time, then allowed, remaining, reset and retry per rule; see decide.lua).
pub fn reply(bytes: &[u8], rules: usize) -> Result<Reply, StoreError> {
    if bytes.len() != 8 * (1 + REPLY_WIDTH * rules) {
        return Err(StoreError::Unavailable(format!(
            "unexpected script reply: {} bytes for {rules} rules",
            bytes.len()
        )));
    }
    // Whole numbers below 2^53 as the script computes them; anything else
    // (which it never sends) saturates rather than wraps.
    let values: SmallVec<[u64; 17]> = bytes
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as u64)
        .collect();
    let (&admitted_at, rules) = values.split_first().expect("at least the time");
    Ok(Reply {
        outcomes: rules
            .chunks_exact(REPLY_WIDTH)
            .map(|v| Outcome {
                allowed: v[0] == 1,
                remaining: u32::try_from(v[1]).unwrap_or(u32::MAX),
                reset_after_ms: v[2],
                retry_after_ms: v[3],
            })
            .collect(),
        admitted_at,
    })
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
        (Algorithm::Concurrency, Raw::Log(members)) => {
            State::Leases(Box::new(concurrency::Leases::from_held(
                members.iter().filter_map(|(id, expires)| {
                    Some((*expires, u128::from_str_radix(id, 16).ok()?))
                }),
            )))
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn doubles(values: &[u64]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|v| (*v as f64).to_le_bytes())
            .collect()
    }

    #[test]
    fn a_reply_reads_as_the_time_then_four_values_per_rule() {
        let bytes = doubles(&[1_764_600_000_123, 1, 9, 100, 0, 0, 0, 250, 40]);
        let read = reply(&bytes, 2).unwrap();
        assert_eq!(read.admitted_at, 1_764_600_000_123);
        assert_eq!(
            read.outcomes.as_slice(),
            [
                Outcome {
                    allowed: true,
                    remaining: 9,
                    reset_after_ms: 100,
                    retry_after_ms: 0
                },
                Outcome {
                    allowed: false,
                    remaining: 0,
                    reset_after_ms: 250,
                    retry_after_ms: 40
                },
            ]
        );
    }

    #[test]
    fn a_reply_of_another_length_is_an_error_not_a_guess() {
        let bytes = doubles(&[1, 1, 9, 100, 0]);
        let error = reply(&bytes, 2).unwrap_err();
        assert!(
            error.to_string().contains("40 bytes for 2 rules"),
            "{error}"
        );
        assert!(reply(&bytes[..39], 1).is_err());
    }

    #[test]
    fn a_packed_rule_carries_its_numbers_exactly() {
        let packed = pack_rule([5, 1_000_000_000, 366 * 86_400_000, 7, 1, 1_000_000], true);
        assert_eq!(packed[..3], [5, 1, 1]);
        let numbers: Vec<u64> = packed[3..]
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()) as u64)
            .collect();
        assert_eq!(numbers, [1_000_000_000, 366 * 86_400_000, 7, 1_000_000]);
    }
}
