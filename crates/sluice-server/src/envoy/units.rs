//! Envoy's `RateLimit.Unit` and envoyproxy/ratelimit's `unit`, one for
//! the other, and the `current_limit` an answer names.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use sluice_core::config::envoy::Unit;

/// The unit a request's `limit` override names (`None`: unknown).
pub(super) fn unit_of_proto(unit: i32) -> Option<Unit> {
    match ProtoUnit::try_from(unit).ok()? {
        ProtoUnit::Second => Some(Unit::Second),
        ProtoUnit::Minute => Some(Unit::Minute),
        ProtoUnit::Hour => Some(Unit::Hour),
        ProtoUnit::Day => Some(Unit::Day),
        ProtoUnit::Week => Some(Unit::Week),
        ProtoUnit::Month => Some(Unit::Month),
        ProtoUnit::Year => Some(Unit::Year),
        ProtoUnit::Unknown => None,
    }
}

/// A status's `current_limit`: `requests_per_unit` per `unit` (unknown
/// when the period is none of the units), named `name`.
pub(super) fn current_limit(requests_per_unit: u32, unit: Option<Unit>, name: &str) -> RateLimit {
    RateLimit {
        name: name.to_owned(),
        requests_per_unit,
        unit: unit.map_or(ProtoUnit::Unknown, proto_unit) as i32,
    }
}

/// The unit answers name.
fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}
