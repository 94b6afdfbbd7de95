//! Entries kept alike in every region (`replica.lua`): the admin API's
//! overrides, shipped by the region link to every peer and merged there,
//! last writer wins (`sluice_core::regions::replica`, whose arithmetic the
//! script's is).

use std::collections::HashMap;

use redis::ScriptInvocation;
use sluice_core::regions::replica::Entry;

/// The merge script's source.
pub const REPLICA_LUA: &str = include_str!("replica.lua");

/// Entries per merge call.
const PER_CALL: usize = 256;

/// The keys a region keeps its replicated entries in (the same names in
/// every region: the prefix is the same).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replicated {
    /// A hash: field → value.
    pub values: String,
    /// A hash: field → version; a field without a value was deleted.
    pub versions: String,
    /// The change counter.
    pub counter: String,
}

/// The merge script, loaded once per process.
pub fn replica_script() -> &'static redis::Script {
    static SCRIPT: std::sync::LazyLock<redis::Script> =
        std::sync::LazyLock::new(|| redis::Script::new(REPLICA_LUA));
    &SCRIPT
}

impl Replicated {
    /// The calls that merge `entries` into the store whose identity key is
    /// `identity`, while it still holds `seen`.
    pub fn merge_calls(
        &self,
        entries: &[Entry],
        (identity, seen): (&str, &str),
    ) -> Vec<ScriptInvocation<'static>> {
        entries
            .chunks(PER_CALL)
            .map(|chunk| {
                let mut call = replica_script().prepare_invoke();
                call.key(&self.values)
                    .key(&self.versions)
                    .key(&self.counter)
                    .key(identity)
                    .arg(seen);
                for e in chunk {
                    call.arg(&e.field)
                        .arg(e.version)
                        .arg(e.value.as_deref().unwrap_or(""));
                }
                call
            })
            .collect()
    }

    /// Reads every entry and the counter, as of one instant.
    pub async fn read(
        &self,
        connection: &mut impl redis::aio::ConnectionLike,
    ) -> Result<(u64, Vec<Entry>), redis::RedisError> {
        type Read = (Option<u64>, HashMap<String, u64>, HashMap<String, String>);
        let (counter, versions, mut values): Read = redis::pipe()
            .atomic()
            .get(&self.counter)
            .hgetall(&self.versions)
            .hgetall(&self.values)
            .query_async(connection)
            .await?;
        let mut entries: Vec<Entry> = versions
            .into_iter()
            .map(|(field, version)| Entry {
                value: values.remove(&field),
                field,
                version,
            })
            .collect();
        entries.sort_by(|a, b| a.field.cmp(&b.field));
        Ok((counter.unwrap_or(0), entries))
    }
}
