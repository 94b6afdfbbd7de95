//! The over-limit cache: denials remembered until they expire.
//!
//! When the store denies a request because a bucket is exhausted, its
//! `retry_after` says when a request of that cost could pass at the
//! earliest. Until then, a request of the same cost for the same bucket is
//! denied here, without a store call: a tenant flooding at fifty times its
//! limit costs the store about one call per reset, not fifty.
//!
//! What a cached answer promises, for any cost and any mix of rules:
//!
//! - **It never denies what the store would admit.** A bucket that denied
//!   a cost only recovers with time, and `until` is the earliest moment it
//!   can hold that cost again (recorded with the clock read *after* the
//!   store answered, so never before the store's own instant).
//! - **Its retry is never earlier than the store's for the rules it
//!   names.** An entry covers exactly the cost that was denied: a dearer
//!   request waits longer than the entry says, a cheaper one may pass
//!   sooner, so both go to the store. When several of a request's buckets
//!   are remembered, the answer is the one that waits longest, as the
//!   store's would be. A later denial of another cost replaces an entry
//!   only once the old one expired or when it waits longer.
//! - **It never outlives the policy it was learned under.** Entries carry
//!   the epoch of the policy; [`clear`](DenialCache::clear) starts a new
//!   epoch, so a decision that was in flight across a reload cannot
//!   re-insert a denial of the old limits.
//!
//! - **It forgets a bucket that admits.** A bucket that denied a dear
//!   request may still admit a cheaper one, which pushes the dear one's
//!   moment later: every admission decided by the store drops the entries
//!   of the buckets it consumed from ([`forget`](DenialCache::forget)).
//!
//! One kind of denial keeps these promises only approximately: a fair
//! valve's share (its gate, [`Scope::Share`]), whose rate is set afresh for
//! every decision from a level that moves. Its denial is remembered for its
//! own wait at the rate it was decided at, and never longer than a
//! twentieth of the valve's period: the share may
//! rise meanwhile, and a tenant past its share be denied up to that long
//! after the store would admit it again (see `fair::remembered_wait`).
//! Without it, a saturated fair valve cost a store call per decision.
//! So is a rule shared across regions (`storage.regions`): a peer region
//! may grant it budget at every sync of the region link, so its denial is
//! remembered for at most `sync_every`; what a remembered denial asked
//! still counts as the region's demand ([`Store::asked`](crate::Store::asked)).
//!
//! Consumption of a request's *other* buckets since an entry was written
//! (by this instance's admissions or another's) can only push the real
//! moment later; the client then retries, reaches the store and hears the
//! new time.

use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};

/// How a store shares budgets, as the cache must know it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sharing {
    /// Each valve is split over several keys (Redis Cluster's
    /// `global_shards`).
    pub split_valves: bool,
    /// With shared rules one budget across regions, how often the region
    /// link moves budget.
    pub regions_sync_every_ms: Option<u64>,
}

use foldhash::fast::RandomState;
use sluice_core::{Outcome, Scope};

use crate::bucket::{Key, KeyRef, PassThrough};
use crate::store::Batch;

/// Most denials remembered at once; further denials are simply not cached.
pub const MAX_ENTRIES: usize = 100_000;

#[derive(Debug, Clone, Copy)]
struct Denial {
    until_ms: u64,
    cost: u64,
    epoch: u64,
}

/// Remembered denials; see the module documentation.
pub struct DenialCache {
    map: papaya::HashMap<Key, Denial, BuildHasherDefault<PassThrough>>,
    hasher: RandomState,
    epoch: AtomicU64,
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
                .collector(crate::bucket::collector())
                .build(),
            hasher: RandomState::default(),
            epoch: AtomicU64::new(0),
        }
    }
}

impl DenialCache {
    /// The current epoch: pass it to [`record`](Self::record) for a store
    /// call started now.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The rule of `batch` whose remembered denial makes it wait longest at
    /// `now` (the first on ties), with how long; `None` when no bucket of
    /// the batch is remembered as denying its cost.
    pub fn check(&self, batch: &Batch<'_>, now: u64) -> Option<(usize, u64)> {
        if self.map.is_empty() {
            return None;
        }
        let epoch = self.epoch();
        let map = self.map.pin();
        let mut longest: Option<(usize, u64)> = None;
        for (i, rule) in batch.rules.iter().enumerate() {
            if rule.shadow() {
                continue;
            }
            let key = KeyRef::new(&self.hasher, rule, batch.partition(i, rule), batch.shard);
            let Some(denial) = map.get(&key) else {
                continue;
            };
            if denial.epoch != epoch || denial.until_ms <= now || denial.cost != batch.cost_of(i) {
                continue;
            }
            let wait = denial.until_ms - now;
            if longest.is_none_or(|(_, w)| wait > w) {
                longest = Some((i, wait));
            }
        }
        longest
    }

    /// Remembers the buckets that denied `batch`, the store having answered
    /// at `now` for a call started in `epoch`, by a store shaped as
    /// `sharing` says.
    pub fn record(
        &self,
        epoch: u64,
        batch: &Batch<'_>,
        outcomes: &[Outcome],
        now: u64,
        sharing: Sharing,
    ) {
        let map = self.map.pin();
        for (i, (rule, outcome)) in batch.rules.iter().zip(outcomes).enumerate() {
            // A concurrency denial lasts until a release, a rule that
            // counts by outcome's until an attempt is given back, either
            // of which can come at any moment: never remembered.
            if outcome.allowed
                || rule.shadow()
                || outcome.retry_after_ms == 0
                || rule.rule().is_concurrency()
                || rule.count_if().is_some()
                // An adaptive valve's limit is set per decision, by
                // priority: a low one's denial says nothing of a critical.
                || rule.adaptive()
                // One key of a split valve denied: the next decision uses
                // another, which may well admit (remembered, one empty key
                // denied every tenant as if the whole valve were).
                || (sharing.split_valves && rule.scope() == sluice_core::Scope::Global)
            {
                continue;
            }
            // A fair valve's share: for a moment only (see
            // `fair::remembered_wait`).
            let wait = if rule.scope() == Scope::Share {
                super::fair::remembered_wait(rule, batch.rules, outcome.retry_after_ms)
            } else if let Some(sync) = sharing.regions_sync_every_ms
                && rule.shared_across_regions()
            {
                // A peer region may grant budget at the next sync.
                outcome.retry_after_ms.min(sync)
            } else {
                outcome.retry_after_ms
            };
            if wait == 0 {
                continue;
            }
            let key = KeyRef::new(&self.hasher, rule, batch.partition(i, rule), batch.shard);
            let denial = Denial {
                until_ms: now + wait,
                cost: batch.cost_of(i),
                epoch,
            };
            if map.get(&key).is_none() && map.len() >= MAX_ENTRIES {
                continue;
            }
            map.update_or_insert(
                key.to_key(),
                |old| {
                    let replace = old.epoch != epoch
                        || old.until_ms <= now
                        || old.cost == denial.cost
                        || old.until_ms < denial.until_ms;
                    if replace { denial } else { *old }
                },
                denial,
            );
        }
    }

    /// Remembers the duplicate guards of an admitted `batch` (by the
    /// store, or by the local fallback at `now`) as denying their
    /// fingerprint for their whole window from `now`: what the guard's
    /// bucket says from then on (the store's window opened a moment
    /// earlier, so this one never ends sooner). A repeat is answered here
    /// without the store, and so still while the store cannot be reached:
    /// this instance admits a fingerprint at most once per window, whoever
    /// decided it (the store, before or after an outage, or its local
    /// fallback during one).
    pub fn record_guards(&self, epoch: u64, batch: &Batch<'_>, now: u64) {
        let map = self.map.pin();
        for (i, rule) in batch.rules.iter().enumerate() {
            if rule.scope() != Scope::Dedupe || rule.shadow() {
                continue;
            }
            let key = KeyRef::new(&self.hasher, rule, batch.partition(i, rule), batch.shard);
            if map.len() >= MAX_ENTRIES && map.get(&key).is_none() {
                continue;
            }
            map.insert(
                key.to_key(),
                Denial {
                    until_ms: now + rule.rule().period_ms(),
                    cost: batch.cost_of(i),
                    epoch,
                },
            );
        }
    }

    /// Drops what is remembered of the buckets that admitted `batch`
    /// (their state moved on).
    pub fn forget(&self, batch: &Batch<'_>, outcomes: &[Outcome]) {
        if self.map.is_empty() {
            return;
        }
        let map = self.map.pin();
        for (i, (rule, outcome)) in batch.rules.iter().zip(outcomes).enumerate() {
            if outcome.allowed {
                let key = KeyRef::new(&self.hasher, rule, batch.partition(i, rule), batch.shard);
                map.remove(&key);
            }
        }
    }

    /// Drops expired denials; returns how many remain.
    pub fn sweep(&self, now: u64) -> usize {
        let map = self.map.pin();
        map.retain(|_, denial| denial.until_ms > now);
        map.len()
    }

    /// Forgets everything (the policy changed), including what calls under
    /// way would still record.
    pub fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
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
        let batch = |tenant, cost| Batch::new(tenant, None, cost, rules);
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
        cache.record(
            0,
            &batch("a", 2),
            &[denied, allowed],
            1_000,
            Sharing::default(),
        );
        assert_eq!(cache.check(&batch("a", 2), 1_050), Some((0, 150)));
        assert_eq!(cache.check(&batch("a", 2), 1_199), Some((0, 1)));
        assert_eq!(
            cache.check(&batch("a", 3), 1_050),
            None,
            "a dearer request waits longer than the entry says"
        );
        assert_eq!(
            cache.check(&batch("a", 1), 1_050),
            None,
            "a cheaper request may pass sooner"
        );
        assert_eq!(cache.check(&batch("a", 2), 1_200), None, "expired");
        assert_eq!(cache.check(&batch("b", 2), 1_050), None, "another tenant");
        assert_eq!(cache.sweep(1_200), 0);
    }

    fn denied(retry_after_ms: u64) -> Outcome {
        Outcome {
            allowed: false,
            remaining: 0,
            reset_after_ms: retry_after_ms,
            retry_after_ms,
        }
    }

    #[test]
    fn several_remembered_rules_answer_the_longest_wait() {
        let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 5, per: 1s }]\n    routes:\n      \"*\": [{ limit: 50, per: 1s }]\n";
        let policy = Policy::compile(&Config::from_yaml(yaml, "t").unwrap().limits);
        let rules = policy.applicable("a", "GET /", false).rules;
        let batch = Batch::new("a", None, 1, rules);
        let cache = DenialCache::default();
        cache.record(
            0,
            &batch,
            &[denied(100), denied(700)],
            1_000,
            Sharing::default(),
        );
        assert_eq!(cache.check(&batch, 1_000), Some((1, 700)));
    }

    #[test]
    fn a_shorter_denial_of_another_cost_never_shortens_an_entry() {
        let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 5, per: 1s }]\n";
        let policy = Policy::compile(&Config::from_yaml(yaml, "t").unwrap().limits);
        let rules = policy.applicable("a", "GET /", false).rules;
        let cache = DenialCache::default();
        cache.record(
            0,
            &Batch::new("a", None, 4, rules),
            &[denied(800)],
            1_000,
            Sharing::default(),
        );
        cache.record(
            0,
            &Batch::new("a", None, 1, rules),
            &[denied(200)],
            1_000,
            Sharing::default(),
        );
        assert_eq!(
            cache.check(&Batch::new("a", None, 4, rules), 1_100),
            Some((0, 700)),
            "the dearer denial stands"
        );
        assert_eq!(cache.check(&Batch::new("a", None, 1, rules), 1_100), None);
    }

    #[test]
    fn a_denial_recorded_across_a_clear_is_ignored() {
        let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 5, per: 1s }]\n";
        let policy = Policy::compile(&Config::from_yaml(yaml, "t").unwrap().limits);
        let rules = policy.applicable("a", "GET /", false).rules;
        let batch = Batch::new("a", None, 1, rules);
        let cache = DenialCache::default();
        let started = cache.epoch();
        cache.clear(); // a reload while the store call was under way
        cache.record(started, &batch, &[denied(800)], 1_000, Sharing::default());
        assert_eq!(cache.check(&batch, 1_100), None);
    }

    #[test]
    fn a_shared_rules_denial_is_remembered_one_sync_across_regions() {
        let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: fixed_window, limit: 5, per: 1m, aligned: true }]\n";
        let policy = Policy::compile(&Config::from_yaml(yaml, "t").unwrap().limits);
        let rules = policy.applicable("a", "GET /", false).rules;
        let batch = Batch::new("a", None, 1, rules);
        for (sync, remembered) in [(None, 40_000), (Some(250), 250)] {
            let cache = DenialCache::default();
            let sharing = Sharing {
                regions_sync_every_ms: sync,
                ..Sharing::default()
            };
            cache.record(0, &batch, &[denied(40_000)], 1_000, sharing);
            assert!(cache.check(&batch, remembered).is_some(), "{sync:?}");
            assert_eq!(cache.check(&batch, 1_000 + remembered), None, "{sync:?}");
        }
    }
}
