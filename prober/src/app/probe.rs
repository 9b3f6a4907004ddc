//! `rtprobe [OPTIONS]` (no subcommand): one probe run, on a testbed this
//! host builds or against a remote reflector (`--target`), with a progress
//! bar, live outputs, the summary and the exit code.

use std::{net::SocketAddr, process::ExitCode, sync::atomic::AtomicU8};

use anyhow::{Context, Result};

use crate::{
    cli::ProbeArgs,
    export::{CsvWriter, live::Live},
    model::run::{RunMeta, RunOutcome},
    probe::{
        ProbeConfig, SessionEnds,
        remote::{Target, summarise},
        run_session,
    },
    signals::with_signals,
    spec::{RunOptions, SpecError, plan, remote::read_key},
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
    if opts.remote.target.is_none() {
        crate::testbed::require_root()?;
    }
    // Every option is checked before --metrics-listen binds its port.
    crate::runner::check(&opts)?;
    let quiet = opts.quiet;
    let (o, opts) = with_signals(quiet, move |stop| {
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
        let r = execute(&opts, crate::sys::linux(), &stop, &mut live);
        bar.finish_and_clear();
        r.map(|o| (o, opts))
    })?;
    report(&o, &opts)
}

/// The summary and the files written; FAILURE when an output failed,
/// 130 when interrupted (as shells report SIGINT: the data is complete).
fn report(o: &RunOutcome, opts: &RunOptions) -> Result<ExitCode> {
    print!(
        "{}",
        crate::export::text::format_summary(&o.summary, &o.meta)
    );
    match opts.continuous.rotation {
        Some(r) => println!(
            "  wrote {} rows to {} and its rotated files (by {}, the last {} kept as {}.1 ..)",
            o.rows,
            opts.out.display(),
            r.when,
            r.keep,
            opts.out.display()
        ),
        None => println!("  wrote {} rows to {}", o.rows, opts.out.display()),
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
    if let Some(failed) = crate::runner::failed_outputs(o.output_error.as_deref(), json.as_ref()) {
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
    if opts.quiet {
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

/// Runs one probe session as `opts` says: against the remote reflector of
/// `--target`, else on a testbed; `live` shows and serves it while it runs.
pub(super) fn execute(
    opts: &RunOptions,
    sys: crate::sys::SysRef,
    stop: &AtomicU8,
    live: &mut Live,
) -> Result<RunOutcome> {
    if opts.remote.target.is_none() {
        return crate::runner::execute(opts, sys, stop, live);
    }
    crate::runner::check(opts)?;
    execute_remote(opts, stop, live)
}

/// `rtprobe --target HOST[:PORT]`: one session against a remote reflector,
/// written and summarised as a testbed run is.
fn execute_remote(opts: &RunOptions, stop: &AtomicU8, live: &mut Live) -> Result<RunOutcome> {
    let remote = &opts.remote;
    let port = remote.port(opts.probe.port);
    let addr = remote
        .target_addr(port)?
        .context("internal: execute without --target")?;
    let key = remote.auth_key.as_deref().map(read_key).transpose()?;
    let target = Target {
        addr,
        protocol: remote.protocol(),
        key,
        stateless_reflector: false,
        shared_clock: false,
    };
    let cfg = ProbeConfig {
        port,
        ..opts.probe.clone()
    };
    let meta = remote_meta(opts, &cfg, &target, addr);
    let mut csv = CsvWriter::create_rotated(&opts.out, &meta, opts.continuous.rotation)?;
    live.set_run(&meta);
    let mut observer = live.main_observer(
        cfg.flow_labels(&addr.to_string()),
        cfg.kernel_reflector,
        &meta,
    )?;
    let ends = SessionEnds::Remote {
        target: &target,
        from: None,
    };
    let o = run_session(&ends, &cfg, &mut csv, stop, &mut observer)?;
    drop(observer);
    let rows = csv.rows();
    let facts = o
        .remote
        .as_ref()
        .context("internal: a session against a target without the reflector's facts")?;
    let output_error = o.output_error.clone();
    let mut summary = summarise(&o, facts, "remote");
    summary.report.output_error = output_error.clone();
    Ok(RunOutcome {
        summary,
        meta,
        rows,
        interrupted: o.interrupted,
        output_error,
    })
}

/// The CSV's first line for a `--target` run: no testbed, no XDP.
fn remote_meta(opts: &RunOptions, cfg: &ProbeConfig, target: &Target, addr: SocketAddr) -> RunMeta {
    let place = crate::probe::meta::Place {
        testbed: "remote".into(),
        tx_if: Some("this host".into()),
        rx_if: Some(addr.to_string()),
        xdp_mode_requested: "none".into(),
        xdp_mode_attached: "none".into(),
        xdp_action: "none".into(),
        reflector: format!("remote {}", target.protocol.name()),
        ..Default::default()
    };
    crate::probe::meta::run_meta(cfg, opts.label.clone(), place)
}
