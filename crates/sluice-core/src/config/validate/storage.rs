//! The `storage:` section: the backend, its bounds and its circuit breaker.

use std::path::PathBuf;

use super::{TOP, Validator};
use crate::config::raw::{RawStorage, S};
use crate::config::{Backend, OnError, StorageConfig, defaults};

/// Longest `storage.timeout`.
const MAX_TIMEOUT_MS: u64 = 10_000;

impl Validator<'_> {
    pub(super) fn storage(&mut self, raw: RawStorage) -> StorageConfig {
        let backend_name = raw.backend.as_ref().map_or("memory", |b| b.value.as_str());
        let backend_at = raw.backend.as_ref().map_or(TOP, |b| b.referenced);
        let backend = match backend_name {
            "memory" => Backend::Memory,
            "redis" => {
                match &raw.url {
                    Some(url) => {
                        self.redis_url(url, "storage.url");
                        Backend::Redis {
                            url: url.value.clone(),
                        }
                    }
                    None => {
                        self.push(backend_at, "`storage.backend: redis` needs `storage.url`, e.g. redis://127.0.0.1:6379");
                        Backend::Memory
                    }
                }
            }
            "redis-cluster" => match &raw.nodes {
                Some(nodes) if !nodes.value.is_empty() => {
                    for node in &nodes.value {
                        self.redis_url(node, "storage.nodes");
                    }
                    Backend::RedisCluster {
                        nodes: nodes.value.iter().map(|n| n.value.clone()).collect(),
                        global_shards: self.integer_in(
                            raw.global_shards.as_ref(),
                            "storage.global_shards",
                            u64::from(defaults::GLOBAL_SHARDS),
                            1..=1024,
                        ) as u16,
                    }
                }
                _ => {
                    self.push(
                        backend_at,
                        "`storage.backend: redis-cluster` needs `storage.nodes`, a list of seed URLs such as [redis://127.0.0.1:7000]",
                    );
                    Backend::Memory
                }
            },
            other => {
                self.push(
                    backend_at,
                    format!(
                        "unknown `storage.backend` `{other}`; allowed: memory, redis, redis-cluster"
                    ),
                );
                Backend::Memory
            }
        };
        if let Some(url) = raw.url.as_ref().filter(|_| backend_name != "redis") {
            self.push(url.referenced, "`storage.url` is only for `backend: redis`");
        }
        if let Some(shards) = raw
            .global_shards
            .as_ref()
            .filter(|_| backend_name != "redis-cluster")
        {
            self.push(
                shards.referenced,
                "`storage.global_shards` is only for `backend: redis-cluster` (elsewhere a global limit is one key)",
            );
        }
        if let Some(nodes) = raw
            .nodes
            .as_ref()
            .filter(|_| backend_name != "redis-cluster")
        {
            self.push(
                nodes.referenced,
                "`storage.nodes` is only for `backend: redis-cluster`",
            );
        }
        let timeout_ms = self.duration_in(
            raw.timeout.as_ref(),
            "storage.timeout",
            defaults::TIMEOUT_MS,
            1..=MAX_TIMEOUT_MS,
        );
        let sweep_interval_ms = self.duration_in(
            raw.sweep_interval.as_ref(),
            "storage.sweep_interval",
            defaults::SWEEP_INTERVAL_MS,
            100..=3_600_000,
        );
        let on_error = raw
            .on_error
            .as_ref()
            .map_or(OnError::Local, |o| self.on_error(o, "storage.on_error"));
        let max_entries = match raw.max_entries {
            None => defaults::MAX_ENTRIES,
            Some(m) if (1_000..=1_000_000_000).contains(&m.value) => m.value as u64,
            Some(m) => {
                self.push(
                    m.referenced,
                    format!(
                        "`storage.max_entries` must be from 1000 to 1000000000, got {}",
                        m.value
                    ),
                );
                defaults::MAX_ENTRIES
            }
        };
        // A quarter by default: a tenant making keys leaves three quarters
        // to the others.
        let max_entries_per_tenant = match raw.max_entries_per_tenant {
            None => max_entries / 4,
            Some(m) if (1..=max_entries as i64).contains(&m.value) => m.value as u64,
            Some(m) => {
                self.push(
                    m.referenced,
                    format!(
                        "`storage.max_entries_per_tenant` must be from 1 to `storage.max_entries` ({max_entries}), got {}",
                        m.value
                    ),
                );
                max_entries / 4
            }
        };
        let urls: Vec<&str> = match &backend {
            Backend::Memory => Vec::new(),
            Backend::Redis { url } => vec![url.as_str()],
            Backend::RedisCluster { nodes, .. } => nodes.iter().map(String::as_str).collect(),
        };
        let tls_ca_file = raw.tls_ca_file.map(|file| {
            if urls.is_empty() || !urls.iter().all(|u| u.starts_with("rediss://")) {
                self.push(
                    file.referenced,
                    "`storage.tls_ca_file` is for Redis over TLS: use rediss:// URLs with it",
                );
            }
            PathBuf::from(file.value)
        });
        let fallback_instances = self.integer_in(
            raw.fallback_instances.as_ref(),
            "storage.fallback_instances",
            1,
            1..=10_000,
        );
        let breaker = raw.breaker.unwrap_or_default();
        let breaker_failures = self.integer_in(
            breaker.failures.as_ref(),
            "storage.breaker.failures",
            u64::from(defaults::BREAKER_FAILURES),
            1..=1_000,
        );
        let breaker_probes = self.integer_in(
            breaker.probes.as_ref(),
            "storage.breaker.probes",
            u64::from(defaults::BREAKER_PROBES),
            1..=1_000,
        );
        let breaker_cool_down_ms = self.duration_in(
            breaker.cool_down.as_ref(),
            "storage.breaker.cool_down",
            defaults::BREAKER_COOL_DOWN_MS,
            10..=600_000,
        );
        let regions = raw.regions.map(|regions| self.regions(regions, &backend));
        StorageConfig {
            regions,
            backend,
            timeout_ms,
            on_error,
            max_entries,
            max_entries_per_tenant,
            sweep_interval_ms,
            tls_ca_file,
            fallback_instances,
            denial_cache: raw.denial_cache.is_none_or(|d| d.value),
            breaker_failures: breaker_failures as u32,
            breaker_cool_down_ms,
            breaker_probes: breaker_probes as u32,
        }
    }

    pub(super) fn redis_url(&mut self, url: &S<String>, field: &str) {
        let ok = ["redis://", "rediss://", "unix://", "redis+unix://"]
            .iter()
            .any(|scheme| url.value.starts_with(scheme) && url.value.len() > scheme.len());
        if !ok {
            // Never echo the URL: it may carry a password.
            self.push(
                url.referenced,
                format!("`{field}` must be a redis://, rediss:// or unix:// URL"),
            );
        }
    }
}
