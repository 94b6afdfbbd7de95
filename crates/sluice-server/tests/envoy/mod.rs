//! The Envoy Rate Limit Service, by concern (the helpers are `envoy_rls.rs`'s).

mod sources;
mod zero_limits;
