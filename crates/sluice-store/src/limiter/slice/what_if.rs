//! What a shadow rule's tolerance would admit: a what-if beside the rule,
//! changing nothing.
//!
//! A rule in shadow mode is decided exactly and never denies. With a
//! tolerance, each request the store admits whose rules would all take
//! slices were the shadow ones enforced ([`replayed`](super::replayed)) is
//! replayed on this instance against two copies of each shadow rule, kept
//! here per key: one enforced exactly, one enforced with its tolerance,
//! the key followed as [`Slices::plan`](super::Slices) follows it (the
//! same [`Entry`]: hot threshold, slice sizes and lifetimes, spends, a new
//! take when a slice runs low). In each window of the rule's `per`
//! (aligned to the epoch), the units the second admits beyond the first
//! are the over-admission the tolerance would have allowed, reported as
//! they appear ([`Telemetry::slice_shadow_over`](crate::Telemetry::slice_shadow_over)).
//!
//! Each instance replays only its share of a key's traffic, so its copies
//! hold its share of the rule among the live instances (as the local
//! fallback does), on the tenant's shard that decided; the fleet's figure
//! is the sum over instances, an estimate that assumes traffic spread
//! evenly. Over-admission shows where a hot key goes from below its limit
//! to past it (the slices held on top of a full bucket, whose refill an
//! exact bucket would have dropped); a key held at its limit, or a
//! `fixed_window` (its slices end with their window), shows none.
//!
//! Both copies live in this process: the what-if costs no store call. It
//! runs where slices do, on Redis and Redis Cluster. At most
//! [`MAX_KEYS`](super::MAX_KEYS) keys are followed; a key idle for two
//! seconds whose copies are both as good as fresh is forgotten, and every
//! key on a reload.

use sluice_core::{BoundRule, Rule, State};

use super::entry::{Entry, Piece};
use super::keys::KeyMap;
use super::{lifetime_ms, slice_size};
use crate::store::Batch;

/// One key of a shadow rule with a tolerance, replayed both ways.
struct Replay {
    /// This instance's share of the rule (see [`WhatIfs::replay`]).
    rule: Rule,
    parts: u64,
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
    fn new(bound: &BoundRule, parts: u64) -> Replay {
        let rule = bound.rule().share(parts);
        let mut entry = Entry::new(bound, 0);
        entry.remaining = rule.capacity();
        Replay {
            rule,
            parts,
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

    /// Whether the key can be forgotten at `now` without changing what it
    /// would report: not decided for two seconds, no slice held, and both
    /// copies as good as fresh (as they are recreated).
    fn idle(&self, now: u64) -> bool {
        now / 1_000 > self.entry.second + 1
            && self.entry.held(now) == 0
            && self.rule.idle_at(&self.exact) <= now
            && self.rule.idle_at(&self.sliced) <= now
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
                whole_at_ms: now + taken.reset_after_ms,
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

/// Every key of a shadow rule with a tolerance this instance replays.
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
    /// Replays `batch`, which the store admitted at `now`, on its shadow
    /// rules with a tolerance: each one's over-admission that appears with
    /// it, by rule index (`report`). Each copy holds this instance's share
    /// of the rule among `parts` live instances (as the local fallback
    /// does), the key's traffic being spread over them.
    pub fn replay(
        &self,
        batch: &Batch<'_>,
        now: u64,
        parts: u64,
        mut report: impl FnMut(usize, u64),
    ) {
        for (i, bound) in batch.rules.iter().enumerate() {
            if !bound.shadow() {
                continue;
            }
            let key = self.replays.key(batch, i, batch.shard);
            let mut map = self.replays.lock(&key);
            let owned = key.to_key();
            let known = map.contains_key(&owned) || self.replays.admit();
            if !known {
                continue;
            }
            let replay = map
                .entry(owned)
                .or_insert_with(|| Replay::new(bound, parts));
            if replay.parts != parts {
                // Another number of instances: another share, afresh.
                *replay = Replay::new(bound, parts);
            }
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

    /// Forgets idle keys whose copies are alike (see `Replay::idle`).
    pub fn sweep(&self, now: u64) {
        self.replays.retain(|r| !r.idle(now));
    }
}
