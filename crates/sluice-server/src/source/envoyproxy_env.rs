//! envoyproxy/ratelimit's environment, read as a sluice configuration:
//! `sluice serve --envoyproxy-env` starts from the variables a typical
//! envoyproxy/ratelimit manifest sets, so the same Deployment runs sluice.
//!
//! | variable | default | becomes |
//! |---|---|---|
//! | `HOST`, `PORT` | `0.0.0.0`, `8080` | `server.http` (also `/healthcheck`, `/json`, `/rlconfig`, `/metrics`) |
//! | `GRPC_HOST`, `GRPC_PORT` | `0.0.0.0`, `8081` | `server.grpc` |
//! | `RUNTIME_ROOT`, `RUNTIME_SUBDIRECTORY`, `RUNTIME_APPDIRECTORY` | `/srv/runtime_data/current`, ``, `config` | `envoy.config` = the three joined; every file but dot files is loaded, subdirectories included (`envoy.files: all`), reloaded when it changes (ConfigMap `..data` swaps included) |
//! | `MERGE_DOMAIN_CONFIG` | `false` | `envoy.merge_domains` |
//! | `BACKEND_TYPE` | `redis` | `redis` only (`memcache` is refused) |
//! | `REDIS_TYPE` | `SINGLE` | `SINGLE` → `redis`, `CLUSTER` → `redis-cluster` (`SENTINEL` is refused) |
//! | `REDIS_SOCKET_TYPE`, `REDIS_URL` | `unix`, `/var/run/nutcracker/ratelimit.sock` | `storage.url` (`tcp`: `host:port`, comma-separated for a cluster) |
//! | `REDIS_AUTH`, `REDIS_TLS` | none, `false` | the URL's credentials (`password` or `user:password`), `rediss://` |
//! | `LOCAL_CACHE_SIZE_IN_BYTES` | `0` | `storage.denial_cache` (on when above 0) |
//! | `NEAR_LIMIT_RATIO` | `0.8` | `near_limit` |
//! | `SHADOW_MODE` | `false` | `envoy.shadow_mode` |
//! | `LOG_LEVEL` | `WARN` | the log filter, unless `SLUICE_LOG` is set |
//! | `USE_PROMETHEUS`, `PROMETHEUS_ADDR`, `PROMETHEUS_PATH` | `false`, `:9090`, `/metrics` | `server.metrics` (the metrics also stay on `PORT`'s `/metrics`) |
//! | `QUOTA_MODE` | `false` | `true` is refused: mark descriptors `quota_mode: true` instead |
//! | `USE_STATSD`, `STATSD_HOST`, `STATSD_PORT` | `true`, … | nothing is pushed; the same counters are on `/metrics` |
//!
//! One addition the manifest needs: the pepper keys are derived with
//! (`SLUICE_PEPPER`, or a file named by `SLUICE_PEPPER_FILE`), since sluice
//! never writes descriptor values to Redis in plain. No sluice plans are
//! needed: requests outside the envoyproxy/ratelimit domains are unlimited.

use std::collections::HashMap;

use crate::Fallible;

/// The sluice configuration (YAML) the environment `vars` describe.
pub fn configuration(vars: &HashMap<String, String>) -> Fallible<String> {
    let var = |name: &str, default: &str| {
        vars.get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
            .unwrap_or(default)
            .to_owned()
    };
    let flag = |name: &str| {
        let value = var(name, "false");
        match value.to_ascii_lowercase().as_str() {
            "true" | "1" => Ok(true),
            "false" | "0" => Ok(false),
            _ => Err(format!("{name} must be true or false, got `{value}`")),
        }
    };
    let port = |name: &str, default: &str| {
        let value = var(name, default);
        value
            .parse::<u16>()
            .map_err(|_| format!("{name} must be a port number, got `{value}`"))
    };
    let http = format!("{}:{}", var("HOST", "0.0.0.0"), port("PORT", "8080")?);
    let grpc = format!(
        "{}:{}",
        var("GRPC_HOST", "0.0.0.0"),
        port("GRPC_PORT", "8081")?
    );
    let mut dir = std::path::PathBuf::from(var("RUNTIME_ROOT", "/srv/runtime_data/current"));
    let sub = var("RUNTIME_SUBDIRECTORY", "");
    if !sub.is_empty() {
        dir.push(sub);
    }
    dir.push(var("RUNTIME_APPDIRECTORY", "config"));
    match var("BACKEND_TYPE", "redis").to_ascii_lowercase().as_str() {
        "redis" => {}
        other => {
            return Err(
                format!("BACKEND_TYPE `{other}` is not supported by sluice; use redis").into(),
            );
        }
    }
    if flag("QUOTA_MODE")? {
        return Err(
            "QUOTA_MODE (every descriptor in quota mode) is not supported by sluice; mark descriptors `quota_mode: true` in the files".into(),
        );
    }
    let tls = flag("REDIS_TLS")?;
    let scheme = if tls { "rediss" } else { "redis" };
    let auth = match vars.get("REDIS_AUTH").filter(|a| !a.is_empty()) {
        None => String::new(),
        Some(auth) => match auth.split_once(':') {
            Some((user, password)) => format!("{}:{}@", encode(user), encode(password)),
            None => format!(":{}@", encode(auth)),
        },
    };
    let socket = var("REDIS_SOCKET_TYPE", "unix").to_ascii_lowercase();
    let url = var("REDIS_URL", "/var/run/nutcracker/ratelimit.sock");
    let endpoint = |address: &str| -> Fallible<String> {
        Ok(match socket.as_str() {
            "tcp" => format!("{scheme}://{auth}{}", address.trim()),
            "unix" if !tls => format!("unix://{}", address.trim()),
            "unix" => return Err("REDIS_TLS needs REDIS_SOCKET_TYPE=tcp".into()),
            other => {
                return Err(format!("REDIS_SOCKET_TYPE must be tcp or unix, got `{other}`").into());
            }
        })
    };
    let storage = match var("REDIS_TYPE", "SINGLE").to_ascii_uppercase().as_str() {
        "SINGLE" => format!("  backend: redis\n  url: {}\n", quoted(&endpoint(&url)?)),
        "CLUSTER" => {
            let nodes: Vec<String> = url
                .split(',')
                .map(|a| endpoint(a).map(|e| quoted(&e)))
                .collect::<Fallible<_>>()?;
            format!(
                "  backend: redis-cluster\n  nodes: [{}]\n",
                nodes.join(", ")
            )
        }
        other => {
            return Err(format!(
                "REDIS_TYPE `{other}` is not supported by sluice; use SINGLE or CLUSTER"
            )
            .into());
        }
    };
    let cache: u64 = var("LOCAL_CACHE_SIZE_IN_BYTES", "0").parse().map_err(|_| {
        format!(
            "LOCAL_CACHE_SIZE_IN_BYTES must be a whole number, got `{}`",
            var("LOCAL_CACHE_SIZE_IN_BYTES", "0")
        )
    })?;
    let near: f64 = var("NEAR_LIMIT_RATIO", "0.8").parse().map_err(|_| {
        format!(
            "NEAR_LIMIT_RATIO must be a number, got `{}`",
            var("NEAR_LIMIT_RATIO", "0.8")
        )
    })?;
    let pepper = if vars.contains_key("SLUICE_PEPPER_FILE") {
        format!(
            "  pepper_file: {}\n",
            quoted(&var("SLUICE_PEPPER_FILE", ""))
        )
    } else {
        "  pepper_env: SLUICE_PEPPER\n".to_owned()
    };
    let metrics = if flag("USE_PROMETHEUS")? {
        let addr = var("PROMETHEUS_ADDR", ":9090");
        let listen = match addr.rsplit_once(':') {
            Some(("", port)) => format!("0.0.0.0:{port}"),
            Some(("localhost", port)) => format!("127.0.0.1:{port}"),
            _ => addr.clone(),
        };
        if listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(format!(
                "PROMETHEUS_ADDR must be `:port` or an IP address and port such as 0.0.0.0:9090, got `{addr}`"
            )
            .into());
        }
        format!(
            "  metrics:\n    listen: {}\n    path: {}\n",
            quoted(&listen),
            quoted(&var("PROMETHEUS_PATH", "/metrics"))
        )
    } else {
        String::new()
    };
    Ok(format!(
        "server:\n  http: {http}\n  grpc: {grpc}\n{metrics}storage:\n{storage}  denial_cache: {}\nkeys:\n{pepper}near_limit: {near}\nenvoy:\n  config: {}\n  files: all\n  merge_domains: {}\n  shadow_mode: {}\n",
        cache > 0,
        quoted(&dir.display().to_string()),
        flag("MERGE_DOMAIN_CONFIG")?,
        flag("SHADOW_MODE")?,
    ))
}

/// What the environment asks for that sluice does not do, to be logged at
/// start.
pub fn notices(vars: &HashMap<String, String>) -> Vec<&'static str> {
    let statsd = vars
        .get("USE_STATSD")
        .is_none_or(|v| !matches!(v.to_ascii_lowercase().as_str(), "false" | "0"));
    let mut notices = Vec::new();
    if statsd {
        notices.push("USE_STATSD: sluice pushes no statsd; the same counters are on /metrics (ratelimit_service_rate_limit_*)");
    }
    notices
}

/// The log filter `LOG_LEVEL` asks for (envoyproxy/ratelimit's names).
pub fn log_filter(vars: &HashMap<String, String>) -> Option<&'static str> {
    let level = vars.get("LOG_LEVEL")?.to_ascii_lowercase();
    Some(match level.as_str() {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warn" | "warning" => "warn",
        "error" | "fatal" | "panic" => "error",
        _ => return None,
    })
}

/// A YAML double-quoted string.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("strings serialise")
}

/// Percent-encodes what a URL's userinfo cannot hold as it is.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_typical_manifest_becomes_a_valid_configuration() {
        let yaml = configuration(&env(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis.default.svc:6379"),
            ("REDIS_AUTH", "s3cr#t"),
            ("USE_STATSD", "false"),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
            ("NEAR_LIMIT_RATIO", "0.9"),
        ]))
        .unwrap();
        let config = sluice_core::Config::from_yaml(&yaml, "env").unwrap();
        assert_eq!(
            config.envoy.config_path.unwrap(),
            std::path::Path::new("/data/ratelimit/config")
        );
        assert!(config.envoy.all_files);
        assert_eq!(config.server.http.port(), 8080);
        assert_eq!(config.server.grpc.port(), 8081);
        assert!(config.storage.denial_cache);
        assert_eq!(config.limits.near_limit, 0.9);
        assert!(
            yaml.contains("redis://:s3cr%23t@redis.default.svc:6379"),
            "{yaml}"
        );
    }

    #[test]
    fn statsd_is_said_not_to_be_pushed_unless_turned_off() {
        assert_eq!(notices(&env(&[])).len(), 1);
        assert_eq!(notices(&env(&[("USE_STATSD", "true")])).len(), 1);
        assert!(notices(&env(&[("USE_STATSD", "false")])).is_empty());
    }

    #[test]
    fn prometheus_settings_become_a_metrics_listener() {
        let config = |pairs: &[(&str, &str)]| {
            sluice_core::Config::from_yaml(&configuration(&env(pairs)).unwrap(), "env")
                .unwrap()
                .server
                .metrics
        };
        assert_eq!(config(&[]), None);
        let m = config(&[("USE_PROMETHEUS", "true")]).unwrap();
        assert_eq!(
            (m.listen.to_string(), m.path.as_str()),
            ("0.0.0.0:9090".to_owned(), "/metrics")
        );
        let m = config(&[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "localhost:9102"),
            ("PROMETHEUS_PATH", "/stats/prometheus"),
        ])
        .unwrap();
        assert_eq!(
            (m.listen.to_string(), m.path.as_str()),
            ("127.0.0.1:9102".to_owned(), "/stats/prometheus")
        );
        let error = configuration(&env(&[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "metrics.svc:9090"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(error.contains("PROMETHEUS_ADDR"), "{error}");
    }

    #[test]
    fn what_sluice_cannot_do_is_refused_by_name() {
        for (name, value) in [
            ("BACKEND_TYPE", "memcache"),
            ("REDIS_TYPE", "SENTINEL"),
            ("SHADOW_MODE", "maybe"),
            ("PORT", "http"),
            ("USE_PROMETHEUS", "yes"),
            ("QUOTA_MODE", "true"),
        ] {
            let error = configuration(&env(&[(name, value)]))
                .unwrap_err()
                .to_string();
            assert!(error.contains(name), "{error}");
        }
    }
}
