//! The region link's peers (`storage.regions`): labelled by the peer
//! region's name, which comes from the configuration.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use sluice_store::redis::regions::PeerStatus;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabel {
    peer: String,
}

pub(super) struct RegionStats {
    last_heard: Family<PeerLabel, Gauge<f64, AtomicU64>>,
    lag: Family<PeerLabel, Gauge<f64, AtomicU64>>,
    shipped: Family<PeerLabel, Counter>,
    received: Family<PeerLabel, Counter>,
    failures: Family<PeerLabel, Counter>,
    cut_off: Family<PeerLabel, Gauge>,
    foreign: Family<PeerLabel, Gauge>,
}

/// Raises a counter to `total` (the link keeps totals).
fn raise(counter: &Counter, total: u64) {
    let now = counter.get();
    if total > now {
        counter.inc_by(total - now);
    }
}

impl RegionStats {
    pub(super) fn register(registry: &mut Registry) -> RegionStats {
        let stats = RegionStats {
            last_heard: Family::default(),
            lag: Family::default(),
            shipped: Family::default(),
            received: Family::default(),
            failures: Family::default(),
            cut_off: Family::default(),
            foreign: Family::default(),
        };
        registry.register(
            "region_peer_last_heard_age_seconds",
            "Seconds since the peer region last shipped to this one (-1: never)",
            stats.last_heard.clone(),
        );
        registry.register(
            "region_peer_sync_lag_seconds",
            "How long this region's last shipping to the peer took",
            stats.lag.clone(),
        );
        registry.register(
            "region_peer_units_shipped",
            "Units of shared rules' budgets this instance granted the peer region, while it led the link",
            stats.shipped.clone(),
        );
        registry.register(
            "region_peer_units_received",
            "Units the peer region granted this one that were added here",
            stats.received.clone(),
        );
        registry.register(
            "region_peer_shipping_failures",
            "Shippings to the peer region that failed or ran out of time",
            stats.failures.clone(),
        );
        registry.register(
            "region_peer_cut_off",
            "Whether the peer region is cut off (not heard from for peer_timeout)",
            stats.cut_off.clone(),
        );
        registry.register(
            "region_peer_foreign",
            "Whether the peer region's store announces another pepper or other regions (never merged)",
            stats.foreign.clone(),
        );
        stats
    }

    pub(super) fn peers(&self, peers: &[PeerStatus], now_ms: u64) {
        for p in peers {
            let label = PeerLabel {
                peer: p.name.clone(),
            };
            let age = p
                .last_heard_ms
                .map_or(-1.0, |at| now_ms.saturating_sub(at) as f64 / 1_000.0);
            self.last_heard.get_or_create(&label).set(age);
            self.lag.get_or_create(&label).set(p.lag.as_secs_f64());
            raise(&self.shipped.get_or_create(&label), p.units_shipped);
            raise(&self.received.get_or_create(&label), p.units_received);
            raise(&self.failures.get_or_create(&label), p.failures);
            self.cut_off.get_or_create(&label).set(i64::from(p.cut_off));
            self.foreign
                .get_or_create(&label)
                .set(i64::from(p.foreign.is_some()));
        }
    }
}
