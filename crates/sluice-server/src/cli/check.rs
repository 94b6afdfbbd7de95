use std::process::ExitCode;

use sluice_core::request::check_cost_signed;
use sluice_core::{Policy, Request};
use sluice_store::Limiter;

use super::CheckArgs;
use crate::backend::Backend;
use crate::http::DecisionView;
use crate::source::Source;

pub(super) fn run(args: CheckArgs) -> ExitCode {
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
    runtime.block_on(check(args))
}

/// Asks the service at `url`; prints its answer; exits as a local check.
async fn remote(url: &str, args: &CheckArgs) -> ExitCode {
    let body = serde_json::json!({
        "tenant": args.tenant,
        "route": args.route,
        "subject": args.subject,
        "cost": args.cost,
        "fingerprint": args.fingerprint,
    });
    let endpoint = format!("{}/v1/check", url.trim_end_matches('/'));
    let response = reqwest::Client::new()
        .post(&endpoint)
        .timeout(std::time::Duration::from_secs(10))
        .json(&body)
        .send()
        .await;
    match response {
        Ok(response) => {
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            println!("{text}");
            match status {
                200 => ExitCode::SUCCESS,
                409 | 429 => ExitCode::FAILURE,
                _ => ExitCode::from(2),
            }
        }
        Err(e) => {
            eprintln!("error: cannot ask {endpoint}: {e}");
            ExitCode::from(2)
        }
    }
}

async fn check(args: CheckArgs) -> ExitCode {
    if let Some(url) = &args.url {
        return remote(url, &args).await;
    }
    let config = match Source::from_arg(args.config).load() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let request = check_cost_signed(args.cost.into())
        .and_then(|cost| Request::new(&args.tenant, &args.route, args.subject.as_deref(), cost))
        .and_then(|r| r.with_fingerprint(args.fingerprint.as_deref()));
    let request = match request {
        Ok(request) => request,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let store = match Backend::connect(&config.storage, &config.keys).await {
        Ok(store) => store,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let policy = Policy::compile_for(&config.limits, store.shards_tenants());
    let limiter = Limiter::new(policy, store, config.storage.on_error);
    let policy = limiter.policy();
    let decision = limiter.decide(&policy, &request).await;
    // No response will follow this check: what it holds on rules that
    // count by outcome is given back at once.
    if let Some(attempt) = limiter.attempt(&policy, &request, &decision)
        && let Err(e) = limiter
            .conclude_attempt(&policy, &attempt, None, 60_000)
            .await
    {
        eprintln!(
            "warning: the check's attempt could not be given back ({e}); it counts until its rules refill"
        );
    }
    match serde_json::to_string(&DecisionView::of(&decision)) {
        Ok(json) => println!("{json}"),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    if decision.allowed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
