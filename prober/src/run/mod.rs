//! One probe run from its validated options to its outcome: [`check`]
//! reads the files the options name, [`execute`] runs it. On a testbed
//! (this file): testbed, knobs, XDP router, probe sessions, summary,
//! teardown; teardown happens through guards, so it also runs on errors
//! and after Ctrl-C. Against reflectors not ours to drive (`--target`,
//! `--targets FILE`): `remote.rs`. `endpoints.rs` turns a testbed into
//! the ends a probe session takes; `flows.rs` runs a testbed run's
//! sessions, one per flow; `reflector.rs` picks the testbed's reflector
//! (in the kernel, or user space: for STAMP a `probe::reflect::Host` in
//! the receiver's namespace) and reports on it.

mod endpoints;
mod flows;
mod reflector;
mod remote;

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use anyhow::{Context, Result, bail};

use crate::{
    ebpf::{ReflectorKind, XdpMode, XdpSetup},
    export::CsvWriter,
    model::knobs::PacingKnobs,
    model::meta::RunMeta,
    options::{RunOptions, remote::ProtocolArg, targets::TargetSpec},
    probe::SessionOutcome,
    probe::stamp::HmacKey,
    probe::{self, ProbeConfig},
    stats::outcome::RunOutcome,
    stats::report::{
        ClockReport, CsvRotation, HardwareClocks, HardwareTimestamping, IpReport, OneClock,
        ReflectorReport, RunReport,
    },
    sys::{SysRef, host::peak_rss_kib},
    testbed::{Kind, Testbed},
    tune,
};

/// One line naming every output that failed and what each holds: the one
/// that stopped the run (CSV, HDR log: its message says where it ends) and
/// the JSON summary written after it. None when all were written.
pub(crate) fn failed_outputs(
    output_error: Option<&str>,
    json: Option<&crate::export::atomic::NotWritten>,
) -> Option<String> {
    let mut parts: Vec<String> = output_error.map(str::to_string).into_iter().collect();
    parts.extend(json.map(|e| e.to_string()));
    (!parts.is_empty()).then(|| parts.join("; "))
}

fn check_stop(stop: &AtomicU8) -> Result<()> {
    if stop.load(Ordering::SeqCst) != 0 {
        bail!("interrupted before probing started; nothing was measured (the testbed was removed)");
    }
    Ok(())
}

/// What a run's options name in files, read once by [`check`] for
/// [`execute`]: the targets (`--target`, `--targets FILE`; None on a
/// testbed) and the STAMP key (`--auth-key`).
pub(crate) struct Checked {
    targets: Option<Vec<TargetSpec>>,
    key: Option<HmacKey>,
}

/// The checks of a run's options that need the system, which the spec's
/// validator leaves to the run: the targets and the key file are read.
/// Callers run it before they start anything that outlives a rejection,
/// the `--metrics-listen` server first: a bad option must never leave a
/// port listening. [`execute`] takes what it read, so no run starts
/// unchecked and neither file is read twice.
pub(crate) fn check(opts: &RunOptions) -> Result<Checked> {
    let remote = &opts.remote;
    let targets = if remote.is_remote() {
        crate::options::targets::of(remote, &opts.probe)?
    } else {
        None
    };
    let key = remote
        .auth_key
        .as_deref()
        .map(crate::options::remote::read_key)
        .transpose()?;
    Ok(Checked { targets, key })
}

/// Runs one probe run as `opts` says (with the files [`check`] read),
/// its outcome for the caller to print: against the remote reflectors of
/// `--target` (or `--targets FILE`, read again at each `reload`
/// request), else on a testbed this host builds, every kernel change
/// through `sys`; `live` shows and serves it while it runs.
pub(crate) fn execute(
    opts: &RunOptions,
    checked: Checked,
    sys: SysRef,
    stop: &AtomicU8,
    live: &mut crate::export::live::Live,
    reload: Option<&AtomicU64>,
) -> Result<RunOutcome> {
    if reload.is_none() && !opts.remote.is_remote() {
        return execute_testbed(opts, checked.key, sys, stop, live);
    }
    remote::execute(opts, checked, stop, live, reload)
}

/// An error of the configuration, not of the run: a targets or key file
/// that fails its checks, or more targets than the open-file limit allows.
/// The command exits with status 78 (EX_CONFIG) on it: restarting cannot
/// fix the file.
#[derive(Debug)]
pub(crate) struct ConfigError(anyhow::Error);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for ConfigError {}

pub(super) fn config_error(e: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(ConfigError(e))
}

/// Runs one probe session on a testbed as `opts` says, every kernel
/// change through `sys` (the real kernel from the command; the recording
/// fake in tests of [`orchestrate`]); `live` shows and serves it while it
/// runs; `key`: the STAMP key [`check`] read.
fn execute_testbed(
    opts: &RunOptions,
    key: Option<HmacKey>,
    sys: SysRef,
    stop: &AtomicU8,
    live: &mut crate::export::live::Live,
) -> Result<RunOutcome> {
    // `--target` runs go to [`remote`]; `--protocol stamp` sends STAMP
    // through the testbed.
    let remote = &opts.remote;
    if remote.is_remote() {
        bail!("internal: a --target run reached the testbed runner");
    }
    crate::testbed::require_root()?;
    let build = |sys: SysRef| match (&opts.tx_if, &opts.rx_if) {
        (Some(t), Some(r)) => Testbed::nic_pair(sys, t, r, opts.force),
        (None, None) => Testbed::veth(sys),
        _ => bail!("internal: NIC-pair mode without both interfaces passed the validator"),
    };
    let mut loader = crate::ebpf::KernelLoader(sys.clone());
    orchestrate(
        sys,
        &Frame::of(opts),
        stop,
        build,
        &mut loader,
        |testbed, prepared| probe_on(testbed, prepared, opts, key, stop, live),
    )
}

/// What the frame around a run's probe step takes from its options.
pub(crate) struct Frame<'a> {
    pub(crate) knobs: &'a tune::Knobs,
    /// Where the queue sampler writes, if the knobs ask for one.
    pub(crate) queue_csv: Option<&'a std::path::Path>,
    pub(crate) xdp_mode: XdpMode,
    pub(crate) xdp_action: crate::ebpf::XdpAction,
}

impl<'a> Frame<'a> {
    pub(crate) fn of(opts: &'a RunOptions) -> Self {
        Self {
            knobs: &opts.knobs,
            queue_csv: opts.queue_csv.as_deref(),
            xdp_mode: opts.xdp_mode,
            xdp_action: opts.xdp_action,
        }
    }
}

/// What the frame has set up on the testbed when the probe step runs.
/// Fields drop in declaration order: on an error the XDP programs go
/// first, then the knobs are put back (see [`on_testbed`]).
pub(crate) struct Prepared<'tb> {
    pub(crate) xdp: XdpSetup,
    pub(crate) applied: Option<tune::Applied<'tb>>,
}

/// A testbed run end to end around its probe step: build the testbed
/// (`build`, through `sys`), apply the knobs, attach XDP (programs from
/// `loader`), run `probe`, detach, restore, tear down. Whatever it set up
/// is undone on an error too, in the same order. [`execute`] runs it on
/// the real kernel with the probe session; tests run it on the fake.
pub(crate) fn orchestrate<T>(
    sys: SysRef,
    frame: &Frame<'_>,
    stop: &AtomicU8,
    build: impl FnOnce(SysRef) -> Result<Testbed>,
    loader: &mut dyn crate::ebpf::Loader,
    probe: impl for<'tb> FnOnce(&'tb Testbed, &mut Prepared<'tb>) -> Result<T>,
) -> Result<T> {
    check_stop(stop)?;
    let testbed = build(sys)?;
    log::info!(
        "testbed {} ready: namespaces {}",
        testbed.id,
        testbed.namespaces().join(", ")
    );
    check_stop(stop)?;
    let out = on_testbed(&testbed, frame, stop, loader, probe)?;
    // Explicit, so a failure to give interfaces back is reported.
    testbed.teardown()?;
    Ok(out)
}

/// Knobs, XDP and the probe step on a built testbed. Whatever it set up
/// is undone before it returns, error or not.
fn on_testbed<'tb, T>(
    testbed: &'tb Testbed,
    frame: &Frame<'_>,
    stop: &AtomicU8,
    loader: &mut dyn crate::ebpf::Loader,
    probe: impl FnOnce(&'tb Testbed, &mut Prepared<'tb>) -> Result<T>,
) -> Result<T> {
    // Knobs before XDP, undone after it: with a native XDP program on a
    // veth the kernel pins some offloads (GSO), so they are changed and
    // put back while no program is attached.
    let mut applied = if frame.knobs.is_empty() {
        None
    } else {
        Some(tune::apply(testbed, frame.knobs)?)
    };
    if let (Some(a), Some(q)) = (applied.as_mut(), frame.queue_csv) {
        a.start_queue_sampler(q)?;
    }
    check_stop(stop)?;
    let xdp =
        crate::ebpf::attach_for_testbed_with(testbed, frame.xdp_mode, frame.xdp_action, loader)?;
    let mut prepared = Prepared { xdp, applied };
    check_stop(stop)?;
    let out = probe(testbed, &mut prepared)?;
    let Prepared { xdp, applied } = prepared;
    xdp.detach().context("detach the XDP router")?;
    if let Some(a) = applied {
        a.restore().context("restore the knobs")?;
    }
    Ok(out)
}

/// The probe session on a testbed the frame prepared ([`orchestrate`]),
/// and its summary.
fn probe_on<'tb>(
    testbed: &'tb Testbed,
    prepared: &mut Prepared<'tb>,
    opts: &RunOptions,
    key: Option<HmacKey>,
    stop: &AtomicU8,
    live: &mut crate::export::live::Live,
) -> Result<RunOutcome> {
    let Prepared { xdp, applied } = prepared;
    let remote = &opts.remote;
    let stamp = remote.protocol() == ProtocolArg::Stamp;
    let stamp_port = remote.port(opts.probe.port);
    let user_only = key.is_some().then_some(ReflectorKind::User);
    // The probes' addresses (`--ip`): the receiver's is where they go.
    let ip = opts.ip;
    let (src_ip, dst_ip) = (testbed.sender_if.ip(ip)?, testbed.receiver_if.ip(ip)?);
    let (kernel_reflector, reflector_info) =
        reflector::choose_reflector(xdp, testbed, opts, user_only, stamp.then_some(stamp_port))?;
    let main_cfg = ProbeConfig {
        kernel_reflector,
        port: if stamp { stamp_port } else { opts.probe.port },
        ..opts.probe.clone()
    };
    // STAMP through the testbed: rtprobe's session-sender in the sender
    // namespace; at the receiver the in-kernel reflector or the same
    // user-space reflector `rtprobe reflect` runs.
    let stamp_reflector = if stamp && !kernel_reflector {
        let addr = std::net::SocketAddr::new(crate::testbed::unspecified(dst_ip), stamp_port);
        Some(reflector::stamp_reflector_on_receiver(
            testbed,
            addr,
            key.clone(),
        )?)
    } else {
        None
    };

    let meta = testbed_meta(
        testbed,
        opts,
        xdp,
        kernel_reflector,
        &main_cfg,
        applied.as_ref(),
    );
    let csv = std::sync::Mutex::new(CsvWriter::create_rotated(
        &opts.out,
        &meta,
        opts.continuous.rotation,
    )?);
    live.set_run(&meta);
    let (mut main_observer, mut flow_observers) =
        flows::observers(live, opts, &main_cfg, dst_ip, &meta)?;
    let ep = endpoints::of(testbed, ip)?;
    let stamp_target = stamp.then(|| crate::probe::remote::Target {
        addr: std::net::SocketAddr::new(dst_ip, stamp_port),
        protocol: ProtocolArg::Stamp,
        key: key.clone(),
        stateless_reflector: kernel_reflector,
        shared_clock: true,
    });
    let flows = flows::Flows {
        ep: &ep,
        main_cfg: &main_cfg,
        extra: &opts.extra_flows,
        stamp_target: stamp_target.as_ref(),
    };
    let outcomes = flows.run(&csv, stop, &mut main_observer, &mut flow_observers)?;
    let rows = csv
        .into_inner()
        .map_err(|_| anyhow::anyhow!("CSV writer poisoned"))?
        .rows();
    let ran = Ran {
        outcomes,
        rows,
        meta,
        reflector_info,
        stamp_reflector,
        addrs: (src_ip, dst_ip),
    };
    testbed_outcome(ran, xdp, applied, opts)
}

/// What a testbed run's sessions left, for its outcome.
struct Ran {
    /// The main flow's first, then the extra flows'.
    outcomes: Vec<SessionOutcome>,
    rows: u64,
    meta: RunMeta,
    /// The reflector chosen, before its counters.
    reflector_info: ReflectorReport,
    stamp_reflector: Option<crate::probe::reflect::Host>,
    /// The sender's and the receiver's addresses.
    addrs: (std::net::IpAddr, std::net::IpAddr),
}

/// A testbed run's outcome: the main flow's summary with the XDP
/// counters, the reflector, the addresses, the session's facts, the
/// flows and the knobs.
fn testbed_outcome(
    ran: Ran,
    xdp: &XdpSetup,
    applied: &mut Option<tune::Applied<'_>>,
    opts: &RunOptions,
) -> Result<RunOutcome> {
    let Ran {
        mut outcomes,
        rows,
        meta,
        reflector_info,
        stamp_reflector,
        addrs: (src_ip, dst_ip),
    } = ran;
    let per_flow = flows::flow_summaries(opts, &outcomes);
    let output_error = outcomes.iter().find_map(|o| o.output_error.clone());
    let outcome = outcomes.swap_remove(0);
    let mut summary = outcome.stats.summary();
    summary.xdp_mode_requested = meta.xdp_mode_requested.clone();
    summary.xdp_mode_attached = meta.xdp_mode_attached.clone();
    summary.xdp_counters = xdp.counters().context("read XDP counters")?;
    // STAMP: what the session-sender learned of the reflector.
    let (loss_split, stamp_info) = outcome.remote.clone().map(|f| (f.loss, f.info)).unzip();
    let r = &mut summary.report;
    if loss_split.is_some() {
        r.loss_split = loss_split;
    }
    r.reflector = Some(reflector::reflector_report(
        xdp,
        reflector_info,
        stamp_reflector,
        stamp_info,
    )?);
    r.ip = Some(IpReport {
        version: opts.ip.number(),
        sender: src_ip.to_string(),
        receiver: dst_ip.to_string(),
    });
    session_report(r, &outcome, opts);
    r.output_error = output_error.clone();
    r.flows = per_flow;
    if let Some(a) = applied.as_mut() {
        knobs_report(r, a, &meta)?;
    }
    Ok(RunOutcome {
        summary,
        meta,
        rows,
        interrupted: outcome.interrupted,
        output_error,
    })
}

/// The report's knobs and the competing load, which stops here.
fn knobs_report(r: &mut RunReport, applied: &mut tune::Applied<'_>, meta: &RunMeta) -> Result<()> {
    (r.load, r.skipped) = applied.stop_load().context("stop the competing load")?;
    if !meta.knobs.is_empty() {
        r.knobs = Some(meta.knobs.clone());
    }
    Ok(())
}

/// The report's fields that come from the main session and the run's
/// options: clock, late arrivals, drops, memory, the host, hardware
/// stamps, interruption, CSV rotation.
fn session_report(r: &mut RunReport, outcome: &SessionOutcome, opts: &RunOptions) {
    r.clock = Some(ClockReport::OneClock(OneClock {
        one_way_shown: true,
        note: ONE_CLOCK_NOTE.into(),
    }));
    r.late_arrivals = Some(outcome.late_arrivals);
    r.kernel_drops = Some(outcome.kernel_drops.clone());
    r.peak_rss_kib = Some(peak_rss_kib());
    r.host = Some(crate::sys::host::host_facts());
    r.hardware_timestamping = Some(HardwareTimestamping {
        sender: outcome.hardware_tx,
        receiver: outcome.hardware_rx,
    });
    if outcome.hw_clocks != HardwareClocks::default() {
        r.hardware_clocks = Some(outcome.hw_clocks.clone());
    }
    r.interrupted = outcome.interrupted;
    r.csv_rotation = opts.continuous.rotation.as_ref().map(|rot| CsvRotation {
        when: rot.when.to_string(),
        keep: rot.keep,
    });
}

/// The metadata of a testbed run: the main flow's probes, the testbed,
/// the router and reflector, the knobs applied and the extra flows.
fn testbed_meta(
    testbed: &Testbed,
    opts: &RunOptions,
    xdp: &XdpSetup,
    kernel_reflector: bool,
    main_cfg: &ProbeConfig,
    applied: Option<&tune::Applied<'_>>,
) -> RunMeta {
    let kind = match testbed.kind {
        Kind::Veth => "veth",
        Kind::NicPair => "nic-pair",
    };
    let action = if opts.xdp_mode == XdpMode::Off {
        "none"
    } else {
        opts.xdp_action.as_str()
    };
    let reflector = if kernel_reflector { "kernel" } else { "user" };
    let place = probe::meta::Place::testbed(kind, &testbed.id, reflector)
        .interfaces(&testbed.sender_if.name, &testbed.receiver_if.name)
        .xdp(mode_name(opts.xdp_mode), xdp.attached_mode_name(), action);
    RunMeta {
        knobs: {
            let mut k = applied.map(|a| a.metadata()).unwrap_or_default();
            k.pacing = Some(pacing_knobs(opts));
            k
        },
        extra_flows: opts
            .extra_flows
            .iter()
            .map(|f| {
                serde_json::json!({"flow": f.flow, "port": f.port, "tos": f.tos, "size": f.size,
                    "interval_ns": f.interval.as_nanos() as u64})
            })
            .collect(),
        ..probe::meta::run_meta(main_cfg, opts.label.clone(), place)
    }
}

/// How the sender paced, stored with the run.
fn pacing_knobs(opts: &RunOptions) -> PacingKnobs {
    let p = &opts.probe;
    PacingKnobs {
        busy_poll: p.busy_poll,
        mode: match (p.busy_poll, p.spin) {
            (true, _) => "busy-poll",
            (false, Some(_)) => "fixed",
            (false, None) => "adaptive",
        }
        .into(),
        no_warm_up: p.no_warm_up,
        spin_ns: if p.busy_poll {
            None
        } else {
            p.spin.map(|s| s.as_nanos() as u64)
        },
    }
}

pub(crate) fn mode_name(m: XdpMode) -> &'static str {
    m.as_str()
}

/// The testbed's sender and receiver read the same kernel clock.
const ONE_CLOCK_NOTE: &str = "sender and receiver share this host's clock (namespaces): \
    one-way needs no synchronisation";

#[cfg(test)]
mod orchestrate_tests;
#[cfg(test)]
mod undo_tests;
