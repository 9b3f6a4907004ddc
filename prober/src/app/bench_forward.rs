//! `rtprobe bench-forward`: packets/s through the router hop, per XDP mode
//! and load step, with a table line per step as it finishes.

use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::{
    bench_forward::{bounce, forward},
    options::bench_forward::BenchForwardArgs,
    signals::with_signals,
};

pub(super) fn command(args: &BenchForwardArgs) -> Result<ExitCode> {
    let merged = args.with_config_file()?;
    let plan = forward::Plan::from_args(&merged).with_context(|| match &args.config {
        Some(f) => format!("{} with the command line over it", f.display()),
        None => "bench-forward".into(),
    })?;
    crate::testbed::require_root()?;
    // Before the run, not after minutes of it.
    if let Some(dir) = plan.json.as_deref().and_then(|j| j.parent())
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).with_context(|| {
            format!("cannot create {} for --json: check the path", dir.display())
        })?;
    }
    let quiet = plan.quiet;
    let p = plan.clone();
    let report = with_signals(quiet, move |stop| {
        if !quiet {
            println!("{}", forward::table_header());
        }
        let mut bounce_header = !quiet;
        forward::run(
            &p,
            crate::sys::linux(),
            &stop,
            |step| {
                if !quiet {
                    println!("{}", forward::format_step(step));
                }
            },
            |b| {
                if std::mem::take(&mut bounce_header) {
                    println!("{}", bounce::table_header());
                }
                if !quiet {
                    println!("{}", bounce::format_step(b));
                }
            },
        )
    })?;
    print!("{}", forward::format_report(&report));
    if let Some(j) = &plan.json {
        crate::export::json::write_value(j, &report)?;
        println!("  wrote {}", j.display());
    }
    Ok(ExitCode::SUCCESS)
}
