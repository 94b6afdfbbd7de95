//! The Envoy Rate Limit Service, by concern (the helpers are `envoy_rls.rs`'s).

mod zero_limits;
