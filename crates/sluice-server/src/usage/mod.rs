//! Usage known after the fact, whatever the door: settles of
//! reservations, reports, attempts concluded, their expiry, and Envoy's
//! quota debits. Each goes through the limiter (`sluice_store`'s `after`),
//! then through one tail, [`App::charged`]: the metrics and the usage
//! ledger, as [`App::decide`] is for decisions. Ids are sealed by
//! [`crate::reservation`]; the expiry task is [`expiry`]. The HTTP
//! handlers (`http/after.rs`, `http/attempt.rs`) only read requests and
//! write answers.

use sluice_core::{Policy, Request};
use sluice_store::{Adjustment, AfterError, MarkerAnswer, Reservation, StoreError};

use crate::app::App;
use crate::metrics::{AttemptResult, SettleResult};

pub mod expiry;

/// A cost charged after its decision, as the metrics and the usage ledger
/// are told of it.
#[derive(Debug, Clone, Copy)]
pub struct Charge<'a> {
    /// Whose: `None` for what no tenant owns (envoyproxy/ratelimit's
    /// descriptors), written to no ledger.
    pub tenant: Option<&'a str>,
    /// The route pattern it is charged under (a class's; empty: none).
    pub route: &'a str,
    /// Units the ledger records (0: none), in the minute of `at_ms`.
    pub recorded: u64,
    /// When, on the app's clock (ms since the epoch).
    pub at_ms: u64,
    /// Units taken past what was held, when some were.
    pub debited: Option<Debited>,
}

/// Units taken after the fact, past what a decision held.
#[derive(Debug, Clone, Copy)]
pub struct Debited {
    /// How many.
    pub units: u64,
    /// Whether they left a rule owing (a request of one unit denied).
    pub owing: bool,
    /// Units beyond `max_debt`, forgiven.
    pub forgiven: u64,
}

/// The header an attempt is handed out in where the answer has no body
/// for it: forward-auth's answer, and the request Envoy forwards.
pub const ATTEMPT_HEADER: &str = "sluice-attempt";

impl App {
    /// The one tail of what is charged after its decision: the metrics,
    /// and the usage ledger when on.
    pub fn charged(&self, charge: Charge<'_>) {
        if let Some(Debited {
            units,
            owing,
            forgiven,
        }) = charge.debited
        {
            self.metrics.usage.debit(units, owing, forgiven);
        }
        if let (Some(tenant), Some(ledger)) = (charge.tenant, &self.ledger)
            && charge.recorded > 0
        {
            ledger.record(
                tenant,
                crate::ledger::route_of(charge.route),
                charge.recorded,
                true,
                charge.at_ms,
            );
        }
    }

    /// Settles `reservation` at `cost` (its marker kept `marker_ttl_ms`)
    /// and counts what it did, once: a settle that applied is charged
    /// (metrics, ledger in the reservation's minute), a repeat or a
    /// refusal only counted.
    pub async fn settle<'p>(
        &self,
        policy: &'p Policy,
        reservation: &Reservation,
        cost: u64,
        marker_ttl_ms: u64,
    ) -> Result<Adjustment<'p>, StoreError> {
        let settled = self
            .limiter
            .settle(policy, reservation, cost, marker_ttl_ms)
            .await?;
        match settled.marker {
            MarkerAnswer::Conflict => self.metrics.usage.settle(SettleResult::Refused, 0),
            MarkerAnswer::Again => self.metrics.usage.settle(SettleResult::Repeated, cost),
            MarkerAnswer::Applied => {
                self.metrics.usage.settle(SettleResult::Applied, cost);
                // Unfinished, the rules' state after is not known everywhere.
                let debited =
                    (cost > reservation.held && settled.unfinished.is_none()).then(|| Debited {
                        units: cost - reservation.held,
                        owing: !settled.decision.allowed,
                        forgiven: settled.forgiven,
                    });
                self.charged(Charge {
                    tenant: Some(&reservation.tenant),
                    route: settled.decision.class.route(),
                    recorded: cost,
                    at_ms: reservation.at_ms,
                    debited,
                });
            }
        }
        Ok(settled)
    }

    /// A settle refused before the store was asked (an unknown id).
    pub fn settle_refused(&self) {
        self.metrics.usage.settle(SettleResult::Refused, 0);
    }

    /// Records `request.cost` as spent and charges what was recorded
    /// (also when the store failed part way through a sharded tenant).
    pub async fn report<'p>(
        &self,
        policy: &'p Policy,
        request: &Request<'_>,
    ) -> Result<Adjustment<'p>, AfterError> {
        let reported = self.limiter.report(policy, request).await;
        let (units, owing, forgiven) = match &reported {
            Ok(reported) => (request.cost, !reported.decision.allowed, reported.forgiven),
            Err(AfterError::Partly {
                recorded, forgiven, ..
            }) => (*recorded, false, *forgiven),
            Err(_) => return reported,
        };
        let class = policy
            .applicable(request.tenant, request.route, request.subject.is_some())
            .class;
        self.charged(Charge {
            tenant: Some(request.tenant),
            route: class.route(),
            recorded: units,
            at_ms: self.now_ms(),
            debited: Some(Debited {
                units,
                owing,
                forgiven,
            }),
        });
        reported
    }

    /// The attempt `decision` holds on the rules of `request` that count
    /// by outcome, sealed for its caller to conclude (`/v1/report`), and
    /// kept here until `attempt_ttl` to be given back if it never is.
    pub fn attempt(
        &self,
        policy: &Policy,
        request: &Request<'_>,
        decision: &sluice_core::Decision<'_>,
    ) -> Option<String> {
        let attempt = self.limiter.attempt(policy, request, decision)?;
        Some(self.reservations.give(attempt))
    }

    /// Concludes `attempt` with `status` (`None`: its `attempt_ttl`
    /// passed, given back), its marker kept `marker_ttl_ms`, and counts
    /// how it ended, once.
    pub async fn conclude<'p>(
        &self,
        policy: &'p Policy,
        attempt: &Reservation,
        status: Option<u16>,
        marker_ttl_ms: u64,
    ) -> Result<Adjustment<'p>, StoreError> {
        let concluded = self
            .limiter
            .conclude_attempt(policy, attempt, status, marker_ttl_ms)
            .await?;
        // The expiry's own claim, made by a call whose answer was lost,
        // finds it again.
        let made = match status {
            Some(_) => concluded.marker == MarkerAnswer::Applied,
            None => concluded.marker != MarkerAnswer::Conflict,
        };
        if made {
            let counts = |s: u16| {
                policy
                    .applicable(&attempt.tenant, &attempt.route, attempt.subject.is_some())
                    .by_outcome
                    .iter()
                    .any(|r| r.counts(s))
            };
            self.metrics.usage.attempt(match status {
                None => AttemptResult::Expired,
                Some(s) if counts(s) => AttemptResult::Counted,
                Some(_) => AttemptResult::GivenBack,
            });
        }
        Ok(concluded)
    }

    /// The app's clock (the limiter's): ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        self.limiter.now_ms()
    }
}
