//! Where the configuration comes from, and reloading it.
//!
//! With `--config FILE` the file is read, validated and watched: a change
//! (checked every two seconds) or SIGHUP reloads it. A reload that fails
//! validation is logged and ignored, so an invalid file never replaces a
//! running configuration. Plans, tenants and valves apply at once; a change
//! to `server`, `storage` or `keys` is reported and waits for a restart.
//! Without `--config`, the example configuration compiled into the binary is
//! used, so `sluice serve` works from any directory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Config, Policy};
use tracing::{info, warn};

use crate::Fallible;
use crate::app::App;

/// `examples/sluice.yaml`, compiled in.
pub const EXAMPLE: &str = include_str!("../../../examples/sluice.yaml");

/// How often a configuration file is checked for changes.
const POLL: Duration = Duration::from_secs(2);

/// A configuration file, or the embedded example.
#[derive(Debug, Clone)]
pub enum Source {
    /// The example compiled into the binary.
    Embedded,
    /// A file on disk.
    File(PathBuf),
}

impl Source {
    /// `Some(path)` → that file; `None` → the embedded example.
    pub fn from_arg(path: Option<PathBuf>) -> Source {
        path.map_or(Source::Embedded, Source::File)
    }

    /// How errors name this source.
    pub fn origin(&self) -> String {
        match self {
            Source::Embedded => "<embedded examples/sluice.yaml>".to_owned(),
            Source::File(path) => path.display().to_string(),
        }
    }

    /// The raw text.
    pub fn text(&self) -> Fallible<String> {
        match self {
            Source::Embedded => Ok(EXAMPLE.to_owned()),
            Source::File(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()).into()),
        }
    }

    /// Reads and validates the configuration.
    pub fn load(&self) -> Fallible<Config> {
        let text = self.text()?;
        Ok(Config::from_yaml(&text, &self.origin())?)
    }
}

/// Reloads `source` on SIGHUP and when the file changes. Returns at once;
/// the work happens on a background task.
pub fn spawn_reloader(source: Source, app: Arc<App>, running: Config) {
    let Source::File(_) = source else { return };
    tokio::spawn(async move {
        let mut running = running;
        let mut last_text = source.text().ok();
        let mut interval = tokio::time::interval(POLL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut hangup = hangup_signal();
        loop {
            let forced = tokio::select! {
                _ = interval.tick() => false,
                Some(()) = hangup.recv() => true,
            };
            let text = match source.text() {
                Ok(text) => text,
                Err(e) => {
                    warn!(error = %e, "configuration not reloaded");
                    continue;
                }
            };
            if !forced && last_text.as_deref() == Some(text.as_str()) {
                continue;
            }
            last_text = Some(text.clone());
            match Config::from_yaml(&text, &source.origin()) {
                Ok(config) => {
                    apply(&app, &running, &config);
                    app.metrics.reload(true);
                    running = config;
                }
                Err(errors) => {
                    app.metrics.reload(false);
                    for e in errors.iter() {
                        warn!("{e}");
                    }
                    warn!("configuration not reloaded: the running configuration stays in force");
                }
            }
        }
    });
}

fn apply(app: &App, running: &Config, next: &Config) {
    if next.server != running.server || next.storage != running.storage || next.keys != running.keys
    {
        warn!("changes to `server`, `storage` or `keys` take effect on restart");
    }
    app.limiter.set_policy(Policy::compile_for(
        &next.limits,
        app.limiter.store().shards_tenants(),
    ));
    info!(
        plans = next.limits.plans.len(),
        tenants = next.limits.tenants.len(),
        "configuration reloaded"
    );
}

#[cfg(unix)]
fn hangup_signal() -> tokio::sync::mpsc::Receiver<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(mut signal) => {
            tokio::spawn(async move {
                while signal.recv().await.is_some() {
                    let _ = tx.try_send(());
                }
            });
        }
        Err(e) => warn!(error = %e, "SIGHUP reload unavailable"),
    }
    rx
}

#[cfg(not(unix))]
fn hangup_signal() -> tokio::sync::mpsc::Receiver<()> {
    tokio::sync::mpsc::channel(1).1
}
