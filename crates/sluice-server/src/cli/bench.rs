use std::process::ExitCode;
use std::time::Duration;

use super::BenchArgs;
use crate::bench::file::{Api, Scenario, ScenarioFile};
use crate::bench::open::{self, Class, Load};
use crate::bench::scenario::{self, Outcome};

/// The most requests per second one class (or the throughput and steady
/// scenarios) may ask for: far beyond what one generator sends, and a
/// schedule with a gap between requests the clock can tell.
const MAX_RATE: f64 = 1e7;

/// The most classes a mix runs (each up to 100,000 tenants).
const MAX_CLASSES: usize = 64;

/// What a run is: the flags over the scenario file over the defaults.
struct Settings {
    scenario: Scenario,
    api: Api,
    target: Option<String>,
    domain: String,
    key: String,
    values: usize,
    concurrency: usize,
    seconds: u64,
    route: String,
    polite: Class,
    noisy: Class,
    classes: Vec<Class>,
    tenants: usize,
    start_rate: f64,
    max_in_flight: usize,
    json: bool,
}

impl Settings {
    /// Merges and checks: the error names the setting and its range.
    fn of(args: BenchArgs) -> Result<Settings, String> {
        let file = match &args.file {
            Some(path) => ScenarioFile::read(path)?,
            None => ScenarioFile::default(),
        };
        let scenario = args.scenario.or(file.scenario).unwrap_or(Scenario::Closed);
        let (polite_default, noisy_default) = match scenario {
            Scenario::Valve => ("1:10", "3:150"),
            _ => ("4:2", "4:200"),
        };
        let polite = match (&args.polite, file.polite) {
            (Some(spec), _) => class("polite", spec)?,
            (None, Some(c)) => checked("polite", "polite", c.tenants, c.rate)?,
            (None, None) => class("polite", polite_default)?,
        };
        let noisy = match (&args.noisy, file.noisy) {
            (Some(spec), _) => class("noisy", spec)?,
            (None, Some(c)) => checked("noisy", "noisy", c.tenants, c.rate)?,
            (None, None) => class("noisy", noisy_default)?,
        };
        let classes = if args.classes.is_empty() {
            let named = file.classes.unwrap_or_default();
            named
                .into_iter()
                .map(|c| named_class(c.name, c.tenants, c.rate))
                .collect::<Result<Vec<_>, _>>()?
        } else {
            args.classes
                .iter()
                .map(|spec| mix_class(spec))
                .collect::<Result<Vec<_>, _>>()?
        };
        if classes.len() > MAX_CLASSES {
            return Err(format!(
                "a mix has at most {MAX_CLASSES} classes; got {}",
                classes.len()
            ));
        }
        if let Some(twice) = classes
            .iter()
            .enumerate()
            .find(|(i, c)| classes[..*i].iter().any(|d| d.name == c.name))
        {
            return Err(format!(
                "class `{}` is given twice: each class needs a name of its own",
                twice.1.name
            ));
        }
        let settings = Settings {
            scenario,
            api: args.api.or(file.api).unwrap_or(Api::Http),
            target: args.target.or(file.target),
            domain: args
                .domain
                .or(file.domain)
                .unwrap_or_else(|| "sluice".into()),
            key: args.key.or(file.key).unwrap_or_else(|| "tenant".into()),
            values: args.values.or(file.values).unwrap_or(10_000),
            concurrency: args.concurrency.or(file.concurrency).unwrap_or(64),
            seconds: args.seconds.or(file.seconds).unwrap_or(10),
            route: args
                .route
                .or(file.route)
                .unwrap_or_else(|| "POST /v1/bench".into()),
            polite,
            noisy,
            classes,
            tenants: args.tenants.or(file.tenants).unwrap_or(10_000),
            start_rate: args.start_rate.or(file.start_rate).unwrap_or(1_000.0),
            max_in_flight: args.max_in_flight.or(file.max_in_flight).unwrap_or(1_024),
            json: args.json,
        };
        let within = |name: &str, value: u64, low: u64, high: u64| {
            if (low..=high).contains(&value) {
                Ok(())
            } else {
                Err(format!("{name} must be {low} to {high}; got {value}"))
            }
        };
        within("--seconds", settings.seconds, 1, 600)?;
        within("--concurrency", settings.concurrency as u64, 1, 10_000)?;
        within("--values", settings.values as u64, 1, 10_000_000)?;
        within("--max-in-flight", settings.max_in_flight as u64, 1, 100_000)?;
        within("--tenants", settings.tenants as u64, 1, 1_000_000)?;
        if !(settings.start_rate >= 1.0 && settings.start_rate <= MAX_RATE) {
            return Err(format!(
                "--start-rate must be 1 to 10000000; got {}",
                settings.start_rate
            ));
        }
        if settings.scenario == Scenario::Mix && settings.classes.is_empty() {
            return Err(
                "the mix scenario needs classes: --class NAME:COUNT:RATE (repeated), or `classes:` in --file"
                    .into(),
            );
        }
        Ok(settings)
    }
}

pub(super) fn run(args: BenchArgs) -> ExitCode {
    if args.scenario == Some(Scenario::HotKey) {
        return hot_key(&args);
    }
    if args.scenario == Some(Scenario::Regions) {
        return regions(&args);
    }
    if args.scenario == Some(Scenario::Adaptive) {
        return adaptive(&args);
    }
    if args.store.is_some() {
        eprintln!("error: --store is for --scenario adaptive (where the limiter's state is)");
        return ExitCode::from(2);
    }
    if args.algorithm.is_some() {
        eprintln!("error: --algorithm is for --scenario regions (the shared rule's algorithm)");
        return ExitCode::from(2);
    }
    let settings = match Settings::of(args) {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    if settings.scenario == Scenario::Closed {
        return closed(&runtime, &settings);
    }
    let api = match settings.api {
        Api::Http => open::Api::Http(
            settings
                .target
                .clone()
                .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned()),
        ),
        Api::Reserve => open::Api::Reserve(
            settings
                .target
                .clone()
                .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned()),
        ),
        Api::Grpc => open::Api::Grpc {
            target: settings
                .target
                .clone()
                .unwrap_or_else(|| "http://127.0.0.1:8081".to_owned()),
            domain: settings.domain.clone(),
        },
    };
    let base = Load {
        api,
        route: settings.route.clone(),
        classes: Vec::new(),
        duration: Duration::from_secs(settings.seconds),
        max_in_flight: settings.max_in_flight,
        // Fresh tenants on every run: budgets left by an earlier run do not
        // count.
        run: format!("bench{}", std::process::id()),
        progress: !settings.json,
    };
    let outcome = match settings.scenario {
        Scenario::Isolation => runtime.block_on(scenario::isolation(
            &base,
            settings.polite.clone(),
            settings.noisy.clone(),
        )),
        Scenario::Throughput | Scenario::Steady => {
            let class = Class {
                name: "all".into(),
                tenants: settings.tenants,
                rate: 0.0,
            };
            if settings.scenario == Scenario::Steady {
                runtime.block_on(scenario::steady(&base, class, settings.start_rate))
            } else {
                runtime.block_on(scenario::throughput(&base, class, settings.start_rate))
            }
        }
        Scenario::Valve => runtime.block_on(scenario::valve(
            &base,
            settings.polite.clone(),
            settings.noisy.clone(),
        )),
        Scenario::Mix => runtime.block_on(scenario::mix(&base, settings.classes.clone())),
        Scenario::Closed | Scenario::HotKey | Scenario::Regions | Scenario::Adaptive => {
            unreachable!("handled above")
        }
    };
    match outcome {
        Ok(outcome) => {
            print(&outcome, settings.json);
            if outcome.passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `COUNT:RATE` as a class.
fn class(name: &str, spec: &str) -> Result<Class, String> {
    let bad = || {
        format!(
            "--{name} takes COUNT:RATE (tenants, requests per second each), such as 4:200; got `{spec}`"
        )
    };
    let (count, rate) = spec.split_once(':').ok_or_else(bad)?;
    let tenants: usize = count.trim().parse().map_err(|_| bad())?;
    let rate: f64 = rate.trim().parse().map_err(|_| bad())?;
    checked(&format!("--{name}"), name, tenants, rate)
}

/// `NAME:COUNT:RATE` as a class of `mix`.
fn mix_class(spec: &str) -> Result<Class, String> {
    let bad = || {
        format!(
            "--class takes NAME:COUNT:RATE (a name, tenants, requests per second each), such as gold:10:50; got `{spec}`"
        )
    };
    let (name, rest) = spec.split_once(':').ok_or_else(bad)?;
    let (count, rate) = rest.split_once(':').ok_or_else(bad)?;
    let tenants: usize = count.trim().parse().map_err(|_| bad())?;
    let rate: f64 = rate.trim().parse().map_err(|_| bad())?;
    named_class(name.trim().to_owned(), tenants, rate)
}

/// A class of `mix` with its name checked: tenants' names start with it.
fn named_class(name: String, tenants: usize, rate: f64) -> Result<Class, String> {
    let fine = !name.is_empty()
        && name.len() <= 32
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !fine {
        return Err(format!(
            "a class name must be 1 to 32 letters, digits, '-' or '_'; got `{name}`"
        ));
    }
    checked(&format!("class {name}"), &name, tenants, rate)
}

/// `tenants` at `rate` each as class `name`, within the ranges; errors
/// begin with `label` (the flag, or where in the file).
fn checked(label: &str, name: &str, tenants: usize, rate: f64) -> Result<Class, String> {
    if !((1..=100_000).contains(&tenants) && rate > 0.0 && rate <= 1e6) {
        return Err(format!(
            "{label}: tenants must be 1 to 100000 and rate above 0 and at most 1000000; got {tenants} tenants at {}/s",
            sluice_core::number::shown(rate)
        ));
    }
    if tenants as f64 * rate > MAX_RATE {
        return Err(format!(
            "{label}: tenants × rate must be at most {MAX_RATE} requests per second; got {}",
            tenants as f64 * rate
        ));
    }
    Ok(Class {
        name: name.to_owned(),
        tenants,
        rate,
    })
}

fn print(outcome: &Outcome, json: bool) {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(outcome).unwrap_or_default()
        );
        return;
    }
    for phase in &outcome.phases {
        println!(
            "{} (offered {:.0}/s):",
            phase.name, phase.offered_per_second
        );
        for class in &phase.classes {
            println!("  {}", class.line());
        }
    }
    let mark = if outcome.passed { "PASS" } else { "FAIL" };
    println!("{} {mark}: {}", outcome.scenario, outcome.verdict);
}

fn closed(runtime: &tokio::runtime::Runtime, args: &Settings) -> ExitCode {
    let target = args
        .target
        .clone()
        .unwrap_or_else(|| "http://127.0.0.1:8081".to_owned());
    let load = crate::bench::rls(
        &target,
        &args.domain,
        &args.key,
        args.values,
        args.concurrency,
        Duration::from_secs(args.seconds),
    );
    match runtime.block_on(load) {
        Ok(report) => {
            println!("{}", report.summary());
            if report.errors > 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `--scenario hot-key` (see [`crate::bench::hot_key`]).
fn hot_key(args: &BenchArgs) -> ExitCode {
    use crate::bench::hot_key::{self, Shared};
    let shared = match (&args.redis, &args.redis_cluster) {
        (Some(url), None) => Shared::Redis(url.clone()),
        (None, Some(nodes)) => Shared::Cluster(nodes.split(',').map(str::to_owned).collect()),
        _ => {
            eprintln!(
                "error: the hot-key scenario needs --redis URL or --redis-cluster NODES (the store its two instances share)"
            );
            return ExitCode::from(2);
        }
    };
    let seconds = args.seconds.unwrap_or(10);
    if !(1..=600).contains(&seconds) {
        eprintln!("error: --seconds must be 1 to 600; got {seconds}");
        return ExitCode::from(2);
    }
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(hot_key::hot_key(&shared, seconds)) {
        Ok(rows) => {
            let verdict = hot_key::verdict(&rows);
            let json = serde_json::json!({ "rows": rows });
            finish(args.json, "hot-key", json, hot_key::table(&rows), verdict)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// The runtime a scenario runs on; exit code 2 when it cannot start.
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("error: {e}");
            ExitCode::from(2)
        })
}

/// Prints a scenario's result (its `detail` merged into the JSON, or its
/// table) and its verdict; the exit code says whether it passed.
fn finish(
    json: bool,
    scenario: &str,
    mut detail: serde_json::Value,
    table: String,
    (passed, verdict): (bool, String),
) -> ExitCode {
    if json {
        detail["scenario"] = scenario.into();
        detail["passed"] = passed.into();
        detail["verdict"] = verdict.into();
        println!(
            "{}",
            serde_json::to_string_pretty(&detail).unwrap_or_default()
        );
    } else {
        print!("{table}");
        let mark = if passed { "PASS" } else { "FAIL" };
        println!("{scenario} {mark}: {verdict}");
    }
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `--scenario regions` (see [`crate::bench::regions`]).
fn regions(args: &BenchArgs) -> ExitCode {
    use crate::bench::regions::{self, Settings, Shared};
    let algorithm = match args.algorithm {
        None | Some(super::SharedAlgorithm::FixedWindow) => Shared::FixedWindow,
        Some(super::SharedAlgorithm::SlidingWindow) => Shared::SlidingWindow,
        Some(super::SharedAlgorithm::Gcra) => Shared::Gcra,
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let settings = Settings {
        algorithm,
        ..Settings::default()
    };
    match runtime.block_on(regions::run(&settings)) {
        Ok(report) => {
            let verdict = regions::verdict(&report);
            let json = serde_json::json!({ "report": report });
            finish(args.json, "regions", json, regions::table(&report), verdict)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// `--scenario adaptive` (see [`crate::bench::adaptive`]).
fn adaptive(args: &BenchArgs) -> ExitCode {
    use crate::bench::adaptive::{self, Backend, Settings};
    let backend = match args.store {
        Some(super::AdaptiveStore::Memory) => Backend::Memory,
        None | Some(super::AdaptiveStore::Redis) => Backend::Redis,
        Some(super::AdaptiveStore::RedisCluster) => Backend::Cluster,
    };
    let runtime = match runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let settings = Settings {
        backend,
        ..Settings::default()
    };
    match runtime.block_on(adaptive::run(&settings)) {
        Ok(report) => {
            let verdict = adaptive::verdict(&report);
            let json = serde_json::json!({ "report": report });
            finish(
                args.json,
                "adaptive",
                json,
                adaptive::table(&report),
                verdict,
            )
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
