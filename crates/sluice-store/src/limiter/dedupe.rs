//! Where a duplicate guard counts: per tenant, subject and fingerprint.
//!
//! A route's `dedupe` rule is a window of one admission. Its bucket is
//! named by the request's subject and fingerprint together (without a
//! fingerprint: one admission per window per subject, the classic
//! "prevent duplicate"), so the rule itself needs nothing new from the
//! stores: it is decided with every other rule of the request, all or
//! nothing, so a duplicate consumes no budget and a request another rule
//! denies leaves no fingerprint behind.

/// Where a duplicate guard counts for `subject` and `fingerprint`: a
/// subject partition of this text (for `Limiter::decide` and `Keyed`
/// alike).
pub(super) fn partition_text(subject: Option<&str>, fingerprint: Option<&str>) -> String {
    // Lengths first, so that no (subject, fingerprint) pair can be spelled
    // like another.
    let subject = subject.unwrap_or("");
    let fingerprint = fingerprint.unwrap_or("");
    format!(
        "{}:{subject}{}:{fingerprint}",
        subject.len(),
        fingerprint.len()
    )
}
