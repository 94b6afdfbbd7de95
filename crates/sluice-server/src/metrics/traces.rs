//! What tracing exports and drops, and the decision latency histogram,
//! which carries exemplars (the trace id of a sampled decision) when
//! tracing is on: OpenMetrics shows them on `/metrics`, and Prometheus
//! links a slow bucket to its trace.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// An exemplar's labels: the trace of one decision.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct TraceExemplar {
    /// 32 hex digits, as the collector shows it.
    trace_id: String,
}

/// `sluice_decision_duration_seconds`: exemplars only when tracing is on,
/// so that a service without tracing takes no second lock per decision.
pub(super) enum DecisionSeconds {
    Plain(Histogram),
    Exemplars(HistogramWithExemplars<TraceExemplar>),
}

impl DecisionSeconds {
    /// The histogram, registered (50µs .. ~1.6s).
    pub(super) fn register(registry: &mut Registry, exemplars: bool) -> DecisionSeconds {
        const NAME: &str = "decision_duration_seconds";
        const HELP: &str = "Time to decide one request, store call included";
        let buckets = exponential_buckets(0.000_05, 2.0, 16);
        if exemplars {
            let histogram = HistogramWithExemplars::new(buckets);
            registry.register(NAME, HELP, histogram.clone());
            DecisionSeconds::Exemplars(histogram)
        } else {
            let histogram = Histogram::new(buckets);
            registry.register(NAME, HELP, histogram.clone());
            DecisionSeconds::Plain(histogram)
        }
    }

    /// Counts one decision of `seconds`, sampled in `trace_id`'s trace.
    pub(super) fn observe(&self, seconds: f64, trace_id: Option<String>) {
        match self {
            DecisionSeconds::Plain(histogram) => histogram.observe(seconds),
            DecisionSeconds::Exemplars(histogram) => histogram.observe(
                seconds,
                trace_id.map(|trace_id| TraceExemplar { trace_id }),
                None,
            ),
        }
    }
}

/// Spans handed to the exporter and spans lost: dropped because the
/// queue was full (the collector slow or away) or because their export
/// failed.
#[derive(Debug, Clone, Default)]
pub struct SpanCounters {
    /// Spans the collector accepted.
    pub exported: Counter,
    /// Spans lost.
    pub dropped: Counter,
}

impl SpanCounters {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "trace_spans_exported",
            "Spans the collector accepted",
            self.exported.clone(),
        );
        registry.register(
            "trace_spans_dropped",
            "Spans lost: the export queue was full (tracing.queue) or their export failed",
            self.dropped.clone(),
        );
    }
}
