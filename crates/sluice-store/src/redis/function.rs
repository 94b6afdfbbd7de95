//! How a decision reaches Redis: as a Redis Function (Redis 7 and later)
//! where it can, as a script elsewhere.
//!
//! A script's body runs from the top on every `EVALSHA`, creating each of
//! its helpers (a dozen closures) before it decides anything; a function's
//! library runs once, when it is loaded, so a call only decides. Measured
//! with `examples/redis_cost`, that is 2–5 µs of Redis CPU per decision
//! (see docs/BENCHMARKS.md).
//!
//! The library is named after a hash of its source, so that instances of
//! different versions sharing a Redis each call their own. A node that
//! lacks it (a restart without persistence, `FUNCTION FLUSH`) answers
//! "Function not found": the library is loaded (on every primary of a
//! cluster) and the call sent again, which is safe because nothing ran.
//! Where functions are unavailable (Redis 6, a user without the `FUNCTION`
//! permission) the store switches to `EVALSHA` for good, and to `EVAL` for a
//! node that does not have the script cached, as before.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::ConnectionLike;

use super::decide::{DECIDE_BODY, DECIDE_LUA};

/// The decision as a function and as a script, and which one this store
/// sends.
#[derive(Debug, Clone)]
pub struct Decide {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Still sending `FCALL`: cleared once functions proved unavailable.
    functions: AtomicBool,
    /// `FUNCTION LOAD`'s source: a header naming the library, then the code.
    library: String,
    /// The registered function's name.
    function: String,
    script: redis::Script,
}

impl Default for Decide {
    fn default() -> Self {
        Decide::new()
    }
}

impl Decide {
    /// Starts with functions, falling back on the first call that shows
    /// they are unavailable.
    pub fn new() -> Decide {
        let script = redis::Script::new(DECIDE_LUA);
        let version = &script.get_hash()[..16];
        let function = format!("sluice_decide_{version}");
        let library = format!(
            "#!lua name=sluice_{version}\n{}\npx_text = {{ n = 0 }}\nredis.register_function('{function}', decide)\n",
            DECIDE_BODY
        );
        Decide {
            inner: Arc::new(Inner {
                functions: AtomicBool::new(true),
                library,
                function,
                script,
            }),
        }
    }

    /// Whether calls go out as `FCALL`.
    fn uses_functions(&self) -> bool {
        self.inner.functions.load(Ordering::Relaxed)
    }

    /// The registered function's name.
    pub fn function_name(&self) -> &str {
        &self.inner.function
    }

    /// Loads the library (on every primary of a cluster), replacing a
    /// library of the same name, which is the same code.
    pub async fn load<C: ConnectionLike + Send>(
        &self,
        connection: &mut C,
    ) -> redis::RedisResult<()> {
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&self.inner.library)
            .query_async::<redis::Value>(connection)
            .await
            .map(drop)
    }

    /// Sends one decision; `fill` appends the key count, keys and
    /// arguments to the command it is given.
    pub async fn call<C, T>(
        &self,
        connection: &mut C,
        fill: impl Fn(&mut redis::Cmd),
    ) -> redis::RedisResult<T>
    where
        C: ConnectionLike + Send,
        T: redis::FromRedisValue,
    {
        if self.uses_functions() {
            let mut fcall = redis::cmd("FCALL");
            fcall.arg(&self.inner.function);
            fill(&mut fcall);
            match fcall.query_async::<T>(connection).await {
                Err(e) if function_missing(&e) => match self.load(connection).await {
                    Ok(()) => return fcall.query_async::<T>(connection).await,
                    Err(e) if unavailable(&e) => self.fall_back(&e),
                    // Not loaded this time (a failover under way): this call
                    // goes as a script, the next one tries again.
                    Err(_) => {}
                },
                Err(e) if unavailable(&e) => self.fall_back(&e),
                other => return other,
            }
        }
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(self.inner.script.get_hash());
        fill(&mut evalsha);
        match evalsha.query_async::<T>(connection).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let mut eval = redis::cmd("EVAL");
                eval.arg(DECIDE_LUA);
                fill(&mut eval);
                eval.query_async::<T>(connection).await
            }
            other => other,
        }
    }

    fn fall_back(&self, error: &redis::RedisError) {
        if self.inner.functions.swap(false, Ordering::Relaxed) {
            tracing::info!(%error, "Redis functions unavailable; deciding with EVALSHA");
        }
    }
}

/// The node has no such function (not loaded yet, or flushed).
fn function_missing(error: &redis::RedisError) -> bool {
    error
        .detail()
        .is_some_and(|d| d.starts_with("Function not found"))
}

/// The node cannot run functions for us: an unknown command (before Redis
/// 7) or a missing permission.
fn unavailable(error: &redis::RedisError) -> bool {
    error.code() == Some("NOPERM")
        || error.detail().is_some_and(|d| {
            d.starts_with("unknown command") || d.starts_with("unknown subcommand")
        })
}
