//! The `sluice` command line.

mod bench;
mod check;
mod inspect;
mod serve;
mod usage;
mod validate;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::bench::file::{Api, Scenario};

/// Multi-tenant rate limiting: one tenant's spike never starves another, and
/// nothing about a tenant is readable from storage.
#[derive(Debug, Parser)]
#[command(name = "sluice", version)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the service (HTTP API, forward-auth, Envoy Rate Limit Service).
    Serve(ServeArgs),
    /// Make one decision and print it as JSON (exit 0 allowed, 1 denied).
    Check(CheckArgs),
    /// Check a configuration file (exit 0 valid, 1 invalid).
    Validate(ValidateArgs),
    /// Show a tenant's stored buckets in a shared store, without changing
    /// them (support tool: keys are computed here, never by hand).
    Inspect(InspectArgs),
    /// Generate load against a running service and report decisions per
    /// second and latency percentiles.
    Bench(BenchArgs),
    /// Sum usage-ledger files per tenant and period.
    Usage(UsageArgs),
}

/// `sluice usage`.
#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Ledger files (`usage-*.jsonl`) or directories of them.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The period to sum over.
    #[arg(long, value_enum, default_value_t = Period::Day)]
    by: Period,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

/// `sluice bench --scenario regions --algorithm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SharedAlgorithm {
    /// An aligned `fixed_window`.
    FixedWindow,
    /// A `sliding_window`.
    SlidingWindow,
    /// A `gcra` (a burst of a tenth of the limit).
    Gcra,
}

/// `sluice bench --scenario adaptive --store`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AdaptiveStore {
    /// One instance, its memory store.
    Memory,
    /// Two instances on one redis-server.
    Redis,
    /// Two instances on a three-node Redis Cluster.
    RedisCluster,
}

/// `sluice usage --by`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Period {
    /// Per minute (as written).
    Minute,
    /// Per hour.
    Hour,
    /// Per day (UTC).
    Day,
    /// Everything in the files.
    All,
}

/// `sluice bench`. Every setting may also come from a scenario file
/// (`--file`); a flag given on the command line wins over the file.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A scenario file (YAML): the settings below by their names
    /// (`max_in_flight`, `start_rate`; `polite` and `noisy` as
    /// `{ tenants, rate }`) and, for `mix`, `classes: [{ name, tenants,
    /// rate }]`.
    #[arg(long)]
    file: Option<PathBuf>,
    /// `closed`: `--concurrency` workers on the Envoy RLS, each sending
    /// when the previous answer came; `isolation`: polite tenants alone,
    /// then with noisy ones (open loop); `valve`: noisy tenants saturating
    /// the valve of `--route` beside polite ones, 2 s to converge and then
    /// `--seconds` measured (open loop); `throughput`: rising rates until
    /// p99 passes 5 ms (open loop); `steady`: one rate (open loop); `mix`:
    /// the `--class`es together (open loop); `hot-key`: two instances in
    /// this process on `--redis` or `--redis-cluster`, one hot tenant with
    /// a tolerance of 1% then exact (store calls per decision, admitted
    /// per aligned window); `regions`: three regions on one machine
    /// (redis-server must be installed), one budget across them, linked,
    /// partitioned and healed. Default `closed`.
    #[arg(long, value_enum)]
    scenario: Option<Scenario>,
    /// The API the open-loop scenarios load. Default `http`.
    #[arg(long, value_enum)]
    api: Option<Api>,
    /// The service: its HTTP base (default http://127.0.0.1:8080) or its
    /// gRPC address (default http://127.0.0.1:8081); several instances,
    /// comma-separated, take turns (open loop).
    #[arg(long)]
    target: Option<String>,
    /// The rate-limit domain of every request (gRPC). Default `sluice`.
    #[arg(long)]
    domain: Option<String>,
    /// The descriptor entry key; values cycle over `--values` distinct ones
    /// (`closed`). Default `tenant`.
    #[arg(long)]
    key: Option<String>,
    /// How many distinct values (buckets) (`closed`), 1 to 10000000.
    /// Default 10000.
    #[arg(long)]
    values: Option<usize>,
    /// Requests in flight at once (`closed`), 1 to 10000. Default 64.
    #[arg(long)]
    concurrency: Option<usize>,
    /// How long to run (each phase of an open-loop scenario), in seconds,
    /// 1 to 600. Default 10.
    #[arg(long)]
    seconds: Option<u64>,
    /// The route of every request (open loop). Default `POST /v1/bench`.
    #[arg(long)]
    route: Option<String>,
    /// Polite tenants, `COUNT:RATE` (requests per second each). Default
    /// `4:2` (`valve`: `1:10`).
    #[arg(long)]
    polite: Option<String>,
    /// Noisy tenants, `COUNT:RATE` (requests per second each). Default
    /// `4:200` (`valve`: `3:150`).
    #[arg(long)]
    noisy: Option<String>,
    /// A class of tenants of the `mix` scenario, `NAME:COUNT:RATE`
    /// (requests per second each); repeat for each class.
    #[arg(long = "class")]
    classes: Vec<String>,
    /// Tenants of the throughput and steady scenarios, 1 to 1000000.
    /// Default 10000.
    #[arg(long)]
    tenants: Option<usize>,
    /// The throughput scenario's first rate, or the steady scenario's rate,
    /// in requests per second, 1 to 10000000. Default 1000.
    #[arg(long)]
    start_rate: Option<f64>,
    /// The most requests in flight at once (open loop), 1 to 100000.
    /// Default 1024.
    #[arg(long)]
    max_in_flight: Option<usize>,
    /// Print the result as JSON (and no progress lines).
    #[arg(long)]
    json: bool,
    /// `regions`: the shared rule's algorithm, `fixed-window` (aligned),
    /// `sliding-window` or `gcra`. Default `fixed-window`.
    #[arg(long, value_enum)]
    algorithm: Option<SharedAlgorithm>,
    /// `adaptive`: where the limiter's state is, `memory`, `redis` or
    /// `redis-cluster` (servers this process starts). Default `redis`.
    #[arg(long, value_enum)]
    store: Option<AdaptiveStore>,
    /// `hot-key`: the Redis its two instances share, e.g.
    /// redis://127.0.0.1:6379.
    #[arg(long, conflicts_with = "redis_cluster")]
    redis: Option<String>,
    /// `hot-key`: the Redis Cluster its two instances share, every master,
    /// comma-separated (their calls are counted).
    #[arg(long)]
    redis_cluster: Option<String>,
}

/// `sluice serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Configuration file (default: the example compiled into the binary,
    /// on the embedded memory store).
    #[arg(long, short, env = "SLUICE_CONFIG")]
    config: Option<PathBuf>,
    /// HTTP address, overriding `server.http`.
    #[arg(long)]
    http: Option<SocketAddr>,
    /// gRPC address (Envoy Rate Limit Service), overriding `server.grpc`.
    #[arg(long)]
    grpc: Option<SocketAddr>,
    /// envoyproxy/ratelimit configuration (a YAML file or a directory of
    /// them), overriding `envoy.config`.
    #[arg(long)]
    envoy_config: Option<PathBuf>,
    /// Configure from envoyproxy/ratelimit's environment variables
    /// (`RUNTIME_ROOT`, `REDIS_URL`, `PORT`, …; docs/ENVOY.md) instead of a
    /// file, so its manifests start sluice.
    #[arg(long, conflicts_with = "config")]
    envoyproxy_env: bool,
}

/// `sluice check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Configuration file (default: the embedded example).
    #[arg(long, short, env = "SLUICE_CONFIG")]
    config: Option<PathBuf>,
    /// Ask a running service instead (its `/v1/check`), e.g.
    /// `http://127.0.0.1:8080`: the answer counts against its budgets.
    #[arg(long, conflicts_with = "config")]
    url: Option<String>,
    /// The duplicate guard's fingerprint.
    #[arg(long)]
    fingerprint: Option<String>,
    /// The tenant.
    #[arg(long)]
    tenant: String,
    /// The route, e.g. "POST /v1/invoices".
    #[arg(long)]
    route: String,
    /// The subject within the tenant.
    #[arg(long)]
    subject: Option<String>,
    /// Units the request consumes.
    #[arg(long, default_value_t = 1)]
    cost: i64,
}

/// `sluice inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Configuration file (its storage and keys say where to look).
    #[arg(long, short, env = "SLUICE_CONFIG")]
    config: Option<PathBuf>,
    /// Ask a running service instead (its admin API: any store, the
    /// memory store too, overrides included), e.g. http://127.0.0.1:8080.
    #[arg(long)]
    url: Option<String>,
    /// The environment variable holding the admin token (with --url).
    #[arg(long, default_value = "SLUICE_ADMIN_TOKEN")]
    token_env: String,
    /// The tenant.
    #[arg(long)]
    tenant: String,
    /// A route: adds its route, global and (with --subject) subject rules
    /// to the tenant's own.
    #[arg(long)]
    route: Option<String>,
    /// A subject within the tenant.
    #[arg(long)]
    subject: Option<String>,
}

/// `sluice validate`.
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// A sluice configuration file (with the envoyproxy/ratelimit files its
    /// `envoy.config` names), or envoyproxy/ratelimit files: one file, or a
    /// directory of them.
    file: PathBuf,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Check(args) => check::run(args),
        Command::Validate(args) => validate::run(args),
        Command::Inspect(args) => inspect::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Usage(args) => usage::run(args),
    }
}

/// Logging to stderr, filtered by `SLUICE_LOG` (e.g.
/// `SLUICE_LOG=sluice_server=debug,info`), else by `fallback`, else at
/// `info`; and, with `tracer`, the spans of `sluice_store::trace::TARGET`
/// to it (never to the log, whatever the filter).
fn init_logging_with(fallback: Option<&str>, tracer: Option<opentelemetry_sdk::trace::SdkTracer>) {
    use sluice_store::trace::TARGET;
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::prelude::*;
    let filter = std::env::var("SLUICE_LOG")
        .ok()
        .and_then(|f| f.parse::<Targets>().ok())
        .or_else(|| fallback.and_then(|f| f.parse::<Targets>().ok()))
        .unwrap_or_else(|| Targets::new().with_default(tracing::Level::INFO))
        .with_target(TARGET, LevelFilter::OFF);
    use std::io::IsTerminal;
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let Some(tracer) = tracer else {
        // One filter for the whole stack, as ever: no per-layer filter
        // state to go stale.
        let _ = tracing_subscriber::registry()
            .with(fmt)
            .with(filter)
            .try_init();
        return;
    };
    // No source locations (they show the build's paths), threads or
    // busy/idle times on spans: what OPERATIONS.md lists, no more.
    let spans = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_filter(Targets::new().with_target(TARGET, LevelFilter::TRACE));
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(spans)
        .try_init();
}
