//! `rtprobe man` (hidden; `cargo xtask man` runs it): writes the man pages
//! and prints their paths.

use std::process::ExitCode;

use anyhow::Result;

use crate::cli::ManArgs;

pub(super) fn command(args: &ManArgs) -> Result<ExitCode> {
    for page in super::docs::write_man_pages(&args.out_dir)? {
        println!("{}", page.display());
    }
    Ok(ExitCode::SUCCESS)
}
