//! Where the envoyproxy/ratelimit configuration comes from: the command
//! line's `--envoy-config`, and envoyproxy/ratelimit's runtime directory.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::common::{Server, TempPath, temp_dir, temp_file};
use crate::{ask, client, descriptor, overall};

/// A file whose domain `domain` allows 1 request per hour per `user`.
fn one_per_hour(domain: &str) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: 1 }}\n"
    )
}

/// `sluice serve` with configuration `config` and `--envoy-config dir`.
fn serve(config: TempPath, dir: tempfile::TempDir) -> Server {
    Server::start(&[
        "--config",
        config.to_str().unwrap(),
        "--envoy-config",
        dir.path().to_str().unwrap(),
    ])
    .keep(config)
    .keep(dir)
}

/// The second request of `user` to `domain` is over, the first not.
async fn limits(server: &Server, domain: &str) {
    let mut c = client(server).await;
    let one = || vec![descriptor(&[("user", "u")])];
    for code in [Code::Ok, Code::OverLimit] {
        assert_eq!(
            overall(&ask(&mut c, domain, one(), 0).await),
            code,
            "{domain}"
        );
    }
}

/// `--envoy-config` stands for an `envoy.config`: a sluice file without
/// plans (here: storage only) serves Envoy alone with it, as with an
/// `envoy:` section.
#[tokio::test]
async fn envoy_config_on_the_command_line_needs_no_plans() {
    let dir = temp_dir("envoy-flag");
    std::fs::write(dir.path().join("flag.yaml"), one_per_hour("flag")).unwrap();
    let config = temp_file("no-plans.yaml", "storage: { backend: memory }\n");
    let out = crate::common::sluice()
        .args(["validate"])
        .arg(&*config)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "alone, a file without plans is refused"
    );
    let mut server = serve(config, dir);
    limits(&server, "flag").await;
    server.stop();
}

/// In envoyproxy/ratelimit's environment, the runtime directory is walked
/// as upstream walks it: files in subdirectories load too, and a change
/// to one reloads. Dot files and directories are skipped (a ConfigMap's
/// `..2024_…` generation holds every file again), and so are links to
/// directories, which upstream's walk does not descend.
#[tokio::test]
async fn the_runtime_directory_is_walked_with_its_subdirectories() {
    let redis = sluice_testkit::RedisServer::start();
    let runtime = temp_dir("runtime-tree");
    let root = runtime.path();
    let config = root.join("ratelimit").join("config");
    let nested = config.join("team").join("payments");
    std::fs::create_dir_all(&nested).unwrap();
    std::fs::write(config.join("top.yaml"), one_per_hour("top")).unwrap();
    std::fs::write(nested.join("limits"), one_per_hour("nested")).unwrap();
    // Were these loaded, domain `top` would be defined twice: refused.
    std::fs::create_dir_all(config.join(".generation")).unwrap();
    std::fs::write(
        config.join(".generation").join("top.yaml"),
        one_per_hour("top"),
    )
    .unwrap();
    let elsewhere = temp_dir("runtime-elsewhere");
    std::fs::write(elsewhere.path().join("top.yaml"), one_per_hour("top")).unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), config.join("linked")).unwrap();
    let root_text = root.display().to_string();
    let mut server = Server::start_with_env(
        &["--envoyproxy-env"],
        &[
            ("RUNTIME_ROOT", root_text.as_str()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &format!("127.0.0.1:{}", redis.port())),
            (
                "SLUICE_PEPPER",
                "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
            ),
        ],
    );
    limits(&server, "top").await;
    limits(&server, "nested").await;
    // A change in a subdirectory is a change of the configuration.
    std::fs::write(nested.join("limits"), one_per_hour("moved")).unwrap();
    server.wait_for_log("configuration reloaded");
    limits(&server, "moved").await;
    server.stop();
    drop((runtime, elsewhere));
}

/// A directory named by `--envoy-config` (or `envoy.config`) is read as
/// upstream's runtime loader reads one: every file, whatever its
/// extension, in it and in its subdirectories; `sluice validate` checks
/// the same files.
#[tokio::test]
async fn a_configuration_directory_is_read_as_upstream_reads_it() {
    let dir = temp_dir("envoy-tree");
    let team = dir.path().join("team-a");
    std::fs::create_dir_all(&team).unwrap();
    std::fs::write(dir.path().join("top.yaml"), one_per_hour("top")).unwrap();
    std::fs::write(team.join("limits.yaml"), one_per_hour("team")).unwrap();
    std::fs::write(dir.path().join("limits.conf"), one_per_hour("conf")).unwrap();
    let (out, _) = crate::common::succeeds(crate::common::sluice().arg("validate").arg(dir.path()));
    assert!(out.contains("ok (3 domains"), "{out}");
    let config = temp_file("tree.yaml", "storage: { backend: memory }\n");
    let mut server = serve(config, dir);
    for domain in ["top", "team", "conf"] {
        limits(&server, domain).await;
    }
    server.stop();
}
