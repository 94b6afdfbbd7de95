//! The [`Layer`] that wraps services in [`RateLimit`].

use std::sync::Arc;
use std::time::Duration;

use sluice_store::trace::Disclosure;
use sluice_store::{Limiter, Store};
use tower::Layer;

use crate::service::RateLimit;
use crate::usage::Usage;

/// Decides every request with a [`Limiter`] before the inner service sees
/// it; see [`RateLimit`].
#[derive(Debug)]
pub struct RateLimitLayer<S, E> {
    limiter: Arc<Limiter<S>>,
    extract: E,
    usage: Option<Usage>,
    disclosure: Option<Arc<Disclosure>>,
}

impl<S, E: Clone> Clone for RateLimitLayer<S, E> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: self.limiter.clone(),
            extract: self.extract.clone(),
            usage: self.usage.clone(),
            disclosure: self.disclosure.clone(),
        }
    }
}

/// How often an embedded limiter sweeps (as `storage.sweep_interval`
/// defaults to in the server).
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(10);

impl<S: Store + 'static, E> RateLimitLayer<S, E> {
    /// Limits requests with `limiter`, by the keys `extract` reads. The
    /// limiter is kept healthy from here on ([`Limiter::keep_healthy`]:
    /// idle keys swept, clocks maintained), so an app needs no server.
    pub fn new(limiter: Arc<Limiter<S>>, extract: E) -> RateLimitLayer<S, E> {
        Limiter::keep_healthy(&limiter, SWEEP_EVERY);
        RateLimitLayer {
            limiter,
            extract,
            usage: None,
            disclosure: None,
        }
    }

    /// What each decision's span (`sluice_store::trace`) tells of who
    /// asked: nothing by default; the tenant's tag, or the request's own
    /// text, as `disclosure` says.
    pub fn with_trace_attributes(mut self, disclosure: Disclosure) -> RateLimitLayer<S, E> {
        self.disclosure = Some(Arc::new(disclosure));
        self
    }

    /// Reads what each request cost from its response (a header such as
    /// `x-usage-tokens`, or a closure over the response's head): the
    /// request is admitted on its estimate and settled at that cost when
    /// the response body ends, fails or is dropped (see [`Usage`]).
    pub fn with_usage(mut self, usage: Usage) -> RateLimitLayer<S, E> {
        self.usage = Some(usage);
        self
    }
}

impl<T, S, E: Clone> Layer<T> for RateLimitLayer<S, E> {
    type Service = RateLimit<T, S, E>;

    fn layer(&self, inner: T) -> RateLimit<T, S, E> {
        RateLimit::new(inner, self.limiter.clone(), self.extract.clone())
            .with_usage(self.usage.clone())
            .with_disclosure(self.disclosure.clone())
    }
}
