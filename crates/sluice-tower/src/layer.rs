//! The [`Layer`] that wraps services in [`RateLimit`].

use std::sync::Arc;

use sluice_store::Limiter;
use tower::Layer;

use crate::service::RateLimit;

/// Decides every request with a [`Limiter`] before the inner service sees
/// it; see [`RateLimit`].
#[derive(Debug)]
pub struct RateLimitLayer<S, E> {
    limiter: Arc<Limiter<S>>,
    extract: E,
}

impl<S, E: Clone> Clone for RateLimitLayer<S, E> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            limiter: self.limiter.clone(),
            extract: self.extract.clone(),
        }
    }
}

impl<S, E> RateLimitLayer<S, E> {
    /// Limits requests with `limiter`, by the keys `extract` reads.
    pub fn new(limiter: Arc<Limiter<S>>, extract: E) -> RateLimitLayer<S, E> {
        RateLimitLayer { limiter, extract }
    }
}

impl<T, S, E: Clone> Layer<T> for RateLimitLayer<S, E> {
    type Service = RateLimit<T, S, E>;

    fn layer(&self, inner: T) -> RateLimit<T, S, E> {
        RateLimit::new(inner, self.limiter.clone(), self.extract.clone())
    }
}
