//! A run against reflectors not ours to drive (`--target`, repeated, or
//! `--targets FILE`): one session against one target, or one session
//! against many with a `target` column in the CSV, per-target metrics
//! and a summary that totals them; the targets file read again on a
//! reload request (SIGHUP, or the file changed).

use std::{
    net::SocketAddr,
    sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering},
};

use anyhow::{Context, Result};

use super::{Checked, config_error};
use crate::{
    export::{CsvWriter, live::Live},
    model::meta::RunMeta,
    options::{RunOptions, remote::ProtocolArg, targets::TargetSpec},
    probe::{
        ProbeConfig, SessionEnds,
        meta::Place,
        remote::{LossSplit, OpenStep, Reloads, RemoteLeg, Target, open_files_for, summarise},
        run_session, run_targets,
    },
    stats::{observer::SessionObserver, outcome::RunOutcome},
};

/// `rtprobe --target HOST[:PORT]`: one session against a remote reflector,
/// written and summarised as a testbed run is. Several targets (the flag
/// repeated, or `--targets FILE`) go to [`execute_targets`], and so does
/// every run with `reload` (the targets file read again on request).
/// The targets and the key are those [`super::check`] read.
pub(super) fn execute(
    opts: &RunOptions,
    checked: Checked,
    stop: &AtomicU8,
    live: &mut Live,
    reload: Option<&AtomicU64>,
) -> Result<RunOutcome> {
    let remote = &opts.remote;
    let Checked { targets, key } = checked;
    let list = targets.context("internal: execute without --target")?;
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
        cfg: target_cfg(opts, t),
        name: Some(t.name.clone()),
        labels: t.labels.clone(),
        host: t.host.clone(),
    }
}

/// A target's probe options: the run's, with the target's port, TOS,
/// size and interval.
fn target_cfg(opts: &RunOptions, t: &TargetSpec) -> ProbeConfig {
    ProbeConfig {
        port: t.addr.port(),
        tos: t.tos,
        size: t.size,
        interval: t.interval,
        ..opts.probe.clone()
    }
}

/// The CSV's first line for a run with several targets.
fn targets_meta(opts: &RunOptions, list: &[TargetSpec]) -> RunMeta {
    let place = Place::remote(
        format!("{} targets (the target column)", list.len()),
        "remote".into(),
    );
    // The header's size, interval and TOS are the first target's; each
    // target's own are in the summary's `extra.targets`.
    let first = list.first().map(|t| target_cfg(opts, t));
    crate::probe::meta::run_meta(
        first.as_ref().unwrap_or(&opts.probe),
        opts.label.clone(),
        place,
    )
}

/// The CSV's first line for a `--target` run: no testbed, no XDP.
fn remote_meta(opts: &RunOptions, cfg: &ProbeConfig, target: &Target, addr: SocketAddr) -> RunMeta {
    let place = Place::remote(
        addr.to_string(),
        format!("remote {}", target.protocol.name()),
    );
    crate::probe::meta::run_meta(cfg, opts.label.clone(), place)
}
