//! Where the configuration comes from, and reloading it.
//!
//! With `--config FILE` the file is read, validated and watched: a change
//! (checked every two seconds) or SIGHUP reloads it. A changed file is
//! applied only once it has read the same for [`SETTLE`]: an editor that
//! writes in place, caught half-way, often leaves valid YAML (a `tenants:`
//! section cut short), and applying it would put the missing tenants on the
//! default plan until the rest lands. A reload that fails validation is
//! logged and ignored, so an invalid file never replaces a running
//! configuration. Everything derived from the files (plans, tenants,
//! valves, envoyproxy/ratelimit descriptors) is one [`Policy`] snapshot,
//! swapped at once; a change to `server`, `storage` or `keys` is reported
//! and waits for a restart.
//! Without `--config`, the example configuration compiled into the binary is
//! used, so `sluice serve` works from any directory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::descriptors::DescriptorPolicy;
use sluice_core::{Config, Policy};
use tracing::{info, warn};

use crate::Fallible;
use crate::app::App;

/// `examples/sluice.yaml`, compiled in.
pub const EXAMPLE: &str = include_str!("../../../examples/sluice.yaml");

/// How often a configuration file is checked for changes.
const POLL: Duration = Duration::from_secs(2);

/// How long a changed configuration must read the same before it is
/// applied.
pub const SETTLE: Duration = Duration::from_secs(1);

/// Longest a reload waits for a file that keeps changing before it gives
/// up until the next change (a file rewritten constantly is not settling).
const SETTLE_AT_MOST: Duration = Duration::from_secs(30);

/// A configuration file (or the embedded example), and where the
/// envoyproxy/ratelimit configuration comes from when the command line says.
#[derive(Debug, Clone)]
pub struct Source {
    file: Option<PathBuf>,
    envoy_config: Option<PathBuf>,
    /// A configuration made from envoyproxy/ratelimit's environment
    /// (`serve --envoyproxy-env`), in place of a file.
    generated: Option<String>,
}

impl Source {
    /// `Some(path)` → that file; `None` → the embedded example.
    pub fn from_arg(path: Option<PathBuf>) -> Source {
        Source {
            file: path,
            envoy_config: None,
            generated: None,
        }
    }

    /// A configuration made from envoyproxy/ratelimit's environment
    /// ([`crate::compat`]); its envoyproxy/ratelimit files are watched like
    /// a file's.
    pub fn generated(text: String) -> Source {
        Source {
            file: None,
            envoy_config: None,
            generated: Some(text),
        }
    }

    /// Takes the envoyproxy/ratelimit configuration from `path` rather than
    /// from `envoy.config`.
    pub fn with_envoy_config(mut self, path: Option<PathBuf>) -> Source {
        self.envoy_config = path;
        self
    }

    /// How errors name this source.
    pub fn origin(&self) -> String {
        match (&self.file, &self.generated) {
            (Some(path), _) => path.display().to_string(),
            (None, Some(_)) => "<envoyproxy/ratelimit environment>".to_owned(),
            (None, None) => "<embedded examples/sluice.yaml>".to_owned(),
        }
    }

    /// The raw text.
    pub fn text(&self) -> Fallible<String> {
        match &self.file {
            None => Ok(self.generated.clone().unwrap_or_else(|| EXAMPLE.to_owned())),
            Some(path) => std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()).into()),
        }
    }

    /// Reads and validates the configuration.
    pub fn load(&self) -> Fallible<Config> {
        Ok(self.load_as_read()?.0)
    }

    /// Reads and validates the configuration, with what it read (the
    /// reloader compares later reads with exactly that).
    pub fn load_as_read(&self) -> Fallible<(Config, Loaded)> {
        let text = self.text()?;
        let config = self.parse(&text)?;
        let loaded = Loaded(self.fingerprint(&text));
        Ok((config, loaded))
    }

    fn parse(&self, text: &str) -> Fallible<Config> {
        let origin = self.origin();
        Ok(match &self.envoy_config {
            Some(path) => Config::from_yaml_with_envoy_config(text, &origin, path)?,
            None => Config::from_yaml(text, &origin)?,
        })
    }

    /// Everything a reload depends on, to tell whether it changed: the
    /// file, and the envoyproxy/ratelimit files it points to.
    fn fingerprint(&self, text: &str) -> String {
        let mut all = text.to_owned();
        let envoy = self
            .envoy_config
            .clone()
            .or_else(|| self.parse(text).ok().and_then(|c| c.envoy.config_path));
        if let Some(path) = envoy {
            // Every file either mode would read, subdirectories included.
            let files: Vec<PathBuf> = if path.is_dir() {
                crate::envoy::files::names(&path, true)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|name| path.join(name))
                    .collect()
            } else {
                vec![path]
            };
            for file in files {
                all.push_str(&file.display().to_string());
                all.push_str(&std::fs::read_to_string(&file).unwrap_or_default());
            }
        }
        all
    }
}

/// What a configuration was loaded from, to tell a later change.
#[derive(Debug, Clone)]
pub struct Loaded(String);

/// Reloads `source` on SIGHUP and when the file changes from what `running`
/// was `loaded` from. Returns at once; the work happens on a background
/// task.
pub fn spawn_reloader(source: Source, app: Arc<App>, running: Config, loaded: Loaded) {
    if source.file.is_none() && source.generated.is_none() {
        return;
    }
    tokio::spawn(async move {
        let mut running = running;
        let mut last = Some(loaded.0);
        let mut interval = tokio::time::interval(POLL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut hangup = hangup_signal();
        // Why the file could not be read at the last poll: said once, not
        // on every poll while it stays unreadable.
        let mut unreadable: Option<String> = None;
        loop {
            let forced = tokio::select! {
                _ = interval.tick() => false,
                Some(()) = hangup.recv() => true,
            };
            let seen = match read(&source) {
                Ok(seen) => {
                    if unreadable.take().is_some() {
                        info!("configuration readable again");
                    }
                    seen
                }
                Err(e) => {
                    if forced || unreadable.as_ref() != Some(&e) {
                        app.metrics.reload(false);
                        warn!(error = %e, "configuration not reloaded; the running configuration stays in force");
                    }
                    unreadable = Some(e);
                    continue;
                }
            };
            if !forced && last.as_deref() == Some(seen.1.as_str()) {
                continue;
            }
            let Some((text, fingerprint)) = settled(&source, seen).await else {
                continue;
            };
            last = Some(fingerprint);
            match source
                .parse(&text)
                .and_then(|config| apply(&app, &running, config))
            {
                Ok(config) => {
                    app.metrics.reload(true);
                    running = config;
                }
                Err(errors) => {
                    app.metrics.reload(false);
                    for line in errors.to_string().lines() {
                        warn!("{line}");
                    }
                    warn!("configuration not reloaded: the running configuration stays in force");
                }
            }
        }
    });
}

/// The configuration's text and its fingerprint, as they read now, or why
/// they cannot be read.
fn read(source: &Source) -> Result<(String, String), String> {
    let text = source.text().map_err(|e| e.to_string())?;
    let fingerprint = source.fingerprint(&text);
    Ok((text, fingerprint))
}

/// The configuration's text and fingerprint once they have read the same
/// for [`SETTLE`], starting from what was `seen`; `None` when it cannot be
/// read or keeps changing.
async fn settled(source: &Source, mut seen: (String, String)) -> Option<(String, String)> {
    info!("configuration changed; applying it once it has settled");
    let started = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(SETTLE).await;
        let now = read(source)
            .map_err(|e| warn!(error = %e, "configuration not reloaded"))
            .ok()?;
        if now.1 == seen.1 {
            return Some(now);
        }
        if started.elapsed() > SETTLE_AT_MOST {
            warn!("configuration keeps changing; not reloaded until it settles");
            return None;
        }
        info!("configuration still changing; waiting for it to settle");
        seen = now;
    }
}

/// The envoyproxy/ratelimit domains `config` points to, compiled (none
/// when it points nowhere).
pub(crate) fn descriptors(config: &Config) -> Fallible<DescriptorPolicy> {
    Ok(match &config.envoy.config_path {
        Some(path) => {
            let domains = crate::envoy::load_envoy_files(
                path,
                config.envoy.all_files,
                config.envoy.merge_domains,
            )?;
            for note in domains.iter().flat_map(|d| &d.notes) {
                warn!("{note}");
            }
            DescriptorPolicy::compile(&domains, config.limits.near_limit)
        }
        None => DescriptorPolicy::default(),
    })
}

/// Applies a new configuration, envoyproxy/ratelimit files included; all
/// or nothing: any error leaves everything as it was.
fn apply(app: &App, running: &Config, next: Config) -> Fallible<Config> {
    let descriptors = descriptors(&next)?;
    let mapping = |c: &Config| {
        (
            c.envoy.domain.clone(),
            c.envoy.tenant_key.clone(),
            c.envoy.route_key.clone(),
            c.envoy.subject_key.clone(),
        )
    };
    if next.server != running.server
        || next.storage != running.storage
        || next.keys != running.keys
        || mapping(&next) != mapping(running)
    {
        warn!(
            "changes to `server`, `storage`, `keys` or the envoy key mapping take effect on restart"
        );
    }
    let sharded = app.limiter.store().shards_tenants();
    app.limiter
        .set_policy(Policy::compile_for(&next.limits, sharded).with_descriptors(descriptors));
    // Overrides stay in force over the new limits.
    app.admin.install(app, &next.limits, sharded);
    info!(
        plans = next.limits.plans.len(),
        tenants = next.limits.tenants.len(),
        "configuration reloaded"
    );
    Ok(next)
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
