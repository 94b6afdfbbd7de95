//! Whether traces are exported, and how: the `tracing:` block over the
//! `OTEL_*` variables it stands for. A field the block gives wins (headers
//! aside: both are sent); the variables it does not give are left to the
//! OpenTelemetry crates, which read them themselves (the exporter: endpoint
//! and headers; the resource: service name and attributes). What sluice must know itself
//! (on or off, the protocol, the sampler, the queue it counts drops
//! against, the export's timeout) it reads here; every variable either
//! reads is checked here, and one that cannot be used stops the start
//! with a message naming it. The batch processor's concurrency and
//! deadline are sluice's (`mod.rs`): `OTEL_BSP_MAX_CONCURRENT_EXPORTS`,
//! `OTEL_BSP_EXPORT_TIMEOUT` and `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` are not
//! read.

use std::time::Duration;

use sluice_core::config::tracing::{
    self as otlp, DEFAULT_QUEUE, DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS, MIN_TIMEOUT_MS, OtlpProtocol,
    SCHEDULE_DELAY_MS, SamplerKind, TraceAttributes, TracingConfig,
};

/// What the tracer is built from.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// How spans travel.
    pub protocol: OtlpProtocol,
    /// The collector's address from `tracing.endpoint`, whole (with
    /// `/v1/traces` over HTTP); `None`: the exporter reads the variables
    /// (which it does not when this is given).
    pub endpoint: Option<String>,
    /// `tracing.headers`, sent with the variables' headers (the exporter
    /// reads those whatever this says; on a name in both, theirs wins).
    pub headers: Option<Vec<(String, String)>>,
    /// How long one export may take.
    pub timeout: Duration,
    /// Which traces are sampled.
    pub sampler: SamplerKind,
    /// The ratio of a `traceidratio` sampler.
    pub ratio: f64,
    /// `service.name`; `None`: `OTEL_SERVICE_NAME` or
    /// `OTEL_RESOURCE_ATTRIBUTES` names it.
    pub service_name: Option<String>,
    /// `tracing.resource`, added to what the variables give.
    pub resource: Vec<(String, String)>,
    /// Spans waiting for export at most.
    pub queue: usize,
    /// What a decision's span tells of who asked.
    pub attributes: TraceAttributes,
    /// Variables set that sluice does not read (it sets what they would):
    /// logged at start.
    pub ignored: Vec<&'static str>,
}

/// The batch processor's variables whose settings sluice makes itself.
const NOT_READ: [&str; 3] = [
    "OTEL_BSP_MAX_CONCURRENT_EXPORTS",
    "OTEL_BSP_EXPORT_TIMEOUT",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
];

/// The name a service gets when nothing names it.
const SERVICE_NAME: &str = "sluice";

impl Settings {
    /// Tracing's settings from `config` (`tracing:`) and the variables
    /// `var` reads; `None`: tracing is off (no `tracing:` block and no
    /// collector named by `OTEL_EXPORTER_OTLP_ENDPOINT` or
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, or `OTEL_SDK_DISABLED=true`,
    /// or `OTEL_TRACES_EXPORTER=none`).
    pub fn resolve(
        config: Option<&TracingConfig>,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Settings>, String> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if let Some(disabled) = var("OTEL_SDK_DISABLED") {
            match disabled.trim().to_ascii_lowercase().as_str() {
                "true" => return Ok(None),
                "false" => {}
                other => {
                    return Err(format!(
                        "OTEL_SDK_DISABLED must be `true` or `false`, got `{other}`"
                    ));
                }
            }
        }
        match var("OTEL_TRACES_EXPORTER").as_deref().map(str::trim) {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(other) => {
                return Err(format!(
                    "OTEL_TRACES_EXPORTER must be `otlp` or `none` (sluice exports over OTLP only), got `{other}`"
                ));
            }
        }
        let named = |name: &str| -> Result<Option<String>, String> {
            match var(name) {
                Some(endpoint) => otlp::check_endpoint(endpoint.trim())
                    .map(|()| Some(endpoint))
                    .map_err(|e| format!("{name} {e}")),
                None => Ok(None),
            }
        };
        let endpoints = [
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                named("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")?,
            ),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                named("OTEL_EXPORTER_OTLP_ENDPOINT")?,
            ),
        ];
        if config.is_none() && endpoints.iter().all(|(_, e)| e.is_none()) {
            return Ok(None);
        }
        let config = config.cloned().unwrap_or_default();
        let protocol = match config.protocol {
            Some(protocol) => protocol,
            None => match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                .map(|p| ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", p))
                .or_else(|| {
                    var("OTEL_EXPORTER_OTLP_PROTOCOL").map(|p| ("OTEL_EXPORTER_OTLP_PROTOCOL", p))
                }) {
                Some((name, text)) => {
                    OtlpProtocol::parse(text.trim()).map_err(|e| format!("{name} {e}"))?
                }
                None => OtlpProtocol::HttpProtobuf,
            },
        };
        // Over gRPC the path is the service's: a path given is a mistake.
        let config_endpoint = ("tracing.endpoint", config.endpoint.clone());
        for (name, endpoint) in endpoints.iter().cloned().chain([config_endpoint]) {
            if let Some(endpoint) = endpoint {
                otlp::check_endpoint_for(endpoint.trim(), protocol)
                    .map_err(|e| format!("{name} {e}"))?;
            }
        }
        let endpoint = config.endpoint.map(|base| match protocol {
            OtlpProtocol::Grpc => base,
            OtlpProtocol::HttpProtobuf => format!("{}/v1/traces", base.trim_end_matches('/')),
        });
        let timeout_ms = match config.timeout_ms {
            Some(ms) => ms,
            None => match var("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
                .map(|t| ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", t))
                .or_else(|| {
                    var("OTEL_EXPORTER_OTLP_TIMEOUT").map(|t| ("OTEL_EXPORTER_OTLP_TIMEOUT", t))
                }) {
                Some((name, text)) => otlp::check_ms(&text, MIN_TIMEOUT_MS..=MAX_TIMEOUT_MS)
                    .map_err(|e| format!("{name} {e}"))?,
                None => DEFAULT_TIMEOUT_MS,
            },
        };
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "OTEL_EXPORTER_OTLP_HEADERS",
        ] {
            if let Some(text) = var(name) {
                for pair in text.split(',').filter(|p| !p.trim().is_empty()) {
                    let (key, value) = pair.split_once('=').ok_or_else(|| {
                        format!("{name} must be NAME=VALUE pairs separated by commas, got `{pair}`")
                    })?;
                    otlp::check_header(key.trim(), value.trim())
                        .map_err(|e| format!("{name}: {e}"))?;
                }
            }
        }
        if let Some(text) = var("OTEL_RESOURCE_ATTRIBUTES") {
            for pair in text.split(',').filter(|p| !p.trim().is_empty()) {
                let key = pair.split_once('=').map(|(k, _)| k.trim()).ok_or_else(|| {
                    format!("OTEL_RESOURCE_ATTRIBUTES must be NAME=VALUE pairs separated by commas, got `{pair}`")
                })?;
                otlp::check_key(key).map_err(|e| format!("OTEL_RESOURCE_ATTRIBUTES: {e}"))?;
            }
        }
        if let Some(text) = var("OTEL_BSP_SCHEDULE_DELAY") {
            otlp::check_ms(&text, SCHEDULE_DELAY_MS)
                .map_err(|e| format!("OTEL_BSP_SCHEDULE_DELAY {e}"))?;
        }
        for name in [
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ] {
            if let Some(text) = var(name)
                && text.trim() != "none"
            {
                return Err(format!(
                    "{name}: sluice exports uncompressed (`none`), got `{text}`"
                ));
            }
        }
        let sampler = match config.sampler {
            Some(sampler) => sampler,
            None => match var("OTEL_TRACES_SAMPLER") {
                Some(text) => SamplerKind::parse(text.trim())
                    .map_err(|e| format!("OTEL_TRACES_SAMPLER {e}"))?,
                None => SamplerKind::ParentBasedAlwaysOn,
            },
        };
        let ratio = match config.ratio {
            Some(ratio) => ratio,
            None => match var("OTEL_TRACES_SAMPLER_ARG") {
                Some(text) => text
                    .trim()
                    .parse::<f64>()
                    .map_err(|_| format!("must be a number from 0 to 1, got `{text}`"))
                    .and_then(otlp::check_ratio)
                    .map_err(|e| format!("OTEL_TRACES_SAMPLER_ARG {e}"))?,
                None => 1.0,
            },
        };
        let queue = match config.queue {
            Some(queue) => queue,
            None => match var("OTEL_BSP_MAX_QUEUE_SIZE") {
                Some(text) => {
                    otlp::check_queue(&text).map_err(|e| format!("OTEL_BSP_MAX_QUEUE_SIZE {e}"))?
                }
                None => DEFAULT_QUEUE,
            },
        };
        let named_by_variables = var("OTEL_SERVICE_NAME").is_some()
            || var("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|attributes| {
                attributes
                    .split(',')
                    .any(|pair| pair.split('=').next().map(str::trim) == Some("service.name"))
            });
        let service_name = config
            .service_name
            .or_else(|| (!named_by_variables).then(|| SERVICE_NAME.to_owned()));
        Ok(Some(Settings {
            protocol,
            endpoint,
            headers: config.headers,
            timeout: Duration::from_millis(timeout_ms),
            sampler,
            ratio,
            service_name,
            resource: config.resource.unwrap_or_default(),
            queue: queue as usize,
            attributes: config.attributes,
            ignored: NOT_READ
                .into_iter()
                .filter(|name| var(name).is_some())
                .collect(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn resolve(
        config: Option<&TracingConfig>,
        vars: &[(&str, &str)],
    ) -> Result<Option<Settings>, String> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::resolve(config, |name| vars.get(name).cloned())
    }

    #[test]
    fn off_without_a_block_or_a_collector() {
        assert_eq!(resolve(None, &[]), Ok(None));
        assert_eq!(
            resolve(None, &[("OTEL_TRACES_SAMPLER", "always_on")]),
            Ok(None)
        );
        let on = resolve(None, &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")]);
        assert!(on.unwrap().is_some());
    }

    #[test]
    fn the_variables_that_turn_it_off_win_over_the_block() {
        let block = TracingConfig::default();
        assert_eq!(
            resolve(Some(&block), &[("OTEL_SDK_DISABLED", "true")]),
            Ok(None)
        );
        assert_eq!(
            resolve(Some(&block), &[("OTEL_TRACES_EXPORTER", "none")]),
            Ok(None)
        );
        assert!(resolve(Some(&block), &[]).unwrap().is_some());
    }

    #[test]
    fn a_field_wins_over_its_variable_and_a_variable_over_the_default() {
        let block = TracingConfig {
            sampler: Some(SamplerKind::AlwaysOn),
            queue: Some(10),
            ..TracingConfig::default()
        };
        let vars = [
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "99"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ];
        let settings = resolve(Some(&block), &vars).unwrap().unwrap();
        assert_eq!(settings.sampler, SamplerKind::AlwaysOn);
        assert_eq!(settings.queue, 10);
        assert_eq!(settings.ratio, 0.25);
        assert_eq!(settings.protocol, OtlpProtocol::Grpc);
        let settings = resolve(Some(&TracingConfig::default()), &[])
            .unwrap()
            .unwrap();
        assert_eq!(settings.sampler, SamplerKind::ParentBasedAlwaysOn);
        assert_eq!(settings.protocol, OtlpProtocol::HttpProtobuf);
        assert_eq!(settings.queue, DEFAULT_QUEUE as usize);
        assert_eq!(settings.service_name.as_deref(), Some("sluice"));
    }

    #[test]
    fn an_endpoint_over_http_is_the_base_of_the_traces_path() {
        let block = |protocol| TracingConfig {
            endpoint: Some("http://collector:4318/".to_owned()),
            protocol: Some(protocol),
            ..TracingConfig::default()
        };
        let http = resolve(Some(&block(OtlpProtocol::HttpProtobuf)), &[])
            .unwrap()
            .unwrap();
        assert_eq!(
            http.endpoint.as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        let grpc = resolve(Some(&block(OtlpProtocol::Grpc)), &[])
            .unwrap()
            .unwrap();
        assert_eq!(grpc.endpoint.as_deref(), Some("http://collector:4318/"));
    }

    #[test]
    fn a_variable_that_cannot_be_used_is_named() {
        let block = TracingConfig::default();
        for (name, value) in [
            ("OTEL_TRACES_SAMPLER", "sometimes"),
            ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
            ("OTEL_TRACES_SAMPLER_ARG", "half"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "collector:4318"),
            ("OTEL_TRACES_EXPORTER", "zipkin"),
            ("OTEL_SDK_DISABLED", "yes"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:notaport"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:99999"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon"),
            ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "-5"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "600000"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "garbage"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "a=\u{1}"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x(y)=1"),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
            ("OTEL_BSP_SCHEDULE_DELAY", "soon"),
            ("OTEL_BSP_SCHEDULE_DELAY", "0"),
            ("OTEL_RESOURCE_ATTRIBUTES", "no-equals-sign"),
        ] {
            let error = resolve(Some(&block), &[(name, value)]).unwrap_err();
            assert!(error.starts_with(name), "{name}={value}: {error}");
        }
    }

    #[test]
    fn a_path_over_grpc_is_refused_wherever_it_comes_from() {
        let grpc = TracingConfig {
            protocol: Some(OtlpProtocol::Grpc),
            ..TracingConfig::default()
        };
        let error = resolve(
            Some(&grpc),
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4317/v1/traces")],
        )
        .unwrap_err();
        assert!(error.starts_with("OTEL_EXPORTER_OTLP_ENDPOINT"), "{error}");
        let with_path = TracingConfig {
            endpoint: Some("http://c:4317/x".to_owned()),
            ..TracingConfig::default()
        };
        let error =
            resolve(Some(&with_path), &[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]).unwrap_err();
        assert!(error.starts_with("tracing.endpoint"), "{error}");
        assert!(resolve(Some(&with_path), &[]).is_ok());
    }

    #[test]
    fn the_timeout_is_the_fields_else_the_variables() {
        let block = TracingConfig::default();
        let settings = resolve(Some(&block), &[("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")])
            .unwrap()
            .unwrap();
        assert_eq!(settings.timeout, Duration::from_millis(2_500));
        let settings = resolve(Some(&block), &[]).unwrap().unwrap();
        assert_eq!(settings.timeout, Duration::from_millis(DEFAULT_TIMEOUT_MS));
    }

    #[test]
    fn a_service_named_by_the_variables_is_left_to_them() {
        let block = TracingConfig::default();
        for vars in [
            [("OTEL_SERVICE_NAME", "rl")],
            [("OTEL_RESOURCE_ATTRIBUTES", "team=a,service.name=rl")],
        ] {
            let settings = resolve(Some(&block), &vars).unwrap().unwrap();
            assert_eq!(settings.service_name, None);
        }
    }
}
