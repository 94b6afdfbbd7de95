//! Spans on their way to the collector, in bounded memory and counted.
//!
//! The SDK's batch processor (on the runtime's tasks) batches and exports;
//! around it, [`Bounded`] admits a span only while fewer than `queue` wait
//! for export, and [`Counting`] tells which left: accepted by the
//! collector (`exported`), or lost (`dropped`: the queue was full, or the
//! export failed). A span waits from its end until its batch is handed to
//! the exporter, so the processor's own queue, as large, never overflows
//! unseen, and a collector away costs decisions one failed `try_send` at
//! most: nothing waits for it. One export at a time (`mod.rs` sets it,
//! whatever the variables say): memory holds the queue and one batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    /// Whether the last export failed (logged once per change).
    failing: Arc<AtomicBool>,
}

impl Waiting {
    pub(super) fn new(queue: usize, counters: SpanCounters) -> Waiting {
        Waiting {
            spans: Arc::new(AtomicUsize::new(0)),
            queue,
            counters,
            failing: Arc::new(AtomicBool::new(false)),
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
        // Counted dropped unless the collector accepts them, even when the
        // processor gives up on this export and drops it half-way.
        let mut unaccepted = Unaccepted {
            spans,
            waiting: &self.waiting,
        };
        let result = self.inner.export(batch).await;
        match &result {
            Ok(()) => {
                unaccepted.spans = 0;
                self.waiting.counters.exported.inc_by(spans as u64);
                if self.waiting.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!("traces: the collector accepts spans again");
                }
            }
            Err(error) => {
                if !self.waiting.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(%error, "traces: an export failed; spans are dropped (sluice_trace_spans_dropped_total) until the collector accepts them");
                }
            }
        }
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

/// Spans of an export not (yet) accepted: counted dropped when dropped.
struct Unaccepted<'a> {
    spans: usize,
    waiting: &'a Waiting,
}

impl Drop for Unaccepted<'_> {
    fn drop(&mut self) {
        self.waiting.counters.dropped.inc_by(self.spans as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exporter that never answers.
    #[derive(Debug)]
    struct Stuck;

    impl SpanExporter for Stuck {
        async fn export(&self, _: Vec<SpanData>) -> OTelSdkResult {
            std::future::pending().await
        }
    }

    #[test]
    fn an_export_given_up_half_way_is_counted_dropped() {
        use std::future::Future;
        let counters = SpanCounters::default();
        let waiting = Waiting::new(8, counters.clone());
        for _ in 0..3 {
            assert!(waiting.admit());
        }
        let exporter = Counting {
            inner: Stuck,
            waiting,
        };
        let span = opentelemetry_sdk::trace::SpanData {
            span_context: opentelemetry::trace::SpanContext::empty_context(),
            parent_span_id: opentelemetry::trace::SpanId::INVALID,
            parent_span_is_remote: false,
            span_kind: opentelemetry::trace::SpanKind::Internal,
            name: "s".into(),
            start_time: std::time::SystemTime::UNIX_EPOCH,
            end_time: std::time::SystemTime::UNIX_EPOCH,
            attributes: Vec::new(),
            dropped_attributes_count: 0,
            events: Default::default(),
            links: Default::default(),
            status: opentelemetry::trace::Status::Unset,
            instrumentation_scope: Default::default(),
        };
        let mut export = Box::pin(exporter.export(vec![span.clone(), span.clone(), span]));
        let waker = std::task::Waker::noop();
        let mut context = std::task::Context::from_waker(waker);
        assert!(export.as_mut().poll(&mut context).is_pending());
        assert_eq!(counters.dropped.get(), 0);
        drop(export);
        assert_eq!(counters.dropped.get(), 3);
        assert_eq!(counters.exported.get(), 0);
    }

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
