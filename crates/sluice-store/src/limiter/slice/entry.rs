//! One key as an instance follows it: its recent rate, the store's last
//! `remaining`, and the pieces of slice it holds.

use std::sync::Arc;

use sluice_core::{BoundRule, Outcome};
use tokio::sync::Notify;

/// Units taken ahead, spendable until `expires_ms`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Piece {
    pub(super) units: u64,
    /// Its size when taken (a new one is taken below half of it).
    pub(super) size: u64,
    pub(super) expires_ms: u64,
    /// When the rule is back to full capacity, as the take said.
    pub(super) reset_at_ms: u64,
    /// When the store took it, on the store's clock.
    pub(super) taken_ms: u64,
    /// When the rule, as the take left it, would be whole again, on the
    /// store's clock (what a give-back of it may return:
    /// [`crate::Batch::whole_at`]).
    pub(super) whole_at_ms: u64,
}

impl Piece {
    pub(super) fn live(&self, now: u64) -> bool {
        self.units > 0 && now < self.expires_ms
    }
}

/// One key as this instance follows it.
pub(super) struct Entry {
    pub(super) rule: BoundRule,
    pub(super) epoch: u64,
    /// The second `hits` counts in, and the count of the one before.
    pub(super) second: u64,
    pub(super) hits: u64,
    pub(super) rate: u64,
    /// The store's `remaining` at its last answer.
    pub(super) remaining: u64,
    /// Two pieces: the one being spent and the next one taken.
    pub(super) pieces: [Piece; 2],
    /// A take is under way until then.
    pub(super) taking_until_ms: u64,
    /// Wakes the requests that found the slice spent while a take was
    /// under way, when it lands.
    pub(super) landed: Arc<Notify>,
}

impl Entry {
    pub(super) fn new(rule: &BoundRule, epoch: u64) -> Entry {
        Entry {
            rule: rule.clone(),
            epoch,
            second: 0,
            hits: 0,
            rate: 0,
            remaining: 0,
            pieces: [Piece::default(); 2],
            taking_until_ms: 0,
            landed: Arc::new(Notify::new()),
        }
    }

    pub(super) fn hit(&mut self, now: u64) {
        let second = now / 1_000;
        if second != self.second {
            self.rate = if second == self.second + 1 {
                self.hits
            } else {
                0
            };
            self.second = second;
            self.hits = 0;
        }
        self.hits += 1;
    }

    /// Decisions a second of this key here, recently.
    pub(super) fn rate(&self, now: u64) -> u64 {
        if now / 1_000 > self.second + 1 {
            0
        } else {
            self.rate.max(self.hits)
        }
    }

    pub(super) fn held(&self, now: u64) -> u64 {
        self.pieces
            .iter()
            .filter(|p| p.live(now))
            .map(|p| p.units)
            .sum()
    }

    /// Spends `cost` from the live piece that expires first and holds it;
    /// which piece (its expiry), the outcome to answer, whether the slice
    /// runs low, and when the store took the piece.
    pub(super) fn spend(&mut self, cost: u64, now: u64) -> Option<(u64, Outcome, bool, u64)> {
        let index = (0..2)
            .filter(|&i| self.pieces[i].live(now) && self.pieces[i].units >= cost)
            .min_by_key(|&i| self.pieces[i].expires_ms)?;
        let piece = &mut self.pieces[index];
        piece.units -= cost;
        let expires = piece.expires_ms;
        let taken_ms = piece.taken_ms;
        let reset_after_ms = piece.reset_at_ms.saturating_sub(now).max(1);
        let held = self.held(now);
        let low = 2 * held < self.pieces[index].size;
        let capacity = self.rule.rule().capacity();
        let remaining = self.remaining.saturating_add(held).min(capacity);
        let outcome = Outcome {
            allowed: true,
            remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
            reset_after_ms,
            retry_after_ms: 0,
        };
        Some((expires, outcome, low, taken_ms))
    }

    /// No take under way any more: the requests waiting for it ask again.
    pub(super) fn landed(&mut self) {
        self.taking_until_ms = 0;
        self.landed.notify_waiters();
    }

    pub(super) fn give_back(&mut self, expires_ms: u64, cost: u64) {
        if let Some(piece) = self.pieces.iter_mut().find(|p| p.expires_ms == expires_ms) {
            piece.units += cost;
        }
    }

    /// Keeps `piece` in place of a spent or expired one, else of the
    /// smaller (whose units are lost: under-admission only).
    pub(super) fn place(&mut self, piece: Piece, now: u64) {
        let index = (0..2)
            .min_by_key(|&i| {
                let p = &self.pieces[i];
                if p.live(now) { p.units } else { 0 }
            })
            .unwrap_or(0);
        self.pieces[index] = piece;
    }
}
