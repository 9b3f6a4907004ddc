//! `rtprobe completions SHELL`: the shell completion script on stdout.

use std::{io::Write, process::ExitCode};

use anyhow::{Context, Result};

use crate::cli::CompletionsArgs;

pub(super) fn command(args: &CompletionsArgs) -> Result<ExitCode> {
    let script = super::docs::completions(args.shell);
    match std::io::stdout().lock().write_all(&script) {
        // `rtprobe completions bash | head` is no error.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(e).context("cannot write the completion script to stdout")
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}
