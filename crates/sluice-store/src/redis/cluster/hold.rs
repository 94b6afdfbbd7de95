//! What a decision over several slots holds of each group it has decided
//! while the others are asked: given back unless the whole decision
//! admitted (see the module documentation of the cluster store).

use redis::cluster_async::ClusterConnection;

use crate::redis::store::send;
use crate::redis::{self as script, RefundCall, TimeSource};

/// What the refund of one group needs besides its decision's rules,
/// prepared before the call.
pub(super) struct RefundPlan {
    /// The lease the decision takes of concurrency rules.
    pub(super) lease: Option<u128>,
    pub(super) time: TimeSource,
    /// Per rule of the group, whether it is a shadow rule.
    pub(super) shadow: Vec<bool>,
}

impl RefundPlan {
    /// The hold of a group that admitted (every enforced rule did),
    /// giving back the rules of `call` that consumed; `None` when the group
    /// denied (it wrote nothing).
    pub(super) fn hold(
        self,
        reply: &script::Reply,
        call: script::DecideCall,
        connection: ClusterConnection,
        script: redis::Script,
    ) -> Option<Hold> {
        let decided = &reply.outcomes;
        let admitted = decided
            .iter()
            .zip(&self.shadow)
            .all(|(o, shadow)| o.allowed || *shadow);
        if !admitted {
            return None;
        }
        let mut rules = call.into_rules();
        // A shadow rule that denied wrote nothing.
        rules.retain(|k| decided[k].allowed);
        Some(Hold {
            refund: (!rules.is_empty()).then(|| {
                RefundCall::of(rules, self.lease, &self.time, reply.admitted_at).commands(&script)
            }),
            connection,
        })
    }
}

/// What one group of a multi-slot decision consumed: refunded when dropped,
/// unless [`confirm`](Hold::confirm)ed because the whole decision
/// admitted.
pub(super) struct Hold {
    /// The refund (`EVALSHA`, `EVAL`); `None` once confirmed, or when
    /// nothing was consumed.
    refund: Option<(redis::Cmd, redis::Cmd)>,
    connection: ClusterConnection,
}

impl Hold {
    pub(super) fn confirm(&mut self) {
        self.refund = None;
    }

    /// Sends the refund as a task of its own and waits for it: the
    /// decision answers once its budgets are whole again. A caller that
    /// goes away meanwhile leaves the task to finish.
    async fn refund(mut self) {
        let Some((evalsha, eval)) = self.refund.take() else {
            return;
        };
        let connection = self.connection.clone();
        let sent = tokio::spawn(async move { send::<_, i64>(connection, evalsha, eval).await });
        if let Ok(Err(e)) = sent.await {
            tracing::warn!(error = %e, "refund of a denied decision failed; the budget recovers with time");
        }
    }
}

/// Gives back what every group of a denied (or failed) decision held,
/// concurrently, and waits for it.
pub(super) async fn refund_all(held: Vec<Hold>) {
    let refunds: Vec<_> = held.into_iter().map(|r| tokio::spawn(r.refund())).collect();
    for refund in refunds {
        let _ = refund.await;
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let Some((evalsha, eval)) = self.refund.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!("no runtime to refund a denied decision; the budget recovers with time");
            return;
        };
        let connection = self.connection.clone();
        runtime.spawn(async move {
            if let Err(e) = send::<_, i64>(connection, evalsha, eval).await {
                tracing::warn!(error = %e, "refund of a denied decision failed; the budget recovers with time");
            }
        });
    }
}
