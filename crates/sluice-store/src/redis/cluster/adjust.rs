//! [`Store::adjust`](crate::Store::adjust) on Redis Cluster: the group
//! of rules in the settle marker's slot first, with the marker, then the
//! other slots, each with a marker of its own.

use sluice_core::keys::Record;

use super::{ClusterStore, Group, hash_tag, select, slot_groups};
use crate::adjust::{Adjusted, Change, Marker, MarkerAnswer};
use crate::redis::{KeySet, Selection, Valve};
use crate::store::{Batch, StoreError};

impl ClusterStore {
    /// [`Store::adjust`] one slot at a time: first the group in the
    /// tenant's slot (or the marker alone), with the marker; then, unless
    /// another settle (or the expiry) holds that marker, the other groups
    /// (a rule kept whole on shard 0, Envoy descriptors' tags) one after
    /// another, each with the same marker in its own slot. So a settle cut
    /// short between calls (a failure, a caller gone) is finished by its
    /// retry, slot by slot, and never applied twice in any. The lead
    /// marker's answer is the settle's: a retry (or an identical settle at
    /// the same time) that finishes other slots answers
    /// [`MarkerAnswer::Again`], so a settle is counted once; one cut short
    /// after its lead applied answers [`MarkerAnswer::Applied`] with
    /// [`Adjusted::unfinished`].
    pub(super) async fn adjust_groups(
        &self,
        batch: &Batch<'_>,
        change: Change,
        marker: Option<&Marker>,
    ) -> Result<Adjusted, StoreError> {
        let valve_parts = u64::from(self.valve_shards);
        let buckets = KeySet::keys(&self.redis.keys.current, batch, Valve::WHOLE);
        let (first, valves) = slot_groups(batch, &buckets.keys);
        let mut groups: Vec<Group> = first.into_iter().chain(valves).collect();
        let marker = marker.map(|m| self.redis.marker(batch, m));
        // The group that shares the marker's slot goes first, with it.
        let lead = marker.as_ref().map(|(key, _, _)| {
            let tag = hash_tag(key);
            match groups
                .iter()
                .position(|g| hash_tag(&buckets.keys[g[0]]) == tag)
            {
                Some(p) => groups.remove(p),
                None => Group::new(),
            }
        });
        let mut outcomes: Vec<(usize, sluice_core::Outcome)> =
            Vec::with_capacity(batch.rules.len());
        let mut answer = MarkerAnswer::Applied;
        let mut forgiven = 0;
        let mut now = 0;
        let mut unfinished = None;
        let selection = |group: &[usize]| -> (Vec<String>, Vec<Record>) { select(&buckets, group) };
        // A give-back names the time its slot admitted: the rules a sharded
        // tenant keeps whole on shard 0, alone in a slot, were decided by a
        // call of their own.
        let dated = |group: &[usize], change: Change| match change {
            Change::GiveBack { first_shard_at, .. }
                if group.iter().all(|&i| batch.rules[i].on_first_shard()) =>
            {
                Change::GiveBack {
                    at: first_shard_at,
                    first_shard_at,
                }
            }
            other => other,
        };
        if let Some(lead) = lead {
            let (keys, records) = selection(&lead);
            let reply = self
                .redis
                .adjust(
                    batch,
                    self.redis.in_region(Selection {
                        indices: Some(&lead),
                        valve_parts,
                        regions: None,
                    }),
                    (keys, &records, None),
                    dated(&lead, change),
                    marker.clone(),
                )
                .await?;
            answer = reply.marker;
            forgiven += reply.forgiven;
            now = reply.now;
            outcomes.extend(lead.iter().copied().zip(reply.outcomes));
        }
        // Another settle's, or the expiry's: the later slots are only read.
        let (rest_change, held) = if answer == MarkerAnswer::Conflict {
            (Change::Nothing, None)
        } else {
            (change, marker.as_ref())
        };
        for group in &groups {
            let (keys, records) = selection(group);
            let marker = held.map(|(key, value, ttl)| {
                let tag = hash_tag(&keys[0]);
                (in_slot_of(key, tag), value.clone(), *ttl)
            });
            let reply = self
                .redis
                .adjust(
                    batch,
                    self.redis.in_region(Selection {
                        indices: Some(group),
                        valve_parts,
                        regions: None,
                    }),
                    (keys, &records, None),
                    dated(group, rest_change),
                    marker,
                )
                .await;
            let reply = match reply {
                Ok(reply) => reply,
                // The settle is made (its lead marker applied): the rest
                // is a retry's to finish.
                Err(error) if held.is_some() && answer == MarkerAnswer::Applied => {
                    unfinished = Some(error);
                    break;
                }
                Err(error) => return Err(error),
            };
            forgiven += reply.forgiven;
            now = now.max(reply.now);
            outcomes.extend(group.iter().copied().zip(reply.outcomes));
        }
        if unfinished.is_some() {
            // The slots not reached are not known: read as passing (what
            // a settle answers then is a 503 saying it is unfinished).
            let reached: Vec<usize> = outcomes.iter().map(|(i, _)| *i).collect();
            let unknown = sluice_core::Outcome {
                allowed: true,
                ..Default::default()
            };
            outcomes.extend(
                (0..batch.rules.len())
                    .filter(|i| !reached.contains(i))
                    .map(|i| (i, unknown)),
            );
        }
        outcomes.sort_by_key(|(i, _)| *i);
        Ok(Adjusted {
            now,
            marker: answer,
            outcomes: outcomes.into_iter().map(|(_, o)| o).collect(),
            forgiven,
            unfinished,
        })
    }
}

/// `key` with its hash tag replaced by `tag` (`{...}`): the same name, in
/// `tag`'s slot.
fn in_slot_of(key: &str, tag: &str) -> String {
    let own = hash_tag(key);
    let at = key.find(own).unwrap_or(0);
    format!("{}{tag}{}", &key[..at], &key[at + own.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_moves_to_another_slot_by_its_hash_tag() {
        assert_eq!(in_slot_of("sl:{abc}:m1", "{xyz}"), "sl:{xyz}:m1");
        assert_eq!(hash_tag(&in_slot_of("sl:{abc}:m1", "{xyz}")), "{xyz}");
    }
}
