//! Reading a `ShouldRateLimit` request: its descriptors, bounded, with
//! what each consumes and its `limit` override.

use sluice_core::config::envoy::Unit;
use sluice_core::request::MAX_REPORTED_COST;
use tonic::Status;

use super::units::unit_of_proto;
use crate::grpc::request::{DescriptorView, MAX_DESCRIPTORS, MAX_ENTRIES, RequestView};

/// Longest entry key or value, in bytes (the other bounds of a request,
/// `MAX_DESCRIPTORS` and `MAX_ENTRIES`, are where it is read).
const MAX_ENTRY_BYTES: usize = 16 * 1024;

/// One request descriptor, read and bounded.
pub(super) struct Descriptor<'r> {
    pub(super) entries: Vec<(&'r str, &'r str)>,
    /// Units it consumes (`hits_addend` of the descriptor, else of the
    /// request); 0 counts nothing.
    pub(super) cost: u64,
    /// A `limit` override from Envoy's route configuration.
    pub(super) limit_override: Option<(u32, Unit)>,
}

pub(super) fn read_request(request: RequestView<'_>) -> Result<(u64, Vec<Descriptor<'_>>), Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument("`domain` must not be empty"));
    }
    if request.descriptors_sent == 0 || request.descriptors_sent > MAX_DESCRIPTORS {
        return Err(Status::invalid_argument(format!(
            "`descriptors` must hold 1 to {MAX_DESCRIPTORS} descriptors, got {}",
            request.descriptors_sent
        )));
    }
    // A `uint32`: every value is taken (a quota's usage can be large).
    let hits = match request.hits_addend {
        0 => 1,
        n => u64::from(n),
    };
    let descriptors = request
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| read_descriptor(i, d, hits))
        .collect::<Result<_, _>>()?;
    Ok((hits, descriptors))
}

fn read_descriptor(
    index: usize,
    d: DescriptorView<'_>,
    hits: u64,
) -> Result<Descriptor<'_>, Status> {
    // An empty descriptor matches no limit (OK), as envoyproxy/ratelimit answers it.
    if d.entries.len() > MAX_ENTRIES {
        return Err(Status::invalid_argument(format!(
            "`descriptors[{index}].entries` must hold at most {MAX_ENTRIES} entries"
        )));
    }
    if d.is_negative_hits {
        return Err(Status::invalid_argument(format!(
            "`descriptors[{index}].is_negative_hits` is not supported"
        )));
    }
    // An empty key is taken, as envoyproxy/ratelimit takes it: no configured key is
    // empty, so it matches nothing.
    for (key, value) in &d.entries {
        if key.len() > MAX_ENTRY_BYTES || value.len() > MAX_ENTRY_BYTES {
            return Err(Status::invalid_argument(format!(
                "`descriptors[{index}].entries`: keys and values must be at most {MAX_ENTRY_BYTES} bytes"
            )));
        }
    }
    let cost = match d.hits_addend {
        None => hits,
        Some(value) if value <= MAX_REPORTED_COST => value,
        Some(value) => {
            return Err(Status::invalid_argument(format!(
                "`descriptors[{index}].hits_addend` must be at most {MAX_REPORTED_COST}, got {value}"
            )));
        }
    };
    let limit_override = match d.limit {
        None => None,
        Some((requests_per_unit, unit)) => match unit_of_proto(unit) {
            Some(unit) => Some((requests_per_unit, unit)),
            None => {
                return Err(Status::invalid_argument(format!(
                    "`descriptors[{index}].limit.unit` must be a known unit"
                )));
            }
        },
    };
    Ok(Descriptor {
        entries: d.entries,
        cost,
        limit_override,
    })
}
