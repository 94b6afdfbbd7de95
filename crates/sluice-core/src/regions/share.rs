//! The parts a window starts from: the pool, and each region's share of
//! it by weight.

use crate::tolerance::Tolerance;

/// The fleet's pool per window for a rule of `limit` units and
/// `tolerance`: `limit + ⌊limit × tolerance⌋`.
pub fn pool(limit: u64, tolerance: Tolerance) -> u64 {
    let over = u128::from(limit) * u128::from(tolerance.ppm()) / 1_000_000;
    limit.saturating_add(u64::try_from(over).unwrap_or(u64::MAX))
}

/// Each region's share of `pool`, in proportion to `weights` (in the
/// regions' order, every region configured the same), summing to `pool`
/// exactly: each gets the floor of its proportion, and the units left
/// over go one each to the regions with the largest remainders (the
/// earlier region first on a tie), so every region computes the same
/// shares. When every weight is zero the shares are even; a zero weight
/// beside others gets nothing (but a leftover unit).
pub fn shares(pool: u64, weights: &[u32]) -> Vec<u64> {
    if weights.is_empty() {
        return Vec::new();
    }
    let even = weights.iter().all(|&w| w == 0);
    let weight = |w: u32| u128::from(if even { 1 } else { w });
    let total: u128 = weights.iter().map(|&w| weight(w)).sum();
    let exact = |w: u32| u128::from(pool) * weight(w);
    let mut shares: Vec<u64> = weights
        .iter()
        .map(|&w| u64::try_from(exact(w) / total).unwrap_or(u64::MAX))
        .collect();
    let mut left = pool - shares.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..weights.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(exact(weights[i]) % total));
    for i in order {
        if left == 0 {
            break;
        }
        shares[i] += 1;
        left -= 1;
    }
    shares
}

/// Region `index`'s share of `pool`, as [`shares`] gives it, without
/// building the others' (a decision of a shared rule asks it).
pub fn share(pool: u64, weights: &[u32], index: usize) -> u64 {
    let Some(&mine) = weights.get(index) else {
        return 0;
    };
    let even = weights.iter().all(|&w| w == 0);
    let weight = |w: u32| u128::from(if even { 1 } else { w });
    let total: u128 = weights.iter().map(|&w| weight(w)).sum();
    let exact = |w: u32| u128::from(pool) * weight(w);
    let floor = |w: u32| u64::try_from(exact(w) / total).unwrap_or(u64::MAX);
    let left = pool - weights.iter().map(|&w| floor(w)).sum::<u64>();
    // Leftover units go one each by largest remainder, the earlier region
    // first on a tie (as `shares` hands them out).
    let remainder = exact(mine) % total;
    let before = weights
        .iter()
        .enumerate()
        .filter(|&(j, &w)| {
            let r = exact(w) % total;
            r > remainder || (r == remainder && j < index)
        })
        .count() as u64;
    floor(mine) + u64::from(before < left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_sum_to_the_pool_and_follow_the_weights() {
        assert_eq!(shares(100, &[1, 1, 1]), [34, 33, 33]);
        assert_eq!(shares(100, &[0, 0]), [50, 50]);
        assert_eq!(shares(10, &[3, 1]), [8, 2]);
        assert_eq!(shares(1, &[1, 1, 1]), [1, 0, 0]);
        for pool in [0, 1, 7, 999, u64::MAX / 3] {
            for weights in [
                &[1, 2, 3][..],
                &[5],
                &[u32::MAX, 1, 0],
                &[0, 0, 0],
                &[2, 2, 1, 1],
            ] {
                let all = shares(pool, weights);
                assert_eq!(all.iter().sum::<u64>(), pool);
                for (i, &s) in all.iter().enumerate() {
                    assert_eq!(share(pool, weights, i), s, "{pool} {weights:?} {i}");
                }
            }
        }
    }

    #[test]
    fn the_pool_adds_the_tolerance_rounded_down() {
        assert_eq!(pool(1000, Tolerance::EXACT), 1000);
        assert_eq!(pool(1000, Tolerance::from_ppm(10_000)), 1010);
        assert_eq!(pool(99, Tolerance::from_ppm(10_000)), 99);
        assert_eq!(pool(u64::MAX, Tolerance::from_ppm(100_000)), u64::MAX);
    }
}
