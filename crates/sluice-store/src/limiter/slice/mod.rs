//! Slices: a hot key's budget taken ahead in one store call and spent
//! here, for rules with a `tolerance`.
//!
//! A key is *hot* on this instance once it is decided [`HOT_PER_SECOND`]
//! times a second or more here. Then, instead of one store call per
//! request, the next request's store call is a *take*: the same decision
//! with each rule's cost raised by a slice (`cost + slice`), so the store
//! admits the request and the slice together, atomically, or neither.
//! Later requests for that key are admitted from the slice without a store
//! call until it is spent or expires. A slice is sized to last about
//! [`HORIZON_MS`] at the key's recent rate (a few store calls a second per
//! hot key per instance), never more than `tolerance × limit`, and a new
//! one is taken when the current one falls below half of what it held, so
//! requests seldom find the slice empty while a take is under way.
//!
//! # The bound
//!
//! Every unit a slice hands out was consumed in the store by the take, at
//! the store's instant `t_take`, which is no earlier than the moment `s`
//! the call was sent. A slice is only spent until `s + lifetime` on this
//! instance's clock (which never goes back and may only slew forward, so
//! clock steps shorten a slice, never stretch it), so every admission from
//! it happens within `lifetime` after its units were consumed. So for any
//! span `[a, a + per]`, what the fleet admits in it was consumed by the
//! store in `[a − lifetime, a + per]`, whatever the number of instances:
//!
//! - `gcra`, `token_bucket`: the store admits at most `burst + limit ×
//!   T / per` in any span `T`, so the fleet admits at most `burst + limit ×
//!   (per + lifetime) / per` in `per`: over-admission at most `limit ×
//!   lifetime / per`. [`lifetime_ms`] is `tolerance × per` (at most
//!   [`MAX_LIFETIME_MS`]), so that is at most `tolerance × limit`.
//! - `fixed_window`: a slice's lifetime ends with the window it was taken
//!   in (`reset_after` from the take's send time, which is no later than the
//!   store's window end), so what the fleet admits in a window was consumed
//!   in that window: at most `limit`, no over-admission at all.
//!
//! Other algorithms take no tolerance (see `Tolerance::applies_to`).
//!
//! # What is not spent goes back
//!
//! A slice that will not be spent here is taken out of the key under its
//! lock (no admission from it afterwards) and given back to the bucket it
//! was taken from, out of band (`Limiter::give_back_dropped_slices`,
//! which `sluice serve` runs from a task of its own, never on a
//! decision's path): a slice expired unspent (the key cooled), one
//! replaced by a newer take, the slices of a rule a reload or an override
//! changed (other parameters or tolerance: dropped at once, see
//! [`Slices::keep_unchanged`]; slices of rules left alone are kept, as
//! are takes under way for them, so an unrelated tenant's override costs
//! a hot key nothing), and all of them after a store error or when the
//! instance stops. A give-back only lowers what the store counts by units
//! never admitted, and returns at most what they still hold
//! (`Rule::returnable`: on `gcra` and `token_bucket`, no more than the
//! bucket as the take left it still misses of them; on `fixed_window`,
//! only into the window they were counted in), so the bound above is
//! unchanged. What is lost is under-admission only, never double
//! counting: a slice held by an instance killed (at most one,
//! `tolerance × limit`, per instance and key), a give-back the store
//! refused until nothing of it could be returned any more (it is tried
//! again every pass till then), and what expired slices hold for at most
//! `GIVE_BACK_EVERY` after they expire; so a key that cools again and
//! again loses nothing per window beyond what its instances hold at a
//! time.
//!
//! All-or-nothing holds across rules: a request is decided here only when
//! every rule of it has a slice holding its cost; units taken from one
//! rule's slice are given back when another's cannot pay. A request one
//! rule of which is exact goes to the store as without slices.
//!
//! Near the limit (the store's last `remaining` below the request's cost
//! plus [`HEADROOM`] slices) no slice is taken and decisions are exact, one
//! store call each. A take the store denies anyway (another instance
//! spent the budget meanwhile) is followed by the exact call.
//!
//! # Denials decided here
//!
//! Past the limit, a hot key's request that no slice pays is denied
//! without a store call when the store's last answer for the key makes
//! the denial certain (`Entry::denied_until`): its `remaining` was below
//! the cost, and too little time has passed since the call was sent for
//! time alone to make room (a `fixed_window` until its window ends; a
//! bucket until, as the store left it, it misses no more than `capacity −
//! cost`, counted from the earliest instant the store can have answered).
//! Others' admissions since only push that moment later. A denial admits
//! nothing, so the bound above is untouched; what such a denial can miss
//! is room another instance gave back since, so the answer is trusted no
//! longer than [`lifetime_ms`] after its call was sent: a give-back is
//! found by then (a bucket keeps it until it is full, a window until it
//! ends, at most a lifetime later than it could have been used). With
//! it a key far past its limit costs about one store call per admission
//! per instance. Keys below [`HOT_PER_SECOND`] stay exact.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use sluice_core::decision::Outcomes;
use sluice_core::tolerance::Tolerance;
use sluice_core::{Algorithm, BoundRule, Outcome, Scope};
use smallvec::SmallVec;
use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

use crate::store::Batch;

mod entry;
mod keys;
mod levels;
mod unspent;
mod what_if;

use entry::{Entry, Piece};
use keys::KeyMap;
pub use levels::{HeldSlice, SliceLevel};
pub(crate) use unspent::Unspent;
pub use what_if::WhatIfs;

/// Decisions per second of one key on one instance from which it takes
/// slices; below it every decision is exact.
pub const HOT_PER_SECOND: u64 = 100;
/// A slice holds about this many milliseconds of the key's recent rate.
pub const HORIZON_MS: u64 = 250;
/// The longest a slice may be spent after its take was sent.
pub const MAX_LIFETIME_MS: u64 = 1_000;
/// A slice is taken only while the store's last `remaining` holds the
/// request and this many slices.
pub const HEADROOM: u64 = 2;
/// The longest a request waits for takes under way when it found the
/// slice spent (within its time budget); then it asks the store itself.
pub const WAIT_MS: u64 = 250;
/// The most keys followed at once; others stay exact.
pub const MAX_KEYS: usize = 100_000;
/// How often a server gives back what slices expired unspent held (see
/// `Limiter::give_back_dropped_slices`).
pub const GIVE_BACK_EVERY: std::time::Duration = std::time::Duration::from_millis(100);
/// How long a take may be under way before another take of the same key
/// may start (a take whose call was dropped never reports back).
const TAKE_PATIENCE_MS: u64 = 1_000;

/// How long a slice taken by a call sent at `s` may be spent from `s`:
/// to the end of the window for `fixed_window` (`reset_after_ms` of the
/// take), `tolerance × per` for the others; never above
/// [`MAX_LIFETIME_MS`]. See the module documentation for why this bounds
/// over-admission by `tolerance × limit`.
pub fn lifetime_ms(rule: &BoundRule, reset_after_ms: u64) -> u64 {
    let lifetime = if rule.rule().algorithm() == Algorithm::FixedWindow {
        reset_after_ms
    } else {
        rule.tolerance().of(rule.rule().period_ms())
    };
    lifetime.min(MAX_LIFETIME_MS)
}

/// The slice to take of `rule` for a key decided `rate` times a second
/// here, holding `held` units of it already, for a request costing `cost`,
/// the store having last said `remaining`: about [`HORIZON_MS`] of the
/// rate (half the lifetime when that is shorter), so that an instance
/// never holds more than `tolerance × limit`; `None` when the key is not
/// hot ([`HOT_PER_SECOND`]), a slice would not hold two requests or the
/// budget is too near its end.
pub fn slice_size(
    rule: &BoundRule,
    rate: u64,
    held: u64,
    cost: u64,
    remaining: u64,
) -> Option<u64> {
    if rate < HOT_PER_SECOND {
        return None;
    }
    let lifetime = if rule.rule().algorithm() == Algorithm::FixedWindow {
        MAX_LIFETIME_MS
    } else {
        lifetime_ms(rule, 0)
    };
    let horizon = HORIZON_MS.min(lifetime / 2);
    let most = rule
        .tolerance()
        .of(rule.rule().limit())
        .saturating_sub(held);
    let size = (rate.saturating_mul(horizon) / 1_000).min(most);
    let enough = size >= cost.max(1).saturating_mul(2);
    let room = cost.saturating_add(HEADROOM.saturating_mul(size));
    (enough && remaining >= room).then_some(size)
}

/// Whether `rule` could be decided from slices, were it enforced: it has
/// a tolerance, of a tenant's own scope, for an algorithm that takes one.
fn sliceable(rule: &BoundRule) -> bool {
    !rule.tolerance().is_exact()
        && matches!(
            rule.scope(),
            Scope::Tenant | Scope::Route | Scope::Subject | Scope::Descriptor
        )
        && Tolerance::applies_to(rule.rule().algorithm())
}

/// Whether every rule of `batch` may be decided from slices.
pub fn eligible(batch: &Batch<'_>) -> bool {
    batch.lease.is_none()
        && !batch.rules.is_empty()
        && batch
            .rules
            .iter()
            .all(|rule| sliceable(rule) && !rule.shadow())
}

/// Whether `batch` is replayed for its shadow rules' tolerances
/// ([`WhatIfs`]): it has one, and would be [`eligible`] were they
/// enforced.
pub fn replayed(batch: &Batch<'_>) -> bool {
    batch.rules.iter().any(BoundRule::shadow)
        && batch.lease.is_none()
        && batch.rules.iter().all(sliceable)
}

/// Whether slices taken under `held` may be spent under `now`: the same
/// parameters and tolerance (the uid, which names the bucket, is the
/// same by the key).
fn same_terms(held: &BoundRule, now: &BoundRule) -> bool {
    held.rule() == now.rule() && held.tolerance() == now.tolerance()
}

/// What to do for one request.
#[derive(Debug)]
pub(super) enum Plan {
    /// Decided from slices: every rule's outcome, and when the store took
    /// the units spent (its clock; the earliest of the rules').
    Local(Outcomes, u64),
    /// Take a slice of each rule along with the request: the sizes.
    Take(SmallVec<[u64; 3]>),
    /// A slice is spent and the take of the next one under way: wait for
    /// it to land (briefly), then plan again.
    Wait(OwnedNotified),
    /// Denied without a store call: rule `.0` denies the request for `.1`
    /// ms more, as the store's last answer makes certain (see
    /// `Entry::denied_until`).
    Deny(usize, u64),
    /// Ask the store, exactly.
    Exact,
}

/// What one rule of a request's plan found.
struct Found {
    /// Where its cost was spent from, when it was.
    spent: Option<u64>,
    size: Option<u64>,
    /// Until when the store denies its cost for sure, when it does.
    denied: Option<u64>,
}

/// Every key this instance follows for slices; see the module
/// documentation.
pub struct Slices {
    entries: KeyMap<Entry>,
    /// What slices no longer spent here still hold (dropped, replaced,
    /// expired), to give back; `unspent` wakes whoever gives it back.
    dropped: Mutex<Vec<Unspent>>,
    unspent: Notify,
    /// When the first piece held expires, at the earliest (`u64::MAX`:
    /// none held): [`expire`](Slices::expire) looks no sooner.
    next_expiry: AtomicU64,
}

impl std::fmt::Debug for Slices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slices")
            .field("keys", &self.entries.len())
            .finish()
    }
}

impl Default for Slices {
    fn default() -> Slices {
        Slices {
            entries: KeyMap::default(),
            dropped: Mutex::new(Vec::new()),
            unspent: Notify::new(),
            next_expiry: AtomicU64::new(u64::MAX),
        }
    }
}

impl Slices {
    /// Runs `f` on the entry of rule `index` of `batch`. A decision
    /// planning (`create`) creates it when missing (unless [`MAX_KEYS`]
    /// are followed: `None`) and forgets one learned under other terms of
    /// the rule (an override or a reload changed it), what it held given
    /// back. What follows a plan (a take landing, an answer learned) finds
    /// only an entry of its own terms (`None` otherwise: the policy
    /// changed under the decision).
    fn with_entry<T>(
        &self,
        batch: &Batch<'_>,
        index: usize,
        create: bool,
        f: impl FnOnce(&mut Entry) -> T,
    ) -> Option<T> {
        let rule = &batch.rules[index];
        let key = self.entries.key(batch, index, batch.shard);
        let mut map = self.entries.lock(&key);
        let owned = key.to_key();
        let followed = map.contains_key(&owned) || (create && self.entries.admit());
        if !followed {
            return None;
        }
        let entry = map.entry(owned).or_insert_with(|| Entry::new(rule));
        if !same_terms(&entry.rule, rule) {
            if !create {
                return None;
            }
            let old = std::mem::replace(entry, Entry::new(rule));
            self.drop_pieces(
                &old.rule,
                key.parts(),
                old.pieces.into_iter().chain(old.unspent),
            );
        }
        let answer = f(entry);
        if !entry.unspent.is_empty() {
            let rule = entry.rule.clone();
            self.drop_pieces(&rule, key.parts(), entry.unspent.drain(..));
        }
        Some(answer)
    }

    /// What to do for an eligible `batch` at `now` (see [`Plan`]); counts
    /// the decision towards each key's rate.
    pub(super) fn plan(&self, batch: &Batch<'_>, now: u64) -> Plan {
        let mut found: SmallVec<[Found; 3]> = SmallVec::new();
        let mut outcomes = Outcomes::new();
        let mut local = true;
        let mut low = false;
        let mut taken_ms = u64::MAX;
        let mut waiting = None;
        for i in 0..batch.rules.len() {
            let cost = batch.cost_of(i);
            let seen = self.with_entry(batch, i, true, |entry| {
                entry.hit(now);
                let spent = if local { entry.spend(cost, now) } else { None };
                let hot = entry.rate(now) >= HOT_PER_SECOND;
                let denied = spent
                    .is_none()
                    .then(|| entry.denied_until(cost, now))
                    .flatten()
                    .filter(|_| hot);
                let taking = entry.taking_until_ms > now;
                if spent.is_none() && taking && waiting.is_none() {
                    // Registered under the lock: the take cannot land
                    // unseen.
                    waiting = Some(entry.landed.clone().notified_owned());
                }
                let size = (!taking)
                    .then(|| {
                        let (rate, held) = (entry.rate(now), entry.held(now));
                        slice_size(&entry.rule, rate, held, cost, entry.remaining)
                    })
                    .flatten();
                (spent, size, denied)
            });
            let Some((spent, size, denied)) = seen else {
                local = false;
                found.push(Found {
                    spent: None,
                    size: None,
                    denied: None,
                });
                continue;
            };
            match spent {
                Some((expires, outcome, is_low, taken)) => {
                    outcomes.push(outcome);
                    low |= is_low;
                    taken_ms = taken_ms.min(taken);
                    found.push(Found {
                        spent: Some(expires),
                        size,
                        denied,
                    });
                }
                None => {
                    local = false;
                    found.push(Found {
                        spent: None,
                        size,
                        denied,
                    });
                }
            }
        }
        let sizes: Option<SmallVec<[u64; 3]>> = found.iter().map(|f| f.size).collect();
        if local && !(low && sizes.is_some()) {
            return Plan::Local(outcomes, taken_ms);
        }
        // The request is not admitted here: what it spent here goes back.
        self.give_back(batch, &found);
        // The rule that denies longest, as the store's answer would.
        let denied = found
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.denied.map(|until| (i, until - now)))
            .max_by_key(|&(i, wait)| (wait, std::cmp::Reverse(i)));
        if let Some((index, wait)) = denied {
            return Plan::Deny(index, wait);
        }
        if let Some(waiting) = waiting.filter(|_| !local) {
            return Plan::Wait(waiting);
        }
        let Some(sizes) = sizes else {
            return Plan::Exact;
        };
        for i in 0..batch.rules.len() {
            self.with_entry(batch, i, false, |entry| {
                entry.taking_until_ms = now + TAKE_PATIENCE_MS;
            });
        }
        Plan::Take(sizes)
    }

    fn give_back(&self, batch: &Batch<'_>, found: &[Found]) {
        for (i, f) in found.iter().enumerate() {
            if let Some(expires) = f.spent {
                let cost = batch.cost_of(i);
                self.with_entry(batch, i, false, |entry| entry.give_back(expires, cost));
            }
        }
    }

    /// A take sent at `sent` (this instance's clock) admitted `batch` and
    /// the slices `sizes`: keeps them and returns the outcomes to answer,
    /// each `remaining` counting what is now held here. A slice whose key
    /// is no longer followed under the rule it was taken of (dropped by a
    /// change of the rule, a store error or the instance stopping) is
    /// given back instead, never spent.
    pub(super) fn install(
        &self,
        batch: &Batch<'_>,
        sizes: &[u64],
        mut outcomes: Outcomes,
        (sent, taken_ms): (u64, u64),
        now: u64,
    ) -> Outcomes {
        for (i, outcome) in outcomes.iter_mut().enumerate() {
            let size = sizes[i];
            let rule = &batch.rules[i];
            let piece = Piece {
                units: size,
                size,
                expires_ms: sent + lifetime_ms(rule, outcome.reset_after_ms),
                reset_at_ms: sent + outcome.reset_after_ms,
                taken_ms,
                whole_at_ms: taken_ms.saturating_add(outcome.reset_after_ms),
            };
            // Created only by a decision under the current policy, which
            // `with_entry` checks against the take's rule.
            let kept = self.with_entry(batch, i, false, |entry| {
                entry.learn(outcome, sent);
                entry.landed();
                entry.place(piece, now);
                let capacity = entry.rule.rule().capacity();
                let remaining = entry
                    .remaining
                    .saturating_add(entry.held(now))
                    .min(capacity);
                outcome.remaining = u32::try_from(remaining).unwrap_or(u32::MAX);
            });
            if kept.is_none() {
                let key = self.entries.key(batch, i, batch.shard);
                self.drop_pieces(rule, key.parts(), [piece]);
            } else {
                self.next_expiry
                    .fetch_min(piece.expires_ms, Ordering::Relaxed);
            }
        }
        outcomes
    }

    /// The store answered an eligible `batch`, exactly or (`take`) a take
    /// it denied, to a call sent at `sent`: what each rule's `remaining`
    /// is now, and after a take, no take under way.
    pub(super) fn learn(&self, batch: &Batch<'_>, outcomes: &[Outcome], take: bool, sent: u64) {
        for (i, outcome) in outcomes.iter().enumerate() {
            self.with_entry(batch, i, false, |entry| {
                entry.learn(outcome, sent);
                if take {
                    entry.landed();
                }
            });
        }
    }

    /// A take failed (the store could not answer): another may start.
    pub(super) fn abandon(&self, batch: &Batch<'_>) {
        for i in 0..batch.rules.len() {
            self.with_entry(batch, i, false, Entry::landed);
        }
    }
}
