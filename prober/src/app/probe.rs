//! `rtprobe [OPTIONS]` (no subcommand): one probe run, on a testbed this
//! host builds or against a remote reflector (`--target`), with a progress
//! bar, live outputs, the summary and the exit code.

use std::{
    net::SocketAddr,
    process::ExitCode,
    sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering},
};

use anyhow::{Context, Result};

use crate::{
    cli::ProbeArgs,
    export::{CsvWriter, live::Live},
    model::run::RunMeta,
    options::{
        RunOptions, SpecError, plan,
        remote::{ProtocolArg, read_key},
        targets::TargetSpec,
    },
    probe::{
        ProbeConfig, SessionEnds,
        remote::{LossSplit, OpenStep, Reloads, RemoteLeg, Target, open_files_for, summarise},
        run_session, run_targets,
    },
    signals::with_signals_reload,
    stats::{observer::SessionObserver, outcome::RunOutcome},
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
    if let Err(e) = crate::run::check(&opts) {
        eprintln!("Error: {e:#}");
        return Ok(ExitCode::from(EX_CONFIG));
    }
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
        let r = match &reloads {
            Some(generation) => execute_remote(&opts, &stop, &mut live, Some(generation)),
            None => execute(&opts, crate::sys::linux(), &stop, &mut live),
        };
        bar.finish_and_clear();
        r.map(|o| (o, opts))
    });
    match run {
        Ok((o, opts)) => report(&o, &opts),
        Err(e) if e.downcast_ref::<ConfigError>().is_some() => {
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

/// An error of the configuration, not of the run: exit status [`EX_CONFIG`].
#[derive(Debug)]
struct ConfigError(anyhow::Error);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for ConfigError {}

fn config_error(e: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(ConfigError(e))
}

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

/// Runs one probe session as `opts` says: against the remote reflector of
/// `--target`, else on a testbed; `live` shows and serves it while it runs.
pub(super) fn execute(
    opts: &RunOptions,
    sys: crate::sys::SysRef,
    stop: &AtomicU8,
    live: &mut Live,
) -> Result<RunOutcome> {
    if !opts.remote.is_remote() {
        return crate::run::execute(opts, sys, stop, live);
    }
    crate::run::check(opts)?;
    execute_remote(opts, stop, live, None)
}

/// `rtprobe --target HOST[:PORT]`: one session against a remote reflector,
/// written and summarised as a testbed run is. Several targets (the flag
/// repeated, or `--targets FILE`) go to [`execute_targets`].
fn execute_remote(
    opts: &RunOptions,
    stop: &AtomicU8,
    live: &mut Live,
    reload: Option<&AtomicU64>,
) -> Result<RunOutcome> {
    let remote = &opts.remote;
    let list = crate::options::targets::of(remote, &opts.probe)
        .map_err(config_error)?
        .context("internal: execute without --target")?;
    let key = remote
        .auth_key
        .as_deref()
        .map(read_key)
        .transpose()
        .map_err(config_error)?;
    if list.len() > 1 || remote.targets.is_some() {
        return execute_targets(opts, &list, key, stop, live, reload);
    }
    // The one target's host name is resolved now: it is the run's.
    let addr = match &list[0].host {
        Some(host) => crate::options::remote::resolve(host, list[0].addr.port())?,
        None => list[0].addr,
    };
    let port = addr.port();
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
    summary.report.host = Some(crate::sys::host::host_facts());
    Ok(RunOutcome {
        summary,
        meta,
        rows,
        interrupted: o.interrupted,
        output_error,
    })
}

/// Several remote reflectors from one process: one session, one CSV with
/// a `target` column, per-target metrics; the summary is their total with
/// each target's own in `extra.targets`.
fn execute_targets(
    opts: &RunOptions,
    list: &[TargetSpec],
    key: Option<crate::probe::stamp::HmacKey>,
    stop: &AtomicU8,
    live: &mut Live,
    reload: Option<&AtomicU64>,
) -> Result<RunOutcome> {
    // One socket per target, besides what the process holds.
    open_files_for(list.len()).map_err(config_error)?;
    let legs: Vec<RemoteLeg> = list.iter().map(|t| remote_leg(opts, t, &key)).collect();
    let meta = targets_meta(opts, list);
    let mut csv = CsvWriter::create_for_targets(&opts.out, &meta, opts.continuous.rotation)?;
    live.set_run(&meta);
    let live_ref = &*live;
    let mut observer_for = |l: &RemoteLeg| {
        live_ref.flow_observer(flow_labels(l), l.cfg.kernel_reflector) as Box<dyn SessionObserver>
    };
    let metrics = live.metrics().cloned();
    let on_error = move |l: &RemoteLeg, step: OpenStep, _why: &str| {
        if let Some(m) = &metrics {
            m.target_error(&flow_labels(l), step.key());
        }
    };
    let read = || -> Result<Vec<RemoteLeg>> {
        let list = crate::options::targets::of(&opts.remote, &opts.probe)?
            .context("internal: a reload without targets")?;
        Ok(list.iter().map(|t| remote_leg(opts, t, &key)).collect())
    };
    let reloads = reload.map(|generation| Reloads {
        generation,
        read: &read,
    });
    let done = AtomicBool::new(false);
    let outcomes = std::thread::scope(|sc| {
        if let (Some(generation), Some(path)) = (reload, &opts.remote.targets) {
            sc.spawn(|| watch_file(path, generation, &done));
        }
        let r = run_targets(
            legs,
            &mut csv,
            &mut observer_for,
            reloads.as_ref(),
            &on_error,
            stop,
        );
        done.store(true, Ordering::SeqCst);
        r
    })?;
    let rows = csv.rows();
    let output_error = outcomes.iter().find_map(|(_, o)| o.output_error.clone());
    let interrupted = outcomes.iter().any(|(_, o)| o.interrupted);
    let mut summary = total_summary(&outcomes)?;
    summary.report.output_error = output_error.clone();
    Ok(RunOutcome {
        summary,
        meta,
        rows,
        interrupted,
        output_error,
    })
}

/// A target's metrics labels: its name and the targets file's labels.
fn flow_labels(l: &RemoteLeg) -> crate::export::metrics::FlowLabels {
    let name = l.name.as_deref().unwrap_or_default();
    l.cfg.flow_labels(name).with_extra(&l.labels)
}

/// Counts a change of the targets file's modification time (looked at
/// every second) as a reload request, as SIGHUP is, until `done`. A file
/// caught half-written fails its checks and changes nothing; the write's
/// end changes the time again.
fn watch_file(path: &std::path::Path, generation: &AtomicU64, done: &AtomicBool) {
    let modified = || std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let mut last = modified();
    let mut ticks = 0u32;
    while !done.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        ticks += 1;
        if !ticks.is_multiple_of(10) {
            continue;
        }
        let now = modified();
        if now != last {
            last = now;
            generation.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The summary of a run with several targets: the total of their
/// statistics (one-way only where every target's clocks allow it, the
/// loss split summed), each target's own in `extra.targets`.
fn total_summary(
    outcomes: &[(RemoteLeg, crate::probe::SessionOutcome)],
) -> Result<crate::stats::Summary> {
    let mut total = crate::stats::RunStats::new();
    let mut targets = Vec::with_capacity(outcomes.len());
    let mut split = LossSplit {
        forward: Some(0),
        r#return: Some(0),
        unknown: 0,
        basis: "the sum of the targets' splits (see each target's)".into(),
    };
    let mut hidden = None;
    for (t, o) in outcomes {
        total.merge(&o.stats);
        let facts = o
            .remote
            .as_ref()
            .context("internal: a target without the reflector's facts")?;
        let (l, add) = (&facts.loss, |a: Option<u64>, b: u64| a.map(|a| a + b));
        if let (Some(f), Some(r)) = (l.forward, l.r#return) {
            split.forward = add(split.forward, f);
            split.r#return = add(split.r#return, r);
        }
        split.unknown += l.unknown;
        if !facts.clock.one_way_shown {
            hidden.get_or_insert_with(|| facts.clock.clone());
        }
        targets.push(crate::stats::report::TargetSummary {
            name: t.name.clone().unwrap_or_default(),
            address: facts
                .info
                .target
                .clone()
                .unwrap_or_else(|| t.target.addr.to_string()),
            errors: facts.open_errors,
            last_error: facts.last_open_error.clone(),
            protocol: t.target.protocol.name().into(),
            interval_ns: t.cfg.interval.as_nanos() as u64,
            size: t.cfg.size,
            tos: t.cfg.tos,
            labels: t.labels.clone(),
            summary: summarise(o, facts, "remote"),
        });
    }
    let mut s = total.summary();
    s.xdp_mode_requested = "none".into();
    s.xdp_mode_attached = "none".into();
    if let Some(v) = &hidden {
        crate::probe::remote::apply_clock_rule(&mut s, v);
    }
    s.report.loss_split = Some(split);
    s.report.late_arrivals = Some(outcomes.iter().map(|(_, o)| o.late_arrivals).sum());
    s.report.peak_rss_kib = Some(crate::sys::host::peak_rss_kib());
    s.report.interrupted = outcomes.iter().any(|(_, o)| o.interrupted);
    s.report.targets = targets;
    s.report.host = Some(crate::sys::host::host_facts());
    Ok(s)
}

/// One target's session leg: its address, protocol and probe options.
fn remote_leg(
    opts: &RunOptions,
    t: &TargetSpec,
    key: &Option<crate::probe::stamp::HmacKey>,
) -> RemoteLeg {
    RemoteLeg {
        target: Target {
            addr: t.addr,
            protocol: t.protocol,
            key: (t.protocol == ProtocolArg::Stamp)
                .then(|| key.clone())
                .flatten(),
            stateless_reflector: false,
            shared_clock: false,
        },
        cfg: ProbeConfig {
            port: t.addr.port(),
            tos: t.tos,
            size: t.size,
            interval: t.interval,
            ..opts.probe.clone()
        },
        name: Some(t.name.clone()),
        labels: t.labels.clone(),
        host: t.host.clone(),
    }
}

/// The CSV's first line for a run with several targets.
fn targets_meta(opts: &RunOptions, list: &[TargetSpec]) -> RunMeta {
    let place = crate::probe::meta::Place {
        testbed: "remote".into(),
        tx_if: Some("this host".into()),
        rx_if: Some(format!("{} targets (the target column)", list.len())),
        xdp_mode_requested: "none".into(),
        xdp_mode_attached: "none".into(),
        xdp_action: "none".into(),
        reflector: "remote".into(),
        ..Default::default()
    };
    // The header's size, interval and TOS are the first target's; each
    // target's own are in the summary's `extra.targets`.
    let first = list.first().map(|t| ProbeConfig {
        port: t.addr.port(),
        tos: t.tos,
        size: t.size,
        interval: t.interval,
        ..opts.probe.clone()
    });
    crate::probe::meta::run_meta(
        first.as_ref().unwrap_or(&opts.probe),
        opts.label.clone(),
        place,
    )
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
