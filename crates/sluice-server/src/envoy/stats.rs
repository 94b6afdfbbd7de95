//! envoyproxy/ratelimit's statistics per descriptor (`ratelimit.service.
//! rate_limit.<domain>.<key>.…`): each counted descriptor's hits, and
//! whether it was within, near or over its limit.

use sluice_core::Decision;

use crate::metrics::{EnvoyproxyStatus, Metrics};

/// Counts each descriptor of `stats` (its limit's key, shadow mode and
/// hits; `None`: not counted) as the decision found it: `owners[i]` are
/// the rules descriptor `i` answers for, `blocked[i]` whether a zero limit
/// denied it.
pub(super) fn count(
    metrics: &Metrics,
    decision: &Decision<'_>,
    stats: &[Option<(String, bool, u64)>],
    owners: &[Vec<usize>],
    blocked: &[bool],
) {
    for (i, stat) in stats.iter().enumerate() {
        let Some((key, shadow, hits)) = stat else {
            continue;
        };
        let known = || {
            owners[i]
                .iter()
                .filter_map(|&r| decision.outcome(r).map(|o| (r, o)))
        };
        let over = blocked[i] || known().any(|(_, o)| !o.allowed);
        let status = if over {
            EnvoyproxyStatus::Over { shadow: *shadow }
        } else {
            let near = known().any(|(r, o)| decision.rules[r].is_near(o.remaining.into()));
            EnvoyproxyStatus::Within { near }
        };
        metrics.envoyproxy_descriptor(key, *hits, status);
    }
}
