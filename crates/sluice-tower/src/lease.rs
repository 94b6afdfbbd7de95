//! Leases of concurrency rules, held for as long as a response is.
//!
//! [`RateLimit`](crate::RateLimit) takes a lease before the inner service
//! runs and hands it to the response body: it is given back when the body
//! ends, fails, or is dropped (the client went away), and when the inner
//! service fails or its future is dropped before answering. A lease never
//! given back (the process died) expires after the rule's `lease`. The
//! body holds its request's reservation the same way (see [`crate::usage`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use sluice_core::Decision;
use sluice_store::{Limiter, Store, trace};

use crate::answer::{Fields, InvalidRequest};
use crate::extract::Keys;
use crate::usage::{Pending, Settlement};

/// Why a request does not go on to the inner service.
pub(crate) enum Refusal<R> {
    /// Its keys are not a valid request.
    Invalid(InvalidRequest),
    /// A rule denied it: the answer made of the decision.
    Denied(R),
}

/// What an admitted request holds: the fields to answer with, its lease,
/// and what it still owes once its response is known ([`Pending`]).
pub(crate) struct Admitted<S: Store + 'static> {
    pub(crate) fields: Fields,
    pub(crate) lease: Option<Lease>,
    pub(crate) pending: Pending<S>,
    /// Who hears of the inner service's latency and status: the request's
    /// adaptive valves, when it met any.
    pub(crate) observer: Option<Observer<S>>,
}

/// Tells the adaptive valves a request met how its inner service answered
/// (see [`Limiter::observe`]). Dropped before it was told (the caller gave
/// up on the call), it reports the call as failed after the time it ran:
/// what overload looks like from here.
pub(crate) struct Observer<S: Store + 'static> {
    limiter: Arc<Limiter<S>>,
    keys: Option<Keys>,
    started: std::time::Instant,
}

/// The status an inner service's error, or a call given up on, counts as.
pub(crate) const FAILED: u16 = 503;

impl<S: Store + 'static> Observer<S> {
    /// The inner service answered, `status` when known (an error:
    /// [`FAILED`]): its latency from the call to the response's head.
    pub(crate) async fn answered(mut self, status: Option<u16>) {
        if let Some(keys) = self.keys.take() {
            observe(&self.limiter, &keys, self.started, status).await;
        }
    }
}

impl<S: Store + 'static> Drop for Observer<S> {
    fn drop(&mut self) {
        let Some(keys) = self.keys.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (limiter, started) = (self.limiter.clone(), self.started);
        runtime.spawn(async move { observe(&limiter, &keys, started, Some(FAILED)).await });
    }
}

/// Tells `limiter` the request of `keys` took since `started`, `status`.
async fn observe<S: Store>(
    limiter: &Limiter<S>,
    keys: &Keys,
    started: std::time::Instant,
    status: Option<u16>,
) {
    let latency_ms = started.elapsed().as_secs_f64() * 1_000.0;
    let Ok(request) =
        sluice_core::Request::new(&keys.tenant, &keys.route, keys.subject.as_deref(), 1)
    else {
        return;
    };
    let policy = limiter.policy();
    limiter.observe(&policy, &request, latency_ms, status).await;
}

/// Decides the request of `keys`, taking a lease of its concurrency rules
/// and holding its cost as an estimate to settle (`reserve`), and as an
/// attempt on the rules that count by outcome: what it holds, or why not
/// (a denial answered by `denied`). Its span tells of who asked as
/// `disclosure` says (`None`: nothing).
pub(crate) async fn admit_reserving<S: Store + 'static, R>(
    limiter: Arc<Limiter<S>>,
    keys: Keys,
    reserve: bool,
    disclosure: Option<&trace::Disclosure>,
    denied: impl FnOnce(&Decision<'_>) -> R,
) -> Result<Admitted<S>, Refusal<R>> {
    let asked = sluice_core::Request::new(
        &keys.tenant,
        &keys.route,
        keys.subject.as_deref(),
        keys.cost,
    )
    .and_then(|r| r.with_fingerprint(keys.fingerprint.as_deref()))
    .map_err(|e| Refusal::Invalid(InvalidRequest::from(e)))?;
    let policy = limiter.policy();
    // The same span as the server's decisions, a child of the app's own.
    let span = trace::decision(Some(asked.cost));
    // Awaited in place when untraced: no layer to move through.
    let acquiring = limiter.acquire(&policy, &asked);
    let (decision, lease) = if span.is_disabled() {
        acquiring.await
    } else {
        tracing::Instrument::instrument(acquiring, span.clone()).await
    };
    trace::decided(&span, &decision);
    if let Some(disclosure) = disclosure {
        trace::disclose(&span, disclosure, &asked, decision.class.route());
    }
    if !decision.allowed {
        return Err(Refusal::Denied(denied(&decision)));
    }
    let fields = Fields::of(&decision);
    let reservation = reserve
        .then(|| limiter.reserve(&policy, &asked, &decision))
        .flatten();
    let attempt = limiter.attempt(&policy, &asked, &decision);
    // Held from here: given back if the inner service fails or the call is
    // abandoned, else when the body ends.
    let lease = lease.map(|held| {
        Lease::new(
            limiter.clone(),
            keys.tenant.clone(),
            keys.subject.clone(),
            held,
        )
    });
    let pending = Pending::new(limiter.clone(), reservation, attempt);
    // Timed from here: the inner service is called next.
    let observer = decision
        .rules
        .iter()
        .any(|r| r.adaptive())
        .then(|| Observer {
            limiter: limiter.clone(),
            keys: Some(keys),
            started: std::time::Instant::now(),
        });
    Ok(Admitted {
        fields,
        lease,
        pending,
        observer,
    })
}

/// A lease taken for one request; given back when dropped.
pub struct Lease {
    give_back: Option<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("held", &self.give_back.is_some())
            .finish()
    }
}

impl Lease {
    /// `held`, taken by `limiter` for `tenant` and `subject`: given back
    /// by the rules it holds, whatever the limiter's policy is by then.
    pub(crate) fn new<S: Store + 'static>(
        limiter: Arc<Limiter<S>>,
        tenant: String,
        subject: Option<String>,
        held: sluice_store::limiter::Lease,
    ) -> Lease {
        let give_back = move || {
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                tracing::warn!("no runtime to give a lease back; it expires by itself");
                return;
            };
            runtime.spawn(async move {
                if let Err(e) = limiter.release(&tenant, subject.as_deref(), &held).await {
                    tracing::warn!(error = %e, "a lease could not be given back; it expires by itself");
                }
            });
        };
        Lease {
            give_back: Some(Box::new(give_back)),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(give_back) = self.give_back.take() {
            give_back();
        }
    }
}

pin_project_lite::pin_project! {
    /// A response body holding the lease its request took, if any, until
    /// the body ends, fails or is dropped.
    pub struct LeaseBody<B> {
        #[pin]
        inner: B,
        lease: Option<Lease>,
        settlement: Option<Settlement>,
    }
}

impl<B> LeaseBody<B> {
    /// `inner`, holding `lease`.
    pub(crate) fn new(inner: B, lease: Option<Lease>) -> LeaseBody<B> {
        LeaseBody {
            inner,
            lease,
            settlement: None,
        }
    }

    /// The same body, also holding `settlement` (its request's
    /// reservation, settled when the body ends, fails or is dropped).
    pub(crate) fn settling(mut self, settlement: Option<Settlement>) -> LeaseBody<B> {
        self.settlement = settlement;
        self
    }

    /// The body inside.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: From<Vec<u8>>> From<Vec<u8>> for LeaseBody<B> {
    fn from(bytes: Vec<u8>) -> LeaseBody<B> {
        LeaseBody::new(B::from(bytes), None)
    }
}

impl<B: Body> Body for LeaseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            // The response is over: its slot is free for the next, and
            // what it cost is known.
            this.lease.take();
            this.settlement.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: std::fmt::Debug> std::fmt::Debug for LeaseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseBody")
            .field("inner", &self.inner)
            .field("lease", &self.lease)
            .field("settlement", &self.settlement)
            .finish()
    }
}
