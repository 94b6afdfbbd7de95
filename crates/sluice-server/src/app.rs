//! What every request handler shares.

use std::sync::Arc;

use sluice_core::config::ForwardAuthConfig;
use sluice_store::Limiter;

use crate::backend::Backend;

/// Shared state of a running service.
#[derive(Debug)]
pub struct App {
    /// Policy + store.
    pub limiter: Limiter<Backend>,
    /// Header names `/v1/forward-auth` reads.
    pub forward_auth: ForwardAuthConfig,
}

impl App {
    /// Wraps a limiter for the handlers.
    pub fn new(limiter: Limiter<Backend>, forward_auth: ForwardAuthConfig) -> Arc<App> {
        Arc::new(App {
            limiter,
            forward_auth,
        })
    }
}
