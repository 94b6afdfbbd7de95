//! What a sealed id holds, in bytes: a version, the marker id, the
//! numbers, then the tenant, route and subject each behind its length, and
//! per own rule when its estimate would have refilled, the rules it took
//! nothing from, when the rules kept whole on shard 0 were admitted
//! (0: with the others), then zeros to a multiple of 256 bytes. Binary, so that an
//! id's size is bounded by the request's own bounds whatever its text
//! holds (JSON escaped a control character into six bytes: ids past the
//! size a settle accepts).

use sluice_core::request::{MAX_ROUTE_BYTES, MAX_SUBJECT_BYTES, MAX_TENANT_BYTES};
use sluice_store::Reservation;

use super::Held;

/// The first byte of this layout, for a reservation.
const VERSION: u8 = 3;

/// The first byte of this layout, for an attempt (sealed, so that one kind
/// is never taken for the other).
const ATTEMPT: u8 = 4;

/// Own rules whose refill instants an id carries, at most (more: none is
/// carried, and a give-back takes each estimate to refill from its
/// admission).
const MAX_WHOLE: usize = 255;

/// The longest plain text: the fixed part, the three texts at their
/// bounds and every refill instant.
const MAX_PLAIN: usize = 1
    + 16
    + 5 * 8
    + 2
    + (2 + MAX_TENANT_BYTES)
    + (2 + MAX_ROUTE_BYTES)
    + (1 + 2 + MAX_SUBJECT_BYTES)
    + 8
    + 1
    + 8 * MAX_WHOLE
    + 8
    + 8;

/// The plain text is padded with zeros to a multiple of this: an id's
/// length tells its holder the length of its texts only to within it.
const BLOCK: usize = 256;

/// The longest id this version seals (a 12-byte nonce, the sealed text
/// padded to its block and its 16-byte tag, in unpadded base64), or an
/// earlier version did.
pub const MAX_ID_CHARS: usize = {
    let sealed = (12 + MAX_PLAIN.div_ceil(BLOCK) * BLOCK + 16).div_ceil(3) * 4;
    if sealed > 4 * 1024 { sealed } else { 4 * 1024 }
};

/// `held` as bytes.
pub(super) fn encode(held: &Held) -> Vec<u8> {
    let r = &held.reservation;
    let mut out = Vec::with_capacity(128 + r.route.len());
    out.push(if r.attempt { ATTEMPT } else { VERSION });
    out.extend_from_slice(&r.id);
    for n in [r.estimate, r.held, r.at_ms, r.admitted_ms, held.expires_ms] {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(&r.shard.to_le_bytes());
    text(&mut out, &r.tenant);
    text(&mut out, &r.route);
    match &r.subject {
        Some(subject) => {
            out.push(1);
            text(&mut out, subject);
        }
        None => out.push(0),
    }
    let whole = if r.whole_after_ms.len() <= MAX_WHOLE {
        &r.whole_after_ms[..]
    } else {
        &[]
    };
    out.extend_from_slice(&r.rules_print.to_le_bytes());
    out.push(whole.len() as u8);
    for n in whole {
        out.extend_from_slice(&n.to_le_bytes());
    }
    out.extend_from_slice(&r.untaken.to_le_bytes());
    let first_shard = if r.first_shard_admitted_ms == r.admitted_ms {
        0
    } else {
        r.first_shard_admitted_ms
    };
    out.extend_from_slice(&first_shard.to_le_bytes());
    out.resize(out.len().div_ceil(BLOCK) * BLOCK, 0);
    out
}

fn text(out: &mut Vec<u8>, text: &str) {
    // Each text is within its request bound, far below 2^16.
    let len = u16::try_from(text.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&text.as_bytes()[..usize::from(len)]);
}

/// What [`encode`] wrote, or `None` for anything else.
pub(super) fn decode(bytes: &[u8]) -> Option<Held> {
    let mut at = Reader { bytes, pos: 0 };
    let attempt = match at.take(1)? {
        [VERSION] => false,
        [ATTEMPT] => true,
        _ => return None,
    };
    let id: [u8; 16] = at.take(16)?.try_into().ok()?;
    let mut numbers = [0u64; 5];
    for n in &mut numbers {
        *n = at.u64()?;
    }
    let [estimate, held, at_ms, admitted_ms, expires_ms] = numbers;
    let shard = u16::from_le_bytes(at.take(2)?.try_into().ok()?);
    let tenant = at.text()?;
    let route = at.text()?;
    let subject = match at.take(1)? {
        [0] => None,
        [1] => Some(at.text()?),
        _ => return None,
    };
    let rules_print = at.u64()?;
    let count = usize::from(at.take(1)?[0]);
    let whole_after_ms = (0..count).map(|_| at.u64()).collect::<Option<_>>()?;
    // Absent from ids sealed before they were (zeros in the padding of
    // later ones): nothing untaken, every rule admitted at `admitted_ms`.
    let mut later = || {
        if bytes.len() - at.pos >= 8 {
            at.u64()
        } else {
            Some(0)
        }
    };
    let untaken = later()?;
    let first_shard_admitted_ms = match later()? {
        0 => admitted_ms,
        ms => ms,
    };
    // The padding, zeros.
    let padding = at.take(bytes.len() - at.pos)?;
    padding.iter().all(|&b| b == 0).then_some(Held {
        reservation: Reservation {
            id,
            tenant,
            route,
            subject,
            estimate,
            held,
            at_ms,
            admitted_ms,
            first_shard_admitted_ms,
            shard,
            whole_after_ms,
            rules_print,
            attempt,
            untaken,
        },
        expires_ms,
    })
}

struct Reader<'b> {
    bytes: &'b [u8],
    pos: usize,
}

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> Option<&'b [u8]> {
        let taken = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(taken)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn text(&mut self) -> Option<String> {
        let len = u16::from_le_bytes(self.take(2)?.try_into().ok()?);
        String::from_utf8(self.take(usize::from(len))?.to_vec()).ok()
    }
}
