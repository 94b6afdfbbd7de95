//! The over-limit cache: denials remembered until they expire.
//!
//! When the store denies a request because a bucket is exhausted, its
//! `retry_after` says when a request of that cost could pass at the
//! earliest. Until then, a request of at least that cost for the same
//! bucket is denied here, without a store call: a tenant flooding at fifty
//! times its limit costs the store about one call per reset, not fifty.
//!
//! A remembered denial never admits anything, so exactness is kept: buckets
//! only recover with time, and `retry_after` is the earliest moment they
//! can; other instances consuming meanwhile only push that moment later. A
//! cheaper request than the one denied is not covered (it may pass sooner)
//! and goes to the store. The cache is emptied when the policy changes.

use std::hash::BuildHasherDefault;

use foldhash::fast::RandomState;
use sluice_core::Outcome;

use crate::bucket::{Key, KeyRef, PassThrough};
use crate::store::Batch;

/// Most denials remembered at once; further denials are simply not cached.
pub const MAX_ENTRIES: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Denial {
    until_ms: u64,
    min_cost: u64,
}

/// Remembered denials; see the module documentation.
pub struct DenialCache {
    map: papaya::HashMap<Key, Denial, BuildHasherDefault<PassThrough>>,
    hasher: RandomState,
}

impl std::fmt::Debug for DenialCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DenialCache")
            .field("entries", &self.map.len())
            .finish()
    }
}

impl Default for DenialCache {
    fn default() -> DenialCache {
        DenialCache {
            map: papaya::HashMap::builder()
                .hasher(BuildHasherDefault::default())
                .build(),
            hasher: RandomState::default(),
        }
    }
}

impl DenialCache {
    /// The first rule of `batch` whose bucket is known to deny it at `now`,
    /// with how long it still will.
    pub fn check(&self, batch: &Batch<'_>, now: u64) -> Option<(usize, u64)> {
        if self.map.is_empty() {
            return None;
        }
        let map = self.map.pin();
        batch.rules.iter().enumerate().find_map(|(i, rule)| {
            if rule.shadow() {
                return None;
            }
            let key = KeyRef::new(&self.hasher, rule, batch.partition(i, rule), batch.shard);
            let denial = map.get(&key)?;
            (denial.until_ms > now && batch.cost_of(i) >= denial.min_cost)
                .then(|| (i, denial.until_ms - now))
        })
    }

    /// Remembers the buckets that denied `batch` at `now`.
    pub fn record(&self, batch: &Batch<'_>, outcomes: &[Outcome], now: u64) {
        let map = self.map.pin();
        for (i, (rule, outcome)) in batch.rules.iter().zip(outcomes).enumerate() {
            if outcome.allowed || rule.shadow() || map.len() >= MAX_ENTRIES {
                continue;
            }
            let key = KeyRef::new(&self.hasher, rule, batch.partition(i, rule), batch.shard);
            map.insert(
                key.to_key(),
                Denial {
                    until_ms: now + outcome.retry_after_ms,
                    min_cost: batch.cost_of(i),
                },
            );
        }
    }

    /// Drops expired denials; returns how many remain.
    pub fn sweep(&self, now: u64) -> usize {
        let map = self.map.pin();
        map.retain(|_, denial| denial.until_ms > now);
        map.len()
    }

    /// Forgets everything (the policy changed).
    pub fn clear(&self) {
        self.map.pin().clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Config, Policy};

    #[test]
    fn a_denial_covers_its_bucket_and_costs_until_it_expires() {
        let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 5, per: 1s }]\n    routes:\n      \"*\": [{ limit: 50, per: 1s }]\n";
        let policy = Policy::compile(&Config::from_yaml(yaml, "t").unwrap().limits);
        let rules = policy.applicable("a", "GET /", false).rules;
        let batch = |tenant, cost| Batch {
            tenant,
            subject: None,
            shard: 0,
            cost,
            rules,
            partitions: &[],
            costs: &[],
        };
        let cache = DenialCache::default();
        let denied = Outcome {
            allowed: false,
            remaining: 0,
            reset_after_ms: 900,
            retry_after_ms: 200,
        };
        let allowed = Outcome {
            allowed: true,
            remaining: 40,
            reset_after_ms: 100,
            retry_after_ms: 0,
        };
        cache.record(&batch("a", 2), &[denied, allowed], 1_000);
        assert_eq!(cache.check(&batch("a", 2), 1_050), Some((0, 150)));
        assert_eq!(cache.check(&batch("a", 3), 1_199), Some((0, 1)));
        assert_eq!(
            cache.check(&batch("a", 1), 1_050),
            None,
            "a cheaper request may pass sooner"
        );
        assert_eq!(cache.check(&batch("a", 2), 1_200), None, "expired");
        assert_eq!(cache.check(&batch("b", 2), 1_050), None, "another tenant");
        assert_eq!(cache.sweep(1_200), 0);
    }
}
