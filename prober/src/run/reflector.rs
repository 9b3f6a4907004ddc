//! The reflector of a testbed run: the in-kernel one attached at the
//! receiver or the user-space one answering there ([`choose_reflector`]),
//! the user-space STAMP reflector in the receiver's namespace (a
//! `probe::reflect::Host`), and what the report says of the one that
//! answered.

use anyhow::{Context, Result, bail};

use crate::{
    ebpf::{ReflectorKind, XdpSetup},
    options::{RunOptions, remote::ProtocolArg},
    stats::report::{ReflectorCounts, ReflectorReport},
    testbed::Testbed,
};

/// Attaches the in-kernel reflector unless `--reflector user`: asked for
/// explicitly, failing to attach is an error; by default the user-space
/// reflector takes over with a note. Returns whether the kernel answers and
/// what the summary says about it.
pub(super) fn choose_reflector(
    xdp: &mut XdpSetup,
    testbed: &Testbed,
    opts: &RunOptions,
    forced: Option<ReflectorKind>,
    stamp_port: Option<u16>,
) -> Result<(bool, ReflectorReport)> {
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
    let kernel = |mode: crate::ebpf::AttachedMode| ReflectorReport {
        xdp_mode: Some(mode.as_str().into()),
        note: Some(KERNEL_LOSS_NOTE.into()),
        rate_limit: Some(KERNEL_LIMIT_NOTE.into()),
        ..ReflectorReport::of_kind("kernel")
    };
    let user = |note: Option<String>| ReflectorReport {
        note,
        ..ReflectorReport::of_kind("user")
    };
    let path_ok = xdp.reflector_replies_get_through(testbed);
    const VETH_NEEDS_ROUTER: &str = "the receiver's interface is a veth whose peer is not \
        the veth testbed's router, where rtprobe does not prepare the peer to take the \
        in-kernel reflector's replies (use the veth testbed)";
    match forced.or(opts.reflector) {
        Some(ReflectorKind::User) => Ok((false, user(None))),
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
            Ok((false, user(Some(note))))
        }
        None => match xdp.attach_reflector_ports(testbed, probe_port, stamp_port) {
            Ok(mode) => Ok((true, kernel(mode))),
            Err(e) => {
                let note = format!(
                    "in-kernel reflector not attached ({e:#}): the user-space reflector answers"
                );
                log::info!("{note}");
                Ok((false, user(Some(note))))
            }
        },
    }
}

/// The user-space STAMP reflector of a testbed run, in its own thread:
/// binds `addr` in the testbed's receiver namespace and answers STAMP
/// there, statefully, with `key` if the run has one.
pub(super) fn stamp_reflector_on_receiver(
    testbed: &Testbed,
    addr: std::net::SocketAddr,
    key: Option<crate::probe::stamp::HmacKey>,
) -> Result<crate::probe::reflect::Host> {
    let socks = testbed
        .receiver
        .run(|| crate::probe::reflect::bind(&[addr]))?;
    let policy = crate::probe::reflect::Policy {
        key,
        ..crate::probe::reflect::Policy::unlimited(ProtocolArg::Stamp)
    };
    crate::probe::reflect::Host::start(socks, policy)
}

/// The reflector's report: what [`choose_reflector`] said, with the
/// counters of the reflector that answered and, for STAMP, the protocol
/// facts the session-sender learned.
pub(super) fn reflector_report(
    xdp: &XdpSetup,
    chosen: ReflectorReport,
    stamp_reflector: Option<crate::probe::reflect::Host>,
    stamp_info: Option<ReflectorReport>,
) -> Result<ReflectorReport> {
    let mut report = chosen;
    if let Some(c) = xdp.reflector_counters() {
        let c = c.context("read the in-kernel reflector's counters")?;
        report.counters = Some(ReflectorCounts::Kernel(c));
    }
    if let Some(r) = stamp_reflector {
        report.counters = Some(ReflectorCounts::User(r.stop()?.0.counters));
    }
    Ok(match stamp_info {
        Some(info) => ReflectorReport {
            kind: report.kind,
            note: report.note,
            rate_limit: report.rate_limit,
            xdp_mode: report.xdp_mode,
            counters: report.counters,
            ..info
        },
        None => report,
    })
}
