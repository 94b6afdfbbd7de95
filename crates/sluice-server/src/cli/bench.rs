use std::process::ExitCode;
use std::time::Duration;

use super::BenchArgs;

pub(super) fn run(args: BenchArgs) -> ExitCode {
    if args.seconds == 0 || args.seconds > 600 || args.concurrency == 0 || args.concurrency > 10_000
    {
        eprintln!("error: --seconds must be 1 to 600 and --concurrency 1 to 10000");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let load = crate::bench::rls(
        &args.target,
        &args.domain,
        &args.key,
        args.values,
        args.concurrency,
        Duration::from_secs(args.seconds),
    );
    match runtime.block_on(load) {
        Ok(mut report) => {
            println!("{}", report.summary());
            if report.errors > 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
