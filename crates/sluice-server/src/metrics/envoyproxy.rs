//! envoyproxy/ratelimit's per-descriptor statistics, under the names its
//! dashboards know.

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// How one descriptor of an envoyproxy/ratelimit domain fared, for its
/// stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnvoyproxyStatus {
    /// Admitted; `near` when past `near_limit` of its limit afterwards.
    Within {
        /// Past `near_limit`.
        near: bool,
    },
    /// Over its limit; `shadow` when in shadow mode (not enforced).
    Over {
        /// In shadow mode.
        shadow: bool,
    },
}

/// envoyproxy/ratelimit's per-descriptor stats under the names its
/// statsd-to-Prometheus mapping gives them
/// (`ratelimit_service_rate_limit_total_hits{domain, key1, key2}`, …), so
/// dashboards keep working. They are exported as gauges that only grow:
/// OpenMetrics would append `_total` to counters and change the names.
/// Labels come from the configured limit's key (`domain.key1.key2`), never
/// from request values, so series are bounded by the configuration.
pub(super) struct EnvoyproxyStats {
    families: [Family<Vec<(&'static str, String)>, Gauge>; 5],
}

impl EnvoyproxyStats {
    const NAMES: [&'static str; 5] = [
        "total_hits",
        "over_limit",
        "near_limit",
        "within_limit",
        "shadow_mode",
    ];

    /// The families, registered in `registry` (which has no prefix).
    pub(super) fn register(registry: &mut Registry) -> EnvoyproxyStats {
        let families: [Family<Vec<(&'static str, String)>, Gauge>; 5] = Default::default();
        for (name, family) in Self::NAMES.iter().zip(&families) {
            registry.register(
                format!("ratelimit_service_rate_limit_{name}"),
                format!("envoyproxy/ratelimit's {name} per configured limit (grows only)"),
                family.clone(),
            );
        }
        EnvoyproxyStats { families }
    }

    pub(super) fn count(&self, key: &str, hits: u64, status: EnvoyproxyStatus) {
        let mut parts = key.split('.');
        let mut labels = vec![("domain", parts.next().unwrap_or_default().to_owned())];
        if let Some(key1) = parts.next() {
            labels.push(("key1", key1.to_owned()));
        }
        if let Some(key2) = parts.next() {
            labels.push(("key2", key2.to_owned()));
        }
        let hits = i64::try_from(hits).unwrap_or(i64::MAX);
        let add = |i: usize| {
            self.families[i].get_or_create(&labels).inc_by(hits);
        };
        add(0);
        match status {
            EnvoyproxyStatus::Within { near } => {
                add(3);
                if near {
                    add(2);
                }
            }
            EnvoyproxyStatus::Over { shadow } => {
                add(1);
                if shadow {
                    add(4);
                }
            }
        }
    }
}
