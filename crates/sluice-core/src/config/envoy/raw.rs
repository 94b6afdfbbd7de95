//! An envoyproxy/ratelimit file as YAML says it, before it is checked.
//!
//! Every key envoyproxy/ratelimit accepts is read at every level, so that none is
//! dropped unseen.

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::scalars::Scalar;
use crate::config::raw::{RawRule, S};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoot {
    pub(super) domain: Option<S<String>>,
    pub(super) descriptors: Option<Vec<S<RawDescriptor>>>,
    // Upstream's keys that have no effect here.
    pub(super) key: Stray,
    pub(super) value: Stray,
    pub(super) rate_limit: Stray,
    pub(super) unit: Stray,
    pub(super) requests_per_unit: Stray,
    pub(super) unlimited: Stray,
    pub(super) name: Stray,
    pub(super) replaces: Stray,
    pub(super) shadow_mode: Stray,
    pub(super) quota_mode: Stray,
    pub(super) detailed_metric: Stray,
    pub(super) value_to_metric: Stray,
    pub(super) share_threshold: Stray,
    pub(super) metadata: Stray,
}

/// One of envoyproxy/ratelimit's keys where it has no effect.
pub(super) type Stray = Option<S<IgnoredAny>>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDescriptor {
    pub(super) key: Option<S<String>>,
    pub(super) value: Option<S<String>>,
    pub(super) rate_limit: Option<S<RawRateLimit>>,
    pub(super) descriptors: Option<Vec<S<RawDescriptor>>>,
    pub(super) shadow_mode: Option<S<Scalar>>,
    pub(super) quota_mode: Option<S<Scalar>>,
    pub(super) detailed_metric: Option<S<Scalar>>,
    pub(super) value_to_metric: Option<S<Scalar>>,
    pub(super) share_threshold: Option<S<Scalar>>,
    /// Passed to Envoy by envoyproxy/ratelimit as response metadata; any
    /// shape, no effect on decisions.
    #[allow(dead_code)]
    pub(super) metadata: Option<IgnoredAny>,
    pub(super) rules: Option<Vec<S<RawRule>>>,
    // Upstream's keys that have no effect here.
    pub(super) domain: Stray,
    pub(super) unit: Stray,
    pub(super) requests_per_unit: Stray,
    pub(super) unlimited: Stray,
    pub(super) name: Stray,
    pub(super) replaces: Stray,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRateLimit {
    pub(super) requests_per_unit: Option<S<Scalar>>,
    pub(super) unit: Option<S<String>>,
    pub(super) unlimited: Option<S<Scalar>>,
    pub(super) name: Option<S<String>>,
    pub(super) replaces: Option<Vec<S<RawReplace>>>,
    pub(super) algorithm: Option<S<String>>,
    pub(super) burst: Option<S<i64>>,
    // Upstream's keys that have no effect here.
    pub(super) domain: Stray,
    pub(super) key: Stray,
    pub(super) value: Stray,
    pub(super) descriptors: Stray,
    pub(super) rate_limit: Stray,
    pub(super) shadow_mode: Stray,
    pub(super) quota_mode: Stray,
    pub(super) detailed_metric: Stray,
    pub(super) value_to_metric: Stray,
    pub(super) share_threshold: Stray,
    pub(super) metadata: Stray,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReplace {
    pub(super) name: Option<S<String>>,
    // Upstream's keys that have no effect here.
    pub(super) domain: Stray,
    pub(super) key: Stray,
    pub(super) value: Stray,
    pub(super) descriptors: Stray,
    pub(super) rate_limit: Stray,
    pub(super) unit: Stray,
    pub(super) requests_per_unit: Stray,
    pub(super) unlimited: Stray,
    pub(super) replaces: Stray,
    pub(super) shadow_mode: Stray,
    pub(super) quota_mode: Stray,
    pub(super) detailed_metric: Stray,
    pub(super) value_to_metric: Stray,
    pub(super) share_threshold: Stray,
    pub(super) metadata: Stray,
}
