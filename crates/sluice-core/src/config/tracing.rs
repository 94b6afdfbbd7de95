//! `tracing:` decisions' spans exported over OTLP. Every field stands for
//! an `OTEL_*` environment variable of the same meaning: a field given
//! here wins over its variable (headers aside: the variables' are sent
//! too), an absent one falls back to it (the server reads them), then to
//! the default. Each value is checked by the one function below, whichever
//! of the two it came from.

/// `tracing:`, as the file gives it (absent fields: `None`, the variable
/// or the default decides).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TracingConfig {
    /// The collector's address (`OTEL_EXPORTER_OTLP_ENDPOINT`): over HTTP,
    /// `/v1/traces` is appended.
    pub endpoint: Option<String>,
    /// `grpc` or `http/protobuf` (`OTEL_EXPORTER_OTLP_PROTOCOL`).
    pub protocol: Option<OtlpProtocol>,
    /// Headers sent with every export (`OTEL_EXPORTER_OTLP_HEADERS`).
    pub headers: Option<Vec<(String, String)>>,
    /// Which traces are sampled (`OTEL_TRACES_SAMPLER`).
    pub sampler: Option<SamplerKind>,
    /// The ratio of a `traceidratio` sampler (`OTEL_TRACES_SAMPLER_ARG`).
    pub ratio: Option<f64>,
    /// `service.name` (`OTEL_SERVICE_NAME`).
    pub service_name: Option<String>,
    /// More resource attributes (`OTEL_RESOURCE_ATTRIBUTES`).
    pub resource: Option<Vec<(String, String)>>,
    /// Spans waiting for export at most (`OTEL_BSP_MAX_QUEUE_SIZE`): past
    /// it, a span is dropped and counted.
    pub queue: Option<u64>,
    /// How long one export may take (`OTEL_EXPORTER_OTLP_TIMEOUT`).
    pub timeout_ms: Option<u64>,
    /// What a span tells of who asked (no variable: `none` by default).
    pub attributes: TraceAttributes,
}

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP over gRPC (port 4317 by convention).
    Grpc,
    /// OTLP over HTTP, protobuf bodies (port 4318 by convention).
    HttpProtobuf,
}

impl OtlpProtocol {
    /// `grpc` or `http/protobuf`.
    pub fn parse(text: &str) -> Result<OtlpProtocol, String> {
        match text {
            "grpc" => Ok(OtlpProtocol::Grpc),
            "http/protobuf" => Ok(OtlpProtocol::HttpProtobuf),
            other => Err(format!(
                "must be `grpc` or `http/protobuf` (`http/json` is not supported), got `{other}`"
            )),
        }
    }
}

/// Which traces are sampled, by the names of `OTEL_TRACES_SAMPLER`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplerKind {
    /// Every trace.
    AlwaysOn,
    /// None.
    AlwaysOff,
    /// A ratio of traces, by trace id.
    TraceIdRatio,
    /// As the caller sampled; a trace that starts here: always.
    ParentBasedAlwaysOn,
    /// As the caller sampled; a trace that starts here: never.
    ParentBasedAlwaysOff,
    /// As the caller sampled; a trace that starts here: by ratio.
    ParentBasedTraceIdRatio,
}

impl SamplerKind {
    /// One of the names `OTEL_TRACES_SAMPLER` takes.
    pub fn parse(text: &str) -> Result<SamplerKind, String> {
        Ok(match text {
            "always_on" => SamplerKind::AlwaysOn,
            "always_off" => SamplerKind::AlwaysOff,
            "traceidratio" => SamplerKind::TraceIdRatio,
            "parentbased_always_on" => SamplerKind::ParentBasedAlwaysOn,
            "parentbased_always_off" => SamplerKind::ParentBasedAlwaysOff,
            "parentbased_traceidratio" => SamplerKind::ParentBasedTraceIdRatio,
            other => {
                return Err(format!(
                    "must be one of always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, parentbased_traceidratio; got `{other}`"
                ));
            }
        })
    }
}

/// What a decision's span tells of who asked (`tracing.attributes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TraceAttributes {
    /// No tenant, route or subject text.
    #[default]
    None,
    /// The tenant's tag under the pepper, and the route pattern matched.
    Derived,
    /// The tenant, route and subject as sent.
    Plain,
}

impl TraceAttributes {
    /// `none`, `derived` or `plain`.
    pub fn parse(text: &str) -> Result<TraceAttributes, String> {
        match text {
            "none" => Ok(TraceAttributes::None),
            "derived" => Ok(TraceAttributes::Derived),
            "plain" => Ok(TraceAttributes::Plain),
            other => Err(format!(
                "must be `none`, `derived` or `plain`, got `{other}`"
            )),
        }
    }
}

/// Checks a collector's address: `http://HOST[:PORT][/PATH]`, the host a
/// name or an address (IPv6 in brackets), the port 1 to 65535. TLS is not
/// spoken here: a collector agent beside sluice forwards over TLS
/// (docs/OPERATIONS.md).
pub fn check_endpoint(text: &str) -> Result<(), String> {
    if text.starts_with("https://") {
        return Err(format!(
            "`{text}`: https is not supported; send to a collector agent beside sluice over http:// and let it forward over TLS"
        ));
    }
    let shape = || format!("must be http://HOST[:PORT][/PATH], got `{text}`");
    let Some(rest) = text.strip_prefix("http://") else {
        return Err(shape());
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let port = match authority.strip_prefix('[') {
        Some(v6) => {
            let (address, after) = v6.split_once(']').ok_or_else(shape)?;
            if address.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(shape());
            }
            match after {
                "" => None,
                after => Some(after.strip_prefix(':').ok_or_else(shape)?),
            }
        }
        None => {
            let (host, port) = match authority.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            };
            let name_byte = |b: u8| b.is_ascii_alphanumeric() || b"-._".contains(&b);
            if host.is_empty() || !host.bytes().all(name_byte) {
                return Err(shape());
            }
            port
        }
    };
    if let Some(port) = port
        && !(port.bytes().all(|b| b.is_ascii_digit()) && port.parse::<u16>().is_ok_and(|p| p > 0))
    {
        return Err(format!("`{text}`: the port must be 1 to 65535"));
    }
    let path_byte = |b: u8| b.is_ascii_alphanumeric() || b"/-._~".contains(&b);
    if !path.bytes().all(path_byte) {
        return Err(format!(
            "`{text}`: the path may hold letters, digits and `/-._~` only"
        ));
    }
    Ok(())
}

/// Checks a collector's address for `protocol`: as [`check_endpoint`],
/// and without a path over gRPC (its path is the service's).
pub fn check_endpoint_for(text: &str, protocol: OtlpProtocol) -> Result<(), String> {
    check_endpoint(text)?;
    if protocol == OtlpProtocol::Grpc && has_path(text) {
        return Err(format!(
            "`{text}`: a path is for http/protobuf only (over gRPC the path is the service's)"
        ));
    }
    Ok(())
}

/// Whether a collector's address has a path.
fn has_path(endpoint: &str) -> bool {
    endpoint
        .strip_prefix("http://")
        .and_then(|rest| rest.find('/').map(|at| &rest[at..]))
        .is_some_and(|path| path != "/")
}

/// The most spans waiting for export, as text (`OTEL_BSP_MAX_QUEUE_SIZE`):
/// a whole number from 1 to [`MAX_QUEUE`].
pub fn check_queue(text: &str) -> Result<u64, String> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|q| (1..=MAX_QUEUE).contains(q))
        .ok_or_else(|| format!("must be a whole number from 1 to {MAX_QUEUE}, got `{text}`"))
}

/// Milliseconds, as text (`OTEL_EXPORTER_OTLP_TIMEOUT`,
/// `OTEL_BSP_SCHEDULE_DELAY`): a whole number within `range`.
pub fn check_ms(text: &str, range: std::ops::RangeInclusive<u64>) -> Result<u64, String> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|ms| range.contains(ms))
        .ok_or_else(|| {
            format!(
                "must be milliseconds from {} to {}, got `{text}`",
                range.start(),
                range.end()
            )
        })
}

/// The shortest export timeout, in milliseconds.
pub const MIN_TIMEOUT_MS: u64 = 100;
/// How often batches leave at least, in milliseconds
/// (`OTEL_BSP_SCHEDULE_DELAY`: shorter only spins).
pub const SCHEDULE_DELAY_MS: std::ops::RangeInclusive<u64> = 100..=60_000;

/// The ratio of a `traceidratio` sampler: from 0 to 1.
pub fn check_ratio(ratio: f64) -> Result<f64, String> {
    if (0.0..=1.0).contains(&ratio) {
        Ok(ratio)
    } else {
        Err(format!("must be from 0 to 1, got {ratio}"))
    }
}

/// The most spans waiting for export: from 1 to this.
pub const MAX_QUEUE: u64 = 1_000_000;
/// Spans waiting for export at most, by default (the SDK's own).
pub const DEFAULT_QUEUE: u64 = 2_048;
/// How long one export may take, by default.
pub const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// The longest export timeout.
pub const MAX_TIMEOUT_MS: u64 = 60_000;

/// Checks a resource attribute's name: printable ASCII, no spaces or
/// separators.
pub fn check_key(key: &str) -> Result<(), String> {
    if !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_graphic() && !b",;=\"".contains(&b))
    {
        Ok(())
    } else {
        Err(format!(
            "`{key}` is not a valid name (printable ASCII, without spaces, `,`, `;`, `=` or quotes)"
        ))
    }
}

/// Checks a header sent to the collector: its name an HTTP token
/// (letters, digits and ``!#$%&'*+-.^_`|~``), its value printable ASCII.
pub fn check_header(name: &str, value: &str) -> Result<(), String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(token) {
        return Err(format!(
            "`{name}` is not a header name (letters, digits and !#$%&'*+-.^_`|~)"
        ));
    }
    if !value
        .bytes()
        .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return Err(format!("the value of `{name}` must be printable ASCII"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_is_a_plain_http_address() {
        for good in [
            "http://collector:4318",
            "http://collector",
            "http://127.0.0.1:4317",
            "http://[::1]:4317",
            "http://[::1]",
            "http://otel-collector.observability.svc:4318/custom/v1/traces",
        ] {
            assert_eq!(check_endpoint(good), Ok(()), "{good}");
        }
        for bad in [
            "https://collector:4318",
            "collector:4318",
            "http://",
            "http://:4318",
            "http://collector:notaport",
            "http://collector:99999",
            "http://collector:0",
            "http://collector:",
            "http://[::1",
            "http://[nope]:4317",
            "http://[::1]4317",
            "http://coll%ector:4318",
            "http://collector:4318/a b",
            "http://user@collector:4318",
            "http://collector:4318/?q",
        ] {
            assert!(check_endpoint(bad).is_err(), "{bad}");
        }
        let grpc = OtlpProtocol::Grpc;
        assert!(check_endpoint_for("http://c:1/v1/traces", grpc).is_err());
        assert!(check_endpoint_for("http://c:1/", grpc).is_ok());
        assert!(check_endpoint_for("http://c:1/v1/traces", OtlpProtocol::HttpProtobuf).is_ok());
        assert_eq!(check_queue("16"), Ok(16));
        assert!(check_queue("0").is_err() && check_queue("lots").is_err());
        assert_eq!(check_ms("250", 100..=1_000), Ok(250));
        assert!(check_ms("50", 100..=1_000).is_err() && check_ms("-5", 0..=9).is_err());
    }

    #[test]
    fn a_header_is_a_token_with_a_printable_value() {
        assert_eq!(check_header("authorization", "Bearer a.b-c"), Ok(()));
        assert_eq!(check_header("x-api-key", ""), Ok(()));
        for (name, value) in [
            ("x(y)", "1"),
            ("", "1"),
            ("a b", "1"),
            ("a", "x\ny"),
            ("a", "\u{1}"),
        ] {
            assert!(check_header(name, value).is_err(), "{name:?}: {value:?}");
        }
    }
}
