//! `rtprobe [OPTIONS]` (no subcommand): one probe run, on a testbed this
//! host builds or against a remote reflector (`--target`), with a progress
//! bar, live outputs, the summary and the exit code. The run itself,
//! remote or not, is [`crate::run::execute`]'s.

use std::{process::ExitCode, sync::atomic::AtomicU64};

use anyhow::Result;

use crate::{
    cli::ProbeArgs,
    export::live::Live,
    options::{RunOptions, SpecError, plan},
    signals::with_signals_reload,
    stats::outcome::RunOutcome,
};

pub(super) fn command(args: &ProbeArgs) -> Result<ExitCode> {
    let opts = match run_options(args) {
        Ok(o) => o,
        // A usage error, as clap's own: status 2.
        Err(e) => {
            eprintln!("Error: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    // A remote target needs no testbed, so no root (knobs say if they do).
    if !opts.remote.is_remote() {
        crate::testbed::require_root()?;
    }
    // Every option is checked before --metrics-listen binds its port; a
    // bad targets or key file is a configuration error (status 78).
    let checked = match crate::run::check(&opts) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("Error: {e:#}");
            return Ok(ExitCode::from(EX_CONFIG));
        }
    };
    let quiet = opts.quiet;
    // With a targets file SIGHUP reads it again instead of stopping.
    let reload = opts
        .remote
        .targets
        .is_some()
        .then(|| std::sync::Arc::new(AtomicU64::new(0)));
    let reloads = reload.clone();
    let run = with_signals_reload(quiet, reload, move |stop| {
        let bar = progress_bar(&opts);
        let (lines, shown) = (bar.clone(), bar.clone());
        let mut live = Live::new(
            &opts.continuous,
            // Interval lines go to stdout even with --quiet (they were asked
            // for), above the progress bar.
            Box::new(move |line| lines.suspend(|| println!("{line}"))),
            Box::new(move |p| {
                shown.set_position(p.counts.sent);
                shown.set_message(p.message());
            }),
        )?;
        if let Some(url) = live.metrics_url() {
            eprintln!("rtprobe: serving metrics at {url}");
        }
        let reload = reloads.as_deref();
        let r = crate::run::execute(
            &opts,
            checked,
            crate::sys::linux(),
            &stop,
            &mut live,
            reload,
        );
        bar.finish_and_clear();
        r.map(|o| (o, opts))
    });
    match run {
        Ok((o, opts)) => report(&o, &opts),
        Err(e) if e.downcast_ref::<crate::run::ConfigError>().is_some() => {
            eprintln!("Error: {e:#}");
            Ok(ExitCode::from(EX_CONFIG))
        }
        Err(e) => Err(e),
    }
}

/// The exit status of a run refused for its configuration: a targets or
/// key file that fails its checks, or more targets than the open-file
/// limit allows (sysexits' EX_CONFIG). The systemd unit names it in
/// `RestartPreventExitStatus=`: restarting cannot fix the file.
pub(super) const EX_CONFIG: u8 = 78;

/// What the CSV lacks, counted: the probes sent (over every flow) that
/// have no row, said after the rows written; empty when every probe has
/// its row.
fn csv_missing(o: &RunOutcome) -> String {
    let flows = &o.summary.report.flows;
    let sent = if flows.is_empty() {
        o.summary.sent
    } else {
        flows.iter().map(|f| f.summary.sent).sum()
    };
    match sent.checked_sub(o.rows) {
        Some(n) if n > 0 => format!(": {n} of the {sent} probes sent are not in it"),
        _ => String::new(),
    }
}

/// The summary and the files written; FAILURE when an output failed,
/// 130 when interrupted (as shells report SIGINT: the data is complete).
fn report(o: &RunOutcome, opts: &RunOptions) -> Result<ExitCode> {
    print!(
        "{}",
        crate::export::text::format_summary(&o.summary, &o.meta)
    );
    let missing = csv_missing(o);
    match opts.continuous.rotation {
        Some(r) => println!(
            "  wrote {} rows to {} and its rotated files (by {}, the last {} kept as {}.1 ..){missing}",
            o.rows,
            opts.out.display(),
            r.when,
            r.keep,
            opts.out.display()
        ),
        None => println!("  wrote {} rows to {}{missing}", o.rows, opts.out.display()),
    }
    // Written even when the CSV failed: on a full disk the atomic write
    // leaves the earlier file or none, and the error below names both.
    let json =
        opts.json.as_ref().and_then(
            |j| match crate::export::json::write_summary(j, &o.summary) {
                Ok(()) => {
                    println!("  wrote summary to {}", j.display());
                    None
                }
                Err(e) => Some(e),
            },
        );
    if let Some(failed) = crate::run::failed_outputs(o.output_error.as_deref(), json.as_ref()) {
        let how = if o.output_error.is_some() {
            "the run stopped at the first failure; "
        } else {
            ""
        };
        eprintln!(
            "Error: {failed} ({how}the summary above covers all {} probes sent)",
            o.summary.sent
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(if o.interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// The probe run's progress: a bar for a fixed count, a spinner otherwise;
/// the message carries the counts and the latest interval's p50/p99.
fn progress_bar(opts: &RunOptions) -> indicatif::ProgressBar {
    // With several targets nothing feeds it (each target has its own
    // metrics; the summary gives each and the total).
    let many = opts.remote.target.len() > 1 || opts.remote.targets.is_some();
    if opts.quiet || many {
        return indicatif::ProgressBar::hidden();
    }
    let (bar, template) = match opts.probe.count {
        Some(n) => (
            indicatif::ProgressBar::new(n),
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} probes (eta {eta})  {msg}",
        ),
        None => (
            indicatif::ProgressBar::new_spinner(),
            "{spinner} [{elapsed_precise}] {msg}",
        ),
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(250));
    bar
}

/// The probe command's plan: the one validator over its flags, then the
/// output files; an error names the flag.
fn run_options(args: &ProbeArgs) -> Result<RunOptions> {
    let to_cli = |e: SpecError| anyhow::anyhow!("{}", e.for_cli());
    let knobs = args.knobs.clone().into();
    let opts = plan::validate(&args.run, &knobs, &args.output).map_err(to_cli)?;
    plan::check_output_paths(&opts).map_err(to_cli)?;
    Ok(opts)
}
