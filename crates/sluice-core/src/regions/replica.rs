//! Entries kept alike in every region (the admin API's overrides): the
//! Rust twin of the store crate's `redis/regions/replica.lua`.
//!
//! Each entry is a field (an opaque tag) with a version and a value (an
//! override, sealed), or no value once deleted: a tombstone, kept so that
//! an older value heard later does not come back.
//!
//! **Last writer wins.** An entry heard replaces the stored one when its
//! version is higher; at an equal version, a tombstone wins over a value
//! (a region removing an expired override keeps its version: the removal
//! outranks that value, never a later write), and a larger value over a
//! smaller one (values are compared as bytes, and are lowercase hex,
//! which Lua's comparison orders alike). So merging is commutative,
//! associative and idempotent: regions that heard the same entries, in
//! any order and any number of times, hold the same.
//!
//! **Versions.** A region writes an entry at its Redis time in µs, or one
//! past its change counter if that is later; merging moves the counter
//! past every version it applied. So a write made in a region after
//! another region's write reached it wins over that one, whatever the two
//! clocks say; only writes that did not see each other are ordered by the
//! clocks.

use std::collections::BTreeMap;

/// One entry as shipped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its field.
    pub field: String,
    /// Its version.
    pub version: u64,
    /// Its value; `None`: deleted.
    pub value: Option<String>,
}

/// What a region's store holds of the replicated entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replica {
    /// By field, the version and the value (`None`: deleted).
    pub entries: BTreeMap<String, (u64, Option<String>)>,
    /// The change counter: moved by every change, at least every version.
    pub counter: u64,
}

/// Whether `heard` replaces `stored` (see the module's documentation).
pub fn wins(heard: (u64, Option<&str>), stored: (u64, Option<&str>)) -> bool {
    (heard.0, heard.1.is_none(), heard.1) > (stored.0, stored.1.is_none(), stored.1)
}

impl Replica {
    /// Merges `heard` (last writer wins): how many entries it changed.
    pub fn merge(&mut self, heard: &[Entry]) -> u64 {
        let mut applied = 0;
        let mut top = 0;
        for entry in heard {
            let stored = self
                .entries
                .get(&entry.field)
                .map_or((0, None), |(v, value)| (*v, value.as_deref()));
            if wins((entry.version, entry.value.as_deref()), stored) {
                self.entries
                    .insert(entry.field.clone(), (entry.version, entry.value.clone()));
                applied += 1;
                top = top.max(entry.version);
            }
        }
        if applied > 0 {
            self.counter = (self.counter + 1).max(top);
        }
        applied
    }

    /// Every entry, tombstones included, as shipped.
    pub fn shipped(&self) -> Vec<Entry> {
        self.entries
            .iter()
            .map(|(field, (version, value))| Entry {
                field: field.clone(),
                version: *version,
                value: value.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(field: &str, version: u64, value: Option<&str>) -> Entry {
        Entry {
            field: field.into(),
            version,
            value: value.map(str::to_owned),
        }
    }

    #[test]
    fn the_later_write_wins_and_a_tombstone_keeps_an_older_value_out() {
        let mut r = Replica::default();
        assert_eq!(r.merge(&[entry("a", 5, Some("0a"))]), 1);
        assert_eq!(r.merge(&[entry("a", 4, Some("ff"))]), 0);
        assert_eq!(r.merge(&[entry("a", 7, None)]), 1);
        assert_eq!(r.merge(&[entry("a", 6, Some("0b"))]), 0, "came back");
        assert_eq!(r.entries["a"], (7, None));
        // An expiry's tombstone, at the expired value's version, wins.
        assert_eq!(
            r.merge(&[entry("e", 4, Some("0e")), entry("e", 4, None)]),
            2
        );
        assert_eq!(r.merge(&[entry("e", 4, Some("0e"))]), 0);
        // Equal versions: the larger value, alike everywhere.
        assert_eq!(
            r.merge(&[entry("b", 3, Some("0c")), entry("b", 3, Some("0d"))]),
            2
        );
        assert_eq!(r.merge(&[entry("b", 3, Some("0c"))]), 0);
        assert_eq!(r.counter, 9, "past every version, and moved by each change");
    }

    #[test]
    fn regions_that_heard_the_same_entries_in_any_order_hold_the_same() {
        let writes = [
            entry("a", 3, Some("01")),
            entry("b", 9, Some("02")),
            entry("a", 3, Some("03")),
            entry("a", 8, None),
            entry("b", 2, None),
            entry("c", 1, Some("04")),
        ];
        let mut first = Replica::default();
        first.merge(&writes);
        let mut second = Replica::default();
        for w in writes.iter().rev() {
            second.merge(std::slice::from_ref(w));
            second.merge(&first.shipped());
        }
        assert_eq!(first.entries, second.entries);
    }
}
