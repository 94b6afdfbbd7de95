//! Where a duplicate guard counts: per tenant, subject and fingerprint.
//!
//! A route's `dedupe` rule is a window of one admission. Its bucket is
//! named by the request's subject and fingerprint together (without a
//! fingerprint: one admission per window per subject, the classic
//! "prevent duplicate"), so the rule itself needs nothing new from the
//! stores: it is decided with every other rule of the request, all or
//! nothing, so a duplicate consumes no budget and a request another rule
//! denies leaves no fingerprint behind.

use sluice_core::{Request, Scope};
use smallvec::SmallVec;

use crate::store::{Batch, Partition};

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

/// The partition text of a request's duplicate guards, when its rules
/// hold one.
pub(super) struct Guarded(Option<String>);

impl Guarded {
    #[inline]
    pub(super) fn of(batch: &Batch<'_>, request: &Request<'_>) -> Guarded {
        let guarded = batch.rules.iter().any(|r| r.scope() == Scope::Dedupe);
        Guarded(guarded.then(|| partition_text(request.subject, request.fingerprint)))
    }

    /// Whether the request's rules hold a duplicate guard.
    pub(super) fn any(&self) -> bool {
        self.0.is_some()
    }

    /// Per rule, where it counts: the guard in the request's (subject,
    /// fingerprint), the others as their scope says. Empty (every rule by
    /// scope) when there is no guard.
    pub(super) fn partitions<'a>(&'a self, batch: &Batch<'a>) -> SmallVec<[Partition<'a>; 4]> {
        let Some(text) = &self.0 else {
            return SmallVec::new();
        };
        batch
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                if rule.scope() == Scope::Dedupe {
                    Partition::Subject(batch.tenant, text)
                } else {
                    batch.partition(i, rule)
                }
            })
            .collect()
    }
}
