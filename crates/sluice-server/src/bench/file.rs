//! A scenario file: `sluice bench --file`'s settings, as YAML.
//!
//! ```yaml
//! scenario: mix            # closed | isolation | throughput | steady | mix
//! api: grpc                # http | grpc
//! target: http://127.0.0.1:8081
//! seconds: 10
//! route: "POST /v1/invoices"
//! classes:                 # mix: any classes, together
//!   - { name: gold, tenants: 10, rate: 50 }
//!   - { name: free, tenants: 1000, rate: 1 }
//!   - { name: abuser, tenants: 2, rate: 2000 }
//! # isolation: polite: { tenants: 4, rate: 2 }, noisy: { tenants: 4, rate: 200 }
//! # throughput, steady: tenants, start_rate; closed: domain, key, values, concurrency
//! ```
//!
//! Every field is optional; unknown fields are refused (a misspelt
//! setting would otherwise be silently ignored). Ranges are checked where
//! the flags' are, with the same messages.

use std::path::Path;

use serde::Deserialize;

/// `sluice bench --scenario`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// Closed loop on the Envoy RLS.
    Closed,
    /// Polite tenants with and without noisy ones.
    Isolation,
    /// Noisy tenants saturating a valve (`--route`) with polite ones below
    /// their share: each tenant's admitted rate.
    Valve,
    /// The highest rate with p99 under 5 ms.
    Throughput,
    /// `--start-rate` requests per second over `--tenants` for
    /// `--seconds` (to measure at a known load).
    Steady,
    /// Every `--class` together for `--seconds`, each reported.
    Mix,
    /// Two instances on `--redis` (or `--redis-cluster`) hammering one
    /// tenant whose rule has a tolerance, then exactly: store calls per
    /// decision, admitted per aligned window.
    #[serde(rename = "hot-key")]
    HotKey,
    /// Three regions on one machine (three redis-server processes this
    /// process starts, linked through a delay proxy): one budget across
    /// them, linked, partitioned and healed.
    Regions,
    /// An adaptive valve before a downstream of limited capacity (the
    /// test kit's), offered twice what it serves by a critical tenant and
    /// a low one, beside no valve and a static valve, then its workers
    /// halved (`--store`: where the limiter's state is).
    Adaptive,
}

/// `sluice bench --api`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    /// `POST /v1/check`.
    Http,
    /// Envoy RLS `ShouldRateLimit`, native domain.
    Grpc,
    /// `POST /v1/check` with `"reserve": true`, then `POST /v1/settle` of
    /// the reservation (at 0, 1 or 2 units in turn: 1 on average, the
    /// estimate): what usage known after the fact costs per decision.
    Reserve,
}

/// The settings a scenario file may give.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    /// Which scenario.
    pub scenario: Option<Scenario>,
    /// Which API the open-loop scenarios load.
    pub api: Option<Api>,
    /// The service's address.
    pub target: Option<String>,
    /// The rate-limit domain (gRPC).
    pub domain: Option<String>,
    /// The descriptor entry key (`closed`).
    pub key: Option<String>,
    /// Distinct values (`closed`).
    pub values: Option<usize>,
    /// Requests in flight (`closed`).
    pub concurrency: Option<usize>,
    /// Seconds per phase.
    pub seconds: Option<u64>,
    /// The route of every request.
    pub route: Option<String>,
    /// Polite tenants (`isolation`).
    pub polite: Option<ClassSpec>,
    /// Noisy tenants (`isolation`).
    pub noisy: Option<ClassSpec>,
    /// The classes of `mix`.
    pub classes: Option<Vec<NamedClass>>,
    /// Tenants (`throughput`, `steady`).
    pub tenants: Option<usize>,
    /// First or only rate (`throughput`, `steady`).
    pub start_rate: Option<f64>,
    /// The most requests in flight at once (open loop).
    pub max_in_flight: Option<usize>,
}

/// A class whose name the scenario gives (`polite`, `noisy`).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassSpec {
    /// How many tenants.
    pub tenants: usize,
    /// Requests per second per tenant.
    pub rate: f64,
}

/// A class of `mix`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedClass {
    /// Shown in reports, and the prefix of its tenants' names.
    pub name: String,
    /// How many tenants.
    pub tenants: usize,
    /// Requests per second per tenant.
    pub rate: f64,
}

impl ScenarioFile {
    /// Reads and parses `path`; the error names the file and what is wrong
    /// where.
    pub fn read(path: &Path) -> Result<ScenarioFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if text.trim().is_empty() {
            return Ok(ScenarioFile::default());
        }
        serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scenario file docs/OPERATIONS.md shows is one `--file` reads.
    #[test]
    fn the_documented_scenario_file_reads() {
        let doc = include_str!("../../../../docs/OPERATIONS.md");
        let section = &doc[doc.find("## Load testing").expect("the section")..];
        let start = section.find("```yaml\n").expect("its example") + "```yaml\n".len();
        let example = &section[start..start + section[start..].find("```").unwrap()];
        let file: ScenarioFile = serde_saphyr::from_str(example).unwrap();
        assert_eq!(file.scenario, Some(Scenario::Mix));
        assert_eq!(file.api, Some(Api::Http));
        let classes = file.classes.unwrap();
        assert_eq!(classes.len(), 3);
        assert_eq!(classes[2].name, "abuser");
        assert_eq!((classes[2].tenants, classes[2].rate), (2, 2000.0));
    }
}
