//! `rtprobe host` (hidden): the facts about this host that every run's
//! summary names, as the summary's header line or as its JSON, so that
//! `cargo xtask bench` names its host through the same reader.

use std::process::ExitCode;

use anyhow::Result;

use crate::cli::HostArgs;

pub(super) fn command(a: &HostArgs) -> Result<ExitCode> {
    let facts = crate::sys::host::host_facts();
    if a.json {
        println!("{}", serde_json::to_string(&facts)?);
    } else {
        println!("{}", facts.line());
    }
    Ok(ExitCode::SUCCESS)
}
