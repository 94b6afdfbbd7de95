use std::process::ExitCode;

use clap::Parser;
use sluice_server::cli::{Cli, run};

fn main() -> ExitCode {
    run(Cli::parse())
}
