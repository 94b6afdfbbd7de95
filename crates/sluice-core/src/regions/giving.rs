//! When a region hands budget to its peers: parts that follow demand (see
//! the module's documentation; the bound does not depend on this policy,
//! only how fast parts follow demand does).

use super::part::Part;

/// What a region last heard of a peer's part for the window, shipped by
/// the peer with its grants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Heard {
    /// The peer's cap.
    pub cap: u64,
    /// What it had admitted.
    pub used: u64,
    /// What it had been asked.
    pub wanted: u64,
    /// The total it had heard from the region it shipped this to: the
    /// rest of that region's grants to it are still in flight.
    pub heard_from_you: u64,
}

/// A region keeps at least this fraction of its share (of what is left of
/// it), `1 / FLOOR_DIVISOR`, for its own next requests: a region idle so
/// far does not grant its whole share away (a tenant that starts sending
/// there is not refused outright while grants travel back).
pub const FLOOR_DIVISOR: u64 = 16;

/// The grants region `me` makes now, as `(region, units)`, from its own
/// `part` and what it last heard of each peer (`None`: nothing heard this
/// window, or cut off: such a peer neither gives nor gets), with
/// `elapsed` the part of the window gone, in `(0, 1]`.
///
/// Each region's need for the rest of the window is its demand so far as
/// a rate, over the time left. What remains of the pool (as seen: each
/// region's cap less its usage, grants in flight counted for their
/// receiver) is shared in proportion to the needs: that is each region's
/// target. `me` keeps its target (at least its floor) and grants the
/// excess to the regions below their targets, in proportion to how far
/// below they are, each at most that far.
pub fn grants(me: usize, part: &Part, heard: &[Option<Heard>], elapsed: f64) -> Vec<(usize, u64)> {
    let elapsed = if elapsed.is_finite() {
        elapsed.clamp(1e-3, 1.0)
    } else {
        1.0
    };
    let rest = 1.0 - elapsed;
    // (left, need) per region this one can see.
    let seen: Vec<Option<(u64, f64)>> = (0..part.given.len())
        .map(|r| {
            if r == me {
                let need = part.wanted as f64 / elapsed * rest;
                return Some((part.left(), need));
            }
            heard.get(r).copied().flatten().map(|h| {
                let in_flight = part.given[r].saturating_sub(h.heard_from_you);
                let left = h.cap.saturating_sub(h.used).saturating_add(in_flight);
                (left, h.wanted as f64 / elapsed * rest)
            })
        })
        .collect();
    let remaining: f64 = seen.iter().flatten().map(|&(left, _)| left as f64).sum();
    let needed: f64 = seen.iter().flatten().map(|&(_, need)| need).sum();
    if needed <= 0.0 || remaining <= 0.0 {
        return Vec::new();
    }
    let target = |need: f64| remaining * need / needed;
    let (left, need) = seen[me].expect("a region sees itself");
    let floor = left.min(part.share.div_ceil(FLOOR_DIVISOR));
    let keep = (target(need).ceil() as u64).max(floor);
    let excess = left.saturating_sub(keep);
    if excess == 0 {
        return Vec::new();
    }
    let deficits: Vec<(usize, f64)> = seen
        .iter()
        .enumerate()
        .filter(|&(r, _)| r != me)
        .filter_map(|(r, s)| s.map(|(left, need)| (r, target(need) - left as f64)))
        .filter(|&(_, short)| short >= 1.0)
        .collect();
    let short: f64 = deficits.iter().map(|&(_, d)| d).sum();
    deficits
        .into_iter()
        .map(|(r, d)| {
            let units = (excess as f64 * d / short.max(excess as f64)).floor();
            (r, units.min(d.floor()) as u64)
        })
        .filter(|&(_, units)| units > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heard(cap: u64, used: u64, wanted: u64) -> Option<Heard> {
        Some(Heard {
            cap,
            used,
            wanted,
            heard_from_you: 0,
        })
    }

    #[test]
    fn an_idle_region_grants_all_but_its_floor_to_a_busy_one() {
        let part = Part::new(320, 2);
        let grants = grants(0, &part, &[None, heard(320, 320, 5_000)], 0.1);
        assert_eq!(grants, [(1, 300)]);
    }

    #[test]
    fn regions_as_busy_as_each_other_grant_nothing() {
        let mut part = Part::new(100, 2);
        (0..50).for_each(|_| {
            part.admit(1);
        });
        assert!(grants(0, &part, &[None, heard(100, 50, 50)], 0.5).is_empty());
    }

    #[test]
    fn grants_in_flight_count_for_their_receiver() {
        let mut part = Part::new(320, 2);
        part.grant(1, 300).unwrap();
        // The busy peer has not heard the 300 yet: nothing more to give.
        let again = grants(0, &part, &[None, heard(320, 320, 5_000)], 0.2);
        assert!(again.is_empty(), "{again:?}");
    }

    #[test]
    fn unknown_peers_and_odd_times_grant_nothing_wrong() {
        let part = Part::new(100, 3);
        assert!(grants(0, &part, &[None, None, None], 0.5).is_empty());
        for elapsed in [0.0, -1.0, f64::NAN, f64::INFINITY, 2.0] {
            let g = grants(0, &part, &[None, heard(0, 0, 10), None], elapsed);
            assert!(g.iter().map(|&(_, u)| u).sum::<u64>() <= part.left());
        }
    }
}
