//! The keys the region link keeps in each region's store, beside the
//! rules' own: the live shared keys (a sorted set, each member a key and
//! record scored by the end of its window), who leads the link, the
//! region's identity (pepper fingerprint and regions), and when each peer
//! last shipped here and what it added.

use sluice_core::keys::Record;

use super::shared::Shared;

/// Shared keys' store keys (by region, under the store's prefix).
pub(super) fn live_key(prefix: &str) -> String {
    format!("{prefix}:regions:live")
}
pub(super) fn lead_key(prefix: &str) -> String {
    format!("{prefix}:regions:lead")
}
pub(super) fn identity_key(prefix: &str) -> String {
    format!("{prefix}:regions:identity")
}
pub(super) fn heard_key(prefix: &str) -> String {
    format!("{prefix}:regions:heard")
}
pub(super) fn received_key(prefix: &str) -> String {
    format!("{prefix}:regions:received")
}

/// A live key's member in the live set: its per, its record's name and its
/// key (the key last: it may hold spaces).
pub(super) fn member(shared: &Shared) -> String {
    let name: String = shared.record.0.iter().map(|b| format!("{b:02x}")).collect();
    format!("{} {name} {}", shared.per_ms, shared.key)
}

pub(super) fn parse_member(member: &str) -> Option<Shared> {
    let mut parts = member.splitn(3, ' ');
    let per_ms = parts.next()?.parse().ok().filter(|&p: &u64| p > 0)?;
    let name = parts.next()?;
    let key = parts.next()?.to_owned();
    let mut record = [0u8; 8];
    if name.len() != 16 {
        return None;
    }
    for (i, byte) in record.iter_mut().enumerate() {
        *byte = u8::from_str_radix(name.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(Shared {
        key,
        record: Record(record),
        per_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_member_reads_back_whatever_its_key_holds() {
        let shared = Shared {
            key: "sl:{ab cd}:0f".into(),
            record: Record([0, 1, 0xfe, 0xff, 7, 8, 9, 10]),
            per_ms: 60_000,
        };
        assert_eq!(parse_member(&member(&shared)), Some(shared));
        for bad in [
            "",
            "0 0001feff0708090a k",
            "60000 zz k",
            "60000 00 k",
            "60000",
        ] {
            assert_eq!(parse_member(bad), None, "{bad}");
        }
    }
}
