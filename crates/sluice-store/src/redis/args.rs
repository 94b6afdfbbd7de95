//! What the scripts are told of a rule, and of the call: one layout,
//! shared by the decision and the refund.

use std::sync::Arc;

use sluice_core::keys::Record;
use sluice_core::{Algorithm, BoundRule};
use smallvec::SmallVec;

use super::keys::Buckets;
use super::regions::shared::{Kind, Regions};
use crate::clock::Clock;
use crate::store::Batch;

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

/// The scripts' code of a fixed_window shared across regions.
pub(crate) const SHARED_WINDOW: u64 = 7;
/// `shared_sliding` in shared.lua: a `sliding_window` shared across
/// regions.
pub(crate) const SHARED_SLIDING: u64 = 8;
/// `shared_bucket` in shared.lua: a `gcra` or `token_bucket` shared across
/// regions. Its burst's place carries its fill, a fraction: as the bits of
/// the double (see `pack_rule`).
pub(crate) const SHARED_BUCKET: u64 = 9;

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

/// A lease as the scripts name it: 32 hex digits ("" for none).
pub fn lease_arg(lease: Option<u128>) -> String {
    lease.map_or_else(String::new, |id| format!("{id:032x}"))
}

/// The decision's header (its second argument, left out when `""`): `""`
/// for the server's clock and no lease (what the service sends but for
/// concurrency rules), else `"NOW;LEASE"`.
pub(super) fn header(time: &TimeSource, lease: Option<u128>) -> String {
    match (time, lease) {
        (TimeSource::Server, None) => String::new(),
        _ => format!("{};{}", now_arg(time), lease_arg(lease)),
    }
}

impl TimeSource {
    /// Now in ms: the caller's clock, or this machine's where the script
    /// reads Redis's (for what is only noted here, not decided).
    pub fn now_ms(&self) -> u64 {
        match self {
            TimeSource::Server => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            TimeSource::Client(clock) => clock.now_ms(),
        }
    }
}

/// The script's "now" argument: "" for the server's clock.
pub(super) fn now_arg(time: &TimeSource) -> String {
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
    /// The regions a shared rule's budget is one across (`None`: regions
    /// are off, every rule is this store's own).
    pub regions: Option<&'s Regions>,
}

impl Selection<'_> {
    /// Every rule, valves whole.
    pub const ALL: Selection<'static> = Selection {
        indices: None,
        valve_parts: 1,
        regions: None,
    };

    pub(super) fn each(&self, rules: usize) -> impl Iterator<Item = usize> + '_ {
        let all = self.indices.is_none().then_some(0..rules);
        all.into_iter()
            .flatten()
            .chain(self.indices.into_iter().flatten().copied())
    }
}

/// The rule as a call enforces it: on Redis Cluster, a valve's share.
pub(crate) fn enforced(rule: &BoundRule, valve_parts: u64) -> sluice_core::Rule {
    if rule.scope() == sluice_core::Scope::Global && !rule.adaptive() {
        rule.rule().share(rule.rule().shares(valve_parts))
    } else {
        *rule.rule()
    }
}

/// A packed rule's bytes (struct `RULE`, `'<BBBHdddddc8'`, in common.lua).
pub(super) const RULE_WIDTH: usize = 53;

/// Appends what both scripts take of a rule to `packed`:
/// algorithm, aligned and shadow as bytes, the index of its key (from 1)
/// as a 16-bit integer, then limit, per, burst, cost and max_debt as
/// little-endian doubles (every one is below 2^53, so exact; see
/// `sluice_core::rule`), then its record's name.
pub(super) fn pack_rule(
    packed: &mut SmallVec<[u8; 2 * RULE_WIDTH]>,
    values: [u64; 7],
    shadow: bool,
    key: u16,
    record: Record,
) {
    let [algorithm, limit, per, burst, aligned, cost, max_debt] = values;
    packed.extend_from_slice(&[algorithm as u8, aligned as u8, u8::from(shadow)]);
    packed.extend_from_slice(&key.to_le_bytes());
    for (i, v) in [limit, per, burst, cost, max_debt].into_iter().enumerate() {
        if i == 2 && algorithm == SHARED_BUCKET {
            packed.extend_from_slice(&f64::from_bits(v).to_le_bytes());
            continue;
        }
        debug_assert!(v < 1 << 53, "{v} is not exact as a double");
        packed.extend_from_slice(&(v as f64).to_le_bytes());
    }
    packed.extend_from_slice(&record.0);
}

/// The rules of one call as both scripts take them (their `KEYS` and
/// `ARGV[1]`): the distinct keys, and every selected rule packed (see
/// `pack_rule`), naming its key by its index among them. Owned, so that a
/// call (or its refund) can go out from a task of its own.
#[derive(Debug, Clone)]
pub struct PackedRules {
    /// The distinct keys, in the order the rules first name them.
    pub(super) keys: Vec<String>,
    /// Every rule packed, one after another; one or two rules without an
    /// allocation.
    pub(super) packed: SmallVec<[u8; 2 * RULE_WIDTH]>,
}

impl PackedRules {
    /// The selected rules of a batch: `keys` and `records` are theirs (in
    /// selection order). Rules sharing a key name it once. Also returns,
    /// per distinct key, the first rule (in selection order) that names it.
    pub(super) fn new(
        batch: &Batch<'_>,
        selection: Selection<'_>,
        keys: Vec<String>,
        records: &[Record],
    ) -> (PackedRules, SmallVec<[usize; 4]>) {
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
        let mut packed = SmallVec::with_capacity(RULE_WIDTH * index.len());
        for (j, i) in selection.each(batch.rules.len()).enumerate() {
            let values = rule_values(batch, i, selection);
            pack_rule(
                &mut packed,
                values,
                batch.rules[i].shadow(),
                index[j],
                records[j],
            );
        }
        let rules = PackedRules {
            keys: distinct,
            packed,
        };
        (rules, first)
    }

    /// While rotating the pepper: the keys of `previous` (the same
    /// buckets under the previous pepper) after these, one per distinct
    /// key (`first`, from [`new`](Self::new)), as the scripts read them;
    /// returns each rule's record name under it, in rule order.
    pub(super) fn with_previous(&mut self, first: &[usize], previous: &Buckets) -> Vec<u8> {
        let n = self.len();
        self.keys
            .extend(first.iter().map(|&j| previous.keys[j].clone()));
        previous.records[..n].iter().flat_map(|r| r.0).collect()
    }

    /// How many rules.
    pub fn len(&self) -> usize {
        self.packed.len() / RULE_WIDTH
    }

    /// Whether there is no rule.
    pub fn is_empty(&self) -> bool {
        self.packed.is_empty()
    }

    /// Keeps only the rules (by position, from 0) that `keep` names. Their
    /// keys keep their indices: a key no rule names any more stays, unread.
    pub fn retain(&mut self, mut keep: impl FnMut(usize) -> bool) {
        let mut kept = 0;
        for j in 0..self.len() {
            if keep(j) {
                self.packed
                    .copy_within(j * RULE_WIDTH..(j + 1) * RULE_WIDTH, kept * RULE_WIDTH);
                kept += 1;
            }
        }
        self.packed.truncate(kept * RULE_WIDTH);
    }
}

/// What both scripts take of rule `i` of a batch: algorithm, limit, per,
/// burst, aligned, cost, max_debt. A rule shared across regions is the
/// script's `shared_window` (code 7), `shared_sliding` (code 8) or
/// `shared_bucket` (code 9), its limit this region's share of its pool.
pub(super) fn rule_values(batch: &Batch<'_>, i: usize, selection: Selection<'_>) -> [u64; 7] {
    let bound = &batch.rules[i];
    let rule = enforced(bound, selection.valve_parts);
    if let Some(regions) = selection.regions
        && bound.shared_across_regions()
    {
        let kind = Kind::of(bound);
        let (code, burst) = match kind {
            Kind::Window => (SHARED_WINDOW, rule.burst()),
            Kind::Sliding => (SHARED_SLIDING, rule.burst()),
            Kind::Bucket { .. } => {
                let terms = kind.terms(rule.period_ms(), rule.max_debt());
                (SHARED_BUCKET, terms.map_or(0.0, |t| t.fill).to_bits())
            }
        };
        return [
            code,
            regions.share(Regions::pool(bound)),
            rule.period_ms(),
            burst,
            u64::from(kind == Kind::Window),
            batch.cost_of(i),
            rule.max_debt(),
        ];
    }
    [
        u64::from(algorithm_code(rule.algorithm())),
        rule.limit(),
        rule.period_ms(),
        rule.burst(),
        u64::from(rule.aligned()),
        batch.cost_of(i),
        rule.max_debt(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packed_rule_carries_its_numbers_exactly() {
        let record = Record(*b"\x01\x02\x03\x04\x05\x06\x07\x08");
        let values = [5, 1_000_000_000, 366 * 86_400_000, 7, 1, 1_000_000, 9];
        let mut packed = smallvec::smallvec![0xee];
        pack_rule(&mut packed, values, true, 300, record);
        pack_rule(&mut packed, values, false, 2, Record([9; 8]));
        assert_eq!(packed.len(), 1 + 2 * RULE_WIDTH);
        let packed = &packed[1..];
        assert_eq!(packed[..5], [5, 1, 1, 44, 1]);
        let numbers: Vec<u64> = packed[5..45]
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()) as u64)
            .collect();
        assert_eq!(numbers, [1_000_000_000, 366 * 86_400_000, 7, 1_000_000, 9]);
        assert_eq!(packed[45..RULE_WIDTH], record.0);
        // The next rule follows at once.
        assert_eq!(packed[RULE_WIDTH..RULE_WIDTH + 5], [5, 1, 0, 2, 0]);
        assert_eq!(packed[2 * RULE_WIDTH - 8..], [9; 8]);
    }

    #[test]
    fn retained_rules_keep_their_order_and_their_keys() {
        let mut packed = SmallVec::new();
        for (key, name) in [(1, 1), (2, 2), (1, 3)] {
            pack_rule(
                &mut packed,
                [1, 10, 1000, 10, 0, 1, 10],
                false,
                key,
                Record([name; 8]),
            );
        }
        let mut rules = PackedRules {
            keys: vec!["a".into(), "b".into()],
            packed,
        };
        assert_eq!(rules.len(), 3);
        rules.retain(|j| j != 1);
        assert_eq!(rules.len(), 2);
        assert_eq!(rules.keys, ["a", "b"]);
        let kept: Vec<(u8, u8)> = rules
            .packed
            .chunks_exact(RULE_WIDTH)
            .map(|rule| (rule[3], rule[RULE_WIDTH - 1]))
            .collect();
        assert_eq!(kept, [(1, 1), (1, 3)]);
        rules.retain(|_| false);
        assert!(rules.is_empty());
    }
}
