//! The commands: one module per subcommand, each turning its parsed
//! arguments into a plan (the options' validator) and calling the domain
//! once; what it prints and the exit code are decided here. The only
//! place that knows clap's parse result, signals and exit codes.
//!
//! `main()` -> [`main_entry`] -> [`run`] -> one command -> a one-line
//! error and a non-zero exit code on failure.

mod bench_forward;
mod cleanup;
mod compare;
mod completions;
mod docs;
mod flows;
mod host;
mod man;
mod plot;
mod probe;
mod reflect;
mod run;
mod targets;
mod testbed;

use std::process::ExitCode;

use anyhow::Result;
use clap::Parser;

use crate::cli::{Cli, Command};

pub fn main_entry() -> ExitCode {
    crate::heap::limit_arenas();
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
        Ok(code) => code,
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
    // -vv also shows the eBPF programs' own log of their rare paths.
    crate::ebpf::klog::enable(verbose >= 2);
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Some(Command::Plot(args)) => plot::command(&args),
        Some(Command::BenchForward(args)) => bench_forward::command(&args),
        Some(Command::Testbed(args)) => testbed::command(args),
        Some(Command::Run(args)) => run::command(args),
        Some(Command::Cleanup(args)) => cleanup::command(&args),
        Some(Command::Flows(args)) => flows::command(&args),
        Some(Command::Reflect(args)) => reflect::command(&args),
        Some(Command::Compare(args)) => compare::command(&args),
        Some(Command::Completions(args)) => completions::command(&args),
        Some(Command::Targets(args)) => targets::command(&args),
        Some(Command::Man(args)) => man::command(&args),
        Some(Command::Host(args)) => host::command(&args),
        None => probe::command(&cli.probe),
    }
}
