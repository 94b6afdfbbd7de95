//! A `RateLimitRequest` read in place: its strings borrowed from the
//! message's bytes. prost's generated type allocates a `String` per string
//! and a `Vec` per repeated field, then frees them all: about 3.5 thousand
//! instructions of a `ShouldRateLimit` with one descriptor of two entries,
//! counted under callgrind (docs/BENCHMARKS.md, "Service CPU per
//! decision").
//!
//! It reads what prost reads and refuses what prost refuses (a
//! differential test holds the two equal): fields in any order, unknown
//! fields skipped, a repeated message appended per occurrence, a singular
//! message merged into an earlier occurrence, the last occurrence of a
//! scalar or string kept, strings UTF-8. The wire primitives (keys,
//! varints, skipping a field) are prost's own, the ones its generated code
//! calls.
//!
//! What it holds is bounded whatever the message's size: past
//! [`MAX_DESCRIPTORS`] descriptors, or [`MAX_ENTRIES`] entries in one, the
//! rest are read and counted but not kept (the request is refused for
//! them). Unbounded, an empty descriptor (2 bytes on the wire, 64 held)
//! would let a message of `server.limits.grpc_max_message_bytes` hold 32
//! times its size.

use std::fmt;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::DecodeError;
use prost::encoding::{DecodeContext, WireType, check_wire_type, decode_key, decode_varint};

// Bounds well above what Envoy sends (a descriptor per `rate_limits`
// action list, an entry per action); the message itself is bounded by
// `server.limits.grpc_max_message_bytes`.
/// Most descriptors in one request.
pub const MAX_DESCRIPTORS: usize = 256;
/// Most entries in one descriptor.
pub const MAX_ENTRIES: usize = 64;

/// The fields of a `RateLimitRequest` sluice reads.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RequestView<'m> {
    /// `domain`.
    pub domain: &'m str,
    /// `descriptors`: the first `MAX_DESCRIPTORS + 1` of them.
    pub descriptors: Vec<DescriptorView<'m>>,
    /// How many descriptors the request has.
    pub descriptors_sent: usize,
    /// `hits_addend` (0 when absent).
    pub hits_addend: u32,
}

/// The fields of one `RateLimitDescriptor`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DescriptorView<'m> {
    /// `entries`: key and value, the first `MAX_ENTRIES + 1` of them (so
    /// that one too many shows).
    pub entries: Vec<(&'m str, &'m str)>,
    /// `limit`: `requests_per_unit` and `unit` as sent (the unit unchecked).
    pub limit: Option<(u32, i32)>,
    /// `hits_addend.value`, when `hits_addend` is present.
    pub hits_addend: Option<u64>,
    /// `is_negative_hits`.
    pub is_negative_hits: bool,
}

impl<'m> RequestView<'m> {
    /// The view of a request prost decoded (or a caller built).
    pub fn of(request: &'m RateLimitRequest) -> RequestView<'m> {
        RequestView {
            domain: &request.domain,
            descriptors: request
                .descriptors
                .iter()
                .map(|d| DescriptorView {
                    entries: d
                        .entries
                        .iter()
                        .map(|e| (e.key.as_str(), e.value.as_str()))
                        .collect(),
                    limit: d.limit.as_ref().map(|l| (l.requests_per_unit, l.unit)),
                    hits_addend: d.hits_addend.map(|h| h.value),
                    is_negative_hits: d.is_negative_hits,
                })
                .collect(),
            descriptors_sent: request.descriptors.len(),
            hits_addend: request.hits_addend,
        }
    }

    /// Reads an encoded `RateLimitRequest`.
    pub fn decode(mut message: &'m [u8]) -> Result<RequestView<'m>, ReadError> {
        let mut view = RequestView::default();
        while !message.is_empty() {
            let (tag, wire) = decode_key(&mut message)?;
            match tag {
                1 => view.domain = string(wire, &mut message)?,
                2 => {
                    let descriptor = DescriptorView::decode(nested(wire, &mut message)?)?;
                    view.descriptors_sent += 1;
                    if view.descriptors.len() <= MAX_DESCRIPTORS {
                        view.descriptors.push(descriptor);
                    }
                }
                3 => view.hits_addend = varint(wire, &mut message)? as u32,
                _ => skip(wire, tag, &mut message)?,
            }
        }
        Ok(view)
    }
}

impl<'m> DescriptorView<'m> {
    fn decode(mut message: &'m [u8]) -> Result<DescriptorView<'m>, ReadError> {
        let mut view = DescriptorView::default();
        while !message.is_empty() {
            let (tag, wire) = decode_key(&mut message)?;
            match tag {
                1 => {
                    let mut entry = nested(wire, &mut message)?;
                    let (mut key, mut value) = ("", "");
                    while !entry.is_empty() {
                        let (tag, wire) = decode_key(&mut entry)?;
                        match tag {
                            1 => key = string(wire, &mut entry)?,
                            2 => value = string(wire, &mut entry)?,
                            _ => skip(wire, tag, &mut entry)?,
                        }
                    }
                    if view.entries.len() <= MAX_ENTRIES {
                        view.entries.push((key, value));
                    }
                }
                2 => {
                    // A second occurrence merges into the first.
                    let mut limit = nested(wire, &mut message)?;
                    let (mut per_unit, mut unit) = view.limit.unwrap_or_default();
                    while !limit.is_empty() {
                        let (tag, wire) = decode_key(&mut limit)?;
                        match tag {
                            1 => per_unit = varint(wire, &mut limit)? as u32,
                            2 => unit = varint(wire, &mut limit)? as i32,
                            _ => skip(wire, tag, &mut limit)?,
                        }
                    }
                    view.limit = Some((per_unit, unit));
                }
                3 => {
                    let mut hits = nested(wire, &mut message)?;
                    let mut value = view.hits_addend.unwrap_or_default();
                    while !hits.is_empty() {
                        let (tag, wire) = decode_key(&mut hits)?;
                        match tag {
                            1 => value = varint(wire, &mut hits)?,
                            _ => skip(wire, tag, &mut hits)?,
                        }
                    }
                    view.hits_addend = Some(value);
                }
                4 => view.is_negative_hits = varint(wire, &mut message)? != 0,
                _ => skip(wire, tag, &mut message)?,
            }
        }
        Ok(view)
    }
}

/// Why a message could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// What prost's primitives refused (a key, a varint, a wire type).
    Wire(DecodeError),
    /// A field says it is longer than what is left of its message.
    Truncated,
    /// A string is not UTF-8.
    NotUtf8,
}

impl From<DecodeError> for ReadError {
    fn from(error: DecodeError) -> ReadError {
        ReadError::Wire(error)
    }
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Wire(error) => error.fmt(f),
            ReadError::Truncated => f.write_str("a field is longer than its message"),
            ReadError::NotUtf8 => f.write_str("a string is not UTF-8"),
        }
    }
}

impl std::error::Error for ReadError {}

fn varint(wire: WireType, message: &mut &[u8]) -> Result<u64, ReadError> {
    check_wire_type(WireType::Varint, wire)?;
    Ok(decode_varint(message)?)
}

/// A length-delimited field's bytes, taken off the front of `message`.
fn nested<'m>(wire: WireType, message: &mut &'m [u8]) -> Result<&'m [u8], ReadError> {
    check_wire_type(WireType::LengthDelimited, wire)?;
    let length = decode_varint(message)?;
    let length = usize::try_from(length)
        .ok()
        .filter(|&n| n <= message.len())
        .ok_or(ReadError::Truncated)?;
    let (field, rest) = message.split_at(length);
    *message = rest;
    Ok(field)
}

fn string<'m>(wire: WireType, message: &mut &'m [u8]) -> Result<&'m str, ReadError> {
    std::str::from_utf8(nested(wire, message)?).map_err(|_| ReadError::NotUtf8)
}

/// Skips an unknown field. Groups inside it may nest 100 deep wherever it
/// is, where prost counts the levels of the message above it too.
fn skip(wire: WireType, tag: u32, message: &mut &[u8]) -> Result<(), ReadError> {
    Ok(prost::encoding::skip_field(
        wire,
        tag,
        message,
        DecodeContext::default(),
    )?)
}

#[cfg(test)]
mod tests;
