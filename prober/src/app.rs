//! Command dispatch: `main()` -> `run()` -> one-line error and exit code.

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

pub fn main_entry() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    init_logging(cli.verbose);
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_timestamp(None)
        .try_init();
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Plot(args)) => crate::export::plot::run(&args),
        None => anyhow::bail!("probe is not implemented yet"),
    }
}
