//! Probing: sockets and their stamps, the pacer, the matcher, the
//! user-space reflector and the wire formats (rtprobe, STAMP). Every
//! session runs through one engine ([`engine`]): its warm-up, its reads,
//! its threads and the collector that turns its events into records
//! (`engine/collect.rs`); [`pair`] holds the testbed's and NIC pair's side
//! of it (hardware timestamping, the two sockets in their namespaces).
//! This file holds the session's plain types and the entry points of a
//! session.

pub(crate) mod addresses;
pub(crate) mod clock;
pub mod cmsg;
pub(crate) mod cpu_wait;
pub(crate) mod engine;
pub(crate) mod events;
pub(crate) mod kstats;
pub mod matcher;
pub(crate) mod meta;
pub(crate) mod pacer;
pub mod packet;
pub(crate) mod pair;
pub(crate) mod phc;
pub mod reflect;
pub(crate) mod remote;
pub(crate) mod socket;
pub mod stamp;
pub(crate) mod timestamps;
pub(crate) mod wake;
pub(crate) mod wire;

pub use engine::collect::Collector;
pub(crate) use engine::collect::HwSetup;
pub use timestamps::TimestampSource;
pub use wire::ProtocolArg;

use std::{sync::atomic::AtomicU8, time::Duration};

use anyhow::{Context, Result, bail};

use crate::{
    model::record::RecordSink,
    stats::{
        RunStats,
        observer::SessionObserver,
        report::{HardwareClocks, KernelDrops},
    },
    sys::Netns,
};

/// Stop levels set by the signal handler: 1 = stop sending and wait for
/// probes in flight, 2 = finish at once.
pub(crate) const STOP_SENDING: u8 = 1;
pub(crate) const STOP_NOW: u8 = 2;

impl ProbeConfig {
    /// The labels of this flow's metrics (and its HDR log's header).
    pub fn flow_labels(&self, target: &str) -> crate::export::metrics::FlowLabels {
        crate::export::metrics::FlowLabels::new(target, self.flow, self.tos, self.size)
    }
}

/// Validated probe options.
#[derive(Clone)]
pub struct ProbeConfig {
    pub size: usize,
    pub interval: Duration,
    pub count: Option<u64>,
    pub duration: Option<Duration>,
    pub tos: u8,
    pub port: u16,
    pub timestamps: TimestampSource,
    pub timeout: Duration,
    pub flow: u8,
    /// The pacer sleeps until this long before a send, then spins (`--spin`);
    /// None: a margin learned from the machine's wake-up latency.
    pub spin: Option<Duration>,
    /// Spin over the whole interval instead of sleeping.
    pub busy_poll: bool,
    /// No loopback warm-up after a wake-up (`--no-warm-up`).
    pub no_warm_up: bool,
    /// Real-time settings the sender thread applies to itself (its
    /// SCHED_FIFO priority also goes to the probe's receive threads).
    pub rt: crate::sys::rt::RtSettings,
    /// rtprobe's in-kernel reflector (XDP) answers this flow's probes at
    /// the receiver: arrivals come from the echoes' payloads.
    pub kernel_reflector: bool,
}

impl std::fmt::Debug for ProbeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeConfig")
            .field("size", &self.size)
            .field("interval", &self.interval)
            .field("count", &self.count)
            .field("duration", &self.duration)
            .field("tos", &self.tos)
            .field("port", &self.port)
            .field("timestamps", &self.timestamps)
            .field("timeout", &self.timeout)
            .field("flow", &self.flow)
            .field("spin", &self.spin)
            .field("busy_poll", &self.busy_poll)
            .field("no_warm_up", &self.no_warm_up)
            .field("rt", &self.rt)
            .field("kernel_reflector", &self.kernel_reflector)
            .finish()
    }
}

/// Where probes go from and to.
pub(crate) struct Endpoints<'a> {
    /// The kernel layer that reads the namespaces' drop counters.
    pub(crate) sys: &'a dyn crate::sys::Sys,
    pub(crate) sender_ns: &'a Netns,
    pub(crate) receiver_ns: &'a Netns,
    /// The interfaces the probes leave from and arrive on (hardware
    /// timestamping, their PTP clocks).
    pub(crate) sender_if: &'a str,
    pub(crate) receiver_if: &'a str,
    /// Where the probes go: the receiver's address in the run's family
    /// (`--ip`).
    pub(crate) dst_ip: std::net::IpAddr,
}

/// What the session learned besides the records.
pub(crate) struct SessionOutcome {
    pub(crate) stats: RunStats,
    pub(crate) hardware_tx: bool,
    pub(crate) hardware_rx: bool,
    pub(crate) late_arrivals: u64,
    pub(crate) interrupted: bool,
    /// Kernel counters that explain losses (receive-buffer and backlog drops).
    /// None where no testbed's counters were sampled (a remote target).
    pub(crate) kernel_drops: Option<KernelDrops>,
    /// Per NIC with hardware stamps: its PHC, the offset's uncertainty and
    /// drift against the system clock, or why its stamps were left out.
    pub(crate) hw_clocks: HardwareClocks,
    /// An output (CSV, HDR log...) failed during the run and stopped it,
    /// in words: "CSV ends at probe 41999: No space left on device".
    pub(crate) output_error: Option<String>,
    /// What a reflector not ours to drive told besides the records (loss
    /// by direction, clocks, protocol facts). None on the testbed's own
    /// rtprobe sessions.
    pub(crate) remote: Option<remote::RemoteFacts>,
}

fn new_session_id() -> u64 {
    use rand::Rng;
    rand::rng().random::<u64>() | 1
}

/// Where a session's probes go from and to, and so who answers them.
pub(crate) enum SessionEnds<'a> {
    /// The self-built testbed or a NIC pair: sender and receiver in their
    /// namespaces, rtprobe's reflector at the receiver (in this process,
    /// or in the kernel where the probe config says `kernel_reflector`).
    Testbed(&'a Endpoints<'a>),
    /// A reflector not ours to drive (`--target`, or STAMP through the
    /// testbed), probed from namespace `from` (None: the calling thread's).
    Remote {
        target: &'a remote::Target,
        from: Option<&'a Netns>,
    },
}

/// Runs one probe session, streaming records to `csv`. Returns when every
/// probe is sent and accounted for, or when `stop` says so. Every run goes
/// through here: the testbed, the NIC pair and a remote target differ
/// only in how the sockets and the reflector are set up before
/// [`engine::warm_up`] and [`engine::drive`], and in what is read back after them.
pub(crate) fn run_session(
    ends: &SessionEnds<'_>,
    cfg: &ProbeConfig,
    csv: &mut dyn RecordSink,
    stop: &AtomicU8,
    observer: &mut dyn SessionObserver,
) -> Result<SessionOutcome> {
    match ends {
        SessionEnds::Testbed(ep) => {
            let mut outs = [engine::LegOut { csv, observer }];
            let mut got = run_testbed(ep, std::slice::from_ref(cfg), &mut outs, stop)?;
            got.pop()
                .context("internal: the session's flow gave no outcome")
        }
        SessionEnds::Remote { target, from } => {
            let leg = remote::RemoteLeg {
                target: (*target).clone(),
                cfg: cfg.clone(),
                name: None,
                labels: Default::default(),
                host: None,
            };
            let mut once = Some(observer);
            let mut observer_for = |_: &remote::RemoteLeg| -> Box<dyn SessionObserver + '_> {
                match once.take() {
                    Some(o) => Box::new(Borrowed(o)),
                    None => Box::new(crate::stats::observer::NoObserver),
                }
            };
            let mut got = remote::targets_session(
                vec![leg],
                *from,
                csv,
                &mut observer_for,
                None,
                &|_, _, _| {},
                stop,
            )?;
            got.pop()
                .map(|(_, o)| o)
                .context("internal: the session's target gave no outcome")
        }
    }
}

/// Runs a testbed's (or NIC pair's) flows, the main one and each
/// `--flow`, as legs of one engine session: one sender paces them all,
/// one I/O thread echoes them at their receiver sockets and reads their
/// echoes; each keeps its own port, sockets, sequence space and records
/// (to its `outs`). Outcomes in the order of `cfgs`.
pub(crate) fn run_testbed(
    ep: &Endpoints<'_>,
    cfgs: &[ProbeConfig],
    outs: &mut [engine::LegOut<'_>],
    stop: &AtomicU8,
) -> Result<Vec<SessionOutcome>> {
    pair::testbed_session(ep, cfgs, outs, stop)
}

/// The caller's observer, lent to a session that owns its observers.
struct Borrowed<'a>(&'a mut dyn SessionObserver);

impl SessionObserver for Borrowed<'_> {
    fn on_record(&mut self, r: &crate::model::record::ProbeRecord) {
        self.0.on_record(r)
    }
    fn on_tick(&mut self, stats: &RunStats, last: bool) -> Result<(), String> {
        self.0.on_tick(stats, last)
    }
    fn on_loss_directions(&mut self, d: &crate::stats::observer::LossDirections) {
        self.0.on_loss_directions(d)
    }
}

/// Runs one probe session against many remote reflectors (`--target`
/// repeated, `--targets FILE`) through the same engine as [`run_session`]:
/// one sender spreads their probes over the interval, one I/O thread
/// takes every echo; each target keeps its own socket, sequence space,
/// matching window and statistics. Rows go to the one `csv`, tagged with
/// the target's name; `observer_for` makes each target's observer;
/// `on_error` is told of each failed open of a target (it is tried again).
/// With `reloads`, a reload request applies a new list without stopping.
/// Returns each target with its outcome (removed ones first).
pub(crate) fn run_targets<'o>(
    targets: Vec<remote::RemoteLeg>,
    csv: &mut dyn RecordSink,
    observer_for: &mut remote::ObserverFor<'o>,
    reloads: Option<&remote::Reloads<'_>>,
    on_error: &remote::OnOpenError<'_>,
    stop: &AtomicU8,
) -> Result<Vec<(remote::RemoteLeg, SessionOutcome)>> {
    if targets.is_empty() {
        bail!("internal: a session without a target");
    }
    remote::targets_session(targets, None, csv, observer_for, reloads, on_error, stop)
}
