//! Concurrency: at most `limit` leases held at once.
//!
//! An admitted request takes a lease, named by an id its caller chose
//! (random, 128 bits), and holds it until it is released or until `lease`
//! (the rule's period) after it was taken, whichever comes first: a holder
//! that crashes never keeps its slot for longer than that. Exact: a lease
//! is taken only under the key's lock (the memory store) or inside the
//! decision script (Redis), so `limit` is never exceeded whatever the
//! interleaving.
//!
//! Deciding without a lease id only checks: whether a slot is free now,
//! taking nothing (`/v1/check` and forward-auth, which have no way to
//! release). A lease is one slot whatever the request's cost.

use super::Outcome;
use crate::rule::Rule;

/// The leases held: `(expires at, id)`, in that order (as Redis sorts
/// them).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leases {
    held: Vec<(u64, u128)>,
}

impl Leases {
    /// Builds the leases from `(expires at, id)` pairs (for stores that keep
    /// them elsewhere).
    pub fn from_held(held: impl IntoIterator<Item = (u64, u128)>) -> Leases {
        let mut held: Vec<_> = held.into_iter().collect();
        held.sort_unstable();
        Leases { held }
    }

    /// `(expires at, id)` of every lease, expired or not.
    pub fn held(&self) -> impl Iterator<Item = (u64, u128)> + '_ {
        self.held.iter().copied()
    }

    fn live(&self, now: u64) -> impl Iterator<Item = u64> + '_ {
        self.held
            .iter()
            .map(|(expires, _)| *expires)
            .filter(move |expires| *expires > now)
    }
}

/// Decides a request at `now`: with `lease`, takes a slot under that id
/// when one is free (`Some(leases)` to write); without, only checks.
pub fn decide(
    rule: &Rule,
    leases: &Leases,
    now: u64,
    lease: Option<u128>,
) -> (Outcome, Option<Leases>) {
    let per = rule.period_ms();
    let limit = rule.limit();
    let live = leases.live(now).count() as u64;
    if live < limit {
        let outcome = Outcome::allowed(limit - live - 1, per);
        let next = lease.map(|id| {
            let mut held: Vec<(u64, u128)> = leases
                .held
                .iter()
                .copied()
                .filter(|(expires, _)| *expires > now)
                .collect();
            held.push((now + per, id));
            held.sort_unstable();
            Leases { held }
        });
        return (outcome, next);
    }
    // A slot frees when enough leases have expired to bring the count
    // under the limit (a release may free one sooner: never later).
    let mut expiries: Vec<u64> = leases.live(now).collect();
    expiries.sort_unstable();
    let must_expire = (live + 1 - limit) as usize;
    let retry = expiries[must_expire - 1] - now;
    let reset = expiries[expiries.len() - 1] - now;
    (Outcome::denied(0, reset, retry), None)
}

/// Gives back lease `id` at `now`: `(released, leases to write)`.
/// `released` is true only when the lease was still held (not expired);
/// an expired one is dropped all the same. `None` to write when the id is
/// not held at all (released already, or never taken here).
pub fn release(leases: &Leases, id: u128, now: u64) -> (bool, Option<Leases>) {
    let Some(at) = leases.held.iter().position(|(_, held)| *held == id) else {
        return (false, None);
    };
    let mut held = leases.held.clone();
    let (expires, _) = held.remove(at);
    (expires > now, Some(Leases { held }))
}

/// The leases as they must be read at `now` when one expires later than a
/// lease taken now would (the clock stepped back): such a lease expires
/// one lease from `now`, so a step back never holds a slot longer.
pub fn repair(rule: &Rule, leases: &Leases, now: u64) -> Option<Leases> {
    let latest = now + rule.period_ms();
    if leases.held.iter().all(|(expires, _)| *expires <= latest) {
        return None;
    }
    Some(Leases::from_held(
        leases
            .held
            .iter()
            .map(|(expires, id)| ((*expires).min(latest), *id)),
    ))
}

/// When the last lease expires.
pub fn idle_at(leases: &Leases) -> u64 {
    leases
        .held
        .iter()
        .map(|(expires, _)| *expires)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(limit: i128, lease_ms: u64) -> Rule {
        Rule::concurrency(limit, lease_ms).unwrap()
    }

    #[test]
    fn holds_at_most_limit_and_frees_on_release_or_expiry() {
        let r = rule(2, 1_000);
        let mut leases = Leases::default();
        for id in [1, 2] {
            let (outcome, next) = decide(&r, &leases, 0, Some(id));
            assert!(outcome.allowed);
            leases = next.unwrap();
        }
        let (denied, next) = decide(&r, &leases, 10, Some(3));
        assert!(!denied.allowed && next.is_none());
        assert_eq!((denied.retry_after_ms, denied.reset_after_ms), (990, 990));
        // A check says the same and takes nothing.
        assert!(!decide(&r, &leases, 10, None).0.allowed);
        let (released, next) = release(&leases, 1, 10);
        assert!(released);
        leases = next.unwrap();
        let (checked, next) = decide(&r, &leases, 10, None);
        assert!(checked.allowed && next.is_none());
        // Releasing twice frees nothing more.
        assert_eq!(release(&leases, 1, 10), (false, None));
        // Expired, a lease no longer counts, and releasing it says so.
        assert!(decide(&r, &leases, 1_000, Some(4)).0.allowed);
        assert!(!release(&leases, 2, 1_000).0);
    }

    #[test]
    fn a_lowered_limit_waits_for_enough_leases_to_expire() {
        let held = Leases::from_held([(100, 1), (200, 2), (300, 3)]);
        let (outcome, _) = decide(&rule(2, 1_000), &held, 0, Some(9));
        assert_eq!((outcome.allowed, outcome.retry_after_ms), (false, 200));
    }

    #[test]
    fn a_clock_step_back_never_holds_a_slot_longer_than_one_lease() {
        let r = rule(1, 1_000);
        let ahead = Leases::from_held([(3_600_000, 1)]);
        let repaired = repair(&r, &ahead, 0).unwrap();
        assert_eq!(idle_at(&repaired), 1_000);
        assert_eq!(repair(&r, &repaired, 0), None);
    }
}
