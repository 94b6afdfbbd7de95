//! Opaque storage keys, derived with HMAC-SHA256 under a server-side pepper.
//!
//! A key reads `PREFIX:{T}:K`:
//!
//! - `T`, the hash tag, is 128 bits of `HMAC(pepper, "T" ‖ shard ‖ tenant)`
//!   (or of `"G" ‖ shard ‖ rule identity` for a global valve). All of a
//!   tenant's keys in one shard share it, so Redis Cluster puts them in one
//!   slot and one script can touch them all.
//! - `K` is 128 bits of `HMAC(pepper, "B" ‖ T ‖ scope and pattern ‖
//!   subject)`: the rules of one scope and pattern whose state is a few
//!   numbers share the key, a record each (one `GET` and one `SET` decide
//!   them all). A record is named by 64 bits of `HMAC(pepper, "K" ‖ T ‖
//!   rule identity ‖ subject)`. A rule whose state is a set of entries
//!   (sliding_log, concurrency) has a key of its own: `K` is 128 bits of
//!   that same HMAC.
//!
//! Both depend on the tenant, so two tenants' keys and records for the same
//! rule look unrelated: the keyspace does not even show who shares a plan.
//! Without the pepper nobody can tell which tenant, route, subject or plan a
//! key belongs to, nor test a guess. Variable-length inputs are
//! length-prefixed so that no two inputs collide by concatenation.

use std::fmt;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::bound::BoundRule;

type HmacSha256 = Hmac<Sha256>;

/// The server-side secret keys are derived under. Never printed.
#[derive(Clone)]
pub struct Pepper(Box<[u8]>);

/// Why a pepper was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the pepper must be at least {min} bytes (got {got}); generate one with `openssl rand -hex 32`",
    min = Pepper::MIN_BYTES
)]
pub struct PepperError {
    got: usize,
}

impl Pepper {
    /// The shortest pepper accepted, in bytes after hex decoding.
    pub const MIN_BYTES: usize = 32;

    /// Reads a pepper from the contents of an environment variable or file.
    /// Surrounding whitespace is ignored; text of only hex digits (even
    /// length) is decoded, anything else is used as raw bytes.
    pub fn parse(secret: &[u8]) -> Result<Pepper, PepperError> {
        let trimmed = secret.trim_ascii();
        let bytes = decode_hex(trimmed).unwrap_or_else(|| trimmed.to_vec());
        if bytes.len() < Pepper::MIN_BYTES {
            return Err(PepperError { got: bytes.len() });
        }
        Ok(Pepper(bytes.into()))
    }
}

impl fmt::Debug for Pepper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Pepper(<redacted>)")
    }
}

fn decode_hex(text: &[u8]) -> Option<Vec<u8>> {
    if text.is_empty() || !text.len().is_multiple_of(2) {
        return None;
    }
    let digit = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    text.chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// A hash tag: 128 bits as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tag([u8; 32]);

impl Tag {
    fn from_mac(mac: HmacSha256) -> Tag {
        let digest = mac.finalize().into_bytes();
        let mut hex = [0u8; 32];
        for (i, byte) in digest[..16].iter().enumerate() {
            hex[2 * i] = HEX[usize::from(byte >> 4)];
            hex[2 * i + 1] = HEX[usize::from(byte & 0xf)];
        }
        Tag(hex)
    }

    /// The tag's text.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex is ASCII")
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Derives keys under one pepper and prefix.
#[derive(Clone)]
pub struct Keyer {
    prefix: Box<str>,
    mac: HmacSha256,
    /// Whether shared rules are one budget across linked regions (see
    /// [`linking_regions`](Self::linking_regions)).
    regions: bool,
}

impl fmt::Debug for Keyer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyer")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Keyer {
    /// A keyer for `prefix` (e.g. `sl`) and `pepper`.
    pub fn new(prefix: &str, pepper: &Pepper) -> Keyer {
        let mac = HmacSha256::new_from_slice(&pepper.0).expect("HMAC takes keys of any length");
        Keyer {
            prefix: prefix.into(),
            mac,
            regions: false,
        }
    }

    /// The keyer of a store whose shared rules are one budget across
    /// linked regions (`storage.regions`): the record of a shared `gcra` or
    /// `token_bucket` is then named apart, with its period. Its numbers
    /// are a region's part of the rate, in units of that period
    /// ([`crate::regions::bucket`]): a rule made local (or shared), or
    /// whose period a reload changes, starts from a record of its own (a
    /// full bucket: the fleet may admit one burst more at that reload)
    /// rather than misread another's.
    pub fn linking_regions(mut self) -> Keyer {
        self.regions = true;
        self
    }

    /// The prefix every key starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A fingerprint of the pepper, 16 hex digits: instances announce it
    /// with their heartbeat so that two on one Redis with different peppers
    /// (whose keys never meet, so every limit would count twice) are told.
    /// It is an HMAC under the pepper of a fixed label, in its own domain
    /// (no key derivation hashes this label), so it reveals nothing of the
    /// pepper or of any key.
    pub fn fingerprint(&self) -> String {
        let mut mac = self.mac.clone();
        mac.update(b"F\0sluice pepper fingerprint v1");
        let digest = mac.finalize().into_bytes();
        digest[..8].iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A secret for `purpose` derived from the pepper (its own domain: no
    /// key derivation hashes these labels), e.g. to encrypt what the admin
    /// API stores.
    pub fn derive(&self, purpose: &str) -> [u8; 32] {
        let mut mac = self.mac.clone();
        mac.update(b"D\0");
        mac.update(purpose.as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// The tag of a tenant's keys in `shard`.
    pub fn tenant_tag(&self, tenant: &str, shard: u16) -> Tag {
        let mut mac = self.mac.clone();
        mac.update(b"T");
        mac.update(&shard.to_be_bytes());
        mac.update(tenant.as_bytes());
        Tag::from_mac(mac)
    }

    /// The tag of a global valve's keys in `shard`.
    pub fn global_tag(&self, rule: &BoundRule, shard: u16) -> Tag {
        let mut mac = self.mac.clone();
        mac.update(b"G");
        mac.update(&shard.to_be_bytes());
        mac.update(rule.identity());
        Tag::from_mac(mac)
    }

    /// The key of `rule`'s bucket under `tag`, for `subject` when the rule
    /// is per subject: shared by the rules of its scope and pattern unless
    /// its state is a set (see the module's documentation).
    pub fn key(&self, tag: &Tag, rule: &BoundRule, subject: Option<&str>) -> String {
        if rule.rule().algorithm().keeps_a_set() {
            self.full_key(tag, &self.rule_digest(tag, rule, subject)[..16])
        } else {
            self.group_key(tag, rule, subject)
        }
    }

    /// The key of the group `rule` belongs to (its scope and pattern, and
    /// `subject`) under `tag`.
    pub fn group_key(&self, tag: &Tag, rule: &BoundRule, subject: Option<&str>) -> String {
        self.full_key(tag, &self.digest(b"B", tag, rule.group(), subject)[..16])
    }

    /// The key of a settle's marker for reservation `id` under `tag` (the
    /// tenant's, so that it shares the slot of the tenant's rules).
    pub fn marker_key(&self, tag: &Tag, id: &[u8]) -> String {
        self.full_key(tag, &self.digest(b"M", tag, id, None)[..16])
    }

    /// The name of `rule`'s record in its group's key under `tag`.
    pub fn record(&self, tag: &Tag, rule: &BoundRule, subject: Option<&str>) -> Record {
        let digest = match rule.shared_identity() {
            Some(identity) if self.regions => self.digest(b"K", tag, identity, subject),
            _ => self.rule_digest(tag, rule, subject),
        };
        Record(digest[16..24].try_into().expect("8 bytes"))
    }

    fn rule_digest(&self, tag: &Tag, rule: &BoundRule, subject: Option<&str>) -> [u8; 32] {
        self.digest(b"K", tag, rule.identity(), subject)
    }

    /// `HMAC(pepper, domain ‖ tag ‖ len(name) ‖ name [‖ "S" ‖ subject])`.
    fn digest(&self, domain: &[u8], tag: &Tag, name: &[u8], subject: Option<&str>) -> [u8; 32] {
        let mut mac = self.mac.clone();
        mac.update(domain);
        mac.update(&tag.0);
        mac.update(&(name.len() as u32).to_be_bytes());
        mac.update(name);
        if let Some(subject) = subject {
            mac.update(b"S");
            mac.update(subject.as_bytes());
        }
        mac.finalize().into_bytes().into()
    }

    /// `PREFIX:{tag}:hex(k)`.
    fn full_key(&self, tag: &Tag, k: &[u8]) -> String {
        let mut key = String::with_capacity(self.prefix.len() + 4 + 32 + 2 * k.len());
        key.push_str(&self.prefix);
        key.push_str(":{");
        key.push_str(tag.as_str());
        key.push_str("}:");
        for byte in k {
            key.push(char::from(HEX[usize::from(byte >> 4)]));
            key.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
        key
    }
}

/// The name of a rule's record among its group's (64 bits of an HMAC:
/// opaque, and different for every tenant).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Record(pub [u8; 8]);

impl fmt::Debug for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_fingerprint_tells_peppers_apart_and_reveals_neither() {
        let a = Pepper::parse(&[7u8; 32]).unwrap();
        let b = Pepper::parse(&[8u8; 32]).unwrap();
        let fa = Keyer::new("sl", &a).fingerprint();
        assert_eq!(fa, Keyer::new("other", &a).fingerprint());
        assert_ne!(fa, Keyer::new("sl", &b).fingerprint());
        assert_eq!(fa.len(), 16);
        assert!(!fa.contains("0707"), "{fa}");
    }

    use super::*;
    use crate::config::Config;
    use crate::policy::Policy;

    fn pepper(byte: u8) -> Pepper {
        Pepper::parse(&[byte; 32]).unwrap()
    }

    #[test]
    fn pepper_accepts_hex_or_raw_and_refuses_short() {
        let hex = "ab".repeat(32);
        assert!(Pepper::parse(hex.as_bytes()).is_ok());
        assert!(Pepper::parse(format!("{hex}\n").as_bytes()).is_ok());
        // 40 hex digits decode to 20 bytes: too short.
        let err = Pepper::parse("ab".repeat(20).as_bytes()).unwrap_err();
        assert!(err.to_string().contains("openssl rand -hex 32"));
        assert!(Pepper::parse(b"too short").is_err());
        assert_eq!(format!("{:?}", pepper(7)), "Pepper(<redacted>)");
    }

    #[test]
    fn keys_are_opaque_stable_and_depend_on_the_pepper() {
        let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ limit: 5, per: 1s }]\n";
        let policy = Policy::compile(&Config::from_yaml(yaml, "t").unwrap().limits);
        let rule = &policy.applicable("acme", "GET /", false).rules[0];
        let a = Keyer::new("sl", &pepper(1));
        let b = Keyer::new("sl", &pepper(2));
        let key = a.key(&a.tenant_tag("acme", 0), rule, None);
        assert_eq!(key, a.key(&a.tenant_tag("acme", 0), rule, None));
        assert_ne!(key, b.key(&b.tenant_tag("acme", 0), rule, None));
        assert_ne!(key, a.key(&a.tenant_tag("acme", 1), rule, None));
        assert_ne!(key, a.key(&a.tenant_tag("acme", 0), rule, Some("u1")));
        assert!(key.starts_with("sl:{"));
        assert_eq!(key.len(), "sl:{".len() + 32 + "}:".len() + 32);
        assert!(!key.contains("acme"));
    }

    #[test]
    fn rules_of_one_scope_share_a_key_and_differ_in_their_record() {
        let yaml = r#"
default_plan: p
plans:
  p:
    tenant:
      - { algorithm: gcra, limit: 5, per: 1s }
      - { algorithm: fixed_window, limit: 50, per: 1m }
      - { algorithm: sliding_log, limit: 5, per: 1s }
    routes:
      "GET /a": [{ algorithm: gcra, limit: 5, per: 1s }]
"#;
        let policy = Policy::compile(&Config::from_yaml(yaml, "t").unwrap().limits);
        let rules = policy.applicable("acme", "GET /a", false).rules;
        let k = Keyer::new("sl", &pepper(1));
        let tag = k.tenant_tag("acme", 0);
        let key = |i: usize| k.key(&tag, &rules[i], None);
        let record = |i: usize| k.record(&tag, &rules[i], None);
        let (gcra, window, log, route) = (0, 1, 2, 3);
        assert_eq!(rules[route].scope(), crate::policy::Scope::Route);
        assert_eq!(key(gcra), key(window));
        assert_ne!(record(gcra), record(window));
        // A set keeps a key of its own; another scope has another key.
        assert_ne!(key(log), key(gcra));
        assert_ne!(key(route), key(gcra));
        // Per subject: another key, the same shape.
        let with_subject = k.key(&tag, &rules[gcra], Some("u1"));
        assert_ne!(with_subject, key(gcra));
        assert_eq!(with_subject.len(), key(gcra).len());
        // Records are per tenant too: they do not show who shares a plan.
        let other = k.tenant_tag("globex", 0);
        assert_ne!(k.record(&other, &rules[gcra], None), record(gcra));
        // Under another pepper, everything differs.
        let b = Keyer::new("sl", &pepper(2));
        let btag = b.tenant_tag("acme", 0);
        assert_ne!(b.key(&btag, &rules[gcra], None), key(gcra));
        assert_ne!(b.record(&btag, &rules[gcra], None), record(gcra));
    }

    /// Keys are what a running fleet shares: a change renames every bucket
    /// (a tenant gets a fresh budget during a rolling upgrade). These were
    /// computed by 0.1, whose set keys this version keeps.
    #[test]
    fn the_keys_of_sets_are_those_of_earlier_versions() {
        let yaml = "default_plan: p\nplans:\n  p:\n    tenant: [{ algorithm: sliding_log, limit: 5, per: 1s }, { algorithm: concurrency, limit: 5, lease: 1s }]\n";
        let policy = Policy::compile(&Config::from_yaml(yaml, "t").unwrap().limits);
        let rules = policy.applicable("acme", "GET /", false).rules;
        let k = Keyer::new("sl", &pepper(1));
        let tag = k.tenant_tag("acme", 0);
        assert_eq!(
            k.key(&tag, &rules[0], None),
            "sl:{e244132a48add183b4598359bc9be1a6}:ba3870ebda4803ea30255be02be46a5c"
        );
        assert_eq!(
            k.key(&tag, &rules[1], Some("u1")),
            "sl:{e244132a48add183b4598359bc9be1a6}:7259f160219fb2c211add80c80ee6a1c"
        );
    }
}
