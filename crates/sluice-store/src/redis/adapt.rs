//! The law script (`adapt.lua`): an adaptive valve's law stepped in the
//! valve's own key, so that every instance steps one state and reads one
//! effective limit (`sluice_core::adaptive::law`, whose arithmetic the
//! script's is).

use sluice_core::BoundRule;
use sluice_core::adaptive::Adaptive;
use sluice_core::adaptive::law::{Law, Seen};
use sluice_core::keys::Keyer;

use super::args::{TimeSource, now_arg};
use crate::store::StoreError;

/// The law script's source.
pub const ADAPT_LUA: &str = concat!(
    include_str!("common.lua"),
    include_str!("adapt.lua"),
    "return adapt(KEYS, ARGV)\n"
);

/// The law script, loaded once per process.
pub fn adapt_script() -> &'static redis::Script {
    static SCRIPT: std::sync::LazyLock<redis::Script> =
        std::sync::LazyLock::new(|| redis::Script::new(ADAPT_LUA));
    &SCRIPT
}

/// The key of adaptive `valve`'s law: beside the valve's (whole) key, in
/// its slot.
pub fn law_key(keyer: &Keyer, valve: &BoundRule) -> String {
    let tag = keyer.global_tag(valve, 0);
    format!("{}:law", keyer.key(&tag, valve, None))
}

/// The call that steps `valve`'s law (of `terms`) with what was `seen`.
pub fn adapt_call(
    keyer: &Keyer,
    valve: &BoundRule,
    terms: Adaptive,
    seen: Seen,
    time: &TimeSource,
) -> redis::ScriptInvocation<'static> {
    let mut call = adapt_script().prepare_invoke();
    call.key(law_key(keyer, valve))
        .arg(now_arg(time))
        .arg(seen.requests)
        .arg(seen.latency_ms)
        .arg(seen.failed)
        .arg(if seen.full { "1" } else { "0" })
        .arg(valve.rule().limit())
        .arg(terms.min)
        .arg(terms.latency_target_ms);
    call
}

/// The law as the script wrote it.
pub fn law_of(reply: &[u8]) -> Result<Law, StoreError> {
    let numbers: Vec<f64> = reply
        .chunks_exact(8)
        .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    match numbers[..] {
        [limit, latency_ms, cut_at, at] if reply.len() == 32 => Ok(Law {
            limit,
            latency_ms,
            cut_at_ms: cut_at as u64,
            at_ms: at as u64,
        }),
        _ => Err(StoreError::Unavailable(format!(
            "the law script answered {} bytes",
            reply.len()
        ))),
    }
}

impl<R: super::store::Reach> super::store::Redis<R> {
    /// Steps adaptive `valve`'s law with what was `seen`, within the time
    /// budget: the law as stepped.
    pub(crate) async fn adapt(
        &self,
        valve: &BoundRule,
        terms: Adaptive,
        seen: Seen,
    ) -> Result<Law, StoreError> {
        let mut connection = self.reach.shared()?;
        let call = adapt_call(&self.keys.current, valve, terms, seen, &self.time);
        let budget = std::time::Duration::from_millis(self.timeout_ms.max(250));
        let reply: Vec<u8> = tokio::time::timeout(budget, call.invoke_async(&mut connection))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout_ms))?
            .map_err(|e| self.error(&e))?;
        law_of(&reply)
    }
}
