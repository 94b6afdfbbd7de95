//! Reservations as clients hold them: sealed, and settled on any instance.
//!
//! A reservation (`"reserve": true`) is handed out as an opaque id: what
//! it reserved (tenant, route, subject, estimate, when, and 128 random
//! bits that name its settle marker) sealed with ChaCha20-Poly1305 under a
//! key derived from the pepper, so that every instance of a fleet opens
//! it, nobody can forge or alter one, and it tells its holder nothing
//! (no tenant or route can be read from it). An id that does not open, or
//! whose `reservation_ttl` has passed, is unknown: 404. A settle is
//! bound to its tenant by the seal; it applies once (the store's settle
//! marker), and an identical retry finds it applied.
//!
//! The instance that reserved keeps each reservation until its
//! `reservation_ttl` has passed (at most [`MAX_PENDING`]): then it claims
//! the settle marker as expired, and if no settle had claimed it first the
//! estimate stands, is recorded in the ledger and counted as expired. A
//! killed instance's reservations keep their estimate all the same (it was
//! charged when they were made); only their ledger line is lost with it.

use std::collections::VecDeque;
use std::sync::Mutex;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use serde::{Deserialize, Serialize};
use sluice_core::keys::Keyer;
use sluice_store::Reservation;

/// Reservations an instance keeps for their expiry, at most.
pub const MAX_PENDING: usize = 1_000_000;

/// Seals and opens reservation ids, and keeps this instance's until they
/// expire.
pub struct Reservations {
    cipher: ChaCha20Poly1305,
    ttl_ms: u64,
    /// This instance's reservations, by when they expire (oldest first).
    pending: Mutex<VecDeque<Reservation>>,
}

impl std::fmt::Debug for Reservations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservations")
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

/// What a sealed id holds.
#[derive(Serialize, Deserialize)]
struct Sealed {
    /// The marker id, hex.
    i: String,
    t: String,
    r: String,
    s: Option<String>,
    e: u64,
    a: u64,
}

impl Reservations {
    /// Sealed under a key derived from the pepper (`keyer`, shared by a
    /// fleet), or a random one for a store of this process alone.
    pub fn new(keyer: Option<&Keyer>, ttl_ms: u64) -> Reservations {
        let secret = match keyer {
            Some(keyer) => keyer.derive("reservations v1"),
            None => {
                let mut secret = [0u8; 32];
                getrandom::fill(&mut secret).expect("an entropy source for the reservation key");
                secret
            }
        };
        Reservations {
            cipher: ChaCha20Poly1305::new(Key::from_slice(&secret)),
            ttl_ms,
            pending: Mutex::new(VecDeque::new()),
        }
    }

    /// How long a reservation may be settled.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// The id a client holds for `reservation`.
    pub fn seal(&self, reservation: &Reservation) -> String {
        let sealed = Sealed {
            i: reservation.id.iter().map(|b| format!("{b:02x}")).collect(),
            t: reservation.tenant.clone(),
            r: reservation.route.clone(),
            s: reservation.subject.clone(),
            e: reservation.estimate,
            a: reservation.at_ms,
        };
        let plain = serde_json::to_vec(&sealed).expect("a reservation serialises");
        let mut nonce = [0u8; 12];
        // The marker id's random bits are fresh per reservation (from the
        // entropy source: the key is shared by the fleet, so a nonce must
        // not come from anything one process alone keeps unique).
        nonce.copy_from_slice(&reservation.id[..12]);
        let mut out = nonce.to_vec();
        out.extend(
            self.cipher
                .encrypt(Nonce::from_slice(&nonce), plain.as_slice())
                .expect("encryption of a small message"),
        );
        URL_SAFE_NO_PAD.encode(out)
    }

    /// The reservation `id` names, if it opens and has not expired at
    /// `now_ms`.
    pub fn open(&self, id: &str, now_ms: u64) -> Option<Reservation> {
        if id.len() > 4 * 1024 {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(id).ok()?;
        let (nonce, sealed) = bytes.split_at_checked(12)?;
        let plain = self.cipher.decrypt(Nonce::from_slice(nonce), sealed).ok()?;
        let sealed: Sealed = serde_json::from_slice(&plain).ok()?;
        let mut marker = [0u8; 16];
        for (i, byte) in marker.iter_mut().enumerate() {
            *byte = u8::from_str_radix(sealed.i.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        let reservation = Reservation {
            id: marker,
            tenant: sealed.t,
            route: sealed.r,
            subject: sealed.s,
            estimate: sealed.e,
            at_ms: sealed.a,
        };
        (now_ms < reservation.at_ms.saturating_add(self.ttl_ms)).then_some(reservation)
    }

    /// How long a settle marker must be kept from `now_ms`: until the
    /// reservation can no longer be settled, and a minute more for clocks
    /// that differ between instances.
    pub fn marker_ttl_ms(&self, reservation: &Reservation, now_ms: u64) -> u64 {
        (reservation.at_ms + self.ttl_ms).saturating_sub(now_ms) + 60_000
    }

    /// Keeps `reservation` until it expires (unless [`MAX_PENDING`] are
    /// kept already: then its expiry goes uncounted).
    pub fn track(&self, reservation: Reservation) {
        let mut pending = self.pending.lock().expect("pending reservations");
        if pending.len() < MAX_PENDING {
            pending.push_back(reservation);
        }
    }

    /// The reservations kept whose time is up at `now_ms`, taken out.
    pub fn due(&self, now_ms: u64) -> Vec<Reservation> {
        let mut pending = self.pending.lock().expect("pending reservations");
        let mut due = Vec::new();
        while pending
            .front()
            .is_some_and(|r| r.at_ms.saturating_add(self.ttl_ms) <= now_ms)
        {
            due.extend(pending.pop_front());
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reservation(at_ms: u64) -> Reservation {
        Reservation {
            id: [7; 16],
            tenant: "acme".into(),
            route: "POST /v1/chat".into(),
            subject: Some("alice".into()),
            estimate: 600,
            at_ms,
        }
    }

    #[test]
    fn an_id_opens_until_it_expires_and_reads_as_nothing() {
        let reservations = Reservations::new(None, 300_000);
        let id = reservations.seal(&reservation(1_000));
        assert!(!id.contains("acme") && !id.contains("alice"));
        assert_eq!(reservations.open(&id, 1_000), Some(reservation(1_000)));
        assert_eq!(reservations.open(&id, 300_999), Some(reservation(1_000)));
        assert_eq!(reservations.open(&id, 301_000), None, "expired");
    }

    #[test]
    fn a_forged_or_altered_or_foreign_id_does_not_open() {
        let reservations = Reservations::new(None, 300_000);
        let id = reservations.seal(&reservation(1_000));
        let mut altered = id.clone().into_bytes();
        let last = altered.len() - 3;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            reservations.open(&String::from_utf8(altered).unwrap(), 1_000),
            None
        );
        assert_eq!(reservations.open("not-a-reservation", 1_000), None);
        assert_eq!(reservations.open("", 1_000), None);
        // Another fleet's (another key's) ids are unknown here.
        let other = Reservations::new(None, 300_000);
        assert_eq!(other.open(&id, 1_000), None);
    }

    #[test]
    fn reservations_come_due_in_order() {
        let reservations = Reservations::new(None, 1_000);
        reservations.track(reservation(0));
        reservations.track(reservation(500));
        assert!(reservations.due(999).is_empty());
        assert_eq!(reservations.due(1_000).len(), 1);
        assert_eq!(reservations.due(2_000).len(), 1);
        assert!(reservations.due(9_000).is_empty());
    }
}
