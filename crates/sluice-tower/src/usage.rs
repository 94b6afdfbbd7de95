//! Usage known once the response is: what a request cost (LLM tokens,
//! query cost, bytes) read from its response, and rules that count only
//! some outcomes (`count_if`).
//!
//! With a [`Usage`] ([`RateLimitLayer::with_usage`](crate::RateLimitLayer::with_usage)),
//! the layer admits a request on its estimate (its [`Keys::cost`]) as a
//! reservation, reads the actual cost from the response's head, and
//! settles the reservation at that cost when the response body ends, fails
//! or is dropped: the difference is given back, or the excess taken even
//! past the limit (the tenant then owes, and waits). A response that says
//! nothing keeps the estimate. A request whose inner service fails, or
//! whose call is abandoned before it answers, keeps its estimate too.
//!
//! On a route with `count_if` rules the request is held there as an
//! attempt, as any rule holds it, so that no more requests than the limit
//! run at once; once the response's status is known the rules whose
//! statuses match keep it and the others are given it back. A call that
//! fails, or is abandoned, before its response is known gives it back.

use std::sync::Arc;

use http::HeaderName;
use http::response::Parts;
use sluice_store::{Limiter, Reservation, Store};

/// How long a settle marker is kept: a settle made in process is made
/// once, so this only has to outlive it.
const MARKER_TTL_MS: u64 = 60_000;

/// Reads a request's cost from its response's head.
type CostOf = dyn Fn(&Parts) -> Option<u64> + Send + Sync;

/// How a response says what its request cost.
#[derive(Clone)]
pub struct Usage {
    cost: Arc<CostOf>,
}

impl std::fmt::Debug for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Usage")
    }
}

impl Usage {
    /// The cost is the response header `name`, a whole number (the inner
    /// service sets it, e.g. `x-usage-tokens`); a response without it, or
    /// with anything else there, keeps the estimate.
    pub fn header(name: HeaderName) -> Usage {
        Usage::from_response(move |parts| {
            parts.headers.get(&name)?.to_str().ok()?.trim().parse().ok()
        })
    }

    /// The cost is what `cost` reads of the response's head (`None`: the
    /// estimate stands).
    pub fn from_response(cost: impl Fn(&Parts) -> Option<u64> + Send + Sync + 'static) -> Usage {
        Usage {
            cost: Arc::new(cost),
        }
    }
}

/// What an admitted request still owes the limiter once its response is
/// known: its reservation's settle, its attempt's conclusion.
pub(crate) struct Pending<S: Store + 'static> {
    limiter: Arc<Limiter<S>>,
    reservation: Option<Reservation>,
    attempt: Option<Attempt<S>>,
}

impl<S: Store + 'static> Pending<S> {
    pub(crate) fn new(
        limiter: Arc<Limiter<S>>,
        reservation: Option<Reservation>,
        attempt: Option<Reservation>,
    ) -> Pending<S> {
        Pending {
            attempt: attempt.map(|held| Attempt {
                limiter: limiter.clone(),
                held: Some(held),
            }),
            limiter,
            reservation,
        }
    }

    /// The response's head is known: the attempt is concluded now with
    /// its `status` (an HTTP status; `None`: not known, given back), before
    /// the response goes out (so that a client's next request finds its
    /// place free); the reservation is settled at what it cost (read by
    /// `usage`, else the estimate) by the [`Settlement`] the body holds.
    pub(crate) async fn respond(
        self,
        parts: &Parts,
        status: Option<u16>,
        usage: Option<&Usage>,
    ) -> Option<Settlement> {
        let Pending {
            limiter,
            reservation,
            attempt,
        } = self;
        if let Some(attempt) = attempt {
            attempt.conclude(status).await;
        }
        let actual = usage.and_then(|u| (u.cost)(parts));
        let runtime = tokio::runtime::Handle::try_current().ok();
        let reservation = reservation?;
        let actual = actual.unwrap_or(reservation.estimate);
        let settle = move || {
            let Some(runtime) = runtime else {
                tracing::warn!("no runtime to settle a reservation; it keeps its estimate");
                return;
            };
            runtime.spawn(async move {
                let policy = limiter.policy();
                if let Err(e) = limiter
                    .settle(&policy, &reservation, actual, MARKER_TTL_MS)
                    .await
                {
                    tracing::warn!(error = %e, "a reservation could not be settled; it keeps its estimate");
                }
            });
        };
        Some(Settlement {
            settle: Some(Box::new(settle)),
        })
    }
}

/// An attempt held on the rules that count by outcome: concluded with the
/// response's status, or given back when dropped before (the call failed
/// or was abandoned).
struct Attempt<S: Store + 'static> {
    limiter: Arc<Limiter<S>>,
    held: Option<Reservation>,
}

impl<S: Store + 'static> Attempt<S> {
    /// Concludes it with `status` (`None`: given back). Cut short, it is
    /// given back when dropped (a conclusion that had applied stands: it
    /// applies once); failed, it is tried again in the background.
    async fn conclude(mut self, status: Option<u16>) {
        let Some(held) = &self.held else {
            return;
        };
        let policy = self.limiter.policy();
        let concluded = self
            .limiter
            .conclude_attempt(&policy, held, status, MARKER_TTL_MS)
            .await;
        if concluded.is_ok() {
            self.held = None;
            return;
        }
        let Some(held) = self.held.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(retried(self.limiter.clone(), held, status));
        }
    }

    /// Gives it back on a task of its own.
    fn give_back(mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no runtime to conclude an attempt; it keeps counting");
            return;
        };
        runtime.spawn(retried(self.limiter.clone(), held, None));
    }
}

/// How long a conclusion the store refused is tried again, once a second:
/// the server's `attempt_ttl` by default.
const RETRY_FOR_MS: u64 = 30_000;

/// Concludes `held` with `status`, trying again once a second while the
/// store fails, for [`RETRY_FOR_MS`] (it applies once, so a try whose
/// answer was lost is safe to repeat); then it keeps counting until its
/// rules refill.
async fn retried<S: Store + 'static>(
    limiter: Arc<Limiter<S>>,
    held: Reservation,
    status: Option<u16>,
) {
    let tries = RETRY_FOR_MS / 1_000 + 1;
    for n in 0..tries {
        if n > 0 {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        let policy = limiter.policy();
        match limiter
            .conclude_attempt(&policy, &held, status, MARKER_TTL_MS)
            .await
        {
            Ok(_) => return,
            Err(e) if n + 1 == tries => {
                tracing::warn!(error = %e, "an attempt could not be concluded; it keeps counting until its rules refill");
            }
            Err(_) => {}
        }
    }
}

impl<S: Store + 'static> Drop for Attempt<S> {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            Attempt {
                limiter: self.limiter.clone(),
                held: Some(held),
            }
            .give_back();
        }
    }
}

/// A reservation to settle at a known cost; settled when dropped (the
/// response body ended, failed, or was dropped).
pub struct Settlement {
    settle: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Settlement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settlement")
            .field("pending", &self.settle.is_some())
            .finish()
    }
}

impl Drop for Settlement {
    fn drop(&mut self) {
        if let Some(settle) = self.settle.take() {
            settle();
        }
    }
}
