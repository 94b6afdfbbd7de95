//! The `tracing:` section: where spans go, which are sampled, what they
//! tell. Each value goes through the parser its `OTEL_*` variable uses
//! (`config/tracing.rs`).

use std::collections::BTreeMap;

use super::Validator;
use crate::config::raw::{RawTracing, S};
use crate::config::tracing::{
    self, MAX_QUEUE, MAX_TIMEOUT_MS, OtlpProtocol, SamplerKind, TraceAttributes, TracingConfig,
};

impl Validator<'_> {
    pub(super) fn tracing(&mut self, raw: RawTracing) -> TracingConfig {
        let protocol = raw
            .protocol
            .and_then(|p| self.checked(&p, "tracing.protocol", OtlpProtocol::parse));
        let endpoint = raw.endpoint.and_then(|e| {
            self.checked(&e, "tracing.endpoint", |t| {
                tracing::check_endpoint(t)?;
                if protocol == Some(OtlpProtocol::Grpc) && tracing::has_path(t) {
                    return Err(format!(
                        "`{t}`: a path is for http/protobuf only (over gRPC the path is the service's)"
                    ));
                }
                Ok(t.to_owned())
            })
        });
        let sampler = raw
            .sampler
            .and_then(|s| self.checked(&s, "tracing.sampler", SamplerKind::parse));
        let attributes = raw
            .attributes
            .and_then(|a| self.checked(&a, "tracing.attributes", TraceAttributes::parse))
            .unwrap_or_default();
        let ratio = raw.ratio.and_then(|r| match tracing::check_ratio(r.value) {
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
        let queue = raw.queue.as_ref().map(|q| {
            self.integer_in(
                Some(q),
                "tracing.queue",
                tracing::DEFAULT_QUEUE,
                1..=MAX_QUEUE,
            )
        });
        let timeout_ms = raw.timeout.as_ref().map(|t| {
            self.duration_in(
                Some(t),
                "tracing.timeout",
                tracing::DEFAULT_TIMEOUT_MS,
                100..=MAX_TIMEOUT_MS,
            )
        });
        TracingConfig {
            endpoint,
            protocol,
            headers: raw
                .headers
                .map(|h| self.pairs(h, "tracing.headers", tracing::check_header)),
            sampler,
            ratio,
            service_name,
            resource: raw
                .resource
                .map(|r| self.pairs(r, "tracing.resource", |key, _| tracing::check_key(key))),
            queue,
            timeout_ms,
            attributes,
        }
    }

    /// `raw`'s text through `parse`; `None`, with the error pushed, when
    /// it is refused.
    fn checked<T>(
        &mut self,
        raw: &S<String>,
        field: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        match parse(&raw.value) {
            Ok(value) => Some(value),
            Err(e) => {
                self.push(raw.referenced, format!("`{field}` {e}"));
                None
            }
        }
    }

    /// A map of names to text (headers, resource attributes), each pair
    /// checked by `check`.
    fn pairs(
        &mut self,
        raw: BTreeMap<String, S<String>>,
        field: &str,
        check: impl Fn(&str, &str) -> Result<(), String>,
    ) -> Vec<(String, String)> {
        let mut pairs = Vec::with_capacity(raw.len());
        for (key, value) in raw {
            match check(&key, &value.value) {
                Ok(()) => pairs.push((key, value.value)),
                Err(e) => self.push(value.referenced, format!("`{field}`: {e}")),
            }
        }
        pairs
    }
}
