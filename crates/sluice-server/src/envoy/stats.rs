//! envoyproxy/ratelimit's statistics per descriptor (`ratelimit.service.
//! rate_limit.<domain>.<key>.…`): each counted descriptor's hits, and
//! whether it was within, near or over its limit.

use sluice_core::Decision;

use super::verdict::Answering;
use crate::metrics::{EnvoyproxyStatus, Metrics};

/// Counts each descriptor with `stats` (its limit's key and hits; `None`:
/// not counted) as the decision found it.
pub(super) fn count(metrics: &Metrics, decision: &Decision<'_>, descriptors: &[Answering]) {
    for d in descriptors {
        let Some((key, hits)) = d.stats else {
            continue;
        };
        let known = || {
            d.owned
                .iter()
                .filter_map(|&r| decision.outcome(r).map(|o| (r, o)))
        };
        let over = d.blocked() || known().any(|(_, o)| !o.allowed);
        let status = if over {
            EnvoyproxyStatus::Over { shadow: d.shadow() }
        } else {
            let near = known().any(|(r, o)| decision.rules[r].is_near(o.remaining.into()));
            EnvoyproxyStatus::Within { near }
        };
        metrics.envoyproxy_descriptor(key, hits, status);
    }
}
