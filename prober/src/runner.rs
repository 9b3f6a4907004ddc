//! One probe run end to end: testbed, XDP router, probe session, summary,
//! teardown. Teardown happens through guards, so it also runs on errors and
//! after Ctrl-C.

use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::{Context, Result, bail};

use crate::{
    ebpf::{ReflectorKind, XdpMode, XdpSetup},
    export::CsvWriter,
    model::run::{RunMeta, RunOutcome, peak_rss_kib},
    probe::{self, Endpoints, ProbeConfig},
    spec::{
        RunOptions,
        remote::{ProtocolArg, RemoteOptions},
    },
    testbed::{Kind, Testbed},
    tune,
};

/// One line naming every output that failed and what each holds: the one
/// that stopped the run (CSV, HDR log: its message says where it ends) and
/// the JSON summary written after it. None when all were written.
pub fn failed_outputs(
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

/// The checks of a run's options that need the system, which the spec's
/// validator leaves to the run: the key file is read, the target
/// resolved. Callers run it before they start anything that outlives a
/// rejection, the `--metrics-listen` server first: a bad option must never
/// leave a port listening. [`execute`] runs it again, so a caller that
/// forgets still gets the error, only later.
pub fn check(opts: &RunOptions) -> Result<()> {
    let remote = &opts.remote;
    if remote.target.is_some() {
        remote.target_addr(remote.port(opts.probe.port))?;
    }
    if let Some(path) = &remote.auth_key {
        crate::spec::remote::read_key(path)?;
    }
    Ok(())
}

/// Runs one probe session on a testbed as `opts` says; `live` shows and
/// serves it while it runs.
pub fn execute(
    opts: &RunOptions,
    stop: &AtomicU8,
    live: &mut crate::export::live::Live,
) -> Result<RunOutcome> {
    check(opts)?;
    // `--target` runs go to `app::probe`; `--protocol stamp` sends STAMP
    // through the testbed.
    let remote = &opts.remote;
    if remote.target.is_some() {
        bail!("internal: a --target run reached the testbed runner");
    }
    crate::testbed::require_root()?;
    check_stop(stop)?;
    let testbed = match (&opts.tx_if, &opts.rx_if) {
        (Some(t), Some(r)) => Testbed::nic_pair(t, r, opts.force)?,
        (None, None) => Testbed::veth()?,
        _ => bail!("internal: NIC-pair mode without both interfaces passed the validator"),
    };
    log::info!(
        "testbed {} ready: namespaces {}",
        testbed.id,
        testbed.namespaces().join(", ")
    );
    check_stop(stop)?;
    let out = probe_on(&testbed, opts, remote, stop, live)?;
    // Explicit, so a failure to give interfaces back is reported.
    testbed.teardown()?;
    Ok(out)
}

/// Everything that happens on a built testbed: XDP, knobs, the probe
/// session. Whatever it set up is undone before it returns, error or not.
fn probe_on(
    testbed: &Testbed,
    opts: &RunOptions,
    remote: &RemoteOptions,
    stop: &AtomicU8,
    live: &mut crate::export::live::Live,
) -> Result<RunOutcome> {
    // Knobs before XDP, undone after it: with a native XDP program on a
    // veth the kernel pins some offloads (GSO), so they are changed and
    // put back while no program is attached.
    let mut applied = if opts.knobs.is_empty() {
        None
    } else {
        Some(tune::apply(testbed, &opts.knobs)?)
    };
    if let (Some(a), Some(q)) = (applied.as_mut(), &opts.queue_csv) {
        a.start_queue_sampler(q)?;
    }
    check_stop(stop)?;
    let mut xdp = crate::ebpf::attach_for_testbed(testbed, opts.xdp_mode, opts.xdp_action)?;
    check_stop(stop)?;
    let stamp = remote.protocol() == ProtocolArg::Stamp;
    let stamp_port = remote.port(opts.probe.port);
    let key = remote
        .auth_key
        .as_deref()
        .map(crate::spec::remote::read_key)
        .transpose()?;
    let user_only = key.is_some().then_some(ReflectorKind::User);
    // The probes' addresses (`--ip`): the receiver's is where they go.
    let ip = opts.ip;
    let (src_ip, dst_ip) = (testbed.sender_if.ip(ip)?, testbed.receiver_if.ip(ip)?);
    let (kernel_reflector, mut reflector_info) = choose_reflector(
        &mut xdp,
        testbed,
        opts,
        user_only,
        stamp.then_some(stamp_port),
    )?;
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
        let socks = testbed
            .receiver
            .run(|| crate::probe::reflect::bind(&[addr]))?;
        let policy = crate::probe::reflect::Policy {
            protocol: ProtocolArg::Stamp,
            key: key.clone(),
            rate_limit_pps: 0,
            stateful: true,
        };
        Some(StampReflector::spawn(socks, policy)?)
    } else {
        None
    };

    let meta = testbed_meta(
        testbed,
        opts,
        &xdp,
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
    let target = |cfg: &ProbeConfig| std::net::SocketAddr::new(dst_ip, cfg.port).to_string();
    let mut flow_observers: Vec<_> = opts
        .extra_flows
        .iter()
        .map(|cfg| live.flow_observer(cfg.flow_labels(&target(cfg)), cfg.kernel_reflector))
        .collect();
    let mut main_observer = live.main_observer(
        main_cfg.flow_labels(&target(&main_cfg)),
        main_cfg.kernel_reflector,
        &meta,
    )?;
    let ep = Endpoints {
        sender_ns: &testbed.sender,
        receiver_ns: &testbed.receiver,
        sender_if: &testbed.sender_if,
        receiver_if: &testbed.receiver_if,
        ip,
    };
    let stamp_outcome = std::sync::Mutex::new(None);
    let stamp_outcome = &stamp_outcome;
    // Every flow is its own session (sockets, reflector, matcher) on its
    // own port, all writing rows into one CSV.
    let mut outcomes = std::thread::scope(|s| {
        let (ep, csv) = (&ep, &csv);
        let others: Vec<_> = opts
            .extra_flows
            .iter()
            .zip(flow_observers.iter_mut())
            .map(|(cfg, observer)| {
                s.spawn(move || {
                    let mut sink = csv;
                    let r = probe::run_session(ep, cfg, &mut sink, stop, &mut **observer);
                    if r.is_err() {
                        stop.fetch_max(probe::STOP_NOW, Ordering::SeqCst);
                    }
                    r
                })
            })
            .collect();
        let mut sink = csv;
        let main = if stamp {
            let target = crate::probe::remote::Target {
                addr: std::net::SocketAddr::new(dst_ip, stamp_port),
                protocol: ProtocolArg::Stamp,
                key: key.clone(),
                stateless_reflector: kernel_reflector,
                shared_clock: true,
            };
            crate::probe::remote::run_session(
                &target,
                &main_cfg,
                Some(ep.sender_ns),
                &mut sink,
                stop,
                &mut main_observer,
            )
            .map(|o| {
                *stamp_outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some((o.loss, o.info));
                o.session
            })
        } else {
            probe::run_session(ep, &main_cfg, &mut sink, stop, &mut main_observer)
        };
        if main.is_err() {
            stop.fetch_max(probe::STOP_NOW, Ordering::SeqCst);
        }
        let mut all = vec![main];
        all.extend(others.into_iter().map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(anyhow::anyhow!("a probe flow thread panicked")))
        }));
        all
    })
    .into_iter()
    .collect::<Result<Vec<_>>>()?;
    let rows = csv
        .into_inner()
        .map_err(|_| anyhow::anyhow!("CSV writer poisoned"))?
        .rows();
    let per_flow: Vec<serde_json::Value> = if opts.extra_flows.is_empty() {
        Vec::new()
    } else {
        std::iter::once(&opts.probe)
            .chain(&opts.extra_flows)
            .zip(&outcomes)
            .map(|(cfg, o)| {
                serde_json::json!({
                    "flow": cfg.flow, "port": cfg.port, "tos": cfg.tos, "size": cfg.size,
                    "interval_ns": cfg.interval.as_nanos() as u64, "summary": o.stats.summary(),
                })
            })
            .collect()
    };
    let output_error = outcomes.iter().find_map(|o| o.output_error.clone());
    let outcome = outcomes.swap_remove(0);
    let mut summary = outcome.stats.summary();
    summary.xdp_mode_requested = meta.xdp_mode_requested.clone();
    summary.xdp_mode_attached = meta.xdp_mode_attached.clone();
    summary.xdp_counters = xdp.counters().context("read XDP counters")?;
    if let Some(c) = xdp.reflector_counters() {
        let c = c.context("read the in-kernel reflector's counters")?;
        reflector_info["counters"] = serde_json::to_value(c).unwrap_or_default();
    }
    if let Some(r) = stamp_reflector {
        let report = r.stop()?;
        reflector_info["counters"] = serde_json::to_value(&report.counters).unwrap_or_default();
    }
    if let Some((loss, info)) = stamp_outcome
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        if let (serde_json::Value::Object(r), serde_json::Value::Object(i)) =
            (&mut reflector_info, info)
        {
            r.extend(i);
        }
        summary.extra.insert(
            "loss_split".into(),
            serde_json::to_value(loss).unwrap_or_default(),
        );
    }
    summary.extra.insert("reflector".into(), reflector_info);
    summary.extra.insert(
        "ip".into(),
        serde_json::json!({"version": ip.number(), "sender": src_ip.to_string(),
            "receiver": dst_ip.to_string()}),
    );
    summary.extra.insert(
        "clock".into(),
        serde_json::json!({"one_way_shown": true, "note": ONE_CLOCK_NOTE}),
    );
    summary
        .extra
        .insert("late_arrivals".into(), outcome.late_arrivals.into());
    summary
        .extra
        .insert("kernel_drops".into(), outcome.kernel_drops.clone());
    summary
        .extra
        .insert("peak_rss_kib".into(), peak_rss_kib().into());
    summary.extra.insert(
        "hardware_timestamping".into(),
        serde_json::json!({"sender": outcome.hardware_tx, "receiver": outcome.hardware_rx}),
    );
    if outcome.hw_clocks.as_object().is_some_and(|o| !o.is_empty()) {
        summary
            .extra
            .insert("hardware_clocks".into(), outcome.hw_clocks.clone());
    }
    if outcome.interrupted {
        summary.extra.insert("interrupted".into(), true.into());
    }
    if let Some(r) = &opts.continuous.rotation {
        summary.extra.insert(
            "csv_rotation".into(),
            serde_json::json!({"when": r.when.to_string(), "keep": r.keep}),
        );
    }
    if let Some(e) = &output_error {
        summary
            .extra
            .insert("output_error".into(), e.clone().into());
    }
    if !per_flow.is_empty() {
        summary
            .extra
            .insert("flows".into(), serde_json::Value::Array(per_flow));
    }
    if let Some(a) = applied.as_mut() {
        summary
            .extra
            .extend(a.stop_load().context("stop the competing load")?);
        if !meta.knobs.is_empty() {
            summary.extra.insert(
                "knobs".into(),
                serde_json::Value::Object(meta.knobs.clone()),
            );
        }
    }
    xdp.detach().context("detach the XDP router")?;
    if let Some(a) = applied {
        a.restore().context("restore the knobs")?;
    }
    Ok(RunOutcome {
        summary,
        meta,
        rows,
        interrupted: outcome.interrupted,
        output_error,
    })
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
    let place = probe::meta::Place {
        testbed: match testbed.kind {
            Kind::Veth => "veth".into(),
            Kind::NicPair => "nic-pair".into(),
        },
        testbed_id: testbed.id.clone(),
        tx_if: Some(testbed.sender_if.name.clone()),
        rx_if: Some(testbed.receiver_if.name.clone()),
        xdp_mode_requested: mode_name(opts.xdp_mode).into(),
        xdp_mode_attached: xdp.attached_mode_name(),
        xdp_action: if opts.xdp_mode == XdpMode::Off {
            "none".into()
        } else {
            opts.xdp_action.as_str().into()
        },
        reflector: if kernel_reflector { "kernel" } else { "user" }.into(),
    };
    RunMeta {
        knobs: {
            let mut k = applied.map(|a| a.metadata()).unwrap_or_default();
            k.extend(pacing_knobs(opts));
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

/// Attaches the in-kernel reflector unless `--reflector user`: asked for
/// explicitly, failing to attach is an error; by default the user-space
/// reflector takes over with a note. Returns whether the kernel answers and
/// what the summary says about it.
fn choose_reflector(
    xdp: &mut XdpSetup,
    testbed: &Testbed,
    opts: &RunOptions,
    forced: Option<ReflectorKind>,
    stamp_port: Option<u16>,
) -> Result<(bool, serde_json::Value)> {
    // STAMP only: the kernel answers STAMP on its port and no rtprobe probes.
    let (probe_port, stamp_port) = match stamp_port {
        Some(p) => (0, p),
        None => (opts.probe.port, 0),
    };
    const KERNEL_LOSS_NOTE: &str = "the in-kernel reflector answers without a socket: a probe \
        counts as arrived when its echo comes back, so loss on the way out and on the way back \
        cannot be told apart (echoes lost is always 0)";
    // No rate limit (see `XdpSetup::attach_reflector_ports`): said in the summary.
    const KERNEL_LIMIT_NOTE: &str = "none: the testbed's reflector answers only the testbed's \
        own sender, at the run's rate";
    let kernel = |mode: crate::ebpf::AttachedMode| serde_json::json!({"kind": "kernel", "xdp_mode": mode.as_str(), "note": KERNEL_LOSS_NOTE, "rate_limit": KERNEL_LIMIT_NOTE});
    let path_ok = xdp.reflector_replies_get_through(testbed);
    const VETH_NEEDS_ROUTER: &str = "the receiver's interface is a veth whose peer is not \
        the veth testbed's router, where rtprobe does not prepare the peer to take the \
        in-kernel reflector's replies (use the veth testbed)";
    match forced.or(opts.reflector) {
        Some(ReflectorKind::User) => Ok((false, serde_json::json!({"kind": "user"}))),
        Some(ReflectorKind::Kernel) => {
            if !path_ok {
                bail!("--reflector kernel: {VETH_NEEDS_ROUTER}; or use --reflector user");
            }
            let mode = xdp
                .attach_reflector_ports(testbed, probe_port, stamp_port)
                .context(
                    "--reflector kernel: cannot attach rtprobe's XDP reflector to the receiver's \
                 interface (use --reflector user, or --xdp-mode off in NIC-pair mode)",
                )?;
            Ok((true, kernel(mode)))
        }
        None if !path_ok => {
            let note = format!("the in-kernel one is not used here: {VETH_NEEDS_ROUTER}");
            log::info!("{note}");
            Ok((false, serde_json::json!({"kind": "user", "note": note})))
        }
        None => match xdp.attach_reflector_ports(testbed, probe_port, stamp_port) {
            Ok(mode) => Ok((true, kernel(mode))),
            Err(e) => {
                let note = format!(
                    "in-kernel reflector not attached ({e:#}): the user-space reflector answers"
                );
                log::info!("{note}");
                Ok((false, serde_json::json!({"kind": "user", "note": note})))
            }
        },
    }
}

/// How the sender paced, stored with the run.
fn pacing_knobs(opts: &RunOptions) -> serde_json::Map<String, serde_json::Value> {
    let p = &opts.probe;
    let mut m = serde_json::Map::new();
    m.insert(
        "pacing".into(),
        serde_json::json!({
            "mode": match (p.busy_poll, p.spin) {
                (true, _) => "busy-poll",
                (false, Some(_)) => "fixed",
                (false, None) => "adaptive",
            },
            "busy_poll": p.busy_poll,
            "spin_ns": if p.busy_poll { None } else { p.spin.map(|s| s.as_nanos() as u64) },
        }),
    );
    m
}

pub fn mode_name(m: XdpMode) -> &'static str {
    m.as_str()
}

/// The testbed's sender and receiver read the same kernel clock.
const ONE_CLOCK_NOTE: &str = "sender and receiver share this host's clock (namespaces): \
    one-way needs no synchronisation";

/// The user-space STAMP reflector of a testbed run, in its own thread.
struct StampReflector {
    stop: std::sync::Arc<AtomicU8>,
    thread: std::thread::JoinHandle<Result<crate::probe::reflect::ServeReport>>,
}

impl StampReflector {
    fn spawn(
        socks: Vec<crate::probe::socket::ProbeSocket>,
        policy: crate::probe::reflect::Policy,
    ) -> Result<Self> {
        let stop = std::sync::Arc::new(AtomicU8::new(0));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rtprobe-reflect".into())
            .spawn(move || {
                let mut core = crate::probe::reflect::Core::new(policy);
                crate::probe::reflect::serve(&socks, &mut core, &s, None, |_| {}, |_| {})
            })
            .context("spawn the STAMP reflector thread")?;
        Ok(Self { stop, thread })
    }

    fn stop(self) -> Result<crate::probe::reflect::ServeReport> {
        self.stop.store(1, Ordering::SeqCst);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the STAMP reflector thread panicked"))?
    }
}
