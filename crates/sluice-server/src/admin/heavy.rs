//! Heavy hitters: the tenants denied (or admitted) most over the recent
//! window, from a bounded-memory sketch, for the admin API only (tenant
//! ids never become metric labels).
//!
//! Each instance keeps, per window of [`EPOCH_MS`] (the current one and
//! the previous one), two Space-Saving summaries of at most [`CAPACITY`]
//! tenants each: one counting denied requests, one admitted. Space-Saving
//! never underestimates, overestimates a tenant by at most `N / CAPACITY`
//! (`N`: requests counted in the window), and lists every tenant with more
//! than `N / CAPACITY`. Memory: at most 4 × 512 entries of a tenant id (up
//! to 256 bytes, held twice: by its slot and in the index) and two
//! counters, about 1.2 MiB.
//!
//! On Redis backends every instance writes its summaries each second,
//! encrypted (as overrides are), and a query on any instance adds up those
//! of the last two windows of every live instance.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Tenants each summary holds.
pub const CAPACITY: usize = 512;
/// One window.
pub const EPOCH_MS: u64 = 60_000;

/// One Space-Saving summary: at most [`CAPACITY`] tenants, the least
/// counted always at hand (a binary min-heap over their slots), so a
/// tenant not held costs a few steps, not a scan of all of them (a scan
/// cost 1.2 µs a decision, under the lock, with 10,000 tenants in turn).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(from = "Counts", into = "Counts")]
struct Summary {
    /// Tenant → its slot.
    index: HashMap<String, u32>,
    /// Per slot: the tenant, its estimated count and overestimate bound.
    slots: Vec<Slot>,
    /// The slots, as a min-heap by count.
    heap: Vec<u32>,
    /// Per slot, where it is in `heap`.
    place: Vec<u32>,
    total: u64,
}

#[derive(Debug, Clone)]
struct Slot {
    tenant: String,
    count: u64,
    over: u64,
}

/// A summary as instances publish it: tenant → (estimated count,
/// overestimate bound), and the requests counted.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Counts {
    counts: HashMap<String, (u64, u64)>,
    total: u64,
}

impl From<Counts> for Summary {
    fn from(published: Counts) -> Summary {
        let mut summary = Summary {
            total: published.total,
            ..Summary::default()
        };
        for (tenant, (count, over)) in published.counts {
            let slot = summary.slots.len() as u32;
            summary.index.insert(tenant.clone(), slot);
            summary.slots.push(Slot {
                tenant,
                count,
                over,
            });
            summary.heap.push(slot);
            summary.place.push(slot);
        }
        for at in (0..summary.heap.len() / 2).rev() {
            summary.sift_down(at);
        }
        summary
    }
}

impl From<Summary> for Counts {
    fn from(summary: Summary) -> Counts {
        Counts {
            counts: summary
                .slots
                .into_iter()
                .map(|s| (s.tenant, (s.count, s.over)))
                .collect(),
            total: summary.total,
        }
    }
}

impl Summary {
    fn add(&mut self, tenant: &str, n: u64) {
        self.total += n;
        if let Some(&slot) = self.index.get(tenant) {
            self.slots[slot as usize].count += n;
            self.sift_down(self.place[slot as usize] as usize);
            return;
        }
        if self.slots.len() < CAPACITY {
            let slot = self.slots.len() as u32;
            self.slots.push(Slot {
                tenant: tenant.to_owned(),
                count: n,
                over: 0,
            });
            self.index.insert(tenant.to_owned(), slot);
            self.heap.push(slot);
            self.place.push(slot);
            self.sift_up(self.heap.len() - 1);
            return;
        }
        // Full: the least counted gives its place, and its count becomes
        // the newcomer's possible overestimate.
        // The evicted tenant's two strings are reused for the newcomer: no
        // allocation on a decision (tenant ids are of similar lengths).
        let slot = self.heap[0];
        let least = &mut self.slots[slot as usize];
        let (mut key, _) = self
            .index
            .remove_entry(least.tenant.as_str())
            .expect("every slot's tenant is indexed");
        key.clear();
        key.push_str(tenant);
        least.tenant.clear();
        least.tenant.push_str(tenant);
        let least_count = least.count;
        least.count = least_count + n;
        least.over = least_count;
        self.index.insert(key, slot);
        self.sift_down(0);
    }

    /// Each tenant held and its estimated count.
    fn counts(&self) -> impl Iterator<Item = (&str, u64)> {
        self.slots.iter().map(|s| (s.tenant.as_str(), s.count))
    }

    fn count_at(&self, at: usize) -> u64 {
        self.slots[self.heap[at] as usize].count
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        self.place[self.heap[a] as usize] = a as u32;
        self.place[self.heap[b] as usize] = b as u32;
    }

    fn sift_down(&mut self, mut at: usize) {
        loop {
            let (left, right) = (2 * at + 1, 2 * at + 2);
            let mut least = at;
            if left < self.heap.len() && self.count_at(left) < self.count_at(least) {
                least = left;
            }
            if right < self.heap.len() && self.count_at(right) < self.count_at(least) {
                least = right;
            }
            if least == at {
                return;
            }
            self.swap(at, least);
            at = least;
        }
    }

    fn sift_up(&mut self, mut at: usize) {
        while at > 0 {
            let parent = (at - 1) / 2;
            if self.count_at(at) >= self.count_at(parent) {
                return;
            }
            self.swap(at, parent);
            at = parent;
        }
    }
}

/// Both summaries of one window.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Window {
    denied: Summary,
    admitted: Summary,
    /// Of the denied, those a fair valve's share denied (absent from what
    /// an older instance published).
    #[serde(default)]
    fair_share_denied: Summary,
}

#[derive(Debug, Default)]
struct Windows {
    /// The window `current` counts (its number since the epoch).
    number: u64,
    current: Window,
    previous: Window,
}

/// One tenant in a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hitter {
    /// The tenant.
    pub tenant: String,
    /// Requests denied.
    pub denied: u64,
    /// Requests admitted.
    pub admitted: u64,
    /// Requests denied because the tenant was past its share of a
    /// saturated fair valve (counted in `denied` too).
    pub fair_share_denied: u64,
}

/// What `GET /v1/admin/heavy-hitters` answers.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The span counted, in seconds (the previous window and the current
    /// one so far).
    pub window_s: u64,
    /// The top tenants, most first.
    pub tenants: Vec<Hitter>,
}

/// Counts decisions per tenant, in bounded memory.
#[derive(Debug, Default)]
pub struct HeavyHitters {
    windows: Mutex<Windows>,
}

/// Which count orders a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// Most denied first.
    Denied,
    /// Most admitted first.
    Admitted,
}

impl HeavyHitters {
    /// Counts one decision of `tenant` at `now_ms`; `fair_share_denied`
    /// when a fair valve's share denied it.
    pub fn record(&self, tenant: &str, allowed: bool, fair_share_denied: bool, now_ms: u64) {
        let mut windows = self.windows.lock().expect("heavy hitters");
        windows.roll(now_ms);
        if fair_share_denied {
            windows.current.fair_share_denied.add(tenant, 1);
        }
        let summary = if allowed {
            &mut windows.current.admitted
        } else {
            &mut windows.current.denied
        };
        summary.add(tenant, 1);
    }

    /// This instance's last two windows, as of `now_ms`.
    pub fn snapshot(&self, now_ms: u64) -> (u64, Window, Window) {
        let mut windows = self.windows.lock().expect("heavy hitters");
        windows.roll(now_ms);
        (
            windows.number,
            windows.previous.clone(),
            windows.current.clone(),
        )
    }
}

impl Windows {
    fn roll(&mut self, now_ms: u64) {
        let number = now_ms / EPOCH_MS;
        if number == self.number {
            return;
        }
        self.previous = if number == self.number + 1 {
            std::mem::take(&mut self.current)
        } else {
            Window::default()
        };
        self.current = Window::default();
        self.number = number;
    }
}

/// The top `limit` tenants `by` one count, over `windows` (this instance's
/// and other instances', all of the same two windows), at `now_ms`.
pub fn report(windows: &[Window], by: By, limit: usize, now_ms: u64) -> Report {
    let mut totals: HashMap<&str, (u64, u64, u64)> = HashMap::new();
    for window in windows {
        for (tenant, count) in window.denied.counts() {
            totals.entry(tenant).or_default().0 += count;
        }
        for (tenant, count) in window.admitted.counts() {
            totals.entry(tenant).or_default().1 += count;
        }
    }
    // Only for the tenants listed: a tenant known only to this summary
    // was denied, so in the denied one too (or evicted from both).
    for window in windows {
        for (tenant, count) in window.fair_share_denied.counts() {
            if let Some(total) = totals.get_mut(tenant) {
                total.2 += count;
            }
        }
    }
    let mut tenants: Vec<Hitter> = totals
        .into_iter()
        .map(|(tenant, (denied, admitted, fair_share_denied))| Hitter {
            tenant: tenant.to_owned(),
            denied,
            admitted,
            fair_share_denied,
        })
        .filter(|h| match by {
            By::Denied => h.denied > 0,
            By::Admitted => h.admitted > 0,
        })
        .collect();
    tenants.sort_by(|a, b| {
        let key = |h: &Hitter| match by {
            By::Denied => (h.denied, h.admitted),
            By::Admitted => (h.admitted, h.denied),
        };
        key(b).cmp(&key(a)).then_with(|| a.tenant.cmp(&b.tenant))
    });
    tenants.truncate(limit);
    Report {
        window_s: (EPOCH_MS + now_ms % EPOCH_MS) / 1_000,
        tenants,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Space-Saving's guarantees hold whatever the stream: never under
        /// the truth, over by at most what the tenant's slot inherited and
        /// at most `N / CAPACITY`, every tenant above `N / CAPACITY` held,
        /// the counts adding up to `N`; and the heap is a heap.
        #[test]
        fn a_summary_keeps_its_bounds(
            stream in proptest::collection::vec((0u32..3_000, 1u64..4), 1..6_000),
            skew in 1u32..6,
        ) {
            let mut summary = Summary::default();
            let mut truth: HashMap<String, u64> = HashMap::new();
            for (id, n) in stream {
                // Half the stream on fewer tenants as `skew` grows.
                let id = if id % 2 == 0 { id % (3_000 / (skew * skew) + 1) } else { id };
                let tenant = format!("t{id}");
                summary.add(&tenant, n);
                *truth.entry(tenant).or_default() += n;
            }
            let total: u64 = truth.values().sum();
            prop_assert_eq!(summary.total, total);
            prop_assert!(summary.slots.len() <= CAPACITY);
            prop_assert_eq!(summary.counts().map(|(_, c)| c).sum::<u64>(), total);
            let bound = total / CAPACITY as u64;
            for slot in &summary.slots {
                let real = truth[&slot.tenant];
                prop_assert!(real <= slot.count && slot.count <= real + slot.over);
                prop_assert!(slot.over <= bound);
            }
            for (tenant, real) in &truth {
                if *real > bound {
                    prop_assert!(summary.index.contains_key(tenant), "{} ({})", tenant, real);
                }
            }
            for at in 1..summary.heap.len() {
                prop_assert!(summary.count_at((at - 1) / 2) <= summary.count_at(at));
            }
            for (at, slot) in summary.heap.iter().enumerate() {
                prop_assert_eq!(summary.place[*slot as usize] as usize, at);
            }
        }
    }

    /// What instances publish keeps its shape (instances of two versions
    /// share a store during an upgrade), and reads back as it was.
    #[test]
    fn a_summary_is_published_as_counts_by_tenant() {
        let mut summary = Summary::default();
        for (tenant, n) in [("a", 3), ("b", 1), ("c", 2), ("a", 1)] {
            summary.add(tenant, n);
        }
        let json = serde_json::to_value(&summary).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"counts": {"a": [4, 0], "b": [1, 0], "c": [2, 0]}, "total": 7})
        );
        let mut back: Summary = serde_json::from_value(json).unwrap();
        back.add("b", 5);
        let mut counts: Vec<_> = back.counts().collect();
        counts.sort_unstable();
        assert_eq!(counts, [("a", 4), ("b", 6), ("c", 2)]);
        assert_eq!(back.count_at(0), 2);
    }

    #[test]
    fn the_top_tenants_are_found_in_bounded_memory_within_the_bound() {
        let hh = HeavyHitters::default();
        let now = 10 * EPOCH_MS + 5_000;
        // Three heavy tenants among 5,000 that deny once each.
        for (tenant, n) in [("big", 3_000), ("bigger", 4_000), ("biggest", 5_000)] {
            for _ in 0..n {
                hh.record(tenant, false, false, now);
            }
        }
        for i in 0..5_000 {
            hh.record(&format!("small-{i}"), false, false, now);
            hh.record("admitted-only", true, false, now);
        }
        let (_, previous, current) = hh.snapshot(now);
        assert!(current.denied.slots.len() <= CAPACITY);
        assert!(previous.denied.slots.is_empty());
        let both = [previous, current];
        let top = report(&both, By::Denied, 3, now);
        let names: Vec<&str> = top.tenants.iter().map(|h| h.tenant.as_str()).collect();
        assert_eq!(names, ["biggest", "bigger", "big"]);
        // Never under, over by at most N / CAPACITY.
        let bound = both[1].denied.total / CAPACITY as u64;
        for (h, truth) in top.tenants.iter().zip([5_000, 4_000, 3_000]) {
            assert!(
                h.denied >= truth && h.denied <= truth + bound,
                "{h:?} vs {truth} ± {bound}"
            );
        }
        let admitted = report(&both, By::Admitted, 10, now);
        assert_eq!(admitted.tenants[0].tenant, "admitted-only");
        assert_eq!(admitted.tenants[0].admitted, 5_000);
        // Two windows later, all of it has aged out.
        let (_, previous, current) = hh.snapshot(now + 2 * EPOCH_MS);
        assert!(
            report(&[previous, current], By::Denied, 3, now)
                .tenants
                .is_empty()
        );
    }
}
