//! Where the envoyproxy/ratelimit configuration comes from: the command
//! line's `--envoy-config`, and envoyproxy/ratelimit's runtime directory.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::common::{Server, temp_dir, temp_file};
use crate::{ask, client, descriptor, overall};

/// A file whose domain `domain` allows 1 request per hour per `user`.
fn one_per_hour(domain: &str) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: hour, requests_per_unit: 1 }}\n"
    )
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
    let mut server = Server::start(&[
        "--config",
        config.to_str().unwrap(),
        "--envoy-config",
        dir.path().to_str().unwrap(),
    ])
    .keep(config)
    .keep(dir);
    limits(&server, "flag").await;
    server.stop();
}
