//! The keys an instance follows for slices and what-ifs: a map split over
//! shards, each behind its own lock, holding at most
//! [`MAX_KEYS`](super::MAX_KEYS) keys.

use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault};
use std::sync::atomic::{AtomicU64, Ordering};

use foldhash::fast::RandomState;
use parking_lot::{Mutex, MutexGuard};

use super::MAX_KEYS;
use crate::bucket::{Key, KeyRef, PassThrough};
use crate::store::Batch;

const SHARD_BITS: u32 = 5;
const SHARDS: usize = 1 << SHARD_BITS;

/// One shard of a [`KeyMap`].
pub(super) type Map<V> = HashMap<Key, V, BuildHasherDefault<PassThrough>>;

/// Keys and what is followed of each.
pub(super) struct KeyMap<V> {
    shards: Box<[Mutex<Map<V>>]>,
    hasher: RandomState,
    keys: AtomicU64,
}

impl<V> Default for KeyMap<V> {
    fn default() -> KeyMap<V> {
        KeyMap {
            shards: (0..SHARDS).map(|_| Mutex::new(Map::default())).collect(),
            hasher: RandomState::default(),
            keys: AtomicU64::new(0),
        }
    }
}

impl<V> KeyMap<V> {
    /// The key of rule `index` of `batch` in the tenant's `shard`.
    pub(super) fn key<'b>(&self, batch: &Batch<'b>, index: usize, shard: u16) -> KeyRef<'b> {
        let rule = &batch.rules[index];
        KeyRef::new(&self.hasher, rule, batch.partition(index, rule), shard)
    }

    /// The shard `key` lives in, locked. Chosen by the hash's high bits:
    /// the table inside starts its probes from the low ones.
    pub(super) fn lock(&self, key: &KeyRef<'_>) -> MutexGuard<'_, Map<V>> {
        let hash = BuildHasherDefault::<PassThrough>::default().hash_one(key);
        self.shards[(hash >> (64 - SHARD_BITS)) as usize].lock()
    }

    /// Counts a key about to be added: false (not counted) when
    /// [`MAX_KEYS`] are followed already.
    pub(super) fn admit(&self) -> bool {
        let room = (self.keys.load(Ordering::Relaxed) as usize) < MAX_KEYS;
        if room {
            self.keys.fetch_add(1, Ordering::Relaxed);
        }
        room
    }

    /// How many keys are followed.
    pub(super) fn len(&self) -> u64 {
        self.keys.load(Ordering::Relaxed)
    }

    /// Runs `f` on every shard, locked in turn.
    pub(super) fn each(&self, mut f: impl FnMut(&mut Map<V>)) {
        for shard in self.shards.iter() {
            f(&mut shard.lock());
        }
    }

    /// Takes every key out, each given to `f`.
    pub(super) fn drain(&self, mut f: impl FnMut(Key, V)) {
        self.each(|map| map.drain().for_each(|(key, value)| f(key, value)));
        self.keys.store(0, Ordering::Relaxed);
    }

    /// Keeps the keys `keep` says, given each key and its value.
    pub(super) fn retain(&self, mut keep: impl FnMut(&Key, &mut V) -> bool) {
        let mut removed = 0;
        self.each(|map| {
            let before = map.len();
            map.retain(|key, value| keep(key, value));
            removed += before - map.len();
        });
        // Saturating: a drain may have reset the count meanwhile.
        let _ = self
            .keys
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |k| {
                Some(k.saturating_sub(removed as u64))
            });
    }
}
