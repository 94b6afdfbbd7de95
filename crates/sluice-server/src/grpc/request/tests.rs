//! The view read in place against prost's decoding of the same bytes.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use proptest::prelude::*;
use prost::Message;

use super::{MAX_DESCRIPTORS, MAX_ENTRIES, RequestView};

/// What prost makes of `bytes`, as a view (or that it refuses them), next
/// to what the view reads.
fn both(bytes: &[u8]) -> (Option<RateLimitRequest>, Option<RequestView<'_>>) {
    (
        RateLimitRequest::decode(bytes).ok(),
        RequestView::decode(bytes).ok(),
    )
}

fn assert_same(bytes: &[u8]) {
    let (prost, view) = both(bytes);
    match (&prost, &view) {
        (Some(prost), Some(view)) => assert_eq!(&RequestView::of(prost), view, "{bytes:?}"),
        (None, None) => {}
        _ => panic!(
            "prost {} where the view {} ({bytes:?})",
            if prost.is_some() { "reads" } else { "refuses" },
            if view.is_some() { "reads" } else { "refuses" },
        ),
    }
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z_]{1,12}",
        "\\PC{0,8}", // any printable characters, multi-byte ones too
    ]
}

fn descriptor() -> impl Strategy<Value = RateLimitDescriptor> {
    (
        prop::collection::vec((text(), text()), 0..4),
        prop::option::of((any::<u32>(), -2i32..10)),
        prop::option::of(any::<u64>()),
        any::<bool>(),
    )
        .prop_map(|(entries, limit, hits, negative)| RateLimitDescriptor {
            entries: entries
                .into_iter()
                .map(|(key, value)| Entry { key, value })
                .collect(),
            limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                requests_per_unit,
                unit,
            }),
            hits_addend: hits.map(|value| UInt64Value { value }),
            is_negative_hits: negative,
        })
}

fn request() -> impl Strategy<Value = RateLimitRequest> {
    (
        text(),
        prop::collection::vec(descriptor(), 0..4),
        any::<u32>(),
    )
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
}

proptest! {
    #[test]
    fn reads_what_prost_encoded(request in request()) {
        let bytes = request.encode_to_vec();
        prop_assert_eq!(RequestView::decode(&bytes).unwrap(), RequestView::of(&request));
    }

    /// Two messages one after the other are one message merged from both:
    /// repeated fields appended, singular messages merged field by field,
    /// the last scalar or string kept.
    #[test]
    fn reads_two_messages_as_prost_merges_them(a in request(), b in request()) {
        let mut bytes = a.encode_to_vec();
        b.encode(&mut bytes).unwrap();
        assert_same(&bytes);
    }

    /// A descriptor's `limit` or `hits_addend` sent twice, the second
    /// without some field, keeps the first's value of it.
    #[test]
    fn merges_a_descriptors_messages_sent_twice(a in descriptor(), b in descriptor()) {
        let mut bytes = a.encode_to_vec();
        b.encode(&mut bytes).unwrap();
        let mut request = Vec::new();
        prost::encoding::bytes::encode(2, &bytes, &mut request);
        assert_same(&request);
    }

    /// Any bytes: both read them alike, or both refuse them.
    #[test]
    fn refuses_what_prost_refuses(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        assert_same(&bytes);
    }

    /// A valid message with one byte changed, cut short or extended.
    #[test]
    fn reads_damaged_messages_as_prost_does(
        request in request(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
        tail in prop::collection::vec(any::<u8>(), 0..6),
    ) {
        let bytes = request.encode_to_vec();
        if bytes.is_empty() {
            return Ok(());
        }
        let mut changed = bytes.clone();
        changed[at.index(bytes.len())] = byte;
        assert_same(&changed);
        assert_same(&bytes[..cut.index(bytes.len())]);
        let mut longer = bytes.clone();
        longer.extend_from_slice(&tail);
        assert_same(&longer);
    }
}

#[test]
fn unknown_fields_of_every_wire_type_are_skipped() {
    // Field 9 as a varint, a 64-bit, a length-delimited, a group (with a
    // varint inside) and a 32-bit value, then the domain.
    let mut bytes = vec![
        0x48, 0x96, 0x01, // 9: varint 150
        0x49, 1, 2, 3, 4, 5, 6, 7, 8, // 9: 64-bit
        0x4a, 2, b'h', b'i', // 9: 2 bytes
        0x4b, 0x08, 0x01, 0x4c, // 9: group { 1: 1 }
        0x4d, 1, 2, 3, 4, // 9: 32-bit
    ];
    prost::encoding::string::encode(1, &"d".to_owned(), &mut bytes);
    assert_same(&bytes);
    assert_eq!(RequestView::decode(&bytes).unwrap().domain, "d");
}

#[test]
fn a_string_that_is_not_utf8_is_refused() {
    let mut bytes = Vec::new();
    prost::encoding::bytes::encode(1, &vec![0xff, 0xfe], &mut bytes);
    assert_same(&bytes);
    let error = RequestView::decode(&bytes).unwrap_err().to_string();
    assert!(error.contains("UTF-8"), "{error}");
}

#[test]
fn a_field_longer_than_the_message_is_refused() {
    // The domain says 5 bytes; 2 follow.
    assert_same(&[0x0a, 5, b'a', b'b']);
    assert!(RequestView::decode(&[0x0a, 5, b'a', b'b']).is_err());
}

#[test]
fn what_is_held_is_bounded_and_what_is_sent_is_counted() {
    // 10,000 empty descriptors (2 bytes each), then one of 1,000 entries.
    let mut bytes = [0x12, 0].repeat(10_000);
    let entries = RateLimitDescriptor {
        entries: vec![Entry::default(); 1_000],
        ..Default::default()
    };
    prost::encoding::message::encode(2, &entries, &mut bytes);
    let view = RequestView::decode(&bytes).unwrap();
    assert_eq!(view.descriptors_sent, 10_001);
    assert_eq!(view.descriptors.len(), MAX_DESCRIPTORS + 1);

    let mut bytes = Vec::new();
    prost::encoding::message::encode(2, &entries, &mut bytes);
    let view = RequestView::decode(&bytes).unwrap();
    assert_eq!(view.descriptors_sent, 1);
    assert_eq!(view.descriptors[0].entries.len(), MAX_ENTRIES + 1);
    // A message damaged past the bounds is refused still.
    bytes.extend_from_slice(&[0x12, 5, 0]);
    assert_same(&bytes);
    assert!(RequestView::decode(&bytes).is_err());
}
