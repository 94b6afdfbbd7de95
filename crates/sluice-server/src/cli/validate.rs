use std::process::ExitCode;

use sluice_core::Config;

use super::ValidateArgs;

/// An envoyproxy/ratelimit file names its `domain` at the top level.
fn is_envoy_file(text: &str) -> bool {
    text.lines().any(|l| l.starts_with("domain:"))
}

/// Checks envoyproxy/ratelimit files (a file or a directory of them) as
/// `serve` loads them, as upstream's `ratelimit_config_check` does.
fn envoy(path: &std::path::Path, all_files: bool, merge: bool) -> ExitCode {
    match crate::source::envoy_files::load(path, all_files, merge) {
        Ok(domains) => {
            for note in domains.iter().flat_map(|d| &d.notes) {
                eprintln!("note: {note}");
            }
            let descriptors: usize = domains.iter().map(|d| d.descriptors.len()).sum();
            println!(
                "{}: ok ({} domains, {descriptors} top-level descriptors)",
                path.display(),
                domains.len()
            );
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            ExitCode::FAILURE
        }
    }
}

pub(super) fn run(args: ValidateArgs) -> ExitCode {
    if args.file.is_dir() {
        return envoy(&args.file, true, false);
    }
    let origin = args.file.display().to_string();
    let text = match std::fs::read_to_string(&args.file) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{origin}: cannot read: {e}");
            return ExitCode::FAILURE;
        }
    };
    if is_envoy_file(&text) {
        return envoy(&args.file, true, false);
    }
    match Config::from_yaml(&text, &origin) {
        Ok(config) => {
            // What `serve` would load with it.
            if let Some(path) = &config.envoy.config_path
                && envoy(path, config.envoy.all_files, config.envoy.merge_domains)
                    != ExitCode::SUCCESS
            {
                return ExitCode::FAILURE;
            }
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
