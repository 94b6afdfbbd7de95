//! Traces over OTLP: the tracer `sluice serve` installs when tracing is on
//! (`settings.rs`), the spans of the requests it serves, and the caller's
//! context they continue.
//!
//! A request to a decision endpoint (HTTP `/v1/check`, `/v1/acquire`,
//! `/v1/release`, `/v1/settle`, `/v1/report`, forward-auth, `/json`; the
//! gRPC Rate Limit Service) gets a server span, a child of the caller's
//! W3C `traceparent` (and `tracestate`) when it sends one: the gateway's
//! span. Its children are the limiter's (`sluice_store::trace`): the
//! decision, the change after the fact, their store calls. Sampling
//! follows the parent (`parentbased_*`, the default): a request the
//! gateway sampled is sampled here.
//!
//! Spans go out in batches (`export.rs`): a collector slow or away costs
//! decisions nothing, and what could not wait is counted in
//! `sluice_trace_spans_dropped_total`.
//!
//! With tracing off, none of this is built: no layer, no span, no header
//! read.

mod export;
pub mod settings;
mod spans;

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, Sampler, SdkTracer, SdkTracerProvider};
use sluice_core::config::tracing::{OtlpProtocol, SamplerKind};

pub use settings::Settings;
pub use spans::{current_if, grpc_answered, grpc_span, http_answered, http_span, sampled_trace_id};

use crate::metrics::SpanCounters;
use export::{Bounded, Counting, Waiting};

/// The most spans exported in one batch (the SDK's default).
const MAX_BATCH: usize = 512;

/// How long a stopping service waits for its last spans to be exported.
pub const SHUTDOWN: Duration = Duration::from_secs(2);

/// The running tracer: spans go through it until [`Traces::shutdown`].
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Traces {
    /// Builds the exporter and the tracer `settings` describe, counting
    /// spans in `counters`. Call within the runtime: the batches are
    /// exported on its tasks.
    pub fn start(settings: &Settings, counters: SpanCounters) -> Result<Traces, String> {
        let exporter = exporter(settings)?;
        let waiting = Waiting::new(settings.queue, counters);
        // Set here whatever the OTEL_BSP_* variables say: one export at a
        // time (memory: the queue and one batch), and the processor's own
        // deadline past the exporter's (which decides; `export.rs` counts
        // a batch given up either way).
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(settings.queue)
            .with_max_export_batch_size(MAX_BATCH.min(settings.queue))
            .with_max_concurrent_exports(1)
            .with_max_export_timeout(settings.timeout + Duration::from_secs(1))
            .build();
        let processor = BatchSpanProcessor::builder(
            Counting {
                inner: exporter,
                waiting: waiting.clone(),
            },
            Tokio,
        )
        .with_batch_config(batches)
        .build();
        // The version first: the operator's attributes win over it.
        let mut resource = Resource::builder()
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
        if let Some(name) = &settings.service_name {
            resource = resource.with_service_name(name.clone());
        }
        let resource = resource
            .with_attributes(
                settings
                    .resource
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(Bounded {
                inner: processor,
                waiting,
            })
            .with_sampler(sampler(settings.sampler, settings.ratio))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("sluice");
        Ok(Traces { provider, tracer })
    }

    /// The tracer the `tracing` layer sends spans to.
    pub fn tracer(&self) -> SdkTracer {
        self.tracer.clone()
    }

    /// Exports what is queued, then stops: within [`SHUTDOWN`], whatever
    /// the collector does (a batch still waiting for it then is lost).
    pub async fn shutdown(self) {
        let provider = self.provider;
        // The processor waits on the runtime's tasks: not from one of them.
        let stopping = tokio::task::spawn_blocking(move || provider.shutdown());
        if tokio::time::timeout(SHUTDOWN, stopping).await.is_err() {
            tracing::warn!(
                "traces: the collector did not take the last spans within {SHUTDOWN:?}; stopping without them"
            );
        }
    }
}

/// The OTLP exporter of `settings`: what `tracing:` gives, the rest from
/// the `OTEL_EXPORTER_OTLP_*` variables (the exporter reads them).
fn exporter(settings: &Settings) -> Result<opentelemetry_otlp::SpanExporter, String> {
    let built = match settings.protocol {
        OtlpProtocol::Grpc => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            if let Some(endpoint) = &settings.endpoint {
                builder = builder.with_endpoint(endpoint.clone());
            }
            builder = builder.with_timeout(settings.timeout);
            if let Some(headers) = &settings.headers {
                let mut metadata = tonic::metadata::MetadataMap::new();
                for (name, value) in headers {
                    let name = tonic::metadata::MetadataKey::from_bytes(name.as_bytes())
                        .map_err(|_| format!("tracing.headers: `{name}` is not a header name"))?;
                    let value = value.parse().map_err(|_| {
                        format!("tracing.headers: the value of `{name}` is not a header value")
                    })?;
                    metadata.insert(name, value);
                }
                builder = builder.with_metadata(metadata);
            }
            builder.build()
        }
        OtlpProtocol::HttpProtobuf => {
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
            if let Some(endpoint) = &settings.endpoint {
                builder = builder.with_endpoint(endpoint.clone());
            }
            builder = builder.with_timeout(settings.timeout);
            if let Some(headers) = &settings.headers {
                builder = builder.with_headers(headers.iter().cloned().collect());
            }
            builder.build()
        }
    };
    built.map_err(|e| format!("tracing: cannot build the OTLP exporter: {e}"))
}

/// The SDK's sampler for `kind` (and `ratio`, for the ratio samplers).
fn sampler(kind: SamplerKind, ratio: f64) -> Sampler {
    let parent_based = |root: Sampler| Sampler::ParentBased(Box::new(root));
    match kind {
        SamplerKind::AlwaysOn => Sampler::AlwaysOn,
        SamplerKind::AlwaysOff => Sampler::AlwaysOff,
        SamplerKind::TraceIdRatio => Sampler::TraceIdRatioBased(ratio),
        SamplerKind::ParentBasedAlwaysOn => parent_based(Sampler::AlwaysOn),
        SamplerKind::ParentBasedAlwaysOff => parent_based(Sampler::AlwaysOff),
        SamplerKind::ParentBasedTraceIdRatio => parent_based(Sampler::TraceIdRatioBased(ratio)),
    }
}
