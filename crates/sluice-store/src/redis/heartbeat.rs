//! The heartbeat script (`heartbeat.lua`): instances count themselves so
//! that `on_error: local` can divide limits among them, and notice another
//! pepper on the same keys.

use sluice_core::keys::Keyer;

use super::keys::KeySet;
use super::store_error;
use crate::store::StoreError;

/// `on_error: local` can divide limits among them.
pub const HEARTBEAT_LUA: &str = include_str!("heartbeat.lua");

/// What a heartbeat learned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heartbeat {
    /// Live instances sharing this one's pepper (this one included).
    pub live: u64,
    /// Live instances on the same store and prefix with another pepper.
    pub other_peppers: u64,
}

/// The key of the live-instances set.
pub fn instances_key(prefix: &str) -> String {
    format!("{prefix}:instances")
}

impl KeySet {
    /// Refreshes `instance`'s heartbeat (lasting `ttl_ms`, announcing the
    /// pepper fingerprints) on `connection`, within `timeout_ms` (at least
    /// 250 ms).
    pub(crate) async fn heartbeat<C: redis::aio::ConnectionLike + Send>(
        &self,
        connection: &mut C,
        instance: &str,
        ttl_ms: u64,
        timeout_ms: u64,
    ) -> Result<Heartbeat, StoreError> {
        let mut eval = redis::cmd("EVAL");
        eval.arg(HEARTBEAT_LUA)
            .arg(1)
            .arg(instances_key(self.current.prefix()))
            .arg(instance)
            .arg(ttl_ms)
            .arg(self.current.fingerprint())
            .arg(
                self.previous
                    .as_ref()
                    .map(Keyer::fingerprint)
                    .unwrap_or_default(),
            );
        let call = eval.query_async::<(u64, u64)>(connection);
        match tokio::time::timeout(std::time::Duration::from_millis(timeout_ms.max(250)), call)
            .await
        {
            Ok(result) => result
                .map(|(live, other_peppers)| Heartbeat {
                    live,
                    other_peppers,
                })
                .map_err(|e| store_error(&e, timeout_ms)),
            Err(_) => Err(StoreError::Timeout(timeout_ms)),
        }
    }
}
