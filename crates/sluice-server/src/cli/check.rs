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

async fn check(args: CheckArgs) -> ExitCode {
    let config = match Source::from_arg(args.config).load() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let request = check_cost_signed(args.cost.into())
        .and_then(|cost| Request::new(&args.tenant, &args.route, args.subject.as_deref(), cost));
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
