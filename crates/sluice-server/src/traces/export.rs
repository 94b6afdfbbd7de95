//! Spans on their way to the collector, in bounded memory and counted.
//!
//! The SDK's batch processor (on the runtime's tasks) batches and exports;
//! around it, [`Bounded`] admits a span only while fewer than `queue` wait
//! for export, and [`Counting`] tells which left: accepted by the
//! collector (`exported`), or lost (`dropped`: the queue was full, or the
//! export failed). A span waits from its end until its batch is handed to
//! the exporter, so the processor's own queue, as large, never overflows
//! unseen, and a collector away costs decisions one failed `try_send` at
//! most: nothing waits for it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};

use crate::metrics::SpanCounters;

/// Spans ended and not yet handed to the exporter, and the counters.
#[derive(Debug, Clone)]
pub(super) struct Waiting {
    spans: Arc<AtomicUsize>,
    queue: usize,
    counters: SpanCounters,
}

impl Waiting {
    pub(super) fn new(queue: usize, counters: SpanCounters) -> Waiting {
        Waiting {
            spans: Arc::new(AtomicUsize::new(0)),
            queue,
            counters,
        }
    }

    /// Takes a place in the queue; false (the span dropped and counted)
    /// when it is full.
    fn admit(&self) -> bool {
        let admitted = self
            .spans
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.queue).then_some(n + 1)
            })
            .is_ok();
        if !admitted {
            self.counters.dropped.inc();
        }
        admitted
    }

    /// `n` spans left the queue for the exporter.
    fn handed(&self, n: usize) {
        let _ = self
            .spans
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                Some(w.saturating_sub(n))
            });
    }
}

/// The batch processor `inner`, admitting only what the queue holds.
#[derive(Debug)]
pub(super) struct Bounded<P> {
    pub(super) inner: P,
    pub(super) waiting: Waiting,
}

impl<P: SpanProcessor> SpanProcessor for Bounded<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        // The batch processor drops spans not sampled: so do we, first.
        if span.span_context.is_sampled() && self.waiting.admit() {
            self.inner.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The exporter `inner`, counting what it was handed and how it went.
#[derive(Debug)]
pub(super) struct Counting<E> {
    pub(super) inner: E,
    pub(super) waiting: Waiting,
}

impl<E: SpanExporter> SpanExporter for Counting<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len();
        self.waiting.handed(spans);
        let result = self.inner.export(batch).await;
        let counter = match result {
            Ok(()) => &self.waiting.counters.exported,
            Err(_) => &self.waiting.counters.dropped,
        };
        counter.inc_by(spans as u64);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_admits_up_to_its_size_and_counts_the_rest() {
        let counters = SpanCounters::default();
        let waiting = Waiting::new(2, counters.clone());
        assert!(waiting.admit());
        assert!(waiting.admit());
        assert!(!waiting.admit());
        assert_eq!(counters.dropped.get(), 1);
        waiting.handed(2);
        assert!(waiting.admit());
        // Handing more than waited (never expected) does not wrap.
        waiting.handed(5);
        assert!(waiting.admit());
        assert!(waiting.admit());
        assert!(!waiting.admit());
        assert_eq!(counters.dropped.get(), 2);
    }
}
