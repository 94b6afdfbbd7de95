use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use std::sync::atomic::Ordering;

use tokio::net::TcpListener;
use tracing::{error, info, warn};

use super::{ServeArgs, init_logging_with};
use crate::Fallible;
use crate::app::App;
use crate::listen::{self, Protocols};
use crate::source::{Source, spawn_reloader};

pub(super) fn run(args: ServeArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let served = runtime.block_on(serve(args));
    // A task still blocked (an export to a collector that never answers)
    // does not hold the exit.
    runtime.shutdown_timeout(Duration::from_millis(500));
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Configuration errors span lines; print them as they are.
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> Fallible<()> {
    let envoyproxy_vars = args
        .envoyproxy_env
        .then(|| std::env::vars().collect::<std::collections::HashMap<String, String>>());
    let source = match &envoyproxy_vars {
        Some(vars) => Source::generated(crate::source::envoyproxy_env::configuration(vars)?),
        None => Source::from_arg(args.config),
    }
    .with_envoy_config(args.envoy_config);
    let (config, loaded) = source.load_as_read()?;
    // Logging starts once the configuration says whether spans are
    // exported too (the tracer is one of its layers).
    let tracing =
        crate::traces::Settings::resolve(config.tracing.as_ref(), |name| std::env::var(name).ok())?;
    let metrics = Arc::new(crate::metrics::Metrics::with_exemplars(tracing.is_some()));
    let traces = match &tracing {
        Some(settings) => Some(crate::traces::Traces::start(
            settings,
            metrics.spans.clone(),
        )?),
        None => None,
    };
    init_logging_with(
        envoyproxy_vars
            .as_ref()
            .and_then(crate::source::envoyproxy_env::log_filter),
        traces.as_ref().map(crate::traces::Traces::tracer),
    );
    if let Some(vars) = &envoyproxy_vars {
        for notice in crate::source::envoyproxy_env::notices(vars) {
            info!("{notice}");
        }
    }
    if let Some(settings) = &tracing {
        for name in &settings.ignored {
            warn!(
                "{name} is set but not read: sluice exports one batch at a time, of at most tracing.queue spans, within tracing.timeout"
            );
        }
        info!(
            protocol = ?settings.protocol,
            sampler = ?settings.sampler,
            queue = settings.queue,
            "traces exported over OTLP"
        );
    }
    let open_files = listen::raise_open_files();
    let http = args.http.unwrap_or(config.server.http);
    let grpc = args.grpc.unwrap_or(config.server.grpc);
    let app = App::build_with(&config, metrics, tracing.as_ref()).await?;
    spawn_sweeper(&app, config.storage.sweep_interval_ms);
    spawn_slice_give_back(&app);
    spawn_adaptive_refresh(&app);
    let instance = instance_id();
    spawn_heartbeat(&app, instance.clone());
    if let Some(peers) = crate::regions::spawn(app.limiter.store(), &config.storage, &instance)? {
        let _ = app.regions.set(peers);
    }
    App::spawn_admin_sync(&app);
    crate::usage::expiry::spawn_expiry(&app);
    spawn_ledger(&app);
    let http_listener = TcpListener::bind(http)
        .await
        .map_err(|e| format!("cannot listen on {http}: {e}"))?;
    let grpc_listener = TcpListener::bind(grpc)
        .await
        .map_err(|e| format!("cannot listen on {grpc}: {e}"))?;
    let metrics_listener = match &config.server.metrics {
        Some(m) => Some((
            TcpListener::bind(m.listen)
                .await
                .map_err(|e| format!("cannot listen on {} (server.metrics): {e}", m.listen))?,
            m.path.clone(),
        )),
        None => None,
    };
    if let Some((listener, path)) = &metrics_listener {
        info!(metrics = %listener.local_addr()?, path = %path, "metrics listening");
    }
    info!(
        http = %http_listener.local_addr()?,
        grpc = %grpc_listener.local_addr()?,
        store = sluice_store::Store::name(app.limiter.store()),
        config = %source.origin(),
        open_files = open_files.unwrap_or(0),
        max_connections = config.server.limits.max_connections,
        "sluice listening"
    );
    let limits = config.server.limits;
    spawn_reloader(source, app.clone(), config, loaded);

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let signal = shutdown_signal();
    tokio::spawn(async move {
        signal.await;
        let _ = stop.send(true);
    });
    // The HTTP and gRPC listeners run on threads of their own, one
    // single-threaded runtime per core (see listen.rs); everything else
    // (reload, heartbeat, sweeper, admin sync, metrics) stays here.
    let routes = crate::grpc::grpc_routes(app.clone(), &limits).await;
    let router = crate::http::router(app.clone(), &limits);
    let (http_places, grpc_places) = (listen::places(&limits), listen::places(&limits));
    let http_socket = http_listener.into_std()?;
    let grpc_socket = grpc_listener.into_std()?;
    let io_stopped = stopped.clone();
    let servers_on_threads = listen::on_threads(listen::io_threads(), move || {
        let socket = |s: &std::net::TcpListener, name: &str| {
            s.try_clone()
                .and_then(TcpListener::from_std)
                .map_err(|e| format!("cannot share the {name} listener: {e}"))
        };
        let (http, grpc) = (socket(&http_socket, "HTTP")?, socket(&grpc_socket, "gRPC")?);
        let (router, routes, stopped) = (router.clone(), routes.clone(), io_stopped.clone());
        let (http_places, grpc_places) = (http_places.clone(), grpc_places.clone());
        Ok(async move {
            let http_server = listen::serve(
                http,
                router,
                &limits,
                Protocols::Any,
                until(stopped.clone()),
                http_places,
            );
            let grpc_server = listen::serve(
                grpc,
                routes,
                &limits,
                Protocols::Http2,
                until(stopped),
                grpc_places,
            );
            tokio::join!(http_server, grpc_server);
        })
    });
    let app_for_metrics = app.clone();
    let app_for_ledger = app.clone();
    let metrics_stopped = stopped.clone();
    let metrics_server = async move {
        if let Some((listener, path)) = metrics_listener {
            listen::serve(
                listener,
                crate::http::metrics_router(app_for_metrics, &path, &limits),
                &limits,
                Protocols::Any,
                until(metrics_stopped),
                listen::places(&limits),
            )
            .await;
        }
    };
    let servers = async { tokio::join!(servers_on_threads, metrics_server) };
    // Once asked to stop, requests in flight get DRAIN to finish; idle
    // connections (Envoy keeps its gRPC connections open) do not hold the
    // exit.
    let drain = async {
        until(stopped).await;
        tokio::time::sleep(DRAIN).await;
    };
    tokio::select! {
        (served, ()) = servers => served?,
        () = drain => info!("connections still open after the drain period; closing them"),
    }
    // What hot keys' slices still hold goes back to the store: other
    // instances may use it.
    let given = app_for_ledger.limiter.give_back_slices().await;
    if given > 0 {
        info!(units = given, "slices given back");
    }
    flush_ledger(&app_for_ledger).await;
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    info!("sluice stopped");
    Ok(())
}

/// How long a stopping instance waits for requests in flight.
const DRAIN: Duration = Duration::from_secs(5);

/// Resolves once shutdown has been asked for.
async fn until(mut stopped: tokio::sync::watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

fn spawn_sweeper(app: &Arc<App>, every_ms: u64) {
    let app = app.clone();
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_millis(every_ms));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            // The store's own upkeep included (memory: idle keys, clock).
            app.limiter.sweep();
            if let Some(memory) = app.limiter.store().memory() {
                tracing::debug!(held = memory.len(), "swept idle keys");
            }
        }
    });
}

/// Gives back what hot keys' slices held and will not spend (dropped by a
/// reload or an override that changed their rule, expired unspent as the
/// key cooled) as soon as it is dropped, and every `GIVE_BACK_EVERY` for
/// the expired ones: off the decisions' path.
fn spawn_slice_give_back(app: &Arc<App>) {
    if app.limiter.store().memory().is_some() {
        return;
    }
    let app = app.clone();
    tokio::spawn(async move {
        let every = sluice_store::limiter::slice::GIVE_BACK_EVERY;
        loop {
            tokio::select! {
                () = app.limiter.slices_dropped() => {}
                () = tokio::time::sleep(every) => {}
            }
            let given = app.limiter.give_back_dropped_slices().await;
            if given > 0 {
                tracing::debug!(units = given, "slices given back");
            }
        }
    });
}

/// Steps the adaptive valves this instance knows every 100 ms, so that
/// it reads the law every instance steps even when it hears no signal
/// itself (see `Limiter::refresh_adaptive`).
fn spawn_adaptive_refresh(app: &Arc<App>) {
    let app = app.clone();
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(Duration::from_millis(100));
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            app.limiter.refresh_adaptive().await;
        }
    });
}

/// Appends the ledger's counts every `ledger.flush_every`.
fn spawn_ledger(app: &Arc<App>) {
    let Some(ledger) = &app.ledger else { return };
    let (app, every) = (app.clone(), ledger.flush_every());
    tokio::spawn(async move {
        let mut interval = tokio::time::interval(every);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval.tick().await;
        loop {
            let ledger = app.ledger.as_ref().expect("a ledger");
            tokio::select! {
                _ = interval.tick() => {}
                () = ledger.full() => {}
            }
            flush_ledger(&app).await;
        }
    });
}

/// Appends what the ledger counted, off the runtime's threads.
async fn flush_ledger(app: &Arc<App>) {
    if app.ledger.is_none() {
        return;
    }
    let app = app.clone();
    let flushed = tokio::task::spawn_blocking(move || {
        app.ledger
            .as_ref()
            .map_or(Ok(()), |l| l.flush(crate::admin::now_ms()))
    })
    .await;
    match flushed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => error!(
            error = %e,
            "ledger: counts not written; kept for the next flush, to a new file"
        ),
        Err(e) => error!(error = %e, "ledger: flush task failed"),
    }
}

/// How often an instance announces itself in a shared store.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// Keeps this instance counted among the live ones (so that `local`
/// divides limits by the right number) and the store's health known.
fn spawn_heartbeat(app: &Arc<App>, instance: String) {
    if app.limiter.store().memory().is_some() {
        return;
    }
    let app = app.clone();
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
                Ok(beat) => {
                    app.limiter.set_live_instances(beat.live);
                    app.metrics.set_live_instances(beat.live);
                    app.store_reachable.store(true, Ordering::Relaxed);
                    let before = app
                        .other_peppers
                        .swap(beat.other_peppers, Ordering::Relaxed);
                    if beat.other_peppers > 0 && before == 0 {
                        tracing::error!(
                            instances = beat.other_peppers,
                            "other sluice instances use this store and key prefix with another pepper: their keys never meet this instance's, so every limit is enforced once by each pepper (doubled). Give every instance the same keys.pepper_env / keys.pepper_file (or another keys.prefix); /readyz fails until they agree"
                        );
                    } else if beat.other_peppers == 0 && before > 0 {
                        tracing::info!("no instance with another pepper is left on the store");
                    }
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

/// Resolves on SIGINT or SIGTERM; in-flight requests then finish. The
/// handlers are installed when this is called, not when it is first polled,
/// so a signal arriving early is not lost.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    #[cfg(unix)]
    let interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
    async move {
        #[cfg(unix)]
        {
            let wait = |signal: std::io::Result<tokio::signal::unix::Signal>| async move {
                match signal {
                    Ok(mut signal) => {
                        signal.recv().await;
                    }
                    Err(_) => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = wait(terminate) => {},
                () = wait(interrupt) => {},
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        info!("shutting down");
    }
}
