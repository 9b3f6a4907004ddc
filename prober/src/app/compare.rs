//! `rtprobe compare BASE OTHER..`: whether runs differ from a baseline.

use std::process::ExitCode;

use anyhow::Result;

use crate::{cli::CompareArgs, export::compare};

pub(super) fn command(a: &CompareArgs) -> Result<ExitCode> {
    let settings = compare::Settings {
        metric: a.metric,
        resamples: a.resamples as usize,
        sample_cap: a.sample as usize,
        seed: a.seed,
        ..compare::Settings::default()
    };
    let c = compare::compare(&a.base, &a.others, &settings)?;
    print!("{}", compare::render(&c));
    if let Some(j) = &a.json {
        crate::export::json::write_value(j, &c)?;
        println!("\n  wrote {}", j.display());
    }
    Ok(ExitCode::SUCCESS)
}
