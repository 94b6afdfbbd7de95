//! The algorithms as pure state transitions.
//!
//! `Rule::decide(state, now, cost)` reads a state and answers with an
//! [`Outcome`] and the [`Step`] that admitting the request would take;
//! `Rule::commit` applies the step. Deciding and committing are separate so
//! that a store can decide every rule of a request first and commit all of
//! them or none: a denied request consumes nothing.
//!
//! Time is passed in as whole milliseconds; nothing here reads a clock. The
//! Redis scripts in `sluice-store` implement the same arithmetic and a
//! differential test holds them to identical answers.
//!
//! # Time that goes backwards
//!
//! A state can be stamped later than `now`: the clock stepped back, or a
//! Redis failover moved the key to a node whose clock is behind.
//! [`Rule::repair`] reads such a state as of `now` (every algorithm: what
//! was consumed stays consumed, re-dated to `now` at the latest), so a step
//! of an hour locks nobody out for an hour and grants nobody extra budget:
//! the bucket recovers within one period, as if everything had been spent
//! at `now`. [`Rule::decide`] decides on the repaired state; stores persist
//! the repair even when the request is denied, so it happens once.
//!
//! A debit ([`Rule::debit`], `debit`) charges a cost already spent even
//! past an exhausted bucket, leaving the rule in debt (up to its
//! `max_debt`); a state ahead of `now` by no more than the deepest debt is
//! read as debt, not as a clock step, so a clock stepped back by less
//! than that waits it out (at most `burst + max_debt` units' worth).
//!
//! # Refunds
//!
//! [`Rule::refund`] gives back what an admission consumed (Redis Cluster
//! refunds the tenant's rules when a valve denies after them); it is the
//! twin of `refund.lua`.

pub mod concurrency;
mod debit;
pub mod fixed_window;
pub mod gcra;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

use crate::rule::{Algorithm, Rule};

pub use debit::Debit;

/// What one rule says about one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Whether the rule admits the request.
    pub allowed: bool,
    /// Units that could still be consumed right now: after this request when
    /// it is admitted, before it when it is denied. Never negative, never
    /// above the rule's capacity (so it fits 32 bits, keeping outcomes small
    /// enough to move around in registers).
    pub remaining: u32,
    /// Milliseconds until the rule is back to its full capacity.
    pub reset_after_ms: u64,
    /// When denied: milliseconds until this request would pass if nothing
    /// else consumed meanwhile, rounded up (never early). 0 when admitted.
    pub retry_after_ms: u64,
}

impl Outcome {
    fn allowed(remaining: u64, reset_after_ms: u64) -> Outcome {
        Outcome {
            allowed: true,
            remaining: clamp(remaining),
            reset_after_ms,
            retry_after_ms: 0,
        }
    }

    fn denied(remaining: u64, reset_after_ms: u64, retry_after_ms: u64) -> Outcome {
        Outcome {
            allowed: false,
            remaining: clamp(remaining),
            reset_after_ms,
            retry_after_ms: retry_after_ms.max(1),
        }
    }
}

fn clamp(remaining: u64) -> u32 {
    u32::try_from(remaining).unwrap_or(u32::MAX)
}

/// The stored state of one rule for one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// Nothing stored yet: the rule is at full capacity.
    Fresh,
    /// `gcra`.
    Gcra(gcra::Tat),
    /// `token_bucket`.
    TokenBucket(token_bucket::Bucket),
    /// `fixed_window`.
    FixedWindow(fixed_window::Window),
    /// `sliding_window`.
    SlidingWindow(sliding_window::Windows),
    /// `sliding_log` (boxed: it is large).
    SlidingLog(Box<sliding_log::Log>),
    /// `concurrency` (boxed: it is large).
    Leases(Box<concurrency::Leases>),
}

/// What admitting a request changes; apply it with [`Rule::commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to write (the request was denied).
    Keep,
    /// Replace the state by this one.
    Replace(State),
    /// Expire the log's oldest entries and append one.
    Log(sliding_log::Append),
}

impl Rule {
    /// Decides one request of `cost` units at `now` against `state`.
    ///
    /// A state written by another algorithm (after a configuration change)
    /// is read as fresh. Callers check [`Rule::capacity`] first: a cost above
    /// it can never pass and is reported as such, not decided here.
    pub fn decide(&self, state: &State, now: u64, cost: u64) -> (Outcome, Step) {
        self.decide_lease(state, now, cost, None)
    }

    /// [`decide`](Self::decide), taking lease `lease` when this is a
    /// `concurrency` rule and a slot is free (without one, a concurrency
    /// rule only checks). Other algorithms ignore `lease`.
    pub fn decide_lease(
        &self,
        state: &State,
        now: u64,
        cost: u64,
        lease: Option<u128>,
    ) -> (Outcome, Step) {
        debug_assert!(cost >= 1 && self.units(cost) <= self.capacity());
        if let Some(repaired) = self.repair(state, now) {
            // Decide on the repaired state and hand back the whole result:
            // a store that did not persist the repair still writes a state
            // that is consistent.
            let (outcome, step) = self.decide_current(&repaired, now, cost, lease);
            return match step {
                Step::Keep => (outcome, Step::Keep),
                step => {
                    let mut next = repaired;
                    self.commit(&mut next, step);
                    (outcome, Step::Replace(next))
                }
            };
        }
        self.decide_current(state, now, cost, lease)
    }

    /// `state` as it must be read at `now`, when it is stamped later than
    /// `now` allows (see the module documentation); `None` when it can be
    /// read as it is. A state of another algorithm needs no repair (it
    /// reads as fresh).
    #[inline]
    pub fn repair(&self, state: &State, now: u64) -> Option<State> {
        match (self.algorithm(), state) {
            (Algorithm::Gcra, State::Gcra(tat)) => gcra::repair(self, *tat, now).map(State::Gcra),
            (Algorithm::TokenBucket, State::TokenBucket(b)) => {
                token_bucket::repair(self, *b, now).map(State::TokenBucket)
            }
            (Algorithm::FixedWindow, State::FixedWindow(w)) => {
                fixed_window::repair(self, *w, now).map(State::FixedWindow)
            }
            (Algorithm::SlidingWindow, State::SlidingWindow(w)) => {
                sliding_window::repair(self, *w, now).map(State::SlidingWindow)
            }
            (Algorithm::SlidingLog, State::SlidingLog(log)) => {
                sliding_log::repair(log, now).map(|l| State::SlidingLog(Box::new(l)))
            }
            (Algorithm::Concurrency, State::Leases(leases)) => {
                concurrency::repair(self, leases, now).map(|l| State::Leases(Box::new(l)))
            }
            _ => None,
        }
    }

    /// Whether `state` is past what the rule allows at `now`: in debt,
    /// so that even a request of nothing would be refused (a bucket that
    /// is merely exhausted is not past it). A concurrency rule never is.
    /// Envoy's quota checks (`hits_addend: 0`) ask this.
    pub fn owes(&self, state: &State, now: u64) -> bool {
        if self.is_concurrency() {
            return false;
        }
        let repaired = self.repair(state, now);
        let state = repaired.as_ref().unwrap_or(state);
        !self.decide_current(state, now, 0, None).0.allowed
    }

    /// Gives back lease `lease` of a `concurrency` rule at `now`:
    /// `(released, state to write)`, `released` only when the lease was
    /// still held; see [`concurrency::release`]. The twin of
    /// `refund.lua`'s concurrency branch.
    pub fn release(&self, state: &State, now: u64, lease: u128) -> (bool, Option<State>) {
        match state {
            State::Leases(leases) if self.is_concurrency() => {
                let (released, next) = concurrency::release(leases, lease, now);
                (released, next.map(|l| State::Leases(Box::new(l))))
            }
            _ => (false, None),
        }
    }

    /// Gives back `cost` units that a request admitted at `at` consumed,
    /// from the state as it is now (others may have consumed since); `None`
    /// when there is nothing to give back (the state moved on, or is of
    /// another algorithm; a `concurrency` lease is given back by
    /// [`release`](Self::release), which names it). The twin of
    /// `refund.lua`.
    pub fn refund(&self, state: &State, at: u64, cost: u64) -> Option<State> {
        match (self.algorithm(), state) {
            (Algorithm::Gcra, State::Gcra(tat)) => {
                Some(State::Gcra(gcra::refund(self, *tat, cost)))
            }
            (Algorithm::TokenBucket, State::TokenBucket(b)) => {
                Some(State::TokenBucket(token_bucket::refund(self, *b, cost)))
            }
            (Algorithm::FixedWindow, State::FixedWindow(w)) => {
                fixed_window::refund(self, *w, at, cost).map(State::FixedWindow)
            }
            (Algorithm::SlidingWindow, State::SlidingWindow(w)) => {
                sliding_window::refund(self, *w, at, cost).map(State::SlidingWindow)
            }
            (Algorithm::SlidingLog, State::SlidingLog(log)) => {
                sliding_log::refund(log, at, cost).map(|l| State::SlidingLog(Box::new(l)))
            }
            _ => None,
        }
    }

    /// Gives back `cost` units that an admission at `at` took from this
    /// rule, at `now`, as far as the admission still holds them
    /// ([`returnable`](Self::returnable)): the state to write (on `gcra`
    /// and `token_bucket` always, if only to write the same), `None` when
    /// a window moved on or the state is of another algorithm
    /// ([`refund`](Self::refund)). The twin of `give_back` in
    /// `common.lua`.
    pub fn give_back(
        &self,
        state: &State,
        at: u64,
        cost: u64,
        whole_at: u64,
        given_back_ms: u64,
        now: u64,
    ) -> Option<State> {
        let scaled = self.returnable(cost, at, whole_at, given_back_ms, now);
        match (self.algorithm(), state) {
            (Algorithm::Gcra, State::Gcra(tat)) => {
                Some(State::Gcra(gcra::refund_scaled(self, *tat, scaled)))
            }
            (Algorithm::TokenBucket, State::TokenBucket(b)) => Some(State::TokenBucket(
                token_bucket::refund_scaled(self, *b, scaled),
            )),
            _ => self.refund(state, at, cost),
        }
    }

    /// What of `cost` units that an admission at `at` took from a `gcra`
    /// or `token_bucket` rule a give-back at `now` returns, in units ×
    /// `per` (parts of a unit count: an estimate of one unit settled at 0 a
    /// millisecond later returns all but what one millisecond refilled):
    /// what the admission still holds.
    ///
    /// A bucket refills whatever took its units: once the units an
    /// estimate took have refilled, giving them back would bank them, a
    /// second burst on top of the refill. Two bounds on what is still
    /// missing of them, the larger taken:
    ///
    /// - their own refill: `cost·per/limit` ms from `at`, as if the bucket
    ///   had been whole when they were taken;
    /// - where they sit: an admission's units lie on top of what the
    ///   bucket missed before it and drain last, until the bucket as the
    ///   admission left it would have been whole again had nothing else
    ///   happened, `whole_at` (the admission's time plus its outcome's
    ///   `reset_after_ms`, rounded up to the ms: one ms less is taken).
    ///   What others consumed since only delays the refill; a give-back
    ///   since may have moved the units down, so this bound holds only
    ///   when none was made to the rule since `at` (`given_back_ms`, the
    ///   latest one's time, which the store keeps beside the state), and
    ///   when `whole_at` is known (not 0).
    ///
    /// A give-back never returns more than had the admission cost less in
    /// the first place (`tests/give_back.rs`). The window algorithms give
    /// back into the window the units were counted in
    /// ([`refund`](Self::refund)'s `at`), which forgets them when it ends:
    /// all `cost` units (`cost × per` here). The twin of `returnable` in
    /// `common.lua`.
    pub fn returnable(
        &self,
        cost: u64,
        at: u64,
        whole_at: u64,
        given_back_ms: u64,
        now: u64,
    ) -> u64 {
        // In units of 1/limit ms, in 128 bits (years of milliseconds times
        // a large limit overflow 64).
        let (limit, per) = (u128::from(self.limit()), u128::from(self.period_ms()));
        let need = u128::from(cost) * per;
        if !self.algorithm().has_burst() {
            return u64::try_from(need).unwrap_or(u64::MAX);
        }
        let since = u128::from(now.saturating_sub(at));
        let own = need.saturating_sub(since * limit);
        let queued = if whole_at == 0 || given_back_ms >= at {
            0
        } else {
            u128::from(whole_at.saturating_sub(1).saturating_sub(now)) * limit
        };
        u64::try_from(own.max(queued).min(need)).unwrap_or(u64::MAX)
    }

    /// [`decide`](Self::decide) for a state already [`repair`](Self::repair)ed
    /// at `now` (stores repair under their lock first, then decide): the
    /// same answer without checking for a repair again.
    pub fn decide_repaired(&self, state: &State, now: u64, cost: u64) -> (Outcome, Step) {
        self.decide_repaired_lease(state, now, cost, None)
    }

    /// [`decide_lease`](Self::decide_lease) for a state already repaired.
    #[inline]
    pub fn decide_repaired_lease(
        &self,
        state: &State,
        now: u64,
        cost: u64,
        lease: Option<u128>,
    ) -> (Outcome, Step) {
        debug_assert!(self.repair(state, now).is_none(), "repair the state first");
        self.decide_current(state, now, cost, lease)
    }

    /// [`decide_repaired_lease`](Self::decide_repaired_lease) and, when the
    /// request is admitted, [`commit`](Self::commit), in place: for a store
    /// deciding one rule alone, with nothing to hold back for other rules.
    /// The same arithmetic, without building the step (the embedded hot
    /// path; `tests/algorithms.rs` holds the two to the same answers).
    #[inline]
    pub fn admit_repaired_lease(
        &self,
        state: &mut State,
        now: u64,
        cost: u64,
        lease: Option<u128>,
    ) -> Outcome {
        debug_assert!(self.repair(state, now).is_none(), "repair the state first");
        fn keep<S>(slot: &mut S, (outcome, next): (Outcome, Option<S>)) -> Outcome {
            if let Some(next) = next {
                *slot = next;
            }
            outcome
        }
        match (self.algorithm(), &mut *state) {
            (Algorithm::Gcra, State::Gcra(tat)) => keep(tat, gcra::decide(self, *tat, now, cost)),
            (Algorithm::TokenBucket, State::TokenBucket(b)) => {
                keep(b, token_bucket::decide(self, Some(*b), now, cost))
            }
            (Algorithm::FixedWindow, State::FixedWindow(w)) => {
                keep(w, fixed_window::decide(self, *w, now, cost))
            }
            (Algorithm::SlidingWindow, State::SlidingWindow(w)) => {
                keep(w, sliding_window::decide(self, *w, now, cost))
            }
            _ => {
                let (outcome, step) = self.decide_current(state, now, cost, lease);
                self.commit(state, step);
                outcome
            }
        }
    }

    fn decide_current(
        &self,
        state: &State,
        now: u64,
        cost: u64,
        lease: Option<u128>,
    ) -> (Outcome, Step) {
        match (self.algorithm(), state) {
            (Algorithm::Concurrency, State::Leases(leases)) => {
                wrap(concurrency::decide(self, leases, now, lease), |l| {
                    State::Leases(Box::new(l))
                })
            }
            (Algorithm::Concurrency, _) => wrap(
                concurrency::decide(self, &concurrency::Leases::default(), now, lease),
                |l| State::Leases(Box::new(l)),
            ),
            (Algorithm::Gcra, State::Gcra(tat)) => {
                wrap(gcra::decide(self, *tat, now, cost), State::Gcra)
            }
            (Algorithm::Gcra, _) => wrap(
                gcra::decide(self, gcra::Tat::default(), now, cost),
                State::Gcra,
            ),
            (Algorithm::TokenBucket, State::TokenBucket(b)) => wrap(
                token_bucket::decide(self, Some(*b), now, cost),
                State::TokenBucket,
            ),
            (Algorithm::TokenBucket, _) => wrap(
                token_bucket::decide(self, None, now, cost),
                State::TokenBucket,
            ),
            (Algorithm::FixedWindow, State::FixedWindow(w)) => wrap(
                fixed_window::decide(self, *w, now, cost),
                State::FixedWindow,
            ),
            (Algorithm::FixedWindow, _) => wrap(
                fixed_window::decide(self, fixed_window::Window::default(), now, cost),
                State::FixedWindow,
            ),
            (Algorithm::SlidingWindow, State::SlidingWindow(w)) => wrap(
                sliding_window::decide(self, *w, now, cost),
                State::SlidingWindow,
            ),
            (Algorithm::SlidingWindow, _) => wrap(
                sliding_window::decide(self, sliding_window::Windows::default(), now, cost),
                State::SlidingWindow,
            ),
            (Algorithm::SlidingLog, State::SlidingLog(log)) => {
                let (outcome, append) = sliding_log::decide(self, log, now, cost);
                (outcome, append.map_or(Step::Keep, Step::Log))
            }
            (Algorithm::SlidingLog, _) => {
                let (outcome, append) =
                    sliding_log::decide(self, &sliding_log::Log::default(), now, cost);
                (outcome, append.map_or(Step::Keep, Step::Log))
            }
        }
    }

    /// Applies the step that [`Rule::decide`] returned for `state`.
    pub fn commit(&self, state: &mut State, step: Step) {
        match step {
            Step::Keep => {}
            Step::Replace(next) => *state = next,
            Step::Log(append) => match state {
                State::SlidingLog(log) => log.apply(append),
                _ => {
                    let mut log = Box::<sliding_log::Log>::default();
                    log.apply(append);
                    *state = State::SlidingLog(log);
                }
            },
        }
    }

    /// The moment (ms) from which `state` is indistinguishable from a fresh
    /// one, so a store may forget it. Expiry times (Redis TTLs, the memory
    /// sweeper) derive from this.
    #[inline]
    pub fn idle_at(&self, state: &State) -> u64 {
        match state {
            State::Fresh => 0,
            State::Gcra(tat) => gcra::idle_at(self, *tat),
            State::TokenBucket(b) => token_bucket::idle_at(self, *b),
            State::FixedWindow(w) => fixed_window::idle_at(self, *w),
            State::SlidingWindow(w) => sliding_window::idle_at(self, *w),
            State::SlidingLog(log) => sliding_log::idle_at(self, log),
            State::Leases(leases) => concurrency::idle_at(leases),
        }
    }
}

fn wrap<S>((outcome, next): (Outcome, Option<S>), into: fn(S) -> State) -> (Outcome, Step) {
    (outcome, next.map_or(Step::Keep, |s| Step::Replace(into(s))))
}

#[cfg(test)]
pub(crate) mod testing;
