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
//! The id holds when it expires, by the `reservation_ttl` of the instance
//! that reserved: every instance refuses a settle past that instant, so a
//! fleet whose instances differ in `reservation_ttl` (a rolling restart)
//! agrees on it. The instance that reserved keeps each reservation until
//! then (at most [`MAX_PENDING`]): then it claims
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
use serde::Deserialize;
use sluice_core::keys::Keyer;
use sluice_store::Reservation;

/// Reservations an instance keeps for their expiry, at most.
pub const MAX_PENDING: usize = 1_000_000;

/// Seals and opens reservation ids, and keeps this instance's until they
/// expire.
pub struct Reservations {
    cipher: ChaCha20Poly1305,
    /// The keys of the versions before, whose ids (JSON) still open.
    earlier: Vec<ChaCha20Poly1305>,
    /// Keys of this version's ids under a previous pepper.
    earlier_v3: Vec<ChaCha20Poly1305>,
    ttl_ms: u64,
    /// How long an attempt may be concluded (`attempt_ttl`).
    attempt_ttl_ms: u64,
    /// This instance's reservations, by when they expire (oldest first).
    pending: Mutex<VecDeque<Held>>,
    /// This instance's attempts, by when they expire (oldest first).
    attempts: Mutex<VecDeque<Held>>,
    /// Attempts concluded on this instance, with when they expire: their
    /// expiry needs no store call.
    concluded: Mutex<std::collections::HashMap<[u8; 16], u64>>,
    /// Expiries whose claim failed (the store unreachable), with when to
    /// try again.
    retrying: Mutex<Vec<(Held, u64)>>,
}

/// A reservation with the instant it expires (ms since the epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    /// What it reserved.
    pub reservation: Reservation,
    /// Past this instant it cannot be settled and its estimate stands.
    pub expires_ms: u64,
}

/// How long after a reservation expires its settle marker is kept: a
/// settle that an instance whose clock is up to this far behind accepts
/// still finds the expiry's claim.
pub const CLOCK_SKEW_MS: u64 = 60_000;

/// What this version's key is derived for: the key prefix is part of it.
fn v3_purpose(keyer: &Keyer) -> String {
    format!("reservations v3\0{}", keyer.prefix())
}

/// How long after a failed expiry claim it is tried again.
const RETRY_MS: u64 = 1_000;

impl std::fmt::Debug for Reservations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservations")
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

mod plain;

pub use plain::MAX_ID_CHARS;

/// What a sealed id of an earlier version holds (JSON).
#[derive(Deserialize)]
struct Sealed {
    /// The marker id, hex.
    i: String,
    t: String,
    r: String,
    s: Option<String>,
    e: u64,
    a: u64,
    /// When it expires (absent from ids sealed before it was: the
    /// opening instance's `reservation_ttl` from `a`).
    #[serde(default)]
    x: Option<u64>,
    /// When the store admitted it, on its clock (absent before: `a`).
    #[serde(default)]
    d: Option<u64>,
    /// The tenant's shard that holds it.
    #[serde(default)]
    h: u16,
    /// What the store holds of it (absent before: `e`).
    #[serde(default)]
    k: Option<u64>,
}

impl Reservations {
    /// Sealed under a key derived from the pepper (`keyer`, shared by a
    /// fleet), or a random one for a store of this process alone.
    pub fn new(keyer: Option<&Keyer>, ttl_ms: u64) -> Reservations {
        let cipher = |secret: [u8; 32]| ChaCha20Poly1305::new(Key::from_slice(&secret));
        let (current, earlier) = match keyer {
            // Ids of this version are sealed under a key of their own,
            // which the key prefix is part of (a staging fleet sharing
            // production's pepper cannot settle production's ids): an
            // earlier version cannot open them (it would read them wrong);
            // its ids still open here.
            Some(keyer) => (
                keyer.derive(&v3_purpose(keyer)),
                vec![
                    cipher(keyer.derive("reservations v2")),
                    cipher(keyer.derive("reservations v1")),
                ],
            ),
            None => {
                let mut secret = [0u8; 32];
                getrandom::fill(&mut secret).expect("an entropy source for the reservation key");
                (secret, Vec::new())
            }
        };
        Reservations {
            cipher: cipher(current),
            earlier,
            earlier_v3: Vec::new(),
            ttl_ms,
            attempt_ttl_ms: sluice_core::config::defaults::ATTEMPT_TTL_MS,
            pending: Mutex::new(VecDeque::new()),
            attempts: Mutex::new(VecDeque::new()),
            concluded: Mutex::new(std::collections::HashMap::new()),
            retrying: Mutex::new(Vec::new()),
        }
    }

    /// The same, attempts concluded within `attempt_ttl_ms`.
    pub fn with_attempt_ttl(mut self, attempt_ttl_ms: u64) -> Reservations {
        self.attempt_ttl_ms = attempt_ttl_ms;
        self
    }

    /// The same, also opening the ids sealed under `previous` (the pepper
    /// a rotation moves away from), so that a rotation drops no
    /// reservation given before it.
    pub fn opening_under(mut self, previous: Option<&Keyer>) -> Reservations {
        if let Some(previous) = previous {
            let cipher = |secret: [u8; 32]| ChaCha20Poly1305::new(Key::from_slice(&secret));
            self.earlier_v3
                .push(cipher(previous.derive(&v3_purpose(previous))));
            for version in ["reservations v2", "reservations v1"] {
                self.earlier.push(cipher(previous.derive(version)));
            }
        }
        self
    }

    /// A reservation's id, sealed, once this instance keeps it until it
    /// expires ([`hold`](Self::hold), [`seal`](Self::seal),
    /// [`track`](Self::track)).
    pub fn give(&self, reservation: Reservation) -> String {
        let held = self.hold(reservation);
        let id = self.seal(&held);
        self.track(held);
        id
    }

    /// How long a reservation may be settled.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// `reservation` held until this instance's `reservation_ttl` (an
    /// attempt's: `attempt_ttl`) has passed from when it was made.
    pub fn hold(&self, reservation: Reservation) -> Held {
        let ttl = if reservation.attempt {
            self.attempt_ttl_ms
        } else {
            self.ttl_ms
        };
        Held {
            expires_ms: reservation.at_ms.saturating_add(ttl),
            reservation,
        }
    }

    /// The id a client holds for `held`.
    pub fn seal(&self, held: &Held) -> String {
        let reservation = &held.reservation;
        let plain = plain::encode(held);
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
    pub fn open(&self, id: &str, now_ms: u64) -> Option<Held> {
        if id.len() > MAX_ID_CHARS {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(id).ok()?;
        let (nonce, sealed) = bytes.split_at_checked(12)?;
        let nonce = Nonce::from_slice(nonce);
        let current = std::iter::once(&self.cipher).chain(&self.earlier_v3);
        let held = match current
            .into_iter()
            .find_map(|c| c.decrypt(nonce, sealed).ok())
        {
            Some(plain) => plain::decode(&plain)?,
            None => {
                let plain = self
                    .earlier
                    .iter()
                    .find_map(|earlier| earlier.decrypt(nonce, sealed).ok())?;
                self.opened_json(&plain)?
            }
        };
        (now_ms < held.expires_ms).then_some(held)
    }

    /// An id of an earlier version (JSON).
    fn opened_json(&self, plain: &[u8]) -> Option<Held> {
        let sealed: Sealed = serde_json::from_slice(plain).ok()?;
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
            held: sealed.k.unwrap_or(sealed.e),
            at_ms: sealed.a,
            admitted_ms: sealed.d.unwrap_or(sealed.a),
            first_shard_admitted_ms: sealed.d.unwrap_or(sealed.a),
            shard: sealed.h,
            whole_after_ms: Vec::new(),
            rules_print: 0,
            attempt: false,
            untaken: 0,
        };
        let expires_ms = sealed
            .x
            .unwrap_or_else(|| reservation.at_ms.saturating_add(self.ttl_ms));
        Some(Held {
            reservation,
            expires_ms,
        })
    }

    /// How long a settle marker must be kept from `now_ms`: until the
    /// reservation can no longer be settled, and [`CLOCK_SKEW_MS`] more
    /// for clocks that differ between instances.
    pub fn marker_ttl_ms(held: &Held, now_ms: u64) -> u64 {
        held.expires_ms.saturating_sub(now_ms) + CLOCK_SKEW_MS
    }

    /// Keeps `held` until it expires (unless [`MAX_PENDING`] are kept
    /// already: then its expiry goes uncounted).
    pub fn track(&self, held: Held) {
        let queue = if held.reservation.attempt {
            &self.attempts
        } else {
            &self.pending
        };
        let mut pending = queue.lock().expect("pending reservations");
        if pending.len() < MAX_PENDING {
            pending.push_back(held);
        }
    }

    /// The reservations kept whose time is up at `now_ms`, taken out
    /// (with those whose claim is to be tried again by then).
    pub fn due(&self, now_ms: u64) -> Vec<Held> {
        let mut due = Vec::new();
        for queue in [&self.pending, &self.attempts] {
            let mut pending = queue.lock().expect("pending reservations");
            while pending.front().is_some_and(|h| h.expires_ms <= now_ms) {
                due.extend(pending.pop_front());
            }
        }
        // An attempt concluded here is not due: its conclusion claimed it.
        // What was concluded here but handed out elsewhere is forgotten
        // once it has expired.
        let mut concluded = self.concluded.lock().expect("concluded attempts");
        due.retain(|held| concluded.remove(&held.reservation.id).is_none());
        concluded.retain(|_, expires_ms| *expires_ms > now_ms);
        drop(concluded);
        let mut retrying = self.retrying.lock().expect("retried reservations");
        retrying.retain(|(held, at)| {
            let now = *at <= now_ms;
            if now {
                due.push(held.clone());
            }
            !now
        });
        due
    }

    /// Notes that `held`, an attempt, was concluded on this instance (its
    /// expiry then makes no store call), unless [`MAX_PENDING`] are noted.
    pub fn concluded(&self, held: &Held) {
        let mut concluded = self.concluded.lock().expect("concluded attempts");
        if concluded.len() < MAX_PENDING {
            concluded.insert(held.reservation.id, held.expires_ms);
        }
    }

    /// Tries `held`'s expiry claim again in a second, if a settle could
    /// still be told from it then: its settle marker lives
    /// [`CLOCK_SKEW_MS`] past the expiry, and a claim made after that would
    /// find none and bill a settled reservation again. False when it is
    /// too late (the estimate stands, unrecorded).
    pub fn retry(&self, held: Held, now_ms: u64) -> bool {
        let next = now_ms + RETRY_MS;
        // Half the marker's extra life: room for clocks that differ.
        let late = next > held.expires_ms + CLOCK_SKEW_MS / 2;
        let mut retrying = self.retrying.lock().expect("retried reservations");
        if late || retrying.len() >= MAX_PENDING {
            return false;
        }
        retrying.push((held, next));
        true
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
            held: 600,
            at_ms,
            admitted_ms: at_ms + 3,
            first_shard_admitted_ms: at_ms + 5,
            shard: 2,
            whole_after_ms: vec![1_000, 0, 60_000],
            rules_print: 0x5eed,
            attempt: false,
            untaken: 0b101,
        }
    }

    fn opened(reservations: &Reservations, id: &str, now_ms: u64) -> Option<Reservation> {
        reservations.open(id, now_ms).map(|held| held.reservation)
    }

    #[test]
    fn an_id_opens_until_it_expires_and_reads_as_nothing() {
        let reservations = Reservations::new(None, 300_000);
        let id = reservations.seal(&reservations.hold(reservation(1_000)));
        assert!(!id.contains("acme") && !id.contains("alice"));
        assert_eq!(opened(&reservations, &id, 1_000), Some(reservation(1_000)));
        assert_eq!(
            opened(&reservations, &id, 300_999),
            Some(reservation(1_000))
        );
        assert_eq!(opened(&reservations, &id, 301_000), None, "expired");
    }

    #[test]
    fn an_id_expires_when_the_instance_that_reserved_said_on_every_instance() {
        // A rolling restart: the new instances keep reservations longer.
        let pepper = sluice_core::keys::Pepper::parse(&[7u8; 32]).unwrap();
        let key = Keyer::new("sl", &pepper);
        let short = Reservations::new(Some(&key), 300_000);
        let long = Reservations::new(Some(&key), 600_000);
        let id = short.seal(&short.hold(reservation(1_000)));
        assert_eq!(opened(&long, &id, 300_999), Some(reservation(1_000)));
        assert_eq!(
            opened(&long, &id, 301_000),
            None,
            "expired where it was made"
        );
        // The expiry's claim outlives every instance's last settle.
        let held = long.open(&long.seal(&long.hold(reservation(1_000))), 2_000);
        assert_eq!(
            Reservations::marker_ttl_ms(&held.unwrap(), 2_000),
            599_000 + CLOCK_SKEW_MS
        );
    }

    #[test]
    fn an_earlier_versions_ids_open_here_and_not_the_other_way_round() {
        let pepper = sluice_core::keys::Pepper::parse(&[7u8; 32]).unwrap();
        let key = Keyer::new("sl", &pepper);
        // An instance of the version before: v1 key, none of x, d, h, k.
        let earlier = Reservations {
            cipher: ChaCha20Poly1305::new(Key::from_slice(&key.derive("reservations v1"))),
            earlier: Vec::new(),
            earlier_v3: Vec::new(),
            ttl_ms: 300_000,
            attempt_ttl_ms: 30_000,
            pending: Mutex::new(VecDeque::new()),
            attempts: Mutex::new(VecDeque::new()),
            concluded: Mutex::new(std::collections::HashMap::new()),
            retrying: Mutex::new(Vec::new()),
        };
        let now = Reservations::new(Some(&key), 300_000);
        let id = now.seal(&now.hold(reservation(1_000)));
        assert_eq!(
            opened(&earlier, &id, 1_000),
            None,
            "settled on shard 0 there"
        );
        let plain = serde_json::json!({"i": "07".repeat(16), "t": "acme", "r": "POST /v1/chat", "s": null, "e": 600, "a": 1_000});
        let nonce = [9u8; 12];
        let mut old = nonce.to_vec();
        old.extend(
            earlier
                .cipher
                .encrypt(Nonce::from_slice(&nonce), plain.to_string().as_bytes())
                .unwrap(),
        );
        let opened = now
            .open(&URL_SAFE_NO_PAD.encode(old), 1_000)
            .expect("an earlier id opens");
        let reservation = opened.reservation;
        assert_eq!(
            (reservation.shard, reservation.admitted_ms, reservation.held),
            (0, 1_000, 600)
        );
        assert_eq!(opened.expires_ms, 301_000);
    }

    #[test]
    fn an_id_at_every_bound_opens_and_fits_a_settles_body() {
        use sluice_core::request::{MAX_ROUTE_BYTES, MAX_SUBJECT_BYTES, MAX_TENANT_BYTES};
        let reservations = Reservations::new(None, 300_000);
        // Control characters, quotes and backslashes: what JSON escaped
        // into six bytes each (an id of 4,950 characters no settle took).
        let worst = |n: usize| "\u{1}\"\\".repeat(n / 3 + 1)[..n].to_owned();
        let reservation = Reservation {
            tenant: worst(MAX_TENANT_BYTES),
            route: worst(MAX_ROUTE_BYTES),
            subject: Some(worst(MAX_SUBJECT_BYTES)),
            whole_after_ms: vec![u64::MAX; 255],
            ..reservation(1_000)
        };
        let id = reservations.seal(&reservations.hold(reservation.clone()));
        assert!(id.len() <= MAX_ID_CHARS, "{} characters", id.len());
        let body = serde_json::json!({"reservation": id, "cost": u32::MAX}).to_string();
        assert!(
            body.len() <= crate::http::MAX_BODY_BYTES,
            "a settle of it is {} bytes",
            body.len()
        );
        assert_eq!(opened(&reservations, &id, 1_000), Some(reservation));
    }

    #[test]
    fn an_id_sealed_before_a_pepper_rotation_opens_after_it() {
        let old = sluice_core::keys::Pepper::parse(&[7u8; 32]).unwrap();
        let new = sluice_core::keys::Pepper::parse(&[8u8; 32]).unwrap();
        let before = Reservations::new(Some(&Keyer::new("sl", &old)), 300_000);
        let id = before.seal(&before.hold(reservation(1_000)));
        let after = Reservations::new(Some(&Keyer::new("sl", &new)), 300_000);
        assert_eq!(
            opened(&after, &id, 1_000),
            None,
            "without the previous pepper"
        );
        let rotating = after.opening_under(Some(&Keyer::new("sl", &old)));
        assert_eq!(opened(&rotating, &id, 1_000), Some(reservation(1_000)));
    }

    #[test]
    fn another_key_prefix_does_not_open_an_id() {
        let pepper = sluice_core::keys::Pepper::parse(&[7u8; 32]).unwrap();
        let production = Reservations::new(Some(&Keyer::new("sl", &pepper)), 300_000);
        let staging = Reservations::new(Some(&Keyer::new("staging", &pepper)), 300_000);
        let id = production.seal(&production.hold(reservation(1_000)));
        assert_eq!(opened(&staging, &id, 1_000), None);
        assert_eq!(opened(&production, &id, 1_000), Some(reservation(1_000)));
    }

    #[test]
    fn a_forged_or_altered_or_foreign_id_does_not_open() {
        let reservations = Reservations::new(None, 300_000);
        let id = reservations.seal(&reservations.hold(reservation(1_000)));
        let mut altered = id.clone().into_bytes();
        let last = altered.len() - 3;
        altered[last] = if altered[last] == b'A' { b'B' } else { b'A' };
        assert_eq!(
            opened(&reservations, &String::from_utf8(altered).unwrap(), 1_000),
            None
        );
        assert_eq!(opened(&reservations, "not-a-reservation", 1_000), None);
        assert_eq!(opened(&reservations, "", 1_000), None);
        // Another fleet's (another key's) ids are unknown here.
        let other = Reservations::new(None, 300_000);
        assert_eq!(opened(&other, &id, 1_000), None);
    }

    #[test]
    fn a_failed_expiry_claim_is_tried_again_while_a_settle_can_be_told() {
        let reservations = Reservations::new(None, 1_000);
        let held = reservations.hold(reservation(0));
        assert_eq!(held.expires_ms, 1_000);
        // The store failed at the expiry: tried again a second later.
        assert!(reservations.retry(held.clone(), 1_000));
        assert!(reservations.due(1_999).is_empty());
        assert_eq!(reservations.due(2_000), vec![held.clone()]);
        assert!(reservations.due(3_000).is_empty(), "taken out");
        // Until the settle marker could be gone.
        assert!(reservations.retry(held.clone(), 1_000 + CLOCK_SKEW_MS / 2 - RETRY_MS));
        assert!(!reservations.retry(held, 1_000 + CLOCK_SKEW_MS / 2));
    }

    #[test]
    fn an_attempt_concluded_here_is_not_due() {
        let reservations = Reservations::new(None, 1_000).with_attempt_ttl(500);
        let attempt = |at| Reservation {
            attempt: true,
            ..reservation(at)
        };
        let concluded = reservations.hold(attempt(0));
        assert_eq!(concluded.expires_ms, 500, "attempt_ttl");
        reservations.track(concluded.clone());
        reservations.track(reservations.hold(Reservation {
            id: [8; 16],
            ..attempt(10)
        }));
        reservations.concluded(&concluded);
        // Concluded elsewhere, never handed out here: forgotten once expired.
        reservations.concluded(&reservations.hold(Reservation {
            id: [9; 16],
            ..attempt(0)
        }));
        let due = reservations.due(600);
        assert_eq!(due.len(), 1, "only the one never concluded");
        assert_eq!(due[0].reservation.id, [8; 16]);
        assert!(reservations.concluded.lock().unwrap().is_empty());
    }

    #[test]
    fn reservations_come_due_in_order() {
        let reservations = Reservations::new(None, 1_000);
        reservations.track(reservations.hold(reservation(0)));
        reservations.track(reservations.hold(reservation(500)));
        assert!(reservations.due(999).is_empty());
        assert_eq!(reservations.due(1_000).len(), 1);
        assert_eq!(reservations.due(2_000).len(), 1);
        assert!(reservations.due(9_000).is_empty());
    }
}
