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
use sluice_core::keys::{Keyer, Record, Tag};
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

/// Keys for one decision, one per rule (rules of one group share theirs).
pub type Keys = SmallVec<[String; 4]>;

/// Where each rule of a batch keeps its state: its key (the group's, for
/// rules whose state is a few numbers) and the name of its record there.
#[derive(Debug, Clone, Default)]
pub struct Buckets {
    /// One per rule.
    pub keys: Keys,
    /// One per rule (unused for rules whose state is a set).
    pub records: SmallVec<[Record; 4]>,
}

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
    /// The keys and records of every rule of `batch` under `keyer`; global
    /// valves in the shard `valve` picks (the whole valve on one node).
    pub fn keys(keyer: &Keyer, batch: &Batch<'_>, valve: Valve) -> Buckets {
        // Most rules of a batch share the request's tenant tag: compute it
        // once, and others (Envoy descriptors) as they come.
        let tenant_tag = keyer.tenant_tag(batch.tenant, batch.shard);
        let tag_of = |tenant: &str, rule: &BoundRule| {
            if rule.on_first_shard() && batch.shard != 0 {
                keyer.tenant_tag(tenant, 0)
            } else if tenant == batch.tenant {
                tenant_tag
            } else {
                keyer.tenant_tag(tenant, batch.shard)
            }
        };
        let mut buckets = Buckets::default();
        // (tag, subject) of each rule so far, to find a group's key made
        // already.
        let mut seen: SmallVec<[(Tag, Option<&str>); 4]> = SmallVec::new();
        for (i, rule) in batch.rules.iter().enumerate() {
            let (tag, subject) = match batch.partition(i, rule) {
                Partition::Global => (keyer.global_tag(rule, valve.shard(rule)), None),
                Partition::Tenant(tenant) => (tag_of(tenant, rule), None),
                Partition::Subject(tenant, subject) => (tag_of(tenant, rule), Some(subject)),
            };
            if is_sorted_set(rule) {
                buckets.keys.push(keyer.key(&tag, rule, subject));
                buckets.records.push(Record::default());
            } else {
                let made = (0..i).find(|&j| {
                    seen[j] == (tag, subject)
                        && !is_sorted_set(&batch.rules[j])
                        && batch.rules[j].group() == rule.group()
                });
                buckets.keys.push(match made {
                    Some(j) => buckets.keys[j].clone(),
                    None => keyer.group_key(&tag, rule, subject),
                });
                buckets.records.push(keyer.record(&tag, rule, subject));
            }
            seen.push((tag, subject));
        }
        buckets
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
    rule.rule().algorithm().keeps_a_set()
}

/// A lease as the scripts name it: 32 hex digits ("" for none).
pub fn lease_arg(lease: Option<u128>) -> String {
    lease.map_or_else(String::new, |id| format!("{id:032x}"))
}

/// The decision's header (its second argument, left out when `""`): `""`
/// for the server's clock and no lease (what the service sends but for
/// concurrency rules), else `"NOW;LEASE"`.
fn header(time: &TimeSource, lease: Option<u128>) -> String {
    match (time, lease) {
        (TimeSource::Server, None) => String::new(),
        _ => format!("{};{}", now_arg(time), lease_arg(lease)),
    }
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
    /// The distinct keys, then (while rotating) the same under the
    /// previous pepper.
    keys: Vec<String>,
    /// `""` (not sent unless rotating), or `"NOW;LEASE"` (see decide.lua).
    header: String,
    /// Every rule packed, one after another (see [`pack_rule`]); one or
    /// two rules without an allocation.
    rules: SmallVec<[u8; 2 * RULE_WIDTH]>,
    /// While rotating, each rule's record name under the previous pepper,
    /// in rule order.
    previous: Option<Vec<u8>>,
}

/// A packed rule's bytes (struct `'<BBBHddddc8'` in decide.lua).
const RULE_WIDTH: usize = 45;

/// Appends what the decision script takes of a rule to `packed`:
/// algorithm, aligned and shadow as bytes, the index of its key (from 1)
/// as a 16-bit integer, then limit, per, burst and cost as little-endian
/// doubles (every one is below 2^53, so exact; see `sluice_core::rule`),
/// then its record's name.
fn pack_rule(
    packed: &mut SmallVec<[u8; 2 * RULE_WIDTH]>,
    values: [u64; 6],
    shadow: bool,
    key: u16,
    record: Record,
) {
    let [algorithm, limit, per, burst, aligned, cost] = values;
    packed.extend_from_slice(&[algorithm as u8, aligned as u8, u8::from(shadow)]);
    packed.extend_from_slice(&key.to_le_bytes());
    for v in [limit, per, burst, cost] {
        debug_assert!(v < 1 << 53, "{v} is not exact as a double");
        packed.extend_from_slice(&(v as f64).to_le_bytes());
    }
    packed.extend_from_slice(&record.0);
}

impl DecideCall {
    /// The selected rules of a batch: `keys` and `records` are theirs (in
    /// selection order), `previous` the same buckets under the previous
    /// pepper when rotating. Rules sharing a key name it once.
    pub fn new(
        batch: &Batch<'_>,
        selection: Selection<'_>,
        keys: Vec<String>,
        records: &[Record],
        previous: Option<&Buckets>,
        time: &TimeSource,
    ) -> DecideCall {
        let mut distinct: Vec<String> = Vec::with_capacity(keys.len() * 2);
        // Per rule, the index of its key among the distinct ones (from 1);
        // per distinct key, the first rule that names it.
        let mut index: SmallVec<[u16; 4]> = SmallVec::new();
        let mut first: SmallVec<[usize; 4]> = SmallVec::new();
        // A call has far fewer keys than 2^16 (at most 256 Envoy
        // descriptors, each with a few rules).
        debug_assert!(keys.len() < usize::from(u16::MAX));
        for (j, key) in keys.into_iter().enumerate() {
            match distinct.iter().position(|k| *k == key) {
                Some(p) => index.push(p as u16 + 1),
                None => {
                    distinct.push(key);
                    first.push(j);
                    index.push(distinct.len() as u16);
                }
            }
        }
        if let Some(previous) = previous {
            distinct.extend(first.iter().map(|&j| previous.keys[j].clone()));
        }
        let mut rules = SmallVec::with_capacity(RULE_WIDTH * index.len());
        for (j, i) in selection.each(batch.rules.len()).enumerate() {
            let values = rule_values(batch, i, selection.valve_parts);
            pack_rule(
                &mut rules,
                values,
                batch.rules[i].shadow(),
                index[j],
                records[j],
            );
        }
        DecideCall {
            keys: distinct,
            header: header(time, batch.lease),
            rules,
            previous: previous.map(|p| p.records[..index.len()].iter().flat_map(|r| r.0).collect()),
        }
    }

    /// Appends the key count, the keys and the arguments to `cmd` (an
    /// `FCALL`, `EVALSHA` or `EVAL` named already).
    pub fn fill(&self, cmd: &mut redis::Cmd) {
        cmd.arg(self.keys.len())
            .arg(&self.keys)
            .arg(self.rules.as_slice());
        // The commonest header, "", is left out (one argument less for
        // Redis to read and set up) unless the previous names follow it.
        if !self.header.is_empty() || self.previous.is_some() {
            cmd.arg(&self.header);
        }
        if let Some(previous) = &self.previous {
            cmd.arg(previous);
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
    for rule in rules.chunks_exact(REFUND_WIDTH) {
        for (k, value) in rule.iter().enumerate() {
            all.push(if k == REFUND_RECORD {
                value.to_le_bytes().to_vec()
            } else {
                value.to_string().into_bytes()
            });
        }
    }
    evalsha_and_eval(script, REFUND_LUA, keys, &all)
}

/// The helpers every script starts with (common.lua), for tests of their
/// arithmetic.
pub const COMMON_LUA: &str = include_str!("common.lua");

/// The refund script's source.
pub const REFUND_LUA: &str = concat!(include_str!("common.lua"), include_str!("refund.lua"));

/// Values per rule in [`refund_args`]: algorithm, limit, per, burst,
/// aligned, cost, the record's name (8 bytes read as a little-endian
/// integer), and last the admission time.
pub const REFUND_WIDTH: usize = 8;
const REFUND_RECORD: usize = 6;

/// The refund script's arguments giving back what the selected rules
/// consumed (`records` are theirs, in selection order), given the admission
/// times the decision returned. Owned, so a refund can be sent after the
/// batch is gone.
pub fn refund_args(
    batch: &Batch<'_>,
    selection: Selection<'_>,
    records: &[Record],
    admitted_at: &[u64],
) -> Vec<u64> {
    let mut args = vec![selection.len(batch.rules.len()) as u64];
    for ((i, at), record) in selection
        .each(batch.rules.len())
        .zip(admitted_at)
        .zip(records)
    {
        args.extend(rule_values(batch, i, selection.valve_parts));
        args.push(u64::from_le_bytes(record.0));
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
const REPLY_WIDTH: usize = 3;

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
/// time, then remaining, reset and retry per rule; see decide.lua). A rule
/// admitted when its retry is 0: every denial's is at least 1 ms.
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
                allowed: v[2] == 0,
                remaining: u32::try_from(v[0]).unwrap_or(u32::MAX),
                reset_after_ms: v[1],
                retry_after_ms: v[2],
            })
            .collect(),
        admitted_at,
    })
}

/// What `GET` (or `ZRANGE … WITHSCORES` for a set) returned for a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Raw {
    /// The key does not exist.
    Missing,
    /// A group's records (see [`RECORD_BYTES`]).
    Records(Vec<u8>),
    /// Sorted-set members with their scores.
    Log(Vec<(String, u64)>),
}

/// The bytes of one record in a group's value: its name (8 bytes), then
/// when its state goes idle (ms) and up to three numbers of state, as
/// little-endian doubles (decide.lua's `RECORD`).
pub const RECORD_BYTES: usize = 40;

/// The numbers of `record`'s state in a group's value: when it goes idle,
/// then the state's three numbers (unused ones 0); `None` when the value
/// has no such record.
pub fn find_record(value: &[u8], record: Record) -> Option<[u64; 4]> {
    value
        .chunks_exact(RECORD_BYTES)
        .find(|r| r[..8] == record.0)
        .map(|r| {
            let mut numbers = [0; 4];
            for (n, b) in numbers.iter_mut().zip(r[8..].chunks_exact(8)) {
                *n = f64::from_le_bytes(b.try_into().expect("8 bytes")) as u64;
            }
            numbers
        })
}

/// Decodes a stored value into the state `sluice-core` decides on; a value
/// without the rule's record reads as fresh.
pub fn decode(rule: &BoundRule, raw: &Raw, record: Record) -> State {
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
        (algorithm, Raw::Records(value)) => match find_record(value, record) {
            None => State::Fresh,
            Some([_idle, a, b, c]) => match algorithm {
                Algorithm::Gcra => State::Gcra(gcra::Tat { ms: a, frac: b }),
                Algorithm::TokenBucket => State::TokenBucket(token_bucket::Bucket {
                    scaled_tokens: a,
                    last_ms: b,
                }),
                Algorithm::FixedWindow => State::FixedWindow(fixed_window::Window {
                    start_ms: a,
                    count: b,
                }),
                Algorithm::SlidingWindow => State::SlidingWindow(sliding_window::Windows {
                    start_ms: a,
                    prev: b,
                    cur: c,
                }),
                Algorithm::SlidingLog | Algorithm::Concurrency => State::Fresh,
            },
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
    fn a_reply_reads_as_the_time_then_three_values_per_rule() {
        // A rule admitted has no retry; one denied a retry of 1 ms or more.
        let bytes = doubles(&[1_764_600_000_123, 9, 100, 0, 0, 250, 40]);
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
        let bytes = doubles(&[1, 9, 100, 0]);
        let error = reply(&bytes, 2).unwrap_err();
        assert!(
            error.to_string().contains("32 bytes for 2 rules"),
            "{error}"
        );
        assert!(reply(&bytes[..31], 1).is_err());
    }

    #[test]
    fn a_packed_rule_carries_its_numbers_exactly() {
        let record = Record(*b"\x01\x02\x03\x04\x05\x06\x07\x08");
        let values = [5, 1_000_000_000, 366 * 86_400_000, 7, 1, 1_000_000];
        let mut packed = smallvec::smallvec![0xee];
        pack_rule(&mut packed, values, true, 300, record);
        pack_rule(&mut packed, values, false, 2, Record([9; 8]));
        assert_eq!(packed.len(), 1 + 2 * RULE_WIDTH);
        let packed = &packed[1..];
        assert_eq!(packed[..5], [5, 1, 1, 44, 1]);
        let numbers: Vec<u64> = packed[5..37]
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()) as u64)
            .collect();
        assert_eq!(numbers, [1_000_000_000, 366 * 86_400_000, 7, 1_000_000]);
        assert_eq!(packed[37..RULE_WIDTH], record.0);
        // The next rule follows at once.
        assert_eq!(packed[RULE_WIDTH..RULE_WIDTH + 5], [5, 1, 0, 2, 0]);
        assert_eq!(packed[2 * RULE_WIDTH - 8..], [9; 8]);
    }

    #[test]
    fn a_record_is_found_only_where_records_start() {
        let record = |name: [u8; 8], numbers: [u64; 4]| -> Vec<u8> {
            let mut r = name.to_vec();
            r.extend(doubles(&numbers));
            r
        };
        // The second record's numbers contain the first's name, misaligned.
        let name = Record([0, 0, 0, 0, 0, 0, 0x45, 0x40]);
        let mut value = record([7; 8], [1, 42, 0, 0]);
        value.extend(record(name.0, [9, 1, 2, 3]));
        assert_eq!(find_record(&value, name), Some([9, 1, 2, 3]));
        assert_eq!(find_record(&value, Record([7; 8])), Some([1, 42, 0, 0]));
        assert_eq!(find_record(&value, Record([8; 8])), None);
        assert_eq!(find_record(&value[..70], name), None);
    }
}
