//! The collector, the engine's reading half: it routes the sockets'
//! events to each leg's [`Collector`] (matcher, statistics, CSV,
//! observer), drains what is complete or timed out, and joins the sender
//! at the end of a round.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU8, Ordering},
        mpsc,
    },
    time::Duration,
};

use anyhow::Result;

use crate::probe::{
    ProbeConfig, RecordSink, STOP_NOW, STOP_SENDING, SessionObserver, clock, engine, events,
    matcher::{self, Event, Matcher},
};
use crate::stats::RunStats;

/// How often the collector flushes the CSV and ticks the observer (~4x/s).
pub(crate) const TICK_NS: i64 = 250_000_000;

/// Hardware timestamping of a session, as the matcher needs it.
pub(crate) struct HwSetup {
    /// The reflector stamps its echoes (per-send OPT_IDs work here).
    pub(crate) echo_stamps: bool,
    /// The sender's NIC stamps TX in hardware: wait for those stamps.
    pub(crate) sender_tx: bool,
    /// The receiver's NIC stamps the echoes' TX in hardware.
    pub(crate) receiver_tx: bool,
    /// Puts the NICs' PHC stamps on the system clock (for every leg: a
    /// testbed's flows share its NICs).
    pub(crate) clocks: std::sync::Arc<dyn matcher::HwClocks>,
}

/// The per-probe state of a session between the event sources and the
/// outputs: the matcher, the run's statistics, the CSV and the observer
/// (interval histograms, HDR log, metrics). [`super::drive`] feeds it the
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
        clocks: std::sync::Arc<dyn matcher::HwClocks>,
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
    pub(crate) fn in_flight(&self) -> usize {
        self.m.in_flight()
    }

    fn fail(&mut self, why: String, stop: &AtomicU8) {
        log::warn!("{why}: stopping the run");
        self.output_error.get_or_insert(why);
        stop.fetch_max(STOP_SENDING, Ordering::SeqCst);
    }

    /// One target among several: the statistics of
    /// [`RunStats::one_of_many`] (fixed histograms: 87.5 KiB, 1.6 %).
    pub(crate) fn one_of_many(mut self) -> Self {
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
pub(super) fn collect_and_join<'s>(
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
    let expect = |l: &engine::Leg<'_>| {
        // The in-kernel reflector's echoes carry its stamps in the payload.
        let echo_stamps = hw.echo_stamps && !l.cfg.kernel_reflector;
        matcher::Expect {
            tx: true,
            tx_hw: hw.sender_tx,
            echo_tx: echo_stamps,
            echo_tx_hw: echo_stamps && hw.receiver_tx,
        }
    };
    let now = clock::realtime_ns();
    // Many remote targets: fixed histograms each (a testbed's few flows
    // keep the full ones).
    let many = c.legs.len() > 1 && matches!(c.legs[0].s.echo_side, engine::EchoSide::Remote);
    let mut carried = c.carried.into_iter();
    c.legs
        .iter()
        .map(|l| match carried.next().flatten() {
            Some(kept) => kept,
            None => {
                let c = Collector::new(&l.cfg, expect(l), hw.clocks.clone(), now);
                if many { c.one_of_many() } else { c }
            }
        })
        .collect()
}

pub(super) fn collect(
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
