//! [`Store::adjust`](crate::Store::adjust) in memory: debits and
//! give-backs, and settle markers, under the same per-key locks as
//! decisions.

use sluice_core::Step;
use sluice_core::decision::Outcomes;

use super::{MemoryStore, repair};

use crate::adjust::{Adjusted, Change, Marker, MarkerAnswer};
use crate::bucket::KeyRef;
use crate::store::{Batch, StoreError};

impl MemoryStore {
    /// [`Store::adjust`](crate::Store::adjust), synchronously: the marker
    /// is checked and stored under its own lock, held while the rules
    /// change, so a settle applies once whatever races it.
    pub fn adjust_now(
        &self,
        batch: &Batch<'_>,
        change: Change,
        marker: Option<&Marker>,
    ) -> Result<Adjusted, StoreError> {
        let now = self.clock.now_ms();
        let mut markers = marker.map(|_| self.markers.lock());
        let mut answer = MarkerAnswer::Applied;
        if let (Some(marker), Some(markers)) = (marker, markers.as_mut()) {
            match markers.get(&(marker.id, marker.shard)) {
                Some((value, until)) if *until > now => {
                    answer = if *value == marker.value {
                        MarkerAnswer::Again
                    } else {
                        MarkerAnswer::Conflict
                    };
                }
                _ => {
                    markers.insert(
                        (marker.id, marker.shard),
                        (marker.value.clone(), now.saturating_add(marker.ttl_ms)),
                    );
                }
            }
        }
        let change = if answer == MarkerAnswer::Applied {
            change
        } else {
            Change::Nothing
        };
        let guard = self.map.guard();
        let mut outcomes = Outcomes::new();
        let mut forgiven = 0;
        for (i, bound) in batch.rules.iter().enumerate() {
            let rule = bound.rule();
            let key = KeyRef::new(&self.hasher, bound, batch.partition(i, bound), batch.shard);
            let cost = batch.cost_of(i);
            let changes = cost > 0 && !rule.is_concurrency() && change != Change::Nothing;
            let mut slot = loop {
                let entry = if changes {
                    // A debit of a key never used needs its entry.
                    Some(self.entry(&key, &guard)?)
                } else {
                    self.map.get(&key, &guard)
                };
                let Some(entry) = entry else {
                    break None;
                };
                let slot = entry.slot.lock();
                // An entry swept between lookup and lock: look up again.
                if !slot.dead {
                    break Some(slot);
                }
            };
            let Some(slot) = slot.as_mut() else {
                outcomes.push(rule.decide(&sluice_core::State::Fresh, now, 1).0);
                continue;
            };
            // Not repaired here: a debit repairs what it reads (Rule::debit),
            // a give-back changes the state as it is (as refund.lua does).
            if changes {
                if change == Change::Debit {
                    super::slot::fresh_mark(slot, now);
                }
                let next = match change {
                    Change::Debit => {
                        let debit = rule.debit(&slot.state, now, cost);
                        forgiven += debit.forgiven;
                        Some(debit.step)
                    }
                    Change::GiveBack { at, .. } => {
                        let whole_at = batch.whole_at.get(i).copied().unwrap_or(0);
                        let next = rule.give_back(
                            &slot.state,
                            at,
                            cost,
                            whole_at,
                            slot.given_back_ms,
                            now,
                        );
                        if next.is_some() && rule.algorithm().has_burst() {
                            slot.given_back_ms = slot.given_back_ms.max(now);
                        }
                        next.map(Step::Replace)
                    }
                    Change::Nothing => None,
                };
                if let Some(step) = next {
                    rule.commit(&mut slot.state, step);
                    slot.idle_at = rule.idle_at(&slot.state);
                }
            }
            // The answer is read as a decision reads: repaired, the repair
            // kept (adjust.lua writes it too).
            repair(rule, slot, now);
            outcomes.push(rule.decide(&slot.state, now, 1).0);
        }
        drop(markers);
        Ok(Adjusted {
            now,
            marker: answer,
            outcomes,
            forgiven,
            unfinished: None,
        })
    }
}
