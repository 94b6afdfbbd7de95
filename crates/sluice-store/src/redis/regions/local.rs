//! What a region's own store does for its shared rules, on one node or a
//! cluster alike: each decision is told this region's share and notes what
//! it asked (for the link), and each region's part is read back for
//! `sluice inspect`.

use std::sync::Arc;

use sluice_core::keys::Keyer;

use super::ledger::{Steps, snapshot};
use super::shared::{Kind, RegionPart, Regions, Shared};
use crate::redis::store::{Reach, Redis};
use crate::redis::{Buckets, KeySet, Selection, Valve};
use crate::store::{Batch, StoreError};

impl<R: Reach> Redis<R> {
    /// Makes shared rules one budget across `regions`: their records are
    /// named apart (see `Keyer::linking_regions`).
    pub(crate) fn link_regions(&mut self, regions: Arc<Regions>) {
        self.regions = Some(regions);
        let keys = &mut self.keys;
        keys.current = keys.current.clone().linking_regions();
        keys.previous = keys.previous.take().map(Keyer::linking_regions);
    }

    /// `selection`, each shared rule decided as this region's part.
    pub(crate) fn in_region<'s>(&'s self, selection: Selection<'s>) -> Selection<'s> {
        Selection {
            regions: self.regions.as_deref(),
            ..selection
        }
    }

    /// Notes what a decision asks of its shared rules kept in `buckets`
    /// (and `previous`, while rotating), for the link.
    pub(crate) fn note_shared(
        &self,
        batch: &Batch<'_>,
        buckets: &Buckets,
        previous: Option<&Buckets>,
    ) {
        let Some(regions) = &self.regions else {
            return;
        };
        let now = self.time.now_ms();
        for (i, rule) in batch.rules.iter().enumerate() {
            if rule.shared_across_regions() {
                let cost = batch.cost_of(i);
                let before = previous.map(|p| (p.keys[i].as_str(), p.records[i]));
                let kept = (buckets.keys[i].as_str(), buckets.records[i], before);
                regions.note(rule, kept, cost, now);
            }
        }
    }

    /// Notes what a decision the limiter answered without the store asked
    /// (a hot key's slice, a denial remembered), for the link.
    pub(crate) fn note_asked(&self, batch: &Batch<'_>) {
        if self.regions.is_some() && batch.rules.iter().any(|r| r.shared_across_regions()) {
            let (buckets, previous) = self.whole_keys(batch);
            self.note_shared(batch, &buckets, previous.as_ref());
        }
    }

    /// The keys of `batch`'s rules (valves whole), and while rotating the
    /// same under the previous pepper (on one node: on a cluster, they are
    /// in other slots, and a decision does not carry them over).
    pub(crate) fn whole_keys(&self, batch: &Batch<'_>) -> (Buckets, Option<Buckets>) {
        let previous = self
            .keys
            .previous
            .as_ref()
            .filter(|_| R::PIPELINES_ANY_KEYS)
            .map(|keyer| KeySet::keys(keyer, batch, Valve::WHOLE));
        (
            KeySet::keys(&self.keys.current, batch, Valve::WHOLE),
            previous,
        )
    }

    /// Each region's part of every shared rule of `batch` (in rule order;
    /// `None` for a rule that is not shared, or with regions off), as this
    /// region's store has it now.
    pub(crate) async fn region_parts(
        &self,
        batch: &Batch<'_>,
    ) -> Result<Vec<Option<Vec<RegionPart>>>, StoreError> {
        let Some(regions) = &self.regions else {
            return Ok(vec![None; batch.rules.len()]);
        };
        let (buckets, previous) = self.whole_keys(batch);
        let steps = Steps {
            time: &self.time,
            regions: regions.len(),
            own: None,
        };
        let mut connection = self.reach.shared()?;
        let mut parts = Vec::with_capacity(batch.rules.len());
        for (i, rule) in batch.rules.iter().enumerate() {
            if !rule.shared_across_regions() {
                parts.push(None);
                continue;
            }
            let shared = Shared {
                key: buckets.keys[i].clone(),
                record: buckets.records[i],
                per_ms: rule.rule().period_ms(),
                kind: Kind::of(rule),
                max_debt: rule.rule().max_debt(),
                previous: previous.as_ref().map(|p| (p.keys[i].clone(), p.records[i])),
            };
            let pool = Regions::pool(rule);
            let reply: Vec<u8> = shared
                .read_call(steps, regions.share(pool))
                .invoke_async(&mut connection)
                .await
                .map_err(|e| self.error(&e))?;
            let mut snapshot = snapshot(&reply, regions.len())?;
            if snapshot.pool == 0 {
                // No link has run for it this window: the pool as now.
                snapshot.pool = pool;
            }
            parts.push(Some(regions.parts(&snapshot, shared.kind)));
        }
        Ok(parts)
    }
}
