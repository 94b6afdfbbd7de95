//! What ships beside the code: the licence, crate metadata, the systemd
//! unit (`systemd-analyze verify`), the compose and Kubernetes
//! configurations (`sluice validate`), and the health paths the
//! Dockerfile and the manifests probe.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Server, sluice, temp_path};

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn text(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_licence_matches_the_crates_and_no_metadata_is_a_placeholder() {
    let licence = text("LICENSE");
    assert!(licence.contains("Apache License") && licence.contains("Version 2.0, January 2004"));
    let workspace = text("Cargo.toml");
    assert!(workspace.contains("license = \"Apache-2.0\""));
    for manifest in [
        "Cargo.toml",
        "crates/sluice-core/Cargo.toml",
        "crates/sluice-store/Cargo.toml",
        "crates/sluice-server/Cargo.toml",
        "crates/sluice-tower/Cargo.toml",
        "crates/sluice-testkit/Cargo.toml",
    ] {
        let text = text(manifest);
        assert!(
            !text.contains("example.invalid"),
            "{manifest} has a placeholder URL"
        );
    }
}

#[test]
fn the_systemd_unit_verifies() {
    let found = Command::new("systemd-analyze").arg("--version").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "`systemd-analyze` is needed by this test: install Debian's systemd package"
    );
    // The unit as installed, with the binary where this build put it.
    let unit = text("deploy/systemd/sluice.service")
        .replace("/usr/local/bin/sluice", env!("CARGO_BIN_EXE_sluice"));
    let path = temp_path("unit", "sluice.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
}

#[test]
fn the_shipped_configurations_validate() {
    for config in [
        "deploy/compose/sluice.yaml",
        "deploy/compose/regions/eu.yaml",
        "deploy/compose/regions/us.yaml",
        "deploy/compose/regions/ap.yaml",
        "deploy/compose/traces/sluice.yaml",
        "deploy/kubernetes/sluice.yaml",
    ] {
        let out = sluice().arg("validate").arg(repo(config)).output().unwrap();
        assert!(
            out.status.success(),
            "{config}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The manifests point at that file and the secret the pepper is in.
    let deployment = text("deploy/kubernetes/deployment.yaml");
    assert!(deployment.contains("/etc/sluice/sluice.yaml"));
    assert!(text("deploy/kubernetes/kustomization.yaml").contains("- sluice.yaml"));
    assert!(text("deploy/kubernetes/sluice.yaml").contains("pepper_env: SLUICE_PEPPER"));
    assert!(deployment.contains("name: SLUICE_PEPPER"));
}

#[tokio::test]
async fn the_paths_the_healthchecks_probe_answer() {
    let dockerfile = text("Dockerfile");
    let deployment = text("deploy/kubernetes/deployment.yaml");
    let mut paths = Vec::new();
    for path in ["/healthz", "/readyz"] {
        if dockerfile.contains(&format!("127.0.0.1:8080{path}"))
            || deployment.contains(&format!("path: {path}"))
        {
            paths.push(path);
        }
    }
    assert_eq!(paths, ["/healthz", "/readyz"]);
    let mut server = Server::start(&[]);
    for path in paths {
        let status = reqwest::get(format!("{}{path}", server.base))
            .await
            .unwrap()
            .status();
        assert_eq!(status, 200, "{path}");
    }
    server.stop();
}
