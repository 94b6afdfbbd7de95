//! What a shadow rule's tolerance would admit: a what-if beside the rule,
//! changing nothing.
//!
//! A rule in shadow mode is decided exactly and never denies. With a
//! tolerance, this instance also replays its own requests of each of the
//! rule's keys against two copies of the rule kept here: one enforced
//! exactly, one enforced with its tolerance, the key followed as
//! [`Slices::plan`](super::Slices) follows it (the same [`Entry`]: hot
//! threshold, slice sizes and lifetimes, spends, a new take when a slice
//! runs low). In each window of the rule's `per` (aligned to the epoch),
//! the units the second admits beyond the first are the over-admission
//! the tolerance would have allowed on this instance's traffic, reported
//! as they appear ([`Telemetry::slice_shadow_over`](crate::Telemetry::slice_shadow_over)).
//! The fleet's is the sum over its instances: an estimate, since each
//! instance's exact copy sees only its share of a key's traffic.
//!
//! Over-admission shows where a hot key goes from below its limit to past
//! it (the slices held on top of a full bucket, whose refill an exact
//! bucket would have dropped); a key held at its limit, or a
//! `fixed_window` (its slices end with their window), shows none.
//!
//! Both copies live in this process: the what-if costs no store call, on
//! any backend. At most [`MAX_KEYS`](super::MAX_KEYS) keys are followed;
//! a key is forgotten two windows after its last request, and every key
//! on a reload.

use sluice_core::tolerance::Tolerance;
use sluice_core::{BoundRule, Rule, Scope, State};

use super::entry::{Entry, Piece};
use super::keys::KeyMap;
use super::{lifetime_ms, slice_size};
use crate::store::Batch;

/// Whether `rule` is replayed: a shadow rule with a tolerance it takes.
fn followed(rule: &BoundRule) -> bool {
    rule.shadow()
        && !rule.tolerance().is_exact()
        && matches!(
            rule.scope(),
            Scope::Tenant | Scope::Route | Scope::Subject | Scope::Descriptor
        )
        && Tolerance::applies_to(rule.rule().algorithm())
}

/// One key of a followed rule, replayed both ways.
struct Replay {
    rule: Rule,
    /// Enforced exactly.
    exact: State,
    /// Enforced with the tolerance: the store's state, and the key as
    /// [`Slices`](super::Slices) follows it (rate, slices held, the
    /// store's last `remaining`).
    sliced: State,
    entry: Entry,
    /// The window of `per` counted in, what each copy admitted in it, and
    /// the over-admission reported of it so far.
    window: u64,
    exact_in: u64,
    sliced_in: u64,
    reported: u64,
}

impl Replay {
    fn new(bound: &BoundRule) -> Replay {
        let rule = *bound.rule();
        let mut entry = Entry::new(bound, 0);
        entry.remaining = rule.capacity();
        Replay {
            rule,
            exact: State::Fresh,
            sliced: State::Fresh,
            entry,
            window: 0,
            exact_in: 0,
            sliced_in: 0,
            reported: 0,
        }
    }

    /// `cost` decided at `now` both ways; the over-admission that appears
    /// with it in the current window.
    fn replay(&mut self, cost: u64, now: u64) -> u64 {
        let window = now - now % self.rule.period_ms().max(1);
        if window != self.window {
            (self.window, self.exact_in, self.sliced_in, self.reported) = (window, 0, 0, 0);
        }
        if admit(&self.rule, &mut self.exact, now, cost).is_some() {
            self.exact_in += cost;
        }
        if self.sliced_admits(cost, now) {
            self.sliced_in += cost;
        }
        let over = self.sliced_in.saturating_sub(self.exact_in);
        let new = over.saturating_sub(self.reported);
        self.reported = self.reported.max(over);
        new
    }

    /// Whether the copy with the tolerance admits `cost` at `now`, as
    /// [`Slices::plan`](super::Slices) decides: from a slice held, unless
    /// it runs low and another can be taken; else from the store, taking
    /// a slice along when the key is hot, exactly when the store denies
    /// the take.
    fn sliced_admits(&mut self, cost: u64, now: u64) -> bool {
        let entry = &mut self.entry;
        entry.hit(now);
        let spent = entry.spend(cost, now);
        let size = slice_size(
            &entry.rule,
            entry.rate(now),
            entry.held(now),
            cost,
            entry.remaining,
        );
        match spent {
            Some((_, _, low, _)) if !(low && size.is_some()) => return true,
            // To the store, with a take: what was spent goes back.
            Some((expires, ..)) => entry.give_back(expires, cost),
            None => {}
        }
        if let Some(size) = size
            && let Some(taken) = admit(&self.rule, &mut self.sliced, now, cost + size)
        {
            entry.remaining = u64::from(taken.remaining);
            let piece = Piece {
                units: size,
                size,
                expires_ms: now + lifetime_ms(&entry.rule, taken.reset_after_ms),
                reset_at_ms: now + taken.reset_after_ms,
                taken_ms: now,
            };
            entry.place(piece, now);
            return true;
        }
        let exact = admit(&self.rule, &mut self.sliced, now, cost);
        entry.remaining = exact.map_or(0, |o| u64::from(o.remaining));
        exact.is_some()
    }
}

/// `cost` decided on `state` at `now`, committed when admitted.
fn admit(rule: &Rule, state: &mut State, now: u64, cost: u64) -> Option<sluice_core::Outcome> {
    let (outcome, step) = rule.decide(state, now, cost);
    outcome.allowed.then(|| {
        rule.commit(state, step);
        outcome
    })
}

/// Every key of a followed rule this instance replays.
#[derive(Default)]
pub struct WhatIfs {
    replays: KeyMap<Replay>,
}

impl std::fmt::Debug for WhatIfs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WhatIfs")
            .field("keys", &self.replays.len())
            .finish()
    }
}

impl WhatIfs {
    /// Replays `batch` at `now` on every followed rule of it: each one's
    /// over-admission that appears with it, by rule index (`report`).
    pub fn replay(&self, batch: &Batch<'_>, now: u64, mut report: impl FnMut(usize, u64)) {
        for (i, bound) in batch.rules.iter().enumerate() {
            if !followed(bound) {
                continue;
            }
            let key = self.replays.key(batch, i, 0);
            let mut map = self.replays.lock(&key);
            let owned = key.to_key();
            let followed = map.contains_key(&owned) || self.replays.admit();
            if !followed {
                continue;
            }
            let replay = map.entry(owned).or_insert_with(|| Replay::new(bound));
            let over = replay.replay(batch.cost_of(i), now);
            if over > 0 {
                report(i, over);
            }
        }
    }

    /// Forgets every key (the policy changed).
    pub fn clear(&self) {
        self.replays.clear();
    }

    /// Forgets keys not decided in their last two windows: both copies
    /// would be whole again (idle past the rule's `per`), or nearly so.
    pub fn sweep(&self, now: u64) {
        self.replays
            .retain(|r| now < r.window + 2 * r.rule.period_ms());
    }
}
