//! What slices will not spend, given back: see "What is not spent goes
//! back" in the [module documentation](super). A piece is taken out of
//! its key under the key's lock (nothing is admitted from it after) and
//! queued; `Limiter::give_back_dropped_slices` empties the queue into the
//! store, out of band.

use std::sync::atomic::Ordering;

use sluice_core::{BoundRule, Policy};

use super::entry::Piece;
use super::{Slices, same_terms};

/// The most pieces queued to give back; beyond, they are lost (nobody
/// gives back: an embedded limiter that never calls
/// `Limiter::give_back_dropped_slices`), as after a crash. Only hot keys
/// hold slices, so a pass every 100 ms stays far below it.
const MAX_QUEUED: usize = 10_000;

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

impl Unspent {
    /// Whether a give-back at `now` could still return some of it: a
    /// window's units only go back into their window (at most `per` after
    /// they were taken), a bucket's only until, as the take left it, it
    /// would have been whole again and their own refill is over
    /// (`Rule::returnable`).
    fn returnable_at(&self, now: u64) -> bool {
        let rule = self.rule.rule();
        let until = if rule.algorithm().has_burst() {
            let own = u128::from(self.units) * u128::from(rule.period_ms())
                / u128::from(rule.limit().max(1));
            let own = self
                .at_ms
                .saturating_add(u64::try_from(own).unwrap_or(u64::MAX));
            own.max(self.whole_at_ms)
        } else {
            self.at_ms.saturating_add(rule.period_ms())
        };
        now < until
    }

    /// What `piece`, taken of `rule` for the bucket `key` names, still
    /// holds; `None` when it holds nothing (or the key is not text).
    fn of(rule: &BoundRule, key: (&[u8], &[u8], u16), piece: &Piece) -> Option<Unspent> {
        let (tenant, subject, shard) = key;
        let (Ok(tenant), Ok(subject)) = (std::str::from_utf8(tenant), std::str::from_utf8(subject))
        else {
            return None;
        };
        (piece.units > 0).then(|| Unspent {
            rule: rule.clone(),
            tenant: tenant.to_owned(),
            subject: (!subject.is_empty()).then(|| subject.to_owned()),
            shard,
            units: piece.units,
            // When the store took the units, on its clock (a fixed window
            // gives back only into that window).
            at_ms: piece.taken_ms,
            whole_at_ms: piece.whole_at_ms,
        })
    }
}

impl Slices {
    /// Queues what `pieces` of `rule`, for the bucket `key` names, still
    /// hold, to give back.
    pub(super) fn drop_pieces(
        &self,
        rule: &BoundRule,
        key: (&[u8], &[u8], u16),
        pieces: impl IntoIterator<Item = Piece>,
    ) {
        let mut dropped = self.dropped.lock();
        let before = dropped.len();
        // Bounded: with nobody giving back, the rest is lost (as after a
        // crash: under-admission only).
        let room = MAX_QUEUED.saturating_sub(before);
        dropped.extend(
            pieces
                .into_iter()
                .filter_map(|p| Unspent::of(rule, key, &p))
                .take(room),
        );
        if dropped.len() > before {
            self.unspent.notify_one();
        }
    }

    /// Takes every slice out, to give back with what was dropped before
    /// (the instance is stopping): no decision is answered from them any
    /// more. A take under way that lands after queues its slice, given
    /// back only by a later pass.
    pub(crate) fn drain(&self) -> Vec<Unspent> {
        let mut unspent = self.take_dropped();
        self.entries.drain(|key, mut entry| {
            let rule = entry.rule.clone();
            let pieces: Vec<Piece> = entry.take_pieces().collect();
            unspent.extend(
                pieces
                    .iter()
                    .filter_map(|p| Unspent::of(&rule, key.parts(), p)),
            );
        });
        unspent
    }

    /// Queues `unspent` again, not given back now, keeping what a
    /// give-back could still return some of at `now`: the units kept.
    /// Wakes nobody (the next pass finds them).
    pub(crate) fn requeue(&self, unspent: Vec<Unspent>, now: u64) -> u64 {
        let mut dropped = self.dropped.lock();
        let room = MAX_QUEUED.saturating_sub(dropped.len());
        let before = dropped.len();
        dropped.extend(
            unspent
                .into_iter()
                .filter(|u| u.returnable_at(now))
                .take(room),
        );
        dropped[before..].iter().map(|u| u.units).sum()
    }

    /// What was dropped since last asked, to give back.
    pub(crate) fn take_dropped(&self) -> Vec<Unspent> {
        std::mem::take(&mut *self.dropped.lock())
    }

    /// Resolves once something is dropped that was not taken out yet
    /// ([`take_dropped`](Self::take_dropped)).
    pub(crate) async fn dropped(&self) {
        self.unspent.notified().await;
    }

    /// Drops every slice (the store is in trouble): what they held is
    /// given back (when the store answers again).
    pub fn clear(&self) {
        self.entries.drain(|key, mut entry| {
            let rule = entry.rule.clone();
            let pieces: Vec<Piece> = entry.take_pieces().collect();
            self.drop_pieces(&rule, key.parts(), pieces);
        });
    }

    /// The policy is now `policy`: the slices of every key whose rule it
    /// changed (other parameters or tolerance, or no such rule for the
    /// key's tenant any more) are dropped at once, what they held given
    /// back; the others are kept, as are takes under way for them.
    pub fn keep_unchanged(&self, policy: &Policy) {
        let rules = policy.rules_by_uid();
        self.entries.retain(|key, entry| {
            let tenant = std::str::from_utf8(key.tenant()).unwrap_or_default();
            let kept = rules
                .find(tenant, entry.rule.uid())
                .is_some_and(|now| same_terms(&entry.rule, now));
            if !kept {
                let rule = entry.rule.clone();
                let pieces: Vec<Piece> = entry.take_pieces().collect();
                self.drop_pieces(&rule, key.parts(), pieces);
            }
            kept
        });
    }

    /// Takes out the pieces expired by `now` that still hold units (the
    /// key cooled before spending them), to give back; looks only once
    /// one may have expired.
    pub(crate) fn expire(&self, now: u64) {
        if now < self.next_expiry.load(Ordering::Relaxed) {
            return;
        }
        self.next_expiry.store(u64::MAX, Ordering::Relaxed);
        self.entries.each(|map| {
            for (key, entry) in map.iter_mut() {
                let rule = entry.rule.clone();
                let expired: Vec<Piece> = entry.take_expired(now).collect();
                if !expired.is_empty() {
                    self.drop_pieces(&rule, key.parts(), expired);
                }
                self.next_expiry
                    .fetch_min(entry.next_expiry(), Ordering::Relaxed);
            }
        });
    }

    /// Forgets keys that hold nothing and were not decided in the last
    /// two seconds (expired pieces are taken out first, to give back).
    pub fn sweep(&self, now: u64) {
        self.expire(now);
        self.entries
            .retain(|_, e| e.next_expiry() != u64::MAX || now / 1_000 <= e.second + 1);
    }
}

#[cfg(test)]
mod tests {
    use sluice_core::decision::Outcomes;
    use sluice_core::{Config, Outcome, Policy};

    use super::super::{Plan, Slices};
    use crate::store::Batch;

    fn policy(limit: u64) -> Policy {
        let yaml = format!(
            "default_plan: p\nplans:\n  p:\n    tenant: [{{ name: hot, limit: {limit}, per: 1m, tolerance: \"1%\" }}]\n"
        );
        Policy::compile(&Config::from_yaml(&yaml, "t.yaml").unwrap().limits)
    }

    fn admitted(remaining: u32) -> Outcome {
        Outcome {
            allowed: true,
            remaining,
            reset_after_ms: 1_000,
            retry_after_ms: 0,
        }
    }

    /// A take sent under the old rule lands after an override changed it
    /// and a decision under the new rule followed the key afresh: the
    /// take's slice is given back, and the key as the new rule follows it
    /// is left alone (never reset to the old rule, never given the slice).
    #[test]
    fn a_take_landing_after_its_rule_changed_is_given_back() {
        let slices = Slices::default();
        let (old, new) = (policy(1_200_000), policy(600_000));
        let old_batch = Batch::new("t", None, 1, old.applicable("t", "GET /", false).rules);
        let new_batch = Batch::new("t", None, 1, new.applicable("t", "GET /", false).rules);
        let now = 1_000_000;
        let _ = slices.plan(&old_batch, now);
        slices.learn(&old_batch, &[admitted(1_000_000)], false, now);
        let mut sizes = None;
        for _ in 0..200 {
            if let Plan::Take(taken) = slices.plan(&old_batch, now) {
                sizes = Some(taken);
                break;
            }
        }
        let sizes = sizes.expect("the key is hot: a take");
        slices.keep_unchanged(&new);
        let _ = slices.plan(&new_batch, now);
        let outcomes: Outcomes = [admitted(900_000)].into_iter().collect();
        slices.install(&old_batch, &sizes, outcomes, (now, now), now + 1);
        assert!(slices.of_tenant("t", now + 1).is_empty(), "not spent here");
        let dropped = slices.take_dropped();
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].units, sizes[0]);
        assert_eq!(dropped[0].rule.rule().limit(), 1_200_000, "of the old rule");
    }
}
