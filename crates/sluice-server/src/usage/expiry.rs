//! The expiry of what this instance handed out: reservations unsettled
//! within `reservation_ttl` keep their estimate (recorded in the ledger in
//! their minute), attempts unconcluded within `attempt_ttl` are given
//! back. A claim the store could not take is tried again while a settle
//! can still be told from it.

use std::sync::Arc;

use sluice_store::StoreError;

use super::Charge;
use crate::app::App;
use crate::reservation::{CLOCK_SKEW_MS, Held};

/// Claims what is due every second, forever.
pub fn spawn_expiry(app: &Arc<App>) {
    let app = app.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            expire_due(&app).await;
        }
    });
}

/// Claims the reservations and attempts due now (see [`spawn_expiry`]).
pub async fn expire_due(app: &App) {
    let now = app.now_ms();
    for held in app.reservations.due(now) {
        let claimed = if held.reservation.attempt {
            expire_attempt(app, &held).await
        } else {
            expire_reservation(app, &held).await
        };
        if let Err(error) = claimed
            && !app.reservations.retry(held, now)
        {
            tracing::warn!(%error, "could not claim an expired reservation or attempt in time: a reservation's estimate stands, unrecorded in the ledger; an attempt keeps counting until its rules refill");
        }
    }
}

/// Claims a reservation as expired (unless a settle claimed it first):
/// its estimate stands, and goes into the ledger in its minute.
async fn expire_reservation(app: &App, held: &Held) -> Result<(), StoreError> {
    let reservation = &held.reservation;
    // Kept as long as an instance whose clock is behind may still accept
    // a settle of it.
    if app.limiter.expire(reservation, CLOCK_SKEW_MS).await? {
        app.metrics.usage.expired();
        let policy = app.limiter.policy();
        let class = policy
            .applicable(
                &reservation.tenant,
                &reservation.route,
                reservation.subject.is_some(),
            )
            .class;
        app.charged(Charge {
            tenant: Some(&reservation.tenant),
            route: class.route(),
            recorded: reservation.estimate,
            at_ms: reservation.at_ms,
            debited: None,
        });
    }
    Ok(())
}

/// Gives back an attempt never concluded (unless a conclusion claimed it
/// first).
async fn expire_attempt(app: &App, held: &Held) -> Result<(), StoreError> {
    let policy = app.limiter.policy();
    app.conclude(&policy, &held.reservation, None, CLOCK_SKEW_MS)
        .await
        .map(drop)
}
