//! The `tracing:` section: where spans go, which are sampled, what they
//! tell. Each value goes through the parser its `OTEL_*` variable uses
//! (`config/tracing.rs`).

use super::Validator;
use crate::config::Backend;
use crate::config::raw::RawTracing;
use crate::config::tracing::{
    self as otlp, MAX_QUEUE, MAX_TIMEOUT_MS, MIN_TIMEOUT_MS, OtlpProtocol, SamplerKind,
    TraceAttributes, TracingConfig,
};

impl Validator<'_> {
    pub(super) fn tracing(&mut self, raw: RawTracing, backend: &Backend) -> TracingConfig {
        let protocol = raw
            .protocol
            .and_then(|p| self.checked(&p, "tracing.protocol", OtlpProtocol::parse));
        let endpoint = raw.endpoint.and_then(|e| {
            self.checked(&e, "tracing.endpoint", |t| {
                match protocol {
                    Some(protocol) => otlp::check_endpoint_for(t, protocol),
                    // The protocol may come from a variable: checked then.
                    None => otlp::check_endpoint(t),
                }
                .map(|()| t.to_owned())
            })
        });
        let sampler = raw
            .sampler
            .and_then(|s| self.checked(&s, "tracing.sampler", SamplerKind::parse));
        let attributes = raw
            .attributes
            .and_then(|a| {
                self.checked(&a, "tracing.attributes", |text| {
                    match TraceAttributes::parse(text)? {
                        TraceAttributes::Derived if *backend == Backend::Memory => Err(
                            "`derived` needs a Redis backend's pepper (keys.pepper_env or keys.pepper_file): the memory store has none".to_owned(),
                        ),
                        attributes => Ok(attributes),
                    }
                })
            })
            .unwrap_or_default();
        let ratio = raw.ratio.and_then(|r| match otlp::check_ratio(r.value) {
            Ok(ratio) => Some(ratio),
            Err(e) => {
                self.push(r.referenced, format!("`tracing.ratio` {e}"));
                None
            }
        });
        let service_name = raw.service_name.and_then(|n| {
            self.checked(&n, "tracing.service_name", |t| {
                if t.trim().is_empty() {
                    Err("must not be empty".to_owned())
                } else {
                    Ok(t.to_owned())
                }
            })
        });
        let queue = raw
            .queue
            .as_ref()
            .map(|q| self.integer_in(Some(q), "tracing.queue", otlp::DEFAULT_QUEUE, 1..=MAX_QUEUE));
        let timeout_ms = raw.timeout.as_ref().map(|t| {
            self.duration_in(
                Some(t),
                "tracing.timeout",
                otlp::DEFAULT_TIMEOUT_MS,
                MIN_TIMEOUT_MS..=MAX_TIMEOUT_MS,
            )
        });
        TracingConfig {
            endpoint,
            protocol,
            headers: raw
                .headers
                .map(|h| self.pairs(h, "tracing.headers", otlp::check_header)),
            sampler,
            ratio,
            service_name,
            resource: raw
                .resource
                .map(|r| self.pairs(r, "tracing.resource", |key, _| otlp::check_key(key))),
            queue,
            timeout_ms,
            attributes,
        }
    }
}
