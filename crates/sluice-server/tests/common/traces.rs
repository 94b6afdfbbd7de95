//! What the trace tests share: the caller's W3C context, and reading the
//! spans a receiver got.

use sluice_testkit::ReceivedSpan;

/// A W3C `traceparent` of a fresh trace, sampled or not: (header, trace
/// id, the caller's span id).
pub fn traceparent(n: u32, sampled: bool) -> (String, String, String) {
    let trace = format!(
        "{:032x}",
        0x7ace_0000_0000_0000_0000_0000_0000_0000u128 + u128::from(n)
    );
    let parent = format!("{:016x}", 0x00f0_0000_0000_0000u64 + u64::from(n));
    let flags = if sampled { "01" } else { "00" };
    (format!("00-{trace}-{parent}-{flags}"), trace, parent)
}

/// The spans of `trace`.
pub fn of_trace<'s>(spans: &'s [ReceivedSpan], trace: &str) -> Vec<&'s ReceivedSpan> {
    spans.iter().filter(|s| s.trace_id == trace).collect()
}

/// Those of `spans` named `name`.
pub fn named<'s>(spans: &[&'s ReceivedSpan], name: &str) -> Vec<&'s ReceivedSpan> {
    spans.iter().copied().filter(|s| s.name == name).collect()
}

/// Asserts that no span's name, attribute or resource holds any of
/// `texts`.
pub fn none_holds(spans: &[ReceivedSpan], texts: &[&str]) {
    for span in spans {
        let held = std::iter::once(&span.name)
            .chain(span.attributes.keys())
            .chain(span.attributes.values())
            .chain(span.resource.values());
        for text in held {
            for secret in texts {
                assert!(!text.contains(secret), "{secret:?} in {span:#?}");
            }
        }
    }
}
