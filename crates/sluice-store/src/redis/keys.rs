//! Where each rule of a batch keeps its state in Redis: its key (hash
//! tagged so that a tenant's keys share a slot) and its record there.

use sluice_core::BoundRule;
use sluice_core::keys::{Keyer, Record, Tag};
use smallvec::SmallVec;

use crate::store::{Batch, Partition};

/// A key of the store's own, not a tenant's (the admin API's, the region
/// link's): `{prefix}:{admin}:name`, all in one slot on a cluster.
pub fn own_key(prefix: &str, name: &str) -> String {
    format!("{prefix}:{{admin}}:{name}")
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
}

/// Whether a rule's state is a sorted set (sliding_log's entries,
/// concurrency's leases) rather than a string.
pub fn is_sorted_set(rule: &BoundRule) -> bool {
    rule.rule().algorithm().keeps_a_set()
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
        if rule.adaptive() {
            // Its limit changes per decision, and so would its number of
            // keys: an adaptive valve is kept whole, on one key.
            return 0;
        }
        (self.turn % rule.rule().shares(self.shards)) as u16
    }
}
