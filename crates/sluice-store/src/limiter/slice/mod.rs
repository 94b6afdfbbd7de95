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
//! A slice that is never spent (an instance killed, a reload, a key gone
//! cold) is simply lost: the store counted it, so loss is under-admission
//! only, never double counting, and at most one slice (`tolerance ×
//! limit`) per instance and key.
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

use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::decision::Outcomes;
use sluice_core::tolerance::Tolerance;
use sluice_core::{Algorithm, BoundRule, Outcome, Scope};
use smallvec::SmallVec;
use tokio::sync::futures::OwnedNotified;

use crate::store::Batch;

mod entry;
mod keys;
mod levels;
mod what_if;

use entry::{Entry, Piece};
use keys::KeyMap;
pub use levels::{HeldSlice, SliceLevel};
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

/// What a slice still holds, to give back to the bucket it was taken
/// from.
#[derive(Debug, Clone)]
pub(crate) struct Unspent {
    pub(crate) rule: BoundRule,
    pub(crate) tenant: String,
    pub(crate) subject: Option<String>,
    pub(crate) shard: u16,
    pub(crate) units: u64,
    pub(crate) at_ms: u64,
    /// When the take's rule, as the take left it, would have been whole
    /// again (its outcome's reset): see [`crate::Batch::whole_at`].
    pub(crate) whole_at_ms: u64,
}

/// What to do for one request.
#[derive(Debug)]
pub(super) enum Plan {
    /// Decided from slices: every rule's outcome, and when the store took
    /// the units spent (its clock; the earliest of the rules').
    Local(Outcomes, u64),
    /// Take a slice of each rule along with the request: the sizes, and
    /// the epoch the take started in.
    Take(SmallVec<[u64; 3]>, u64),
    /// A slice is spent and the take of the next one under way: wait for
    /// it to land (briefly), then plan again.
    Wait(OwnedNotified),
    /// Ask the store, exactly.
    Exact,
}

/// What one rule of a request's plan found.
struct Found {
    /// Where its cost was spent from, when it was.
    spent: Option<u64>,
    size: Option<u64>,
}

/// Every key this instance follows for slices; see the module
/// documentation.
pub struct Slices {
    entries: KeyMap<Entry>,
    epoch: AtomicU64,
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
            epoch: AtomicU64::new(0),
        }
    }
}

impl Slices {
    fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Runs `f` on the entry of rule `index` of `batch`, created when
    /// missing (unless [`MAX_KEYS`] are followed: `None`).
    fn with_entry<T>(
        &self,
        batch: &Batch<'_>,
        index: usize,
        create: bool,
        f: impl FnOnce(&mut Entry) -> T,
    ) -> Option<T> {
        let rule = &batch.rules[index];
        let key = self.entries.key(batch, index, batch.shard);
        let epoch = self.epoch();
        let mut map = self.entries.lock(&key);
        let owned = key.to_key();
        let followed = map.contains_key(&owned) || (create && self.entries.admit());
        if !followed {
            return None;
        }
        let entry = map.entry(owned).or_insert_with(|| Entry::new(rule, epoch));
        if entry.epoch != epoch {
            // Learned under another policy: forgotten.
            *entry = Entry::new(rule, epoch);
        }
        Some(f(entry))
    }

    /// What to do for an eligible `batch` at `now` (see [`Plan`]); counts
    /// the decision towards each key's rate.
    pub(super) fn plan(&self, batch: &Batch<'_>, now: u64) -> Plan {
        let epoch = self.epoch();
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
                (spent, size)
            });
            let Some((spent, size)) = seen else {
                local = false;
                found.push(Found {
                    spent: None,
                    size: None,
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
                    });
                }
                None => {
                    local = false;
                    found.push(Found { spent: None, size });
                }
            }
        }
        let sizes: Option<SmallVec<[u64; 3]>> = found.iter().map(|f| f.size).collect();
        if local && !(low && sizes.is_some()) {
            return Plan::Local(outcomes, taken_ms);
        }
        // The request goes to the store: what it spent here goes back.
        self.give_back(batch, &found);
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
        Plan::Take(sizes, epoch)
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
    /// the slices `sizes`: keeps them (unless the policy changed since
    /// `epoch`) and returns the outcomes to answer, each `remaining`
    /// counting what is now held here.
    pub(super) fn install(
        &self,
        batch: &Batch<'_>,
        sizes: &[u64],
        epoch: u64,
        mut outcomes: Outcomes,
        (sent, taken_ms): (u64, u64),
        now: u64,
    ) -> Outcomes {
        for (i, outcome) in outcomes.iter_mut().enumerate() {
            let size = sizes[i];
            // A reload since the take started (or a store error that
            // dropped every slice): what it took is lost, never spent.
            self.with_entry(batch, i, false, |entry| {
                entry.remaining = u64::from(outcome.remaining);
                entry.landed();
                if entry.epoch != epoch {
                    return;
                }
                let piece = Piece {
                    units: size,
                    size,
                    expires_ms: sent + lifetime_ms(&entry.rule, outcome.reset_after_ms),
                    reset_at_ms: sent + outcome.reset_after_ms,
                    taken_ms,
                    whole_at_ms: taken_ms.saturating_add(outcome.reset_after_ms),
                };
                entry.place(piece, now);
                let capacity = entry.rule.rule().capacity();
                let remaining = entry
                    .remaining
                    .saturating_add(entry.held(now))
                    .min(capacity);
                outcome.remaining = u32::try_from(remaining).unwrap_or(u32::MAX);
            });
        }
        outcomes
    }

    /// The store answered an eligible `batch`, exactly or (`take`) a take
    /// it denied: what each rule's `remaining` is now, and after a take, no
    /// take under way.
    pub(super) fn learn(&self, batch: &Batch<'_>, outcomes: &[Outcome], take: bool) {
        for (i, outcome) in outcomes.iter().enumerate() {
            self.with_entry(batch, i, false, |entry| {
                entry.remaining = u64::from(outcome.remaining);
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

    /// Takes every live slice out, to give back (the instance is
    /// stopping): per piece, its rule, the bucket it was taken from and
    /// its units; no decision is answered from them any more, and takes
    /// under way keep nothing.
    pub(crate) fn drain(&self, now: u64) -> Vec<Unspent> {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let mut unspent = Vec::new();
        self.entries.drain(|key, entry| {
            let (Ok(tenant), Ok(subject)) = (
                std::str::from_utf8(key.tenant()),
                std::str::from_utf8(key.subject()),
            ) else {
                return;
            };
            for piece in entry.pieces.iter().filter(|p| p.live(now)) {
                unspent.push(Unspent {
                    rule: entry.rule.clone(),
                    tenant: tenant.to_owned(),
                    subject: (!subject.is_empty()).then(|| subject.to_owned()),
                    shard: key.shard(),
                    units: piece.units,
                    // When the store took the units, on its clock (a
                    // fixed window gives back only into that window).
                    at_ms: piece.taken_ms,
                    whole_at_ms: piece.whole_at_ms,
                });
            }
        });
        unspent
    }

    /// Drops every slice (the policy changed): what they held is lost,
    /// and takes under way keep nothing.
    pub fn clear(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.entries.clear();
    }

    /// Forgets keys that hold nothing and were not decided in the last
    /// two seconds.
    pub fn sweep(&self, now: u64) {
        self.entries
            .retain(|e| e.held(now) > 0 || now / 1_000 <= e.second + 1);
    }
}
