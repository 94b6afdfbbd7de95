//! The keys the region link keeps in each region's store, beside the
//! rules' own: the live shared keys (a sorted set, each member a key and
//! record scored by the end of its window), who leads the link, the
//! region's identity (pepper fingerprint and regions), and when each peer
//! last shipped here and what it added. They are the store's own keys
//! (`own_key`): one slot on a cluster, the admin API's.

use std::collections::HashMap;

use redis::Cmd;
use sluice_core::keys::Record;

use crate::redis::own_key;

use super::shared::{Kind, Shared};

/// Shared keys' store keys (by region, under the store's prefix).
pub(super) fn live_key(prefix: &str) -> String {
    own_key(prefix, "regions:live")
}
/// The live keys whose part changed since the lead last read them (noted
/// here, or shipped by a peer): a set of live-set members.
pub(super) fn changed_key(prefix: &str) -> String {
    own_key(prefix, "regions:changed")
}
pub(super) fn lead_key(prefix: &str) -> String {
    own_key(prefix, "regions:lead")
}
/// The key of the region's identity (its peppers' fingerprints, the
/// regions and weights), read by its peers before they merge.
pub fn identity_key(prefix: &str) -> String {
    own_key(prefix, "regions:identity")
}
pub(super) fn heard_key(prefix: &str) -> String {
    own_key(prefix, "regions:heard")
}
/// The hash of the units each region's totals added here, by region
/// (its place among the regions).
pub fn received_key(prefix: &str) -> String {
    own_key(prefix, "regions:received")
}

/// A live key's member in the live set: its per (after an `s` for a
/// `sliding_window`, a `b` for a bucket) and its max_debt after a colon (a
/// bucket's burst and pool after two more), its record's name and
/// its key, then while rotating the same under the previous pepper,
/// separated by spaces (keys are a prefix of letters, digits, `_` or `-`,
/// a hash tag and hex digits).
pub(super) fn member(shared: &Shared) -> String {
    let hex = |r: &Record| -> String { r.0.iter().map(|b| format!("{b:02x}")).collect() };
    let (kind, bucket) = match shared.kind {
        Kind::Window => ("", String::new()),
        Kind::Sliding => ("s", String::new()),
        Kind::Bucket { burst, pool } => ("b", format!(":{burst}:{pool}")),
    };
    let mut member = format!(
        "{kind}{}:{}{bucket} {} {}",
        shared.per_ms,
        shared.max_debt,
        hex(&shared.record),
        shared.key
    );
    if let Some((key, record)) = &shared.previous {
        member.push_str(&format!(" {} {key}", hex(record)));
    }
    member
}

fn record(hex: &str) -> Option<Record> {
    let mut record = [0u8; 8];
    if hex.len() != 16 {
        return None;
    }
    for (i, byte) in record.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Record(record))
}

pub(super) fn parse_member(member: &str) -> Option<Shared> {
    let parts: Vec<&str> = member.split(' ').collect();
    let mut numbers = parts.first()?.split(':');
    let (per, max_debt) = (numbers.next()?, numbers.next()?);
    let (kind, per) = if let Some(per) = per.strip_prefix('s') {
        (Kind::Sliding, per)
    } else if let Some(per) = per.strip_prefix('b') {
        let burst = numbers.next()?.parse().ok()?;
        let pool = numbers.next()?.parse().ok()?;
        (Kind::Bucket { burst, pool }, per)
    } else {
        (Kind::Window, per)
    };
    if numbers.next().is_some() {
        return None;
    }
    let per_ms = per.parse().ok().filter(|&p: &u64| p > 0)?;
    let max_debt = max_debt.parse().ok()?;
    let previous = match parts.len() {
        3 => None,
        5 => Some((parts[4].to_owned(), record(parts[3])?)),
        _ => return None,
    };
    Some(Shared {
        key: parts[2].to_owned(),
        record: record(parts[1])?,
        per_ms,
        kind,
        max_debt,
        previous,
    })
}

/// The commands that mark `live` keys (each with the end of its window)
/// live and changed in the store whose keys are under `prefix`: its lead
/// reads them next.
pub(super) fn marked_live<'a>(
    prefix: &str,
    live: impl Iterator<Item = (u64, &'a Shared)>,
) -> Vec<Cmd> {
    let (mut zadd, mut sadd) = (redis::cmd("ZADD"), redis::cmd("SADD"));
    zadd.arg(live_key(prefix)).arg("GT");
    sadd.arg(changed_key(prefix));
    let mut any = false;
    for (ends, shared) in live {
        let member = member(shared);
        zadd.arg(ends).arg(&member);
        sadd.arg(member);
        any = true;
    }
    if any { vec![zadd, sadd] } else { Vec::new() }
}

/// The live keys `members` name, each once: a key named both with and
/// without the previous pepper's key (noted here while rotating, shipped
/// by a peer that is not, or that is a cluster) is read with it, on one
/// node; on a cluster (`cluster`), which carries nothing over from a
/// previous pepper, without.
pub(super) fn live_keys(members: &[String], cluster: bool) -> Vec<Shared> {
    let mut keys: Vec<Shared> = Vec::with_capacity(members.len());
    let mut at: HashMap<Shared, usize> = HashMap::with_capacity(members.len());
    for shared in members.iter().filter_map(|m| parse_member(m)) {
        let mut bare = shared.clone();
        bare.previous = None;
        let shared = if cluster { bare.clone() } else { shared };
        match at.get(&bare) {
            Some(&i) => {
                if keys[i].previous.is_none() {
                    keys[i] = shared;
                }
            }
            None => {
                at.insert(bare, keys.len());
                keys.push(shared);
            }
        }
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_member_reads_back_whatever_its_key_holds() {
        let shared = Shared {
            key: "sl:{abcd}:0f".into(),
            record: Record([0, 1, 0xfe, 0xff, 7, 8, 9, 10]),
            per_ms: 60_000,
            kind: Kind::Window,
            max_debt: 7,
            previous: None,
        };
        assert_eq!(parse_member(&member(&shared)), Some(shared.clone()));
        let rotating = Shared {
            previous: Some(("sl:{ef}:01".into(), Record([9; 8]))),
            ..shared.clone()
        };
        assert_eq!(parse_member(&member(&rotating)), Some(rotating));
        let bucket = Shared {
            kind: Kind::Bucket {
                burst: 50,
                pool: 33,
            },
            ..shared.clone()
        };
        assert_eq!(parse_member(&member(&bucket)), Some(bucket));
        let sliding = Shared {
            kind: Kind::Sliding,
            ..shared
        };
        assert_eq!(parse_member(&member(&sliding)), Some(sliding));
        for bad in [
            "",
            "0:0 0001feff0708090a k",
            "60000 0001feff0708090a k",
            "60000:x 0001feff0708090a k",
            "60000:0 zz k",
            "60000:0 00 k",
            "60000:0",
            "60000:0 0001feff0708090a k 0909 k2",
        ] {
            assert_eq!(parse_member(bad), None, "{bad}");
        }
    }

    /// A key noted here while rotating (with its previous pepper's key) and
    /// shipped by a peer without it is one live key, read with it on one
    /// node (else its lead would grant from the same reading twice a
    /// sync), without it on a cluster.
    #[test]
    fn a_key_named_with_and_without_its_previous_is_read_once() {
        let bare = Shared {
            key: "sl:{t}:01".into(),
            record: Record([1; 8]),
            per_ms: 60_000,
            kind: Kind::Window,
            max_debt: 0,
            previous: None,
        };
        let rotating = Shared {
            previous: Some(("sl:{u}:02".into(), Record([2; 8]))),
            ..bare.clone()
        };
        let other = Shared {
            key: "sl:{v}:03".into(),
            ..bare.clone()
        };
        let members = [member(&bare), member(&other), member(&rotating)];
        assert_eq!(
            live_keys(&members, false),
            [rotating.clone(), other.clone()]
        );
        assert_eq!(live_keys(&members, true), [bare, other]);
    }
}
