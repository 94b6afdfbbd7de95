//! Keys of in-process maps: one bucket = one rule × one partition × one
//! shard, hashed once and compared without allocating.

use std::hash::{BuildHasher, Hash, Hasher};

use foldhash::fast::RandomState;
use papaya::Equivalent;
use sluice_core::{BoundRule, bytes};
use smallvec::SmallVec;

use crate::store::Partition;

/// The reclamation of a map of buckets. A removed or replaced entry is
/// retired, and every `batch_size` retirements the thread that retires
/// the last one issues a `membarrier` system call, which interrupts every
/// other thread of the process: with seize's default of 32, sweeping a
/// million idle keys issued 31,000 of them, and a denial storm one per 32
/// remembered denials on the request path. A batch of 1,024 keeps at most
/// that many retired entries per thread unfreed (some 150 KiB) for 32
/// times fewer barriers (`examples/sweep.rs`, docs/BENCHMARKS.md).
pub(crate) fn collector() -> seize::Collector {
    seize::Collector::new().batch_size(1024)
}

/// A stored key: the rule's uid and the partition's bytes
/// (`tenant ‖ subject`, and where the tenant ends), with its hash computed
/// once.
/// Short partitions are held inline: one allocation and one cache miss less
/// per lookup.
pub(crate) struct Key {
    hash: u64,
    rule: u64,
    shard: u16,
    tenant_len: u32,
    bytes: SmallVec<[u8; 30]>,
}

/// A key as a request names it, without allocating.
pub(crate) struct KeyRef<'a> {
    hash: u64,
    rule: u64,
    shard: u16,
    tenant: &'a [u8],
    subject: &'a [u8],
}

impl<'a> KeyRef<'a> {
    #[inline]
    pub(crate) fn new(
        hasher: &RandomState,
        rule: &BoundRule,
        partition: Partition<'a>,
        shard: u16,
    ) -> KeyRef<'a> {
        let shard = if rule.on_first_shard() { 0 } else { shard };
        let (tenant, subject): (&[u8], &[u8]) = match partition {
            Partition::Global => (b"", b""),
            Partition::Tenant(t) => (t.as_bytes(), b""),
            Partition::Subject(t, s) => (t.as_bytes(), s.as_bytes()),
        };
        // Equality compares every part; the hash only has to spread them.
        // foldhash's `write` mixes in the length, so where the tenant ends
        // is part of the hash without a separator.
        let mut h = hasher.build_hasher();
        h.write_u64(rule.uid() ^ u64::from(shard).rotate_right(16));
        h.write(tenant);
        if !subject.is_empty() {
            h.write(subject);
        }
        KeyRef {
            hash: h.finish(),
            rule: rule.uid(),
            shard,
            tenant,
            subject,
        }
    }

    /// The tenant's bytes (empty for a global valve).
    pub(crate) fn tenant(&self) -> &'a [u8] {
        self.tenant
    }

    /// The tenant's bytes, the subject's (empty for a partition of the
    /// tenant) and the shard.
    pub(crate) fn parts(&self) -> (&'a [u8], &'a [u8], u16) {
        (self.tenant, self.subject, self.shard)
    }

    pub(crate) fn to_key(&self) -> Key {
        let mut bytes = SmallVec::with_capacity(self.tenant.len() + self.subject.len());
        bytes.extend_from_slice(self.tenant);
        bytes.extend_from_slice(self.subject);
        Key {
            hash: self.hash,
            rule: self.rule,
            shard: self.shard,
            // A request's tenant is at most 256 bytes; an Envoy partition
            // (descriptor entries joined) is bounded by the gRPC message
            // size, far below 4 GiB.
            tenant_len: u32::try_from(self.tenant.len()).unwrap_or(u32::MAX),
            bytes,
        }
    }
}

impl Key {
    /// The tenant's bytes (empty for a global valve).
    pub(crate) fn tenant(&self) -> &[u8] {
        &self.bytes[..self.tenant_len as usize]
    }

    /// The subject's bytes (empty for a partition of the tenant).
    pub(crate) fn subject(&self) -> &[u8] {
        &self.bytes[self.tenant_len as usize..]
    }

    /// The tenant's bytes, the subject's and the shard.
    pub(crate) fn parts(&self) -> (&[u8], &[u8], u16) {
        (self.tenant(), self.subject(), self.shard)
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.hash == other.hash
            && self.rule == other.rule
            && self.shard == other.shard
            && self.tenant_len == other.tenant_len
            && self.bytes == other.bytes
    }
}

impl Eq for Key {}

impl Equivalent<Key> for KeyRef<'_> {
    fn equivalent(&self, key: &Key) -> bool {
        if self.hash != key.hash || self.rule != key.rule || self.shard != key.shard {
            return false;
        }
        if key.tenant_len as usize != self.tenant.len()
            || key.bytes.len() != self.tenant.len() + self.subject.len()
        {
            return false;
        }
        let (tenant, subject) = key.bytes.split_at(self.tenant.len());
        bytes::same(tenant, self.tenant) && bytes::same(subject, self.subject)
    }
}

/// Keys carry their hash already; the map only needs to pass it through.
#[derive(Default)]
pub(crate) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is ever called (see the `Hash` impls above).
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}
