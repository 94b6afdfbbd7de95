//! The scenarios `sluice bench` runs: what a prospect asks a limiter to
//! prove, in one command each.
//!
//! - **isolation**: polite tenants under their limit, first alone, then
//!   with noisy tenants sending many times theirs. It passes when no
//!   polite request was denied and no noisy tenant got more than the limit
//!   the service answered with; it reports polite latency with and without
//!   the noise.
//! - **valve**: noisy tenants, each inside its own limits, saturate a
//!   global valve while polite ones ask for less than their fair share:
//!   after the shares have converged, it passes when the valve denied the
//!   polite tenants at most 2% of their requests and gave each noisy
//!   tenant its share within ±25% of their mean; it reports each tenant's
//!   admitted rate.
//! - **throughput**: one class of tenants at rising rates: the highest
//!   rate at which p99 stays under 5 ms (and nothing failed).
//! - **steady**: one class at one rate, to measure at a known load.
//! - **mix**: any classes of tenants together (from `--class` or a
//!   scenario file), each reported; passes when nothing failed.

use serde::Serialize;

use super::open::{self, Class, ClassReport, Load};
use crate::Fallible;

/// How long the valve scenario lets shares converge before it measures.
pub const VALVE_CONVERGENCE: std::time::Duration = std::time::Duration::from_secs(2);
/// The valve scenario's bounds: the polite tenants' share denied, and how
/// far a noisy tenant may be from the noisy tenants' mean.
const POLITE_DENIED_PERCENT: f64 = 2.0;
const SHARE_SPREAD: f64 = 0.25;

/// One phase of a scenario and what each class saw.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// What the phase was.
    pub name: String,
    /// The offered rate, requests per second (all classes).
    pub offered_per_second: f64,
    /// Per class.
    pub classes: Vec<ClassReport>,
}

/// A scenario's result.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// `isolation`, `throughput`, `steady` or `mix`.
    pub scenario: &'static str,
    /// Every phase, in order.
    pub phases: Vec<Phase>,
    /// Whether what the scenario proves held.
    pub passed: bool,
    /// What it found, in one sentence.
    pub verdict: String,
}

fn offered(classes: &[Class]) -> f64 {
    classes.iter().map(|c| c.rate * c.tenants as f64).sum()
}

/// Isolation: `polite` alone, then `polite` with `noisy`.
pub async fn isolation(base: &Load, polite: Class, noisy: Class) -> Fallible<Outcome> {
    let alone = Load {
        classes: vec![polite.clone()],
        run: format!("{}-alone", base.run),
        ..base.clone()
    };
    let quiet = open::run(&alone).await?;
    let together = Load {
        classes: vec![polite.clone(), noisy.clone()],
        run: format!("{}-noisy", base.run),
        ..base.clone()
    };
    let loud = open::run(&together).await?;
    let (polite_report, noisy_report) = (&loud[0], &loud[1]);
    let polite_denied = polite_report.denied + quiet[0].denied;
    let errors: u64 = quiet.iter().chain(&loud).map(|c| c.errors).sum();
    // Over a run longer than a window a tenant is rightly admitted more
    // than one window's limit: the bound is what the advertised policies
    // allow over the whole run.
    let over = noisy_report
        .allowance
        .map(|allowance| noisy_report.most_admitted_per_tenant > allowance);
    let passed = polite_denied == 0 && errors == 0 && over == Some(false);
    let verdict = format!(
        "polite tenants: {} of {} denied ({:.2}%) with the noise, p99 {}µs alone and {}µs with it; noisy tenants: at most {} admitted each in {} s, where their policies allow {} (limit {}){}",
        polite_report.denied,
        polite_report.sent,
        polite_report.denied_percent(),
        quiet[0].p99_us,
        polite_report.p99_us,
        noisy_report.most_admitted_per_tenant,
        base.duration.as_secs(),
        noisy_report.allowance.map_or(
            "an unknown number (no RateLimit-Policy answered)".to_owned(),
            |a| a.to_string()
        ),
        noisy_report
            .limit
            .map_or("unknown".to_owned(), |l| l.to_string()),
        if errors > 0 {
            format!("; {errors} requests failed")
        } else {
            String::new()
        }
    );
    Ok(Outcome {
        scenario: "isolation",
        phases: vec![
            Phase {
                name: "polite alone".into(),
                offered_per_second: offered(&alone.classes),
                classes: quiet,
            },
            Phase {
                name: "polite with noisy".into(),
                offered_per_second: offered(&together.classes),
                classes: loud,
            },
        ],
        passed,
        verdict,
    })
}

/// Valve: `polite` and `noisy` together on `base.route`, a valve's route,
/// for [`VALVE_CONVERGENCE`] (shares converge) and then for
/// `base.duration` (measured), the same tenants throughout.
pub async fn valve(base: &Load, polite: Class, noisy: Class) -> Fallible<Outcome> {
    if polite.tenants.max(noisy.tenants) > open::LISTED_TENANTS {
        return Err(format!(
            "the valve scenario reports every tenant's rate: --polite and --noisy take at most {} tenants each",
            open::LISTED_TENANTS
        )
        .into());
    }
    let classes = vec![polite, noisy];
    let run = format!("{}-valve", base.run);
    let converging = Load {
        classes: classes.clone(),
        duration: VALVE_CONVERGENCE,
        run: run.clone(),
        ..base.clone()
    };
    let measured = Load {
        classes,
        run,
        ..base.clone()
    };
    let phases = vec![
        Phase {
            name: "converging".into(),
            offered_per_second: offered(&converging.classes),
            classes: open::run(&converging).await?,
        },
        Phase {
            name: "measured".into(),
            offered_per_second: offered(&measured.classes),
            classes: open::run(&measured).await?,
        },
    ];
    let seconds = base.duration.as_secs_f64();
    let (polite, noisy) = (&phases[1].classes[0], &phases[1].classes[1]);
    let rates = |c: &ClassReport| -> Vec<f64> {
        c.admitted_per_tenant
            .iter()
            .map(|&n| n as f64 / seconds)
            .collect()
    };
    let noisy_rates = rates(noisy);
    let mean = noisy_rates.iter().sum::<f64>() / noisy_rates.len().max(1) as f64;
    let even = noisy_rates
        .iter()
        .all(|r| (r - mean).abs() <= SHARE_SPREAD * mean);
    let errors: u64 = phases
        .iter()
        .flat_map(|p| &p.classes)
        .map(|c| c.errors)
        .sum();
    let polite_denied = polite.denied_percent();
    let passed = polite_denied <= POLITE_DENIED_PERCENT && even && errors == 0;
    let shown = |rates: &[f64]| {
        rates
            .iter()
            .map(|r| format!("{r:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let verdict = format!(
        "after {} s to converge, over {} s: polite tenants denied {polite_denied:.2}% (at most {POLITE_DENIED_PERCENT}%), admitted {} per second each; noisy tenants admitted {} per second each (within ±{:.0}% of their mean {mean:.1}: {}){}{}",
        VALVE_CONVERGENCE.as_secs(),
        base.duration.as_secs(),
        shown(&rates(polite)),
        shown(&noisy_rates),
        SHARE_SPREAD * 100.0,
        if even { "yes" } else { "no" },
        if errors > 0 {
            format!("; {errors} requests failed")
        } else {
            String::new()
        },
        lag_note(&phases[1..]),
    );
    Ok(Outcome {
        scenario: "valve",
        phases,
        passed,
        verdict,
    })
}

/// p99 under this is "keeping up".
const P99_BOUND_US: u64 = 5_000;

/// Requests a try of the throughput search must send for its p99 to mean
/// something: of fewer, p99 is the slowest one or two, and one stall of
/// the machine fails the rate whatever the service does.
const MIN_SAMPLES: f64 = 1_000.0;

/// Throughput: `class` at rates from `start` per second, doubling while
/// p99 stays under 5 ms, then halving the step three times between the
/// last rate that kept up and the first that did not (see
/// [`highest_rate`]); each try lasts `base.duration`. The search goes no
/// lower than the rate at which a try sends `MIN_SAMPLES` requests
/// (`start` when that is lower).
pub async fn throughput(base: &Load, class: Class, start: f64) -> Fallible<Outcome> {
    let mut phases = Vec::new();
    let mut tries = 0;
    let floor = search_floor(start, base.duration);
    let good = highest_rate(start, floor, async |rate: f64| {
        let per_tenant = rate / class.tenants.max(1) as f64;
        let load = Load {
            classes: vec![Class {
                rate: per_tenant,
                ..class.clone()
            }],
            run: format!("{}-step{tries}", base.run),
            ..base.clone()
        };
        tries += 1;
        let report = open::run(&load).await?;
        let ok = report[0].errors == 0 && report[0].p99_us < P99_BOUND_US;
        let again = phases
            .last()
            .is_some_and(|p: &Phase| p.offered_per_second == rate);
        phases.push(Phase {
            name: format!("{rate:.0}/s{}", if again { ", again" } else { "" }),
            offered_per_second: rate,
            classes: report,
        });
        Ok(ok)
    })
    .await?;
    let passed = good.is_some();
    let mut verdict = match good {
        Some(g) => format!(
            "highest rate with p99 under 5 ms and no errors: {g:.0} requests/s (a rate counts as missed when it misses twice in a row)"
        ),
        None => format!(
            "p99 stayed above 5 ms (or requests failed) at every rate tried, twice, down to {floor:.0} requests/s (a try below it sends too few requests for its p99 to mean anything)"
        ),
    };
    verdict.push_str(&lag_note(&phases));
    Ok(Outcome {
        scenario: "throughput",
        phases,
        passed,
        verdict,
    })
}

/// The lowest rate the throughput search tries: where a try of `duration`
/// sends [`MIN_SAMPLES`] requests, or `start` when that is lower.
fn search_floor(start: f64, duration: std::time::Duration) -> f64 {
    start.min(MIN_SAMPLES / duration.as_secs_f64().max(1e-3))
}

/// The search of the throughput scenario: rates from `start`, doubling
/// while `keeps_up(rate)`, halving while it does not (not below `floor`,
/// nor 1/s), then bisecting between the highest that kept up and the
/// lowest that did not until they are within 10% (at most 12 rates). A
/// rate that misses is tried once more and counts as missed only if it
/// misses again: one stall of a shared machine (or of the load generator
/// itself, which shares it) would otherwise end the search far below what
/// the service sustains. Returns the highest rate that kept up, if any.
pub async fn highest_rate(
    start: f64,
    floor: f64,
    mut keeps_up: impl AsyncFnMut(f64) -> Fallible<bool>,
) -> Fallible<Option<f64>> {
    let (mut good, mut bad): (Option<f64>, Option<f64>) = (None, None);
    let floor = floor.max(1.0);
    let mut rate = start.max(floor);
    for n in 0..12 {
        if keeps_up(rate).await? || keeps_up(rate).await? {
            good = Some(rate);
        } else {
            bad = Some(rate);
        }
        rate = match (good, bad) {
            (Some(_), None) => rate * 2.0,
            (None, Some(_)) => rate / 2.0,
            (Some(g), Some(b)) if (b - g) / b > 0.1 && n < 11 => (g + b) / 2.0,
            _ => break,
        };
        if rate < floor {
            break;
        }
    }
    Ok(good)
}

/// Steady: `class` at `rate` requests per second for `base.duration`.
/// Passes when nothing failed.
pub async fn steady(base: &Load, class: Class, rate: f64) -> Fallible<Outcome> {
    let load = Load {
        classes: vec![Class {
            rate: rate / class.tenants.max(1) as f64,
            ..class
        }],
        run: format!("{}-steady", base.run),
        ..base.clone()
    };
    let report = open::run(&load).await?;
    let errors = report[0].errors;
    let phases = vec![Phase {
        name: format!("{rate:.0}/s"),
        offered_per_second: rate,
        classes: report,
    }];
    let report = &phases[0].classes[0];
    let verdict = format!(
        "{} sent at {rate:.0}/s: p50 {}µs, p99 {}µs, {errors} errors{}",
        report.sent,
        report.p50_us,
        report.p99_us,
        lag_note(&phases)
    );
    Ok(Outcome {
        scenario: "steady",
        phases,
        passed: errors == 0,
        verdict,
    })
}

/// A generator whose own send lag (p99) passed this fell behind its
/// schedule: its latencies say as much about the machine it runs on as
/// about the service.
const LAG_NOTE_US: u64 = 1_000;

/// A warning for the verdict when the load's own send lag passed
/// [`LAG_NOTE_US`] in some phase, else nothing.
fn lag_note(phases: &[Phase]) -> String {
    let worst = phases
        .iter()
        .flat_map(|p| &p.classes)
        .map(|c| c.send_lag_p99_us)
        .max()
        .unwrap_or(0);
    if worst > LAG_NOTE_US {
        format!(
            " (the load itself sent up to {worst}µs late at p99: a busy or shared machine; the latencies are upper bounds for the service)"
        )
    } else {
        String::new()
    }
}

/// Mix: every class of `classes` at once for `base.duration`. Passes when
/// nothing failed.
pub async fn mix(base: &Load, classes: Vec<Class>) -> Fallible<Outcome> {
    let load = Load {
        classes,
        run: format!("{}-mix", base.run),
        ..base.clone()
    };
    let report = open::run(&load).await?;
    let errors: u64 = report.iter().map(|c| c.errors).sum();
    let verdict = report
        .iter()
        .map(|c| {
            format!(
                "{}: {} sent, {:.2}% denied, p99 {}µs",
                c.class,
                c.sent,
                c.denied_percent(),
                c.p99_us
            )
        })
        .chain((errors > 0).then(|| format!("{errors} requests failed")))
        .collect::<Vec<_>>()
        .join("; ");
    let phases = vec![Phase {
        name: "all classes together".into(),
        offered_per_second: offered(&load.classes),
        classes: report,
    }];
    let verdict = verdict + &lag_note(&phases);
    Ok(Outcome {
        scenario: "mix",
        phases,
        passed: errors == 0,
        verdict,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn phase(send_lag_p99_us: u64) -> Phase {
        Phase {
            name: "p".into(),
            offered_per_second: 1.0,
            classes: vec![ClassReport {
                class: "all".into(),
                tenants: 1,
                sent: 1,
                allowed: 1,
                denied: 0,
                errors: 0,
                most_admitted_per_tenant: 1,
                least_admitted_per_tenant: 1,
                admitted_per_tenant: vec![1],
                limit: None,
                allowance: None,
                p50_us: 1,
                p90_us: 1,
                p99_us: 1,
                p999_us: 1,
                max_us: 1,
                send_lag_p99_us,
            }],
        }
    }

    /// The throughput search finds the highest rate a service sustains to
    /// within 10%, never above it, though the machine stalls the first try
    /// of every third rate; and gives none when nothing keeps up, trying
    /// every rate twice and none below its floor.
    #[tokio::test]
    async fn the_throughput_search_is_not_ended_by_one_stall() {
        let sustains = 10_000.0;
        let mut tries = 0;
        let found = highest_rate(1_000.0, 1.0, async |rate: f64| {
            tries += 1;
            let stalled = tries % 3 == 1;
            Ok(rate <= sustains && !stalled)
        })
        .await
        .unwrap()
        .unwrap();
        assert!(found <= sustains && found >= 0.9 * sustains, "{found}");

        let mut rates = Vec::new();
        let none = highest_rate(1_000.0, 250.0, async |rate: f64| {
            rates.push(rate);
            Ok(false)
        })
        .await
        .unwrap();
        assert_eq!(none, None);
        assert_eq!(rates, [1_000.0, 1_000.0, 500.0, 500.0, 250.0, 250.0]);
    }

    /// A try at the throughput search's floor sends enough requests for
    /// its p99 to be more than the slowest one or two; a lower start rate
    /// is kept as the user gave it.
    #[test]
    fn the_throughput_search_stops_where_p99_stops_meaning_anything() {
        let two = std::time::Duration::from_secs(2);
        assert_eq!(search_floor(2_000.0, two), 500.0);
        assert_eq!(search_floor(2_000.0, two) * 2.0, MIN_SAMPLES);
        assert_eq!(search_floor(100.0, two), 100.0);
        assert_eq!(
            search_floor(2_000.0, std::time::Duration::from_secs(10)),
            100.0
        );
    }

    /// The valve scenario judges each noisy tenant's rate, so it refuses
    /// a class too large to list them (its check would pass on nothing),
    /// before it sends anything.
    #[tokio::test]
    async fn the_valve_scenario_refuses_classes_it_cannot_list() {
        let load = Load {
            api: open::Api::Http("http://127.0.0.1:9".into()),
            route: "POST /v1/orders".into(),
            classes: Vec::new(),
            duration: std::time::Duration::from_secs(1),
            max_in_flight: 1,
            run: "t".into(),
            progress: false,
        };
        let class = |tenants| Class {
            name: "c".into(),
            tenants,
            rate: 1.0,
        };
        let refused = valve(&load, class(1), class(open::LISTED_TENANTS + 1)).await;
        let error = refused.expect_err("refused").to_string();
        assert!(error.contains("at most 16 tenants"), "{error}");
    }

    /// A verdict warns when the load itself sent late, by its worst phase,
    /// and says nothing when it kept to its schedule.
    #[test]
    fn a_late_load_is_named_in_the_verdict() {
        assert_eq!(lag_note(&[phase(200), phase(LAG_NOTE_US)]), "");
        let note = lag_note(&[phase(200), phase(4_500), phase(1_200)]);
        assert!(note.contains("up to 4500µs late"), "{note}");
    }
}
