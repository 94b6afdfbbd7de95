use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::Ordering;

use tokio::net::TcpListener;
use tracing::{error, info};

use super::{ServeArgs, init_logging};
use crate::Fallible;
use crate::app::App;
use crate::source::{Source, spawn_reloader};

pub(super) fn run(args: ServeArgs) -> ExitCode {
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            error!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Configuration errors span lines; print them as they are.
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> Fallible<()> {
    let source = Source::from_arg(args.config);
    let config = source.load()?;
    let http = args.http.unwrap_or(config.server.http);
    let app = App::build(&config).await?;
    spawn_sweeper(&app, config.storage.sweep_interval_ms);
    spawn_heartbeat(&app);
    let listener = TcpListener::bind(http)
        .await
        .map_err(|e| format!("cannot listen on {http}: {e}"))?;
    info!(
        http = %listener.local_addr()?,
        store = app.limiter.store().name(),
        config = %source.origin(),
        "sluice listening"
    );
    spawn_reloader(source, app.clone(), config);
    axum::serve(listener, crate::http::router(app))
        .with_graceful_shutdown(shutdown_signal())
        .await?;
    info!("sluice stopped");
    Ok(())
}

fn spawn_sweeper(app: &Arc<App>, every_ms: u64) {
    let app = app.clone();
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_millis(every_ms));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            app.limiter.sweep();
            if let Some(memory) = app.limiter.store().memory() {
                memory.clock().resync();
                let dropped = memory.sweep();
                tracing::debug!(dropped, held = memory.len(), "swept idle keys");
            }
        }
    });
}

/// How often an instance announces itself in a shared store.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// Keeps this instance counted among the live ones (so that `local`
/// divides limits by the right number) and the store's health known.
fn spawn_heartbeat(app: &Arc<App>) {
    if app.limiter.store().memory().is_some() {
        return;
    }
    let app = app.clone();
    let instance = instance_id();
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(HEARTBEAT);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            match app
                .limiter
                .store()
                .heartbeat(&instance, 3 * HEARTBEAT)
                .await
            {
                Ok(live) => {
                    app.limiter.set_live_instances(live);
                    app.metrics.set_live_instances(live);
                    app.store_reachable.store(true, Ordering::Relaxed);
                }
                Err(e) => {
                    if app.store_reachable.swap(false, Ordering::Relaxed) {
                        tracing::warn!(error = %e, "the store stopped answering");
                    }
                }
            }
        }
    });
}

/// A random id for this process, so heartbeats of instances never collide.
fn instance_id() -> String {
    use std::hash::BuildHasher;
    let seed = std::collections::hash_map::RandomState::new().hash_one(std::process::id());
    format!("{seed:016x}")
}

/// Resolves on SIGINT or SIGTERM; in-flight requests then finish.
async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
    info!("shutting down");
}
