//! One key of the memory store: its state behind its lock, when it goes
//! idle, and when something was last given back to it; and the settle
//! markers.

use parking_lot::Mutex;
use sluice_core::State;

/// Settle markers by reservation id and shard: the settled value, and
/// until when it is kept.
pub(super) type Markers = std::collections::HashMap<([u8; 16], u16), (String, u64)>;

pub(super) struct Entry {
    pub(super) slot: Mutex<Slot>,
}

pub(super) struct Slot {
    pub(super) state: State,
    /// From this moment the state is as good as fresh and may be dropped.
    pub(super) idle_at: u64,
    /// Set by the sweeper before it removes the entry.
    pub(super) dead: bool,
    /// When something was last given back to it (`gcra` and
    /// `token_bucket`; see [`Rule::returnable`](sluice_core::Rule::returnable)):
    /// `refund.lua` and `adjust.lua` keep it in the record's third number.
    pub(super) given_back_ms: u64,
}

impl Entry {
    pub(super) fn fresh() -> Entry {
        Entry {
            slot: Mutex::new(Slot {
                state: State::Fresh,
                idle_at: 0,
                dead: false,
                given_back_ms: 0,
            }),
        }
    }
}

/// Re-dates a state stamped later than `now` (the clock stepped back), and
/// keeps the repair whatever the decision: see `sluice_core::algorithm`.
#[inline]
pub(super) fn repair(rule: &sluice_core::Rule, slot: &mut Slot, now: u64) {
    fresh_mark(slot, now);
    if let Some(repaired) = rule.repair(&slot.state, now) {
        slot.state = repaired;
        slot.idle_at = rule.idle_at(&slot.state);
    }
}

/// A key without a state (new, or swept: its bucket was whole) is marked
/// as given back to now: no give-back of an admission before it can count
/// on where that admission's units sat
/// ([`Rule::returnable`](sluice_core::Rule::returnable)), as `decide.lua`
/// marks a record it makes.
pub(super) fn fresh_mark(slot: &mut Slot, now: u64) {
    if matches!(slot.state, State::Fresh) {
        slot.given_back_ms = now;
    }
}
