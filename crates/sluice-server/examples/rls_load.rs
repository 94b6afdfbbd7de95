//! Envoy RLS decisions per second and latency percentiles over gRPC on
//! loopback, on the memory store and on Redis, in one run.
//!
//! Starts its own `redis-server` on a free loopback port and one sluice
//! gRPC service per backend in this process, then drives each with
//! `sluice bench`'s load generator: 64 requests in flight, 10,000 distinct
//! descriptor values, 5 seconds, every request admitted (the limit is
//! generous) so that what is measured is the decision path.
//!
//! Run: `cargo run --release -p sluice-server --example rls_load`.

use std::time::Duration;

use sluice_core::Config;
use sluice_server::app::App;
use sluice_testkit::RedisServer;

const ENVOY: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: second, requests_per_unit: 1000000 }
"#;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // Removed with what it holds when this ends.
    let temp = tempfile::Builder::new()
        .prefix("sluice-rls-load-")
        .tempdir()?;
    let dir = temp.path();
    std::fs::write(dir.join("edge.yaml"), ENVOY)?;
    std::fs::write(
        dir.join("pepper"),
        "5f2b8e4c1a7d9036b5e8c2f1a4d7906e3b5c8f1e2a4d6b8c0e9f7a5d3c1b2e4f",
    )?;
    let redis = RedisServer::start();
    let backends = [
        ("memory", String::new()),
        (
            "redis",
            format!(
                "storage:\n  backend: redis\n  url: {}\nkeys:\n  pepper_file: {}\n",
                redis.url(),
                dir.join("pepper").display()
            ),
        ),
    ];
    for (name, storage) in backends {
        let yaml = format!(
            "{storage}envoy:\n  config: {}\ndefault_plan: p\nplans:\n  p: {{}}\n",
            dir.join("edge.yaml").display()
        );
        let config = Config::from_yaml(&yaml, "rls_load.yaml")?;
        let app = App::build(&config).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let target = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(sluice_server::grpc::serve_grpc(
            app,
            listener,
            config.server.limits,
            async {
                let _ = stopped.await;
            },
        ));
        let report = sluice_server::bench::rls(
            &target,
            "edge",
            "remote_address",
            10_000,
            64,
            Duration::from_secs(5),
        )
        .await?;
        println!("{name:>7}: {}", report.summary());
        let _ = stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(2), server).await;
    }
    Ok(())
}
