//! One key as an instance follows it: its recent rate, the store's last
//! `remaining`, and the pieces of slice it holds.

use std::sync::Arc;

use sluice_core::{Algorithm, BoundRule, Outcome};
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
    /// The second `hits` counts in, and the count of the one before.
    pub(super) second: u64,
    pub(super) hits: u64,
    pub(super) rate: u64,
    /// The store's `remaining` at its last answer.
    pub(super) remaining: u64,
    /// When the call of that answer was sent (this instance's clock) and
    /// its `reset_after_ms`; `None` before any.
    pub(super) answered: Option<(u64, u64)>,
    /// Two pieces: the one being spent and the next one taken.
    pub(super) pieces: [Piece; 2],
    /// A take is under way until then.
    pub(super) taking_until_ms: u64,
    /// Wakes the requests that found the slice spent while a take was
    /// under way, when it lands.
    pub(super) landed: Arc<Notify>,
    /// Pieces no longer spent here that still hold units, to give back
    /// (see [`Slices`](super::Slices)): one replaced by a newer take.
    pub(super) unspent: Vec<Piece>,
}

impl Entry {
    pub(super) fn new(rule: &BoundRule) -> Entry {
        Entry {
            rule: rule.clone(),
            second: 0,
            hits: 0,
            rate: 0,
            remaining: 0,
            answered: None,
            pieces: [Piece::default(); 2],
            taking_until_ms: 0,
            landed: Arc::new(Notify::new()),
            unspent: Vec::new(),
        }
    }

    /// Takes out every piece that still holds units, live or expired:
    /// none is spent here any more.
    pub(super) fn take_pieces(&mut self) -> impl Iterator<Item = Piece> + '_ {
        self.pieces
            .iter_mut()
            .filter(|p| p.units > 0)
            .map(std::mem::take)
            .chain(self.unspent.drain(..))
    }

    /// Takes out the pieces expired at `now` that still hold units.
    pub(super) fn take_expired(&mut self, now: u64) -> impl Iterator<Item = Piece> + '_ {
        self.pieces
            .iter_mut()
            .filter(move |p| p.units > 0 && now >= p.expires_ms)
            .map(std::mem::take)
            .chain(self.unspent.drain(..))
    }

    /// When the first piece still holding units expires (`u64::MAX`:
    /// none).
    pub(super) fn next_expiry(&self) -> u64 {
        self.pieces
            .iter()
            .filter(|p| p.units > 0)
            .map(|p| p.expires_ms)
            .min()
            .unwrap_or(u64::MAX)
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

    /// The store answered `outcome` to a call sent at `sent`.
    pub(super) fn learn(&mut self, outcome: &Outcome, sent: u64) {
        self.remaining = u64::from(outcome.remaining);
        self.answered = Some((sent, outcome.reset_after_ms));
    }

    /// Until when the store, as it last answered, denies `cost` for sure
    /// (at `now`; `None`: it may admit it). Its `remaining` was below
    /// `cost`; since, others can only have consumed more, and time alone
    /// brings the rule back: a `fixed_window` at the end of its window,
    /// no sooner than `reset_after` from the call's sending; a bucket
    /// (`gcra`, `token_bucket`), which was whole again no sooner than
    /// `reset_after` (rounded up to the ms, so one ms less) from then,
    /// once it misses no more than `capacity − cost`, i.e. `(capacity −
    /// cost) × per / limit` earlier (rounded up, so never later than the
    /// store's own moment). Trusted no longer than a slice would
    /// be spent ([`lifetime_ms`](super::lifetime_ms)): what others gave
    /// back meanwhile is found then.
    pub(super) fn denied_until(&self, cost: u64, now: u64) -> Option<u64> {
        let (sent, reset_after) = self.answered?;
        if self.remaining >= cost {
            return None;
        }
        let rule = self.rule.rule();
        let whole = sent.saturating_add(reset_after);
        let until = if rule.algorithm() == Algorithm::FixedWindow {
            whole
        } else {
            // Rounded up: the bucket's moment is never overstated.
            let missing = (u128::from(rule.capacity().saturating_sub(cost))
                * u128::from(rule.period_ms()))
            .div_ceil(u128::from(rule.limit().max(1)));
            let missing = u64::try_from(missing).unwrap_or(u64::MAX);
            whole.saturating_sub(1).saturating_sub(missing)
        };
        let until = until.min(sent.saturating_add(super::lifetime_ms(&self.rule, reset_after)));
        (now < until).then_some(until)
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
    /// smaller; what the one replaced still holds is to give back
    /// ([`unspent`](Self::unspent)).
    pub(super) fn place(&mut self, piece: Piece, now: u64) {
        let index = (0..2)
            .min_by_key(|&i| {
                let p = &self.pieces[i];
                if p.live(now) { p.units } else { 0 }
            })
            .unwrap_or(0);
        let replaced = std::mem::replace(&mut self.pieces[index], piece);
        if replaced.units > 0 {
            self.unspent.push(replaced);
        }
    }
}
