//! Probing: sockets and their stamps, the pacer, the matcher, the
//! reflectors and the wire formats (rtprobe, STAMP). Every session runs
//! through one engine ([`engine`]): its warm-up, its reads and its
//! threads; [`pair`] holds the testbed's and NIC pair's side of it
//! (hardware timestamping, the two sockets in their namespaces). This
//! file holds the session's plain types, the entry points of a session
//! and the collector that turns the engine's events into records.

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

pub use timestamps::TimestampSource;
pub use wire::ProtocolArg;

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU8, Ordering},
        mpsc,
    },
    time::Duration,
};

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
use matcher::{Event, Matcher};

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

/// How often the collector flushes the CSV and ticks the observer (~4x/s).
pub(crate) const TICK_NS: i64 = 250_000_000;

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
    pub sys: &'a dyn crate::sys::Sys,
    pub sender_ns: &'a Netns,
    pub receiver_ns: &'a Netns,
    /// The interfaces the probes leave from and arrive on (hardware
    /// timestamping, their PTP clocks).
    pub sender_if: &'a str,
    pub receiver_if: &'a str,
    /// Where the probes go: the receiver's address in the run's family
    /// (`--ip`).
    pub dst_ip: std::net::IpAddr,
}

/// What the session learned besides the records.
pub(crate) struct SessionOutcome {
    pub stats: RunStats,
    pub hardware_tx: bool,
    pub hardware_rx: bool,
    pub late_arrivals: u64,
    pub interrupted: bool,
    /// Kernel counters that explain losses (receive-buffer and backlog drops).
    /// None where no testbed's counters were sampled (a remote target).
    pub kernel_drops: Option<KernelDrops>,
    /// Per NIC with hardware stamps: its PHC, the offset's uncertainty and
    /// drift against the system clock, or why its stamps were left out.
    pub hw_clocks: HardwareClocks,
    /// An output (CSV, HDR log...) failed during the run and stopped it,
    /// in words: "CSV ends at probe 41999: No space left on device".
    pub output_error: Option<String>,
    /// What a reflector not ours to drive told besides the records (loss
    /// by direction, clocks, protocol facts). None on the testbed's own
    /// rtprobe sessions.
    pub remote: Option<remote::RemoteFacts>,
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
        SessionEnds::Testbed(ep) => pair::testbed_session(ep, cfg, csv, stop, observer),
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

/// Hardware timestamping of a session, as the matcher needs it.
pub(crate) struct HwSetup {
    /// The reflector stamps its echoes (per-send OPT_IDs work here).
    echo_stamps: bool,
    /// The sender's NIC stamps TX in hardware: wait for those stamps.
    sender_tx: bool,
    /// The receiver's NIC stamps the echoes' TX in hardware.
    receiver_tx: bool,
    /// Puts the NICs' PHC stamps on the system clock.
    clocks: Box<dyn matcher::HwClocks>,
}

/// The per-probe state of a session between the event sources and the
/// outputs: the matcher, the run's statistics, the CSV and the observer
/// (interval histograms, HDR log, metrics). [`run_session`] feeds it the
/// sockets' events; anything else that produces [`Event`]s (e.g. the
/// continuous-run memory bench) drives the same code. Times are the
/// events' clock (CLOCK_REALTIME ns), passed in by the caller.
pub struct Collector {
    stats: RunStats,
    m: Matcher,
    timeout_ns: i64,
    last_flush: i64,
    /// A failed output (disk full, file removed) ends the run the way a
    /// first Ctrl-C does: no more sends, probes in flight still counted.
    output_error: Option<String>,
    csv_ok: bool,
}

impl Collector {
    /// `expect`: the stamps a record waits for; `clocks` puts hardware
    /// stamps on the system clock; `now_ns` starts the flush clock.
    pub fn new(
        cfg: &ProbeConfig,
        expect: matcher::Expect,
        clocks: Box<dyn matcher::HwClocks>,
        now_ns: i64,
    ) -> Self {
        let m = Matcher::new(
            cfg.size as u32,
            cfg.flow,
            cfg.timeout.as_nanos() as i64,
            expect,
        )
        .with_hw_clocks(clocks)
        .with_kernel_reflector(cfg.kernel_reflector);
        Self {
            stats: RunStats::with_interval(cfg.interval.as_nanos() as i64),
            m,
            timeout_ns: cfg.timeout.as_nanos() as i64,
            last_flush: now_ns,
            output_error: None,
            csv_ok: true,
        }
    }

    /// Feeds events in arrival order.
    pub fn on_events(&mut self, evs: impl IntoIterator<Item = Event>) {
        for e in evs {
            self.m.on_event(e, &mut self.stats);
        }
    }

    /// Probes in flight (not yet finalized).
    pub fn in_flight(&self) -> usize {
        self.m.in_flight()
    }

    /// The run's statistics so far.
    pub fn stats(&self) -> &RunStats {
        &self.stats
    }

    /// Probes that arrived after they had been given up as lost.
    pub fn late_arrivals(&self) -> u64 {
        self.m.late_arrivals()
    }

    /// The first output that failed, if one did.
    pub fn output_error(&self) -> Option<&str> {
        self.output_error.as_deref()
    }

    fn fail(&mut self, why: String, stop: &AtomicU8) {
        log::warn!("{why}: stopping the run");
        self.output_error.get_or_insert(why);
        stop.fetch_max(STOP_SENDING, Ordering::SeqCst);
    }

    /// One target among several: the statistics of
    /// [`RunStats::one_of_many`] (fixed histograms: 87.5 KiB, 1.6 %).
    pub fn one_of_many(mut self) -> Self {
        self.stats = RunStats::one_of_many(self.stats.interval_ns());
        self
    }

    /// Finalizes what is complete or timed out at `now_ns` (everything
    /// with `flush_all`) into the statistics, the observer and the CSV;
    /// then, about every [`TICK_NS`], flushes the CSV and ticks the observer.
    pub fn drain(
        &mut self,
        now_ns: i64,
        flush_all: bool,
        csv: &mut dyn RecordSink,
        observer: &mut dyn SessionObserver,
        stop: &AtomicU8,
    ) {
        let mut write_err: Option<anyhow::Error> = None;
        let (stats, csv_ok) = (&mut self.stats, self.csv_ok);
        self.m.drain(now_ns, flush_all, |r| {
            stats.on_record(&r);
            observer.on_record(&r);
            if csv_ok
                && write_err.is_none()
                && let Err(e) = csv.write(&r)
            {
                write_err = Some(e);
            }
        });
        if let Some(e) = write_err.take() {
            self.csv_ok = false;
            self.fail(format!("{e:#}"), stop);
        }
        if now_ns - self.last_flush > TICK_NS {
            if self.csv_ok
                && let Err(e) = csv.flush()
            {
                self.csv_ok = false;
                self.fail(format!("{e:#}"), stop);
            }
            self.last_flush = now_ns;
            self.stats.set_unmatched(self.m.unmatched());
            if let Err(e) = observer.on_tick(&self.stats, false) {
                self.fail(e, stop);
            }
        }
    }

    /// Flushes the CSV and ticks the observer a last time: the run's
    /// statistics, its late arrivals and the first output that failed.
    pub fn finish(
        mut self,
        csv: &mut dyn RecordSink,
        observer: &mut dyn SessionObserver,
        stop: &AtomicU8,
    ) -> (RunStats, u64, Option<String>) {
        if self.csv_ok
            && let Err(e) = csv.flush()
        {
            self.fail(format!("{e:#}"), stop);
        }
        self.stats.set_unmatched(self.m.unmatched());
        if let Err(e) = observer.on_tick(&self.stats, true) {
            self.fail(e, stop);
        }
        if self.m.hw_unconverted() > 0 {
            log::warn!(
                "{} hardware timestamps could not be put on the system clock and were left out",
                self.m.hw_unconverted()
            );
        }
        (self.stats, self.m.late_arrivals(), self.output_error)
    }
}

/// Collects until the sender has sent its last probe (stopping it if
/// collecting fails), ends the reading (`done`), joins the sender and puts
/// its pacing figures into every leg's statistics: per leg, its
/// statistics, late arrivals and the output that failed; or, when the
/// round paused, the collectors as they are. Also the sender's timing as
/// the reader, where it read the sockets.
fn collect_and_join<'s>(
    ev_rx: &mpsc::Receiver<Vec<events::Tagged>>,
    c: engine::Collecting<'_, '_>,
    hw: HwSetup,
    outs: &mut [engine::LegOut<'_>],
    stop: &AtomicU8,
    (sender, sent, done): (
        std::thread::ScopedJoinHandle<'s, engine::SenderDone>,
        &AtomicBool,
        &AtomicBool,
    ),
) -> Result<(engine::Driven, Option<crate::stats::ReaderTiming>)> {
    // A sender thread that ended early (an error, a panic) has sent all it will.
    let sent_all = || sent.load(Ordering::SeqCst) || sender.is_finished();
    let out = collect(ev_rx, c, hw, outs, stop, &sent_all);
    if out.is_err() {
        stop.fetch_max(STOP_NOW, Ordering::SeqCst);
    }
    done.store(true, Ordering::SeqCst);
    let (pacing, reader) = sender
        .join()
        .unwrap_or_else(|_| (Err(anyhow::anyhow!("the sender thread panicked")), None));
    let pacing = pacing?;
    let driven = out.map(|d| match d {
        engine::Driven::Finished(v) => engine::Driven::Finished(
            v.into_iter()
                .map(|(mut stats, late, failed)| {
                    stats.set_pacing(pacing.clone());
                    (stats, late, failed)
                })
                .collect(),
        ),
        paused => paused,
    })?;
    Ok((driven, reader))
}

/// Hands each event to its leg's collector.
pub(crate) fn route(cs: &mut [Collector], evs: Vec<events::Tagged>) {
    route_marking(cs, evs, &mut Touched::default());
}

fn route_marking(cs: &mut [Collector], evs: Vec<events::Tagged>, touched: &mut Touched) {
    for (leg, e) in evs {
        if let Some(c) = cs.get_mut(leg as usize) {
            c.on_events(std::iter::once(e));
            touched.mark(leg as usize);
        }
    }
}

/// With several targets every collector is drained (its timeouts looked
/// at) this often; in between only those that got events. Draining all
/// 1000 of a fleet on every batch of events was a quarter of the
/// collector's CPU.
const FULL_DRAIN_NS: i64 = 20_000_000;

/// The legs that got events since the last drain.
#[derive(Default)]
struct Touched {
    seen: Vec<bool>,
    legs: Vec<usize>,
}

impl Touched {
    fn mark(&mut self, leg: usize) {
        if self.seen.len() <= leg {
            self.seen.resize(leg + 1, false);
        }
        if !std::mem::replace(&mut self.seen[leg], true) {
            self.legs.push(leg);
        }
    }

    /// Puts the legs to drain now in `out` (all of `n` when `all`) and
    /// forgets them; `out` is the caller's, reused from wake-up to wake-up.
    fn take_into(&mut self, n: usize, all: bool, out: &mut Vec<usize>) {
        out.clear();
        for &l in &self.legs {
            self.seen[l] = false;
        }
        if all {
            out.extend(0..n);
        } else {
            out.extend_from_slice(&self.legs);
        }
        self.legs.clear();
    }
}

/// Each leg's collector: the one carried from the round before, or a new one.
fn collectors(c: engine::Collecting<'_, '_>, hw: HwSetup) -> Vec<Collector> {
    let kernel_reflector = c.legs.first().is_some_and(|l| l.cfg.kernel_reflector);
    let expect = matcher::Expect {
        tx: true,
        tx_hw: hw.sender_tx,
        echo_tx: hw.echo_stamps && !kernel_reflector,
        echo_tx_hw: hw.echo_stamps && hw.receiver_tx && !kernel_reflector,
    };
    // Hardware stamps are a testbed's, which has one leg.
    let mut clocks = Some(hw.clocks);
    let now = clock::realtime_ns();
    let many = c.legs.len() > 1;
    let mut carried = c.carried.into_iter();
    c.legs
        .iter()
        .map(|l| match carried.next().flatten() {
            Some(kept) => kept,
            None => {
                let hw = clocks
                    .take()
                    .unwrap_or_else(|| Box::new(matcher::NoHwClocks));
                let c = Collector::new(&l.cfg, expect, hw, now);
                if many { c.one_of_many() } else { c }
            }
        })
        .collect()
}

fn collect(
    ev_rx: &mpsc::Receiver<Vec<events::Tagged>>,
    c: engine::Collecting<'_, '_>,
    hw: HwSetup,
    outs: &mut [engine::LegOut<'_>],
    stop: &AtomicU8,
    sender_finished: &dyn Fn() -> bool,
) -> Result<engine::Driven> {
    let (pause, read) = (c.pause, c.read);
    let mut cs = collectors(c, hw);
    let timeout_ns = cs.iter().map(|c| c.timeout_ns).max().unwrap_or(0);
    let mut sender_done_at: Option<i64> = None;
    let (mut touched, mut full_drain_at, mut to_drain) = (Touched::default(), 0, Vec::new());
    loop {
        // Looked at before taking events: once it is true every event of
        // the sender is already in the channel, so none can be missed below.
        let sender_done = sender_finished();
        // A reload waits on this round's end: look every millisecond.
        let wait = Duration::from_millis(if pause() { 1 } else { 20 });
        if let Ok(evs) = ev_rx.recv_timeout(wait) {
            route_marking(&mut cs, evs, &mut touched);
        }
        // Read before taking what else is queued: every echo the I/O
        // thread read before this mark is then routed below.
        let read_until = read.until_ns();
        while let Ok(evs) = ev_rx.try_recv() {
            route_marking(&mut cs, evs, &mut touched);
        }
        // Timeouts run on what the I/O thread has read, not on this
        // thread's clock: an I/O thread kept from a CPU past a probe's
        // timeout delays its record, and the echo the kernel received in
        // time still counts. (0 until its first read: nothing expires.)
        let wall = clock::realtime_ns();
        let now = wall.min(read_until).max(0);
        if sender_done && pause() && stop.load(Ordering::SeqCst) == 0 {
            // A reload: probes in flight stay with their collectors.
            for (c, o) in cs.iter_mut().zip(outs.iter_mut()) {
                c.drain(now, false, o.csv, o.observer, stop);
            }
            return Ok(engine::Driven::Paused(cs));
        }
        if sender_done_at.is_none() && sender_done {
            sender_done_at = Some(wall);
        }
        let finish_now = stop.load(Ordering::SeqCst) >= STOP_NOW
            || sender_done_at.is_some_and(|t| now - t > timeout_ns + 50_000_000);
        if finish_now {
            // The sender may still be stopping (it looks at `stop` at least
            // every 100 ms); its last events must not be lost.
            let give_up = std::time::Instant::now() + Duration::from_secs(2);
            while !sender_finished() && std::time::Instant::now() < give_up {
                std::thread::sleep(Duration::from_millis(1));
            }
            while let Ok(evs) = ev_rx.try_recv() {
                route(&mut cs, evs);
            }
        }
        let all = finish_now || sender_done || now - full_drain_at >= FULL_DRAIN_NS;
        if all {
            full_drain_at = now;
        }
        touched.take_into(cs.len(), all, &mut to_drain);
        for &i in &to_drain {
            if let (Some(c), Some(o)) = (cs.get_mut(i), outs.get_mut(i)) {
                c.drain(now, finish_now, o.csv, o.observer, stop);
            }
        }
        if finish_now || (sender_done_at.is_some() && cs.iter().all(|c| c.in_flight() == 0)) {
            break;
        }
    }
    Ok(engine::Driven::Finished(
        cs.into_iter()
            .zip(outs.iter_mut())
            .map(|(c, o)| c.finish(o.csv, o.observer, stop))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::Touched;

    #[test]
    fn touched_legs_are_drained_once_and_all_of_them_when_asked() {
        let (mut t, mut out) = (Touched::default(), Vec::new());
        for leg in [7, 2, 7, 2, 7] {
            t.mark(leg);
        }
        t.take_into(10, false, &mut out);
        assert_eq!(out, [7, 2], "each leg once, in the order first seen");
        t.take_into(10, false, &mut out);
        assert!(out.is_empty(), "forgotten once taken");
        t.mark(3);
        t.take_into(4, true, &mut out);
        assert_eq!(out, [0, 1, 2, 3]);
        t.mark(3);
        t.take_into(4, false, &mut out);
        assert_eq!(out, [3], "a full drain forgets the marks too");
    }
}
