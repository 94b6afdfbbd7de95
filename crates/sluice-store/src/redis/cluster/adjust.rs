//! [`Store::adjust`](crate::Store::adjust) on Redis Cluster: the group
//! of rules in the settle marker's slot first, with the marker, then the
//! other slots.

use sluice_core::keys::Record;

use super::{ClusterStore, Group, hash_tag, select, slot_groups};
use crate::adjust::{Adjusted, Change, Marker, MarkerAnswer};
use crate::redis::{KeySet, Selection, Valve};
use crate::store::{Batch, StoreError};

impl ClusterStore {
    /// [`Store::adjust`] one slot at a time: first the group in the
    /// tenant's slot (or the marker alone), with the marker; then, if the
    /// change applied, the other groups (Envoy descriptors' tags, valves)
    /// one after another; else they are only read. A caller that goes away
    /// between calls leaves the later groups unchanged: a give-back short,
    /// never a change applied twice.
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
        let selection = |group: &[usize]| -> (Vec<String>, Vec<Record>) { select(&buckets, group) };
        if let Some(lead) = lead {
            let (keys, records) = selection(&lead);
            let reply = self
                .redis
                .adjust(
                    batch,
                    Selection {
                        indices: Some(&lead),
                        valve_parts,
                    },
                    (keys, &records),
                    change,
                    marker,
                )
                .await?;
            answer = reply.marker;
            forgiven += reply.forgiven;
            now = reply.now;
            outcomes.extend(lead.iter().copied().zip(reply.outcomes));
        }
        let rest_change = if answer == MarkerAnswer::Applied {
            change
        } else {
            Change::Nothing
        };
        for group in &groups {
            let (keys, records) = selection(group);
            let reply = self
                .redis
                .adjust(
                    batch,
                    Selection {
                        indices: Some(group),
                        valve_parts,
                    },
                    (keys, &records),
                    rest_change,
                    None,
                )
                .await?;
            forgiven += reply.forgiven;
            now = now.max(reply.now);
            outcomes.extend(group.iter().copied().zip(reply.outcomes));
        }
        outcomes.sort_by_key(|(i, _)| *i);
        Ok(Adjusted {
            now,
            marker: answer,
            outcomes: outcomes.into_iter().map(|(_, o)| o).collect(),
            forgiven,
        })
    }
}
