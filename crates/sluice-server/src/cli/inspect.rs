use std::process::ExitCode;

use sluice_core::Policy;

use super::InspectArgs;
use crate::backend::Backend;
use crate::inspect::{Inspection, inspect as read, table};
use crate::source::Source;

pub(super) fn run(args: InspectArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let inspected = match &args.url {
        Some(url) => runtime.block_on(through_admin(url, &args)),
        None => runtime.block_on(from_store(&args)),
    };
    match inspected {
        Ok(inspection) => {
            print!("{}", table(&inspection));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Straight from the shared store a configuration names.
async fn from_store(args: &InspectArgs) -> crate::Fallible<Inspection> {
    let config = Source::from_arg(args.config.clone()).load()?;
    let store = Backend::connect(&config.storage, &config.keys).await?;
    if store.memory().is_some() {
        return Err("inspect reads a shared store; with `storage.backend: memory` each `sluice serve` keeps its state in its own process: ask it with --url (its admin API)".into());
    }
    let policy = Policy::compile_for(&config.limits, store.shards_tenants());
    read(
        &policy,
        &store,
        &args.tenant,
        args.route.as_deref(),
        args.subject.as_deref(),
    )
    .await
}

/// From a running service's admin API (its live policy, overrides
/// included; any store, memory too).
async fn through_admin(url: &str, args: &InspectArgs) -> crate::Fallible<Inspection> {
    let token = std::env::var(&args.token_env).map_err(|_| {
        format!(
            "--url needs the admin token in the environment variable {} (--token-env)",
            args.token_env
        )
    })?;
    let mut query = vec![("tenant", args.tenant.clone())];
    if let Some(route) = &args.route {
        query.push(("route", route.clone()));
    }
    if let Some(subject) = &args.subject {
        query.push(("subject", subject.clone()));
    }
    let response = reqwest::Client::new()
        .get(format!("{}/v1/admin/inspect", url.trim_end_matches('/')))
        .bearer_auth(token.trim())
        .query(&query)
        .send()
        .await
        .map_err(|e| format!("cannot reach {url}: {e}"))?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(format!("{url} answered {status}: {body}").into());
    }
    Ok(response.json().await?)
}
