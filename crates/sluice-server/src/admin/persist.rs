//! Overrides in Redis (Redis Cluster included), shared by every instance.
//!
//! Three keys in one slot (`{prefix}:{admin}:…`): a hash of overrides by
//! field, a hash of their versions, and a version counter bumped by every
//! change. A field is the tenant's opaque tag (an HMAC under the pepper,
//! as every key is); a value is the override encrypted with
//! ChaCha20-Poly1305 under a key derived from the pepper, so nothing in
//! Redis names a tenant. A change is one script call that checks the
//! version it was based on (`If-Match`), so concurrent edits cannot
//! silently overwrite each other.

use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use sluice_core::keys::Keyer;
use sluice_store::StoreError;
use sluice_store::redis::own_key;
use sluice_store::redis::regions::Replicated;

use super::{Refused, Stored};
use crate::backend::Backend;

/// Check-and-set of one override: KEYS = overrides, versions, counter;
/// ARGV = field, expected version ("" for any), value ("" to delete),
/// "expire" when the delete is of an expired override, then this region's
/// place among the regions and how many there are (0 and 1 without
/// `storage.regions`). Returns {1, version} when done, {-1, stored
/// version} on a mismatch, {0, 0} for a delete of an override the store
/// does not hold.
///
/// A delete keeps the field's version (a tombstone), so that across
/// regions (`storage.regions`: the link keeps overrides alike, last writer
/// wins, see `sluice_store::redis::regions::replica`) an older value heard
/// later does not bring it back. An expiry's tombstone keeps the expired
/// value's own version: it outranks that value (a tombstone wins a tie),
/// never a later write made elsewhere. `If-Match` compares with the
/// version of an override held, 0 for none.
///
/// A version is the Redis server's time in microseconds (or one more than
/// the last version, if that is later): it never comes back after the
/// store loses its data (FLUSHALL, a restart without persistence, a
/// failover to a lagging replica), where a counter restarting from 0 could
/// reach the version an instance knew with other overrides behind it. It
/// is then moved up to the next one that is this region's place modulo
/// the regions: two regions never write the same version, so a change
/// replicated from another region always changes the version `If-Match`
/// checks. Below 2^53, so exact in Lua and in JSON.
const WRITE_LUA: &str = r"
local held = redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1
if ARGV[3] == '' and not held then return {0, 0} end
local stored = 0
if held then stored = tonumber(redis.call('HGET', KEYS[2], ARGV[1]) or '0') end
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= stored then return {-1, stored} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[3]) or '0')
local place, regions = tonumber(ARGV[5]), tonumber(ARGV[6])
local version_at = math.max(last + 1, now)
version_at = version_at + (place - version_at % regions) % regions
redis.call('SET', KEYS[3], string.format('%d', version_at))
local version = string.format('%d', version_at)
if ARGV[4] == 'expire' then version = string.format('%d', stored) end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
end
redis.call('HSET', KEYS[2], ARGV[1], version)
return {1, version}
";

/// What tells a change: KEYS = counter, overrides; returns the counter
/// ("0" when missing) and how many overrides the hash holds.
const STAMP_LUA: &str = r"
return {redis.call('GET', KEYS[1]) or '0', redis.call('HLEN', KEYS[2])}
";

/// One override and its version: KEYS = overrides, versions; ARGV = field.
const READ_ONE_LUA: &str = r"
return {redis.call('HGET', KEYS[1], ARGV[1]), redis.call('HGET', KEYS[2], ARGV[1])}
";

/// One instance's heavy hitters: KEYS = the windows' hash, the numbers'
/// hash; ARGV = instance, sealed windows, number of the last window, the
/// hashes' time to live (ms).
const PUBLISH_LUA: &str = r"
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 1
";

/// How long the heavy hitters' hashes outlive the last publication: a
/// query reads an instance's windows for two windows after it published
/// them (the current one and the next), never later, so no key lives
/// forever once every instance is gone.
const HEAVY_TTL_MS: u64 = 2 * super::heavy::EPOCH_MS;

/// What the store says of its overrides, read twice a second to tell a
/// change, or a loss.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stamp {
    /// The version of the last change (0: the store has no counter).
    pub version: u64,
    /// How many overrides the store holds (some may not open under this
    /// pepper).
    pub held: u64,
}

impl Stamp {
    /// What this stamp, read now, says against the one read last.
    pub fn against(self, known: Stamp) -> Drift {
        if self == known {
            Drift::Same
        } else if self.version == 0 && known.version > 0 {
            Drift::CounterGone
        } else if self.version < known.version {
            Drift::CounterBack
        } else if self.version == known.version && self.held < known.held {
            Drift::Lost
        } else {
            Drift::Changed
        }
    }
}

/// How the store's overrides moved since they were last read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drift {
    /// Not at all.
    Same,
    /// A change, as every write makes.
    Changed,
    /// The change counter is gone: the store lost its data (FLUSHALL, a
    /// restart without persistence).
    CounterGone,
    /// The counter is below the last one read: a failover to a replica
    /// that had not seen the last changes.
    CounterBack,
    /// Fewer overrides at the same version: lost, the counter brought back
    /// to where it was by changes since.
    Lost,
}

/// Where and how overrides are kept.
pub struct Persist {
    keyer: Keyer,
    cipher: ChaCha20Poly1305,
    keys: [String; 3],
    /// This region's place among the regions, and how many (0 and 1
    /// without `storage.regions`).
    region: (usize, usize),
}

impl std::fmt::Debug for Persist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persist")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl Persist {
    /// For a shared backend; `None` for the memory store.
    pub fn for_backend(backend: &Backend) -> Option<Persist> {
        let keyer = backend.keyer()?.clone();
        let secret = keyer.derive("admin overrides v1");
        let cipher = ChaCha20Poly1305::new(Key::from_slice(&secret));
        let prefix = keyer.prefix();
        Some(Persist {
            keys: [
                own_key(prefix, "overrides"),
                own_key(prefix, "versions"),
                own_key(prefix, "version"),
            ],
            keyer,
            cipher,
            region: backend.regions().map_or((0, 1), |r| (r.index, r.len())),
        })
    }

    /// The keys the overrides are in, as the region link keeps them alike
    /// in every region.
    pub fn replicated(&self) -> Replicated {
        let [values, versions, counter] = self.keys.clone();
        Replicated {
            values,
            versions,
            counter,
        }
    }

    fn field(&self, tenant: &str) -> String {
        self.keyer.tenant_tag(tenant, 0).as_str().to_owned()
    }

    /// `value` as JSON, encrypted, in hex.
    pub fn seal<T: serde::Serialize>(&self, value: &T) -> String {
        let mut nonce = [0u8; 12];
        if getrandom::fill(&mut nonce).is_err() {
            // A nonce must never repeat under one key: fall back on time
            // and a counter.
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            nonce[..8].copy_from_slice(&super::now_ms().to_be_bytes());
            nonce[8..].copy_from_slice(&n.to_be_bytes());
        }
        let plain = serde_json::to_vec(value).expect("admin state serialises");
        let sealed = self
            .cipher
            .encrypt(Nonce::from_slice(&nonce), plain.as_slice())
            .expect("encryption of a small message");
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut out = String::with_capacity(2 * (nonce.len() + sealed.len()));
        for &b in nonce.iter().chain(&sealed) {
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
        out
    }

    /// What [`seal`](Self::seal) sealed; `None` for anything else.
    pub fn open<T: serde::de::DeserializeOwned>(&self, value: &str) -> Option<T> {
        let bytes: Vec<u8> = (0..value.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(value.get(i..i + 2)?, 16).ok())
            .collect::<Option<_>>()?;
        let (nonce, sealed) = bytes.split_at_checked(12)?;
        let plain = self.cipher.decrypt(Nonce::from_slice(nonce), sealed).ok()?;
        serde_json::from_slice(&plain).ok()
    }

    /// Stores (or with `None` removes) `tenant`'s override if its version
    /// is `expected`: the new version.
    pub async fn write(
        &self,
        backend: &Backend,
        tenant: &str,
        stored: Option<&Stored>,
        expected: Option<u64>,
    ) -> Result<u64, Refused> {
        self.call_write(backend, tenant, stored, (expected, false))
            .await
    }

    /// Removes `tenant`'s override of version `version`, expired: its
    /// tombstone keeps that version (see `WRITE_LUA`).
    pub async fn expire(
        &self,
        backend: &Backend,
        tenant: &str,
        version: u64,
    ) -> Result<u64, Refused> {
        self.call_write(backend, tenant, None, (Some(version), true))
            .await
    }

    async fn call_write(
        &self,
        backend: &Backend,
        tenant: &str,
        stored: Option<&Stored>,
        (expected, expiring): (Option<u64>, bool),
    ) -> Result<u64, Refused> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(WRITE_LUA).arg(3).arg(&self.keys[..]);
        cmd.arg(self.field(tenant))
            .arg(expected.map_or_else(String::new, |v| v.to_string()))
            .arg(stored.map_or_else(String::new, |s| self.seal(s)))
            .arg(if expiring { "expire" } else { "" })
            .arg(self.region.0)
            .arg(self.region.1);
        let (done, version): (i64, u64) = query(backend, &cmd).await.map_err(store)?;
        match done {
            1 => Ok(version),
            0 => Err(Refused::Missing),
            _ => Err(Refused::Conflict(version)),
        }
    }

    /// Publishes this instance's heavy-hitter windows (`snapshot`, sealed)
    /// under `instance`, and beside them (in a hash of small values) the
    /// number of the window they end with: what tells an instance gone
    /// silent, without reading every instance's windows.
    pub async fn publish_heavy(
        &self,
        backend: &Backend,
        instance: &str,
        number: u64,
        snapshot: &impl serde::Serialize,
    ) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(PUBLISH_LUA)
            .arg(2)
            .arg(format!("{}:heavy", self.base()))
            .arg(format!("{}:heavy-at", self.base()))
            .arg(instance)
            .arg(self.seal(snapshot))
            .arg(number)
            .arg(HEAVY_TTL_MS);
        query::<i64>(backend, &cmd).await.map(drop)
    }

    /// Every instance that published heavy hitters, with the number of
    /// the window it last published (0 for one that wrote no number: an
    /// older sluice).
    pub async fn heavy_numbers(
        &self,
        backend: &Backend,
    ) -> Result<std::collections::HashMap<String, u64>, StoreError> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(format!("{}:heavy-at", self.base()));
        let mut numbers: std::collections::HashMap<String, u64> = query(backend, &cmd).await?;
        let mut cmd = redis::cmd("HKEYS");
        cmd.arg(format!("{}:heavy", self.base()));
        let published: Vec<String> = query(backend, &cmd).await?;
        for instance in published {
            numbers.entry(instance).or_insert(0);
        }
        Ok(numbers)
    }

    /// Every instance's published heavy-hitter windows, by instance.
    pub async fn read_heavy<T: serde::de::DeserializeOwned>(
        &self,
        backend: &Backend,
    ) -> Result<Vec<(String, T)>, StoreError> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(format!("{}:heavy", self.base()));
        let values: std::collections::HashMap<String, String> = query(backend, &cmd).await?;
        Ok(values
            .into_iter()
            .filter_map(|(instance, value)| Some((instance, self.open(&value)?)))
            .collect())
    }

    /// Removes the windows `instance` published (gone stale).
    pub async fn forget_heavy(&self, backend: &Backend, instance: &str) -> Result<(), StoreError> {
        for key in ["heavy", "heavy-at"] {
            let mut cmd = redis::cmd("HDEL");
            cmd.arg(format!("{}:{key}", self.base())).arg(instance);
            query::<i64>(backend, &cmd).await?;
        }
        Ok(())
    }

    /// `{prefix}:{admin}`: every admin key's start, one slot.
    fn base(&self) -> &str {
        self.keys[0]
            .strip_suffix(":overrides")
            .expect("the overrides key")
    }

    /// What tells a change, in one call: the change counter (0 when the
    /// store has none) and how many overrides the store holds.
    pub async fn stamp(&self, backend: &Backend) -> Result<Stamp, StoreError> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(STAMP_LUA)
            .arg(2)
            .arg(&self.keys[2])
            .arg(&self.keys[0]);
        let (version, held): (u64, u64) = query(backend, &cmd).await?;
        Ok(Stamp { version, held })
    }

    /// `tenant`'s stored override, if the store holds one that opens.
    pub async fn read_one(
        &self,
        backend: &Backend,
        tenant: &str,
    ) -> Result<Option<Stored>, StoreError> {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(READ_ONE_LUA)
            .arg(2)
            .arg(&self.keys[..2])
            .arg(self.field(tenant));
        let (value, version): (Option<String>, Option<u64>) = query(backend, &cmd).await?;
        Ok(value.and_then(|value| {
            let mut stored: Stored = self.open(&value)?;
            stored.version = version.unwrap_or(0);
            Some(stored)
        }))
    }

    /// Every stored override that opens (others were written under another
    /// pepper), with its version.
    pub async fn read_all(&self, backend: &Backend) -> Result<Vec<Stored>, StoreError> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(&self.keys[0]);
        let values: std::collections::HashMap<String, String> = query(backend, &cmd).await?;
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(&self.keys[1]);
        let versions: std::collections::HashMap<String, u64> = query(backend, &cmd).await?;
        Ok(values
            .iter()
            .filter_map(|(field, value)| {
                let mut stored: Stored = self.open(value)?;
                stored.version = versions.get(field).copied().unwrap_or(0);
                Some(stored)
            })
            .collect())
    }
}

async fn query<T: redis::FromRedisValue>(
    backend: &Backend,
    cmd: &redis::Cmd,
) -> Result<T, StoreError> {
    match backend {
        Backend::Redis(store) => store.query(cmd).await,
        Backend::Cluster(store) => store.query(cmd).await,
        Backend::Memory(_) => Err(StoreError::Unavailable("no shared store".into())),
    }
}

/// A store error as the admin API refuses with it.
pub(super) fn store(e: StoreError) -> Refused {
    Refused::Store(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamp_tells_a_change_from_a_loss() {
        let known = Stamp {
            version: 10,
            held: 2,
        };
        let at = |version, held| Stamp { version, held }.against(known);
        assert_eq!(at(10, 2), Drift::Same);
        assert_eq!(at(11, 1), Drift::Changed);
        assert_eq!(at(10, 3), Drift::Changed);
        assert_eq!(at(0, 0), Drift::CounterGone);
        assert_eq!(at(7, 2), Drift::CounterBack);
        assert_eq!(at(10, 0), Drift::Lost);
        assert_eq!(Stamp::default().against(Stamp::default()), Drift::Same);
        assert_eq!(at(10, 2), Drift::Same);
    }
}
