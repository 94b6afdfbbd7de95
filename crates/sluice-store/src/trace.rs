//! What a trace shows of a decision: `tracing` spans, under the target
//! [`TARGET`], that an OpenTelemetry layer (`tracing-opentelemetry`)
//! exports. `sluice serve` installs one when tracing is on; an app that
//! embeds the limiter (or the tower layer) gets them in its own traces,
//! children of whatever span is current.
//!
//! - `sluice.decide`: one per decision, with its outcome ([`decided`]),
//!   made by the caller that answers it (the server's one tail, the tower
//!   layer) around the limiter's door.
//! - `sluice.settle`, `sluice.report`, `sluice.release`: one per change
//!   after the fact, made by the limiter ([`change_span`]).
//! - `sluice.store`: one per call to a store across the network, a child of
//!   the span it serves: the backend, the shard, the slots it touched, the
//!   breaker's state, the error if any ([`store_call`]). The memory store
//!   decides and changes in the caller's own span, without a child.
//!
//! Background work (an expiry, slices given back) is in no request's span
//! and starts no trace: its changes and store calls have no span.
//!
//! No tenant, route or subject text is on any span unless the deployment
//! says so ([`Disclosure`], on decisions' spans only): `SECURITY.md` says
//! what each choice exposes.
//!
//! With no subscriber interested in [`TARGET`] (tracing off), each span is
//! one check of its call site's cached interest, and nothing is recorded.

use sluice_core::keys::Keyer;
use sluice_core::{Decision, Request};
use tracing::Span;
use tracing::field::Empty;

use crate::limiter::breaker::BreakerState;
use crate::store::{Batch, StoreError};

/// The target of every span here: a subscriber that should not see them
/// (a log's formatter) filters it out; an exporter keeps only it.
pub const TARGET: &str = "sluice::trace";

/// What a decision's span tells of who asked.
#[derive(Debug, Clone, Default)]
pub enum Disclosure {
    /// Nothing: no tenant, route or subject text (the default).
    #[default]
    Nothing,
    /// The tenant's tag under the pepper (the `{T}` of its keys in the
    /// store, and the ledger's `tenants: hmac`), and the route pattern the
    /// request matched (configuration text, as the metrics show it).
    Derived(Keyer),
    /// The tenant, route and subject as the request gave them.
    Plain,
}

/// A decision's span, of a request of `cost` (`None`: Envoy descriptors,
/// each with its own). Record what was decided with [`decided`], who asked
/// with [`disclose`].
pub fn decision(cost: Option<u64>) -> Span {
    let span = tracing::info_span!(
        target: "sluice::trace",
        "sluice.decide",
        sluice.cost = Empty,
        sluice.allowed = Empty,
        sluice.reason = Empty,
        sluice.rule = Empty,
        sluice.scope = Empty,
        sluice.degraded = Empty,
        sluice.near_limit = Empty,
        sluice.shadow_denied = Empty,
        sluice.tenant = Empty,
        sluice.route = Empty,
        sluice.subject = Empty,
    );
    if let Some(cost) = cost.filter(|_| !span.is_disabled()) {
        span.record("sluice.cost", cost);
    }
    span
}

/// `future` run within `span`; as it is when tracing is off.
pub async fn within<F: std::future::Future>(span: &Span, future: F) -> F::Output {
    if span.is_disabled() {
        future.await
    } else {
        tracing::Instrument::instrument(future, span.clone()).await
    }
}

/// Whether spans are wanted here: within a request's span (none exists
/// when tracing is off). A call made by background work (an expiry,
/// slices given back) has none: it starts no trace of its own.
///
/// Not `tracing::enabled!`: a dynamic `enabled` call leaves per-layer
/// filters' state behind for the next event whose interest is cached, and
/// that event is then lost to the log (tokio-rs/tracing#2519).
fn in_a_request() -> bool {
    !Span::current().is_none()
}

/// `future`, a change of `kind` (of `cost` units where known), within its
/// span, which records whether it `applied` or the error's kind.
pub(crate) async fn changed<T, E>(
    kind: ChangeKind,
    cost: Option<u64>,
    future: impl std::future::Future<Output = Result<T, E>>,
    applied_of: impl Fn(&T) -> bool,
    kind_of: impl Fn(&E) -> &'static str,
) -> Result<T, E> {
    let span = change_span(kind, cost);
    let result = within(&span, future).await;
    record_applied(&span, result.as_ref().map(&applied_of).map_err(&kind_of));
    result
}

/// A change after the fact's span (tenant text is never on it): of `cost`
/// units where known; none outside a request.
pub fn change_span(kind: ChangeKind, cost: Option<u64>) -> Span {
    if !in_a_request() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: "sluice::trace",
        "sluice.change",
        otel.name = kind.span_name(),
        sluice.cost = Empty,
        sluice.applied = Empty,
        error.type = Empty,
        otel.status_code = Empty,
    );
    if let Some(cost) = cost {
        span.record("sluice.cost", cost);
    }
    span
}

/// What a [`change_span`] is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// `/v1/settle`: a reservation's estimate replaced by its cost.
    Settle,
    /// `/v1/report`: usage known after the fact, charged.
    Report,
    /// `/v1/release`: a lease given back.
    Release,
    /// `/v1/report` with an attempt: an attempt concluded by its status.
    Conclude,
}

impl ChangeKind {
    /// Its span's name: `sluice.settle`, `sluice.report`, `sluice.release`,
    /// `sluice.conclude`.
    pub fn span_name(self) -> &'static str {
        match self {
            ChangeKind::Settle => "sluice.settle",
            ChangeKind::Report => "sluice.report",
            ChangeKind::Release => "sluice.release",
            ChangeKind::Conclude => "sluice.conclude",
        }
    }
}

/// Records on `span` what `decision` was: allowed, the reason and the
/// rule that denied (name and scope), degraded, near the limit.
pub fn decided(span: &Span, decision: &Decision<'_>) {
    if span.is_disabled() {
        return;
    }
    span.record("sluice.allowed", decision.allowed);
    span.record("sluice.near_limit", decision.near_limit);
    if let Some(reason) = decision.reason {
        span.record("sluice.reason", reason.as_str());
    }
    if !decision.allowed
        && let Some(rule) = decision.policy()
    {
        span.record("sluice.rule", rule.name());
        span.record("sluice.scope", rule.scope().name());
    }
    if let Some(policy) = decision.degraded {
        span.record("sluice.degraded", policy.name());
    }
    if decision.shadow_denied {
        span.record("sluice.shadow_denied", true);
    }
}

/// Records on `span` whether a change applied (`Ok(true)`), found nothing
/// to change (`Ok(false)`) or failed (`Err`: the error's kind, a closed
/// set such as [`StoreError::kind`]).
fn record_applied(span: &Span, result: Result<bool, &'static str>) {
    if span.is_disabled() {
        return;
    }
    match result {
        Ok(applied) => {
            span.record("sluice.applied", applied);
        }
        Err(kind) => {
            span.record("error.type", kind);
            span.record("otel.status_code", "error");
        }
    }
}

/// Records on `span` who asked, as far as `disclosure` allows; `route` is
/// the route pattern the request matched.
pub fn disclose(span: &Span, disclosure: &Disclosure, request: &Request<'_>, route: &str) {
    if span.is_disabled() {
        return;
    }
    match disclosure {
        Disclosure::Nothing => {}
        Disclosure::Derived(keyer) => {
            span.record(
                "sluice.tenant",
                keyer.tenant_tag(request.tenant, 0).as_str(),
            );
            span.record("sluice.route", route);
        }
        Disclosure::Plain => {
            span.record("sluice.tenant", request.tenant);
            span.record("sluice.route", request.route);
            if let Some(subject) = request.subject {
                span.record("sluice.subject", subject);
            }
        }
    }
}

/// A store call's span: `op` is `decide`, `release` or `adjust`; `store`
/// the backend's name. Instrument the call with it, then [`answered`].
/// None outside a request.
pub(crate) fn store_call(
    op: &'static str,
    store: &'static str,
    batch: &Batch<'_>,
    breaker: BreakerState,
) -> Span {
    if !in_a_request() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: "sluice::trace",
        "sluice.store",
        otel.kind = "client",
        db.system.name = Empty,
        sluice.store.backend = store,
        sluice.store.op = op,
        sluice.store.shard = batch.shard,
        sluice.store.rules = batch.rules.len(),
        sluice.store.slots = Empty,
        sluice.breaker = breaker.as_str(),
        error.type = Empty,
        otel.status_code = Empty,
    );
    if !span.is_disabled() && store.starts_with("redis") {
        span.record("db.system.name", "redis");
        if store == "redis" {
            span.record("sluice.store.slots", 1);
        }
    }
    span
}

/// Records on a [`store_call`] span how the call ended.
pub(crate) fn answered<T>(span: &Span, result: &Result<T, StoreError>) {
    if let Err(error) = result
        && !span.is_disabled()
    {
        span.record("error.type", error.kind());
        span.record("otel.status_code", "error");
    }
}

/// Records, from inside a store call, how many slots it touched (Redis
/// Cluster; one on a single node).
#[cfg(feature = "redis")]
pub(crate) fn slots(count: usize) {
    let span = Span::current();
    if !span.is_none() {
        span.record("sluice.store.slots", count);
    }
}
