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
//! valves, envoyproxy/ratelimit descriptors) is one [`Policy`](sluice_core::Policy) snapshot,
//! swapped at once; a change to `server`, `storage`, `keys` or `tracing` is reported
//! and waits for a restart.
//! Without `--config`, the example configuration compiled into the binary is
//! used, so `sluice serve` works from any directory.
//!
//! The envoyproxy/ratelimit files a configuration points to are read once
//! per poll ([`envoy_files`]): what is applied is exactly the read that
//! settled, never a second read that a swap of the runtime directory may
//! have changed (or mixed) in between. [`envoyproxy_env`] reads
//! envoyproxy/ratelimit's environment variables as a configuration.

pub mod envoy_files;
pub mod envoyproxy_env;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::Config;
use sluice_core::config::Limits;
use sluice_core::descriptors::DescriptorPolicy;
use tracing::{info, warn};

use crate::Fallible;
use envoy_files::EnvoyFiles;

/// `examples/sluice.yaml`, compiled in.
pub const EXAMPLE: &str = include_str!("../../../../examples/sluice.yaml");

/// How often a configuration file is checked for changes.
const POLL: Duration = Duration::from_secs(2);

/// How long a changed configuration must read the same before it is
/// applied.
pub const SETTLE: Duration = Duration::from_secs(1);

/// Longest a reload waits for a file that keeps changing before it gives
/// up until the next change (a file rewritten constantly is not settling).
const SETTLE_AT_MOST: Duration = Duration::from_secs(30);

/// The running service a reload changes.
pub trait Reloadable: Send + Sync + 'static {
    /// Puts `limits`, with the envoyproxy/ratelimit `descriptors`, in
    /// force as one snapshot.
    fn install(&self, limits: &Limits, descriptors: DescriptorPolicy);
    /// Counts a reload: applied, or refused and the running configuration
    /// kept.
    fn reloaded(&self, applied: bool);
}

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
    /// ([`envoyproxy_env`]); its envoyproxy/ratelimit files are watched like
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
        let read = self.read()?;
        let config = self.parse(&read.text)?;
        Ok((config, Loaded(read.fingerprint)))
    }

    fn parse(&self, text: &str) -> Fallible<Config> {
        let origin = self.origin();
        Ok(match &self.envoy_config {
            Some(path) => Config::from_yaml_with_envoy_config(text, &origin, path)?,
            None => Config::from_yaml(text, &origin)?,
        })
    }

    /// The configuration's text and the envoyproxy/ratelimit files it
    /// points to, read once, with the fingerprint that tells a change.
    fn read(&self) -> Fallible<Read> {
        let text = self.text()?;
        let parsed = self.parse(&text).ok();
        let path = self
            .envoy_config
            .clone()
            .or_else(|| parsed.as_ref().and_then(|c| c.envoy.config_path.clone()));
        let all_files = parsed.as_ref().is_some_and(|c| c.envoy.all_files);
        let envoy = path.map(|path| EnvoyFiles::read(&path, all_files).map_err(|e| e.to_string()));
        let mut fingerprint = text.clone();
        match &envoy {
            Some(Ok(files)) => files.fingerprint_into(&mut fingerprint),
            Some(Err(e)) => fingerprint.push_str(e),
            None => {}
        }
        Ok(Read {
            text,
            envoy,
            fingerprint,
        })
    }
}

/// One read of a configuration: its text, the envoyproxy/ratelimit files
/// it points to (or why they could not be read), and the fingerprint of
/// both.
#[derive(Debug, Clone)]
struct Read {
    text: String,
    envoy: Option<Result<EnvoyFiles, String>>,
    fingerprint: String,
}

/// What a configuration was loaded from, to tell a later change.
#[derive(Debug, Clone)]
pub struct Loaded(String);

/// Reloads `source` into `service` on SIGHUP and when the file changes
/// from what `running` was `loaded` from. Returns at once; the work happens
/// on a background task.
pub fn spawn_reloader(
    source: Source,
    service: Arc<impl Reloadable>,
    running: Config,
    loaded: Loaded,
) {
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
                        service.reloaded(false);
                        warn!(error = %e, "configuration not reloaded; the running configuration stays in force");
                    }
                    unreadable = Some(e);
                    continue;
                }
            };
            if !forced && last.as_deref() == Some(seen.fingerprint.as_str()) {
                continue;
            }
            let Some(read) = settled(&source, seen).await else {
                continue;
            };
            last = Some(read.fingerprint.clone());
            match source
                .parse(&read.text)
                .and_then(|config| apply(&*service, &running, config, read.envoy.as_ref()))
            {
                Ok(config) => {
                    service.reloaded(true);
                    running = config;
                }
                Err(errors) => {
                    service.reloaded(false);
                    for line in errors.to_string().lines() {
                        warn!("{line}");
                    }
                    warn!("configuration not reloaded: the running configuration stays in force");
                }
            }
        }
    });
}

/// The configuration as it reads now, or why it cannot be read.
fn read(source: &Source) -> Result<Read, String> {
    source.read().map_err(|e| e.to_string())
}

/// The configuration once it has read the same for [`SETTLE`], starting
/// from what was `seen`: that read itself, applied as it is; `None` when it
/// cannot be read or keeps changing.
async fn settled(source: &Source, mut seen: Read) -> Option<Read> {
    info!("configuration changed; applying it once it has settled");
    let started = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(SETTLE).await;
        let now = read(source)
            .map_err(|e| warn!(error = %e, "configuration not reloaded"))
            .ok()?;
        if now.fingerprint == seen.fingerprint {
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
/// when it points nowhere), read now.
pub(crate) fn descriptors(config: &Config) -> Fallible<DescriptorPolicy> {
    descriptors_of(config, None)
}

/// [`descriptors`], from the files already `read` when given.
fn descriptors_of(
    config: &Config,
    read: Option<&Result<EnvoyFiles, String>>,
) -> Fallible<DescriptorPolicy> {
    let Some(path) = &config.envoy.config_path else {
        return Ok(DescriptorPolicy::default());
    };
    let files = match read {
        Some(Ok(files)) => files.clone(),
        Some(Err(e)) => return Err(e.clone().into()),
        None => EnvoyFiles::read(path, config.envoy.all_files)?,
    };
    let tolerance = config.envoy.tolerance;
    let domains: Vec<_> = files
        .domains(config.envoy.merge_domains)?
        .into_iter()
        .map(|domain| domain.with_tolerance(tolerance))
        .collect();
    for note in domains.iter().flat_map(|d| &d.notes) {
        warn!("{note}");
    }
    Ok(DescriptorPolicy::compile(
        &domains,
        config.limits.near_limit,
    ))
}

/// Applies a new configuration with the envoyproxy/ratelimit files as they
/// were `read` with it (read now when not given); all or nothing: any
/// error leaves everything as it was.
fn apply(
    service: &impl Reloadable,
    running: &Config,
    next: Config,
    read: Option<&Result<EnvoyFiles, String>>,
) -> Fallible<Config> {
    let descriptors = descriptors_of(&next, read)?;
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
        || next.tracing != running.tracing
        || next.reservation_ttl_ms != running.reservation_ttl_ms
        || next.attempt_ttl_ms != running.attempt_ttl_ms
        || mapping(&next) != mapping(running)
    {
        warn!(
            "changes to `server`, `storage`, `keys`, `tracing`, `reservation_ttl`, `attempt_ttl` or the envoy key mapping take effect on restart"
        );
    }
    service.install(&next.limits, descriptors);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::App;
    use sluice_core::Policy;
    use std::path::Path;

    /// A ConfigMap-style runtime directory: each generation a directory
    /// of its own, `..data` a symlink to the current one, every file a
    /// symlink through `..data`.
    fn generation(dir: &Path, name: &str, limit: u32) {
        let real = dir.join(name);
        std::fs::create_dir(&real).unwrap();
        for file in ["a.yaml", "b.yaml"] {
            let domain = file.trim_end_matches(".yaml");
            std::fs::write(
                real.join(file),
                format!("domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: minute, requests_per_unit: {limit} }}\n"),
            )
            .unwrap();
        }
        let swap = dir.join("..data_tmp");
        std::os::unix::fs::symlink(name, &swap).unwrap();
        std::fs::rename(&swap, dir.join("..data")).unwrap();
        for file in ["a.yaml", "b.yaml"] {
            let link = dir.join(file);
            if !link.exists() {
                std::os::unix::fs::symlink(format!("..data/{file}"), link).unwrap();
            }
        }
    }

    fn app(config: &Config) -> Arc<App> {
        let limiter = sluice_store::Limiter::new(
            Policy::compile(&config.limits),
            crate::backend::Backend::Memory(sluice_store::MemoryStore::new(1_000)),
            config.storage.on_error,
        );
        App::new(
            limiter,
            config.server.forward_auth.clone(),
            Default::default(),
        )
    }

    /// What settled is what is applied: a `..data` swap after the settle
    /// check (before, the reload read the files again and applied the new
    /// generation, or a mix of both, without it ever settling).
    #[test]
    fn a_reload_applies_exactly_what_settled() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = dir.path().join("runtime");
        std::fs::create_dir(&runtime).unwrap();
        generation(&runtime, "..gen_1", 7);
        let file = dir.path().join("sluice.yaml");
        std::fs::write(
            &file,
            format!("envoy:\n  config: {}\n  files: all\n", runtime.display()),
        )
        .unwrap();
        let source = Source::from_arg(Some(file));
        let (running, _) = source.load_as_read().unwrap();
        let app = app(&running);
        let settled = read(&source).unwrap();
        // Swapped between the settle check and the apply.
        generation(&runtime, "..gen_2", 9);
        let next = source.parse(&settled.text).unwrap();
        apply(&*app, &running, next, settled.envoy.as_ref()).unwrap();
        let applied = app.limiter.policy().descriptors().dump();
        assert!(applied.contains("requests_per_unit=7"), "{applied}");
        assert!(!applied.contains("requests_per_unit=9"), "{applied}");
    }
}
