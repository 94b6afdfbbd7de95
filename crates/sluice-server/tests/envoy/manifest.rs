//! An envoyproxy/ratelimit Deployment's environment and ConfigMap
//! starting sluice.

use super::*;

/// A Kubernetes ConfigMap as mounted: the files are symlinks into `..data`,
/// itself a symlink to a timestamped directory that an update swaps.
fn configmap(dir: &std::path::Path, version: &str, files: &[(&str, &str)]) {
    let stamped = dir.join(format!("..{version}"));
    std::fs::create_dir_all(&stamped).unwrap();
    for (name, text) in files {
        std::fs::write(stamped.join(name), text).unwrap();
        let link = dir.join(name);
        if !link.exists() {
            std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
        }
    }
    let next = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&next);
    std::os::unix::fs::symlink(format!("..{version}"), &next).unwrap();
    std::fs::rename(&next, dir.join("..data")).unwrap();
}

#[tokio::test]
async fn an_envoyproxy_ratelimit_manifest_starts_sluice() {
    let redis = RedisServer::start();
    let runtime = temp_dir("runtime");
    let root = runtime.path();
    let config = root.join("ratelimit").join("config");
    std::fs::create_dir_all(&config).unwrap();
    let limit = |n: u32| {
        format!(
            "domain: k8s\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: {n} }}\n"
        )
    };
    // Every file of the directory is loaded, with or without `.yaml`.
    let other = "domain: other\ndescriptors:\n  - key: k\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n";
    configmap(
        &config,
        "v1",
        &[("config.yaml", &limit(2)), ("other", other)],
    );
    let port = redis.port().to_string();
    let root_text = root.display().to_string();
    let prometheus = format!("127.0.0.1:{}", sluice_testkit::free_port(false));
    let mut server = Server::start_with_env(
        &["--envoyproxy-env"],
        &[
            ("RUNTIME_ROOT", root_text.as_str()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &format!("127.0.0.1:{port}")),
            ("LOCAL_CACHE_SIZE_IN_BYTES", "1048576"),
            ("LOG_LEVEL", "info"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", &prometheus),
            ("PROMETHEUS_PATH", "/stats"),
            (
                "SLUICE_PEPPER",
                "6c1f0c2b9e8a4f6d3c5b7a9e1f2d4c6b8a0e2f4d6c8b0a1e3f5d7c9b1a3e5f72",
            ),
        ],
    );
    let mut c = client(&server).await;
    let one = |v: &str| vec![descriptor(&[("user", v)])];
    for code in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(overall(&ask(&mut c, "k8s", one("a"), 0).await), code);
    }
    let r = ask(&mut c, "other", vec![descriptor(&[("k", "x")])], 0).await;
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        1
    );
    // The buckets are in that Redis, opaque.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("sl:*")
        .query(&mut redis.connection())
        .unwrap();
    assert!(!keys.is_empty() && keys.iter().all(|k| !k.contains("user")));
    // The scrape the manifest points at PROMETHEUS_ADDR still finds
    // upstream's stats; statsd is said not to be pushed.
    let stats = reqwest::get(format!("http://{prometheus}/stats"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        stats.contains(r#"ratelimit_service_rate_limit_over_limit{domain="k8s",key1="user"} 1"#),
        "{stats}"
    );
    server.wait_for_log("sluice pushes no statsd");
    // A ConfigMap update (the `..data` swap) is picked up.
    configmap(
        &config,
        "v2",
        &[("config.yaml", &limit(5)), ("other", other)],
    );
    server.wait_for_log("configuration reloaded");
    let r = ask(&mut c, "k8s", one("a"), 0).await;
    assert_eq!(overall(&r), Code::Ok);
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .unwrap()
            .requests_per_unit,
        5
    );
    drop(c);
    server.stop();
}
