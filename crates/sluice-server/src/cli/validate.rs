use std::process::ExitCode;

use sluice_core::Config;

use super::ValidateArgs;

pub(super) fn run(args: ValidateArgs) -> ExitCode {
    let origin = args.file.display().to_string();
    let text = match std::fs::read_to_string(&args.file) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{origin}: cannot read: {e}");
            return ExitCode::FAILURE;
        }
    };
    match Config::from_yaml(&text, &origin) {
        Ok(config) => {
            let rules: usize = config
                .limits
                .plans
                .iter()
                .map(|p| {
                    p.tenant.len()
                        + p.routes
                            .iter()
                            .chain(&p.subject)
                            .map(|r| r.rules.len())
                            .sum::<usize>()
                })
                .sum::<usize>()
                + config
                    .limits
                    .global
                    .iter()
                    .map(|r| r.rules.len())
                    .sum::<usize>();
            println!(
                "{origin}: ok ({} plans, {} tenants, {rules} rules, storage {})",
                config.limits.plans.len(),
                config.limits.tenants.len(),
                config.storage.backend.name()
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::FAILURE
        }
    }
}
