//! The `server:` section: listeners, forward-auth headers, connection limits.

use std::net::SocketAddr;

use super::Validator;
use crate::config::raw::{RawServer, S};
use crate::config::{
    ClientIpHeader, ConnectionLimits, ForwardAuthConfig, MetricsListener, ServerConfig, defaults,
};

impl Validator<'_> {
    pub(super) fn server(&mut self, raw: RawServer) -> ServerConfig {
        let forward = raw.forward_auth.unwrap_or_default();
        let tenant_header = match forward.tenant_header {
            Some(h) => self.header_name(&h, "server.forward_auth.tenant_header"),
            None => defaults::TENANT_HEADER.to_owned(),
        };
        let subject_header = forward
            .subject_header
            .map(|h| self.header_name(&h, "server.forward_auth.subject_header"));
        let cost_header = forward
            .cost_header
            .map(|h| self.header_name(&h, "server.forward_auth.cost_header"));
        let client_ip_subject = match &forward.subject_from {
            None => false,
            Some(f) if f.value == "header" => false,
            Some(f) if f.value == "client_ip" => {
                if subject_header.is_some() {
                    self.push(
                        f.referenced,
                        "`server.forward_auth.subject_from: client_ip` and `subject_header` exclude each other",
                    );
                }
                true
            }
            Some(f) => {
                self.push(
                    f.referenced,
                    format!(
                        "`server.forward_auth.subject_from` must be `header` or `client_ip`, got `{}`",
                        f.value
                    ),
                );
                false
            }
        };
        let mut trusted_proxies = Vec::new();
        for cidr in forward.trusted_proxies.iter().flatten() {
            let parsed = cidr.value.parse::<ipnet::IpNet>().or_else(|_| {
                cidr.value
                    .parse::<std::net::IpAddr>()
                    .map(ipnet::IpNet::from)
            });
            match parsed {
                Ok(net) => trusted_proxies.push(net),
                Err(_) => self.push(
                    cidr.referenced,
                    format!(
                        "`server.forward_auth.trusted_proxies` takes addresses or CIDRs such as 10.0.0.0/8, got `{}`",
                        cidr.value
                    ),
                ),
            }
        }
        let client_ip_header = match &forward.client_ip_header {
            None => ClientIpHeader::default(),
            Some(h) if h.value.eq_ignore_ascii_case("x-forwarded-for") => {
                ClientIpHeader::XForwardedFor
            }
            Some(h) if h.value.eq_ignore_ascii_case("forwarded") => ClientIpHeader::Forwarded,
            Some(h) => {
                self.push(
                    h.referenced,
                    format!(
                        "`server.forward_auth.client_ip_header` must be `x-forwarded-for` or `forwarded`, got `{}`",
                        h.value
                    ),
                );
                ClientIpHeader::default()
            }
        };
        let fingerprint_header = match forward.fingerprint_header {
            Some(h) => self.header_name(&h, "server.forward_auth.fingerprint_header"),
            None => defaults::FINGERPRINT_HEADER.to_owned(),
        };
        let method_headers = match forward.method_header {
            Some(h) => vec![self.header_name(&h, "server.forward_auth.method_header")],
            None => defaults::METHOD_HEADERS.map(str::to_owned).to_vec(),
        };
        let uri_headers = match forward.uri_header {
            Some(h) => vec![self.header_name(&h, "server.forward_auth.uri_header")],
            None => defaults::URI_HEADERS.map(str::to_owned).to_vec(),
        };
        let limits = raw.limits.unwrap_or_default();
        let limits = ConnectionLimits {
            max_connections: self.integer_in(
                limits.max_connections.as_ref(),
                "server.limits.max_connections",
                defaults::MAX_CONNECTIONS,
                1..=1_000_000,
            ),
            header_timeout_ms: self.duration_in(
                limits.header_timeout.as_ref(),
                "server.limits.header_timeout",
                defaults::HEADER_TIMEOUT_MS,
                100..=600_000,
            ),
            request_timeout_ms: self.duration_in(
                limits.request_timeout.as_ref(),
                "server.limits.request_timeout",
                defaults::REQUEST_TIMEOUT_MS,
                100..=600_000,
            ),
            grpc_keepalive_ms: self.duration_in(
                limits.grpc_keepalive.as_ref(),
                "server.limits.grpc_keepalive",
                defaults::GRPC_KEEPALIVE_MS,
                1_000..=3_600_000,
            ),
            grpc_max_streams: self.integer_in(
                limits.grpc_max_streams.as_ref(),
                "server.limits.grpc_max_streams",
                u64::from(defaults::GRPC_MAX_STREAMS),
                1..=65_536,
            ) as u32,
            grpc_max_message_bytes: self.integer_in(
                limits.grpc_max_message_bytes.as_ref(),
                "server.limits.grpc_max_message_bytes",
                defaults::GRPC_MAX_MESSAGE_BYTES,
                1_024..=16 * 1024 * 1024,
            ),
        };
        let metrics = raw.metrics.map(|m| {
            let at = m.referenced;
            let m = m.value;
            if m.listen.is_none() {
                self.push(at, "`server.metrics` needs `listen`, an IP address and port such as 0.0.0.0:9090");
            }
            let path = match m.path {
                None => "/metrics".to_owned(),
                Some(p) => {
                    let ok = p.value.starts_with('/')
                        && p.value.len() <= 256
                        && p.value.bytes().all(|b| b.is_ascii_graphic() && b != b'?' && b != b'#');
                    if !ok {
                        self.push(
                            p.referenced,
                            format!("`server.metrics.path` must be a path such as /metrics (at most 256 characters, no query), got `{}`", p.value),
                        );
                    }
                    p.value
                }
            };
            MetricsListener {
                listen: self.address(m.listen, "server.metrics.listen", "0.0.0.0:9090"),
                path,
            }
        });
        ServerConfig {
            metrics,
            http: self.address(raw.http, "server.http", defaults::HTTP),
            grpc: self.address(raw.grpc, "server.grpc", defaults::GRPC),
            forward_auth: ForwardAuthConfig {
                tenant_header,
                subject_header,
                cost_header,
                fingerprint_header,
                method_headers,
                uri_headers,
                client_ip_subject,
                trusted_proxies,
                client_ip_header,
            },
            limits,
        }
    }

    fn address(&mut self, raw: Option<S<String>>, field: &str, default: &str) -> SocketAddr {
        let fallback: SocketAddr = default.parse().expect("default addresses parse");
        let Some(raw) = raw else { return fallback };
        raw.value.parse().unwrap_or_else(|_| {
            self.push(
                raw.referenced,
                format!(
                    "`{field}` must be an IP address and port such as {default}, got `{}`",
                    raw.value
                ),
            );
            fallback
        })
    }

    fn header_name(&mut self, raw: &S<String>, field: &str) -> String {
        let ok = !raw.value.is_empty()
            && raw.value.len() <= 128
            && raw
                .value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !ok {
            self.push(
                raw.referenced,
                format!(
                    "`{field}` must be an HTTP header name (letters, digits, `-`), got `{}`",
                    raw.value
                ),
            );
        }
        raw.value.clone()
    }
}
