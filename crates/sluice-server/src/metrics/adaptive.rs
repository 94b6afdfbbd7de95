//! Adaptive valves (appendix I): labelled by the valve rule's name, and
//! what they shed by the request's priority (never a tenant or a route).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_store::limiter::AdaptiveLevel;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ValveLabel {
    valve: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShedLabel {
    valve: String,
    priority: &'static str,
}

pub(super) struct AdaptiveStats {
    limit: Family<ValveLabel, Gauge>,
    latency: Family<ValveLabel, Gauge<f64, AtomicU64>>,
    shed: Family<ShedLabel, Counter>,
}

impl AdaptiveStats {
    pub(super) fn register(registry: &mut Registry) -> AdaptiveStats {
        let stats = AdaptiveStats {
            limit: Family::default(),
            latency: Family::default(),
            shed: Family::default(),
        };
        registry.register(
            "adaptive_valve_limit",
            "An adaptive valve's effective limit, as this instance last stepped its law (0: not yet)",
            stats.limit.clone(),
        );
        registry.register(
            "adaptive_valve_latency_seconds",
            "An adaptive valve's estimate of its downstream's latency, as its law last stepped",
            stats.latency.clone(),
        );
        registry.register(
            "adaptive_valve_shed",
            "Requests an adaptive valve denied on this instance, by the request's priority",
            stats.shed.clone(),
        );
        stats
    }

    pub(super) fn levels(&self, levels: &[AdaptiveLevel]) {
        for level in levels {
            let label = ValveLabel {
                valve: level.valve.to_string(),
            };
            self.limit
                .get_or_create(&label)
                .set(i64::try_from(level.effective_limit).unwrap_or(i64::MAX));
            self.latency
                .get_or_create(&label)
                .set(level.latency_ms / 1_000.0);
            for (priority, shed) in level.shed {
                let counter = self.shed.get_or_create(&ShedLabel {
                    valve: level.valve.to_string(),
                    priority: priority.name(),
                });
                let now = counter.get();
                if shed > now {
                    counter.inc_by(shed - now);
                }
            }
        }
    }
}
