//! `rtprobe cleanup`: removes the testbeds of runs that died.

use std::{path::Path, process::ExitCode};

use anyhow::Result;

use crate::{cli::CleanupArgs, testbed::record};

pub(super) fn command(args: &CleanupArgs) -> Result<ExitCode> {
    if !args.dry_run {
        crate::testbed::require_root()?;
    }
    let sys = crate::sys::linux();
    record::cleanup(
        sys.as_ref(),
        Path::new(record::RUN_DIR),
        args.dry_run,
        &mut std::io::stdout().lock(),
    )?;
    Ok(ExitCode::SUCCESS)
}
