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
//! to 256 bytes) and two counters, under 700 KiB.
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

/// One Space-Saving summary.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct Summary {
    /// Tenant → (estimated count, overestimate bound).
    counts: HashMap<String, (u64, u64)>,
    total: u64,
}

impl Summary {
    fn add(&mut self, tenant: &str, n: u64) {
        self.total += n;
        if let Some((count, _)) = self.counts.get_mut(tenant) {
            *count += n;
            return;
        }
        if self.counts.len() < CAPACITY {
            self.counts.insert(tenant.to_owned(), (n, 0));
            return;
        }
        // Full: the least counted gives its place, and its count becomes
        // the newcomer's possible overestimate.
        let (evicted, least) = self
            .counts
            .iter()
            .min_by_key(|(_, (count, _))| *count)
            .map(|(t, (count, _))| (t.clone(), *count))
            .expect("full, so not empty");
        self.counts.remove(&evicted);
        self.counts.insert(tenant.to_owned(), (least + n, least));
    }
}

/// Both summaries of one window.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Window {
    denied: Summary,
    admitted: Summary,
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
    /// Counts one decision of `tenant` at `now_ms`.
    pub fn record(&self, tenant: &str, allowed: bool, now_ms: u64) {
        let mut windows = self.windows.lock().expect("heavy hitters");
        windows.roll(now_ms);
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
    let mut totals: HashMap<&str, (u64, u64)> = HashMap::new();
    for window in windows {
        for (tenant, (count, _)) in &window.denied.counts {
            totals.entry(tenant).or_default().0 += count;
        }
        for (tenant, (count, _)) in &window.admitted.counts {
            totals.entry(tenant).or_default().1 += count;
        }
    }
    let mut tenants: Vec<Hitter> = totals
        .into_iter()
        .map(|(tenant, (denied, admitted))| Hitter {
            tenant: tenant.to_owned(),
            denied,
            admitted,
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

    #[test]
    fn the_top_tenants_are_found_in_bounded_memory_within_the_bound() {
        let hh = HeavyHitters::default();
        let now = 10 * EPOCH_MS + 5_000;
        // Three heavy tenants among 5,000 that deny once each.
        for (tenant, n) in [("big", 3_000), ("bigger", 4_000), ("biggest", 5_000)] {
            for _ in 0..n {
                hh.record(tenant, false, now);
            }
        }
        for i in 0..5_000 {
            hh.record(&format!("small-{i}"), false, now);
            hh.record("admitted-only", true, now);
        }
        let (_, previous, current) = hh.snapshot(now);
        assert!(current.denied.counts.len() <= CAPACITY);
        assert!(previous.denied.counts.is_empty());
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
