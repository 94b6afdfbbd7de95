use std::process::ExitCode;
use std::time::Duration;

use super::{Api, BenchArgs, Scenario};
use crate::bench::open::{self, Class, Load};
use crate::bench::scenario::{self, Outcome};

pub(super) fn run(args: BenchArgs) -> ExitCode {
    if args.seconds == 0 || args.seconds > 600 || args.concurrency == 0 || args.concurrency > 10_000
    {
        eprintln!("error: --seconds must be 1 to 600 and --concurrency 1 to 10000");
        return ExitCode::from(2);
    }
    if args.max_in_flight == 0 || args.max_in_flight > 100_000 {
        eprintln!("error: --max-in-flight must be 1 to 100000");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if args.scenario == Scenario::Closed {
        return closed(&runtime, &args);
    }
    let api = match args.api {
        Api::Http => open::Api::Http(
            args.target
                .clone()
                .unwrap_or_else(|| "http://127.0.0.1:8080".to_owned()),
        ),
        Api::Grpc => open::Api::Grpc {
            target: args
                .target
                .clone()
                .unwrap_or_else(|| "http://127.0.0.1:8081".to_owned()),
            domain: args.domain.clone(),
        },
    };
    let base = Load {
        api,
        route: args.route.clone(),
        classes: Vec::new(),
        duration: Duration::from_secs(args.seconds),
        max_in_flight: args.max_in_flight,
        // Fresh tenants on every run: budgets left by an earlier run do not
        // count.
        run: format!("bench{}", std::process::id()),
        progress: !args.json,
    };
    let outcome = match args.scenario {
        Scenario::Isolation => {
            let (polite, noisy) = match (class("polite", &args.polite), class("noisy", &args.noisy))
            {
                (Ok(p), Ok(n)) => (p, n),
                (Err(e), _) | (_, Err(e)) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(2);
                }
            };
            runtime.block_on(scenario::isolation(&base, polite, noisy))
        }
        Scenario::Throughput | Scenario::Steady => {
            if args.tenants == 0 || !(args.start_rate > 0.0 && args.start_rate <= 1e7) {
                eprintln!(
                    "error: --tenants must be at least 1 and --start-rate from 1 to 10000000"
                );
                return ExitCode::from(2);
            }
            let class = Class {
                name: "all".into(),
                tenants: args.tenants,
                rate: 0.0,
            };
            if args.scenario == Scenario::Steady {
                runtime.block_on(scenario::steady(&base, class, args.start_rate))
            } else {
                runtime.block_on(scenario::throughput(&base, class, args.start_rate))
            }
        }
        Scenario::Closed => unreachable!("handled above"),
    };
    match outcome {
        Ok(outcome) => {
            print(&outcome, args.json);
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
    if !((1..=100_000).contains(&tenants) && rate > 0.0 && rate <= 1e6) {
        return Err(format!(
            "--{name}: COUNT must be 1 to 100000 and RATE above 0 and at most 1000000; got `{spec}`"
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

fn closed(runtime: &tokio::runtime::Runtime, args: &BenchArgs) -> ExitCode {
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
        Ok(mut report) => {
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
