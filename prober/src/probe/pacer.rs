//! The probe sender: an absolute schedule (probe n is due at start + n x
//! interval, so lateness never accumulates) on CLOCK_MONOTONIC, a timer
//! sleep up to a margin before each send and a spin for the rest (the
//! margin learned from this machine's wake-up latency, see [`super::wake`];
//! fixed with `--spin`; a spin over the whole interval with `--busy-poll`),
//! and batched sends: when the sender wakes up late, every probe already due
//! goes out in one sendmmsg(2), each still with its own scheduled time and
//! OPT_ID, instead of the sender falling further behind one syscall at a time.
//! Right after waking, in place of the spin's first part, a sender that
//! wakes ahead of its send rehearses the send path on loopback
//! ([`super::socket::Warmer`]), and right after each tick's sends it reads
//! what the session's sockets hold ([`Handover`]): nobody sleeps on them.
//! The scheduled and send times it records are on CLOCK_REALTIME, like the
//! kernel's stamps, through an offset re-measured every
//! [`OFFSET_REFRESH_NS`]: a step of the wall clock moves the stamps, never
//! the sending.
//!
//! Kernel interfaces: clock_nanosleep(2) TIMER_ABSTIME on CLOCK_MONOTONIC,
//! clock_gettime(2) (CLOCK_THREAD_CPUTIME_ID for the sender's CPU), prctl(2)
//! PR_SET_TIMERSLACK (Linux >= 2.6.28), sched_setscheduler(2) (any Linux;
//! the rest of the real-time settings are `sys::rt`'s), sendmmsg(2) (>= 3.0).

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU8, AtomicU64, Ordering},
        mpsc,
    },
};

use anyhow::{Context, Result};

use crate::{stats::Pacing, sys::rt::RtSettings};

use super::{
    ProbeConfig,
    clock::{self, PaceClock, RealtimeMap, SystemClock},
    cpu_wait,
    events::{self, EventBatch},
    matcher::Event,
    socket::{ProbeSocket, SendBatch, Warmer},
    wake::{Waiter, WakeMargin, WakeMode},
};

/// Most probes one sendmmsg() carries when the sender is behind.
pub(crate) const MAX_BATCH: usize = 64;
/// The sender looks at the stop flag at least this often.
const STOP_CHECK_NS: i64 = 100_000_000;
/// The monotonic-to-realtime offset is measured again this often.
pub(crate) const OFFSET_REFRESH_NS: i64 = 100_000_000;

/// When each probe is due. Pure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Schedule {
    pub(crate) start_ns: i64,
    pub(crate) interval_ns: i64,
    /// Probes to send (u64::MAX with only an end time).
    pub(crate) count: u64,
    /// No probe is scheduled at or after this time.
    pub(crate) end_ns: Option<i64>,
}

impl Schedule {
    /// Scheduled send time of probe `seq`.
    pub(crate) fn at(&self, seq: u64) -> i64 {
        self.start_ns + seq as i64 * self.interval_ns
    }

    /// Whether probe `seq` is past the end of the run.
    pub(crate) fn finished(&self, seq: u64) -> bool {
        seq >= self.count || self.end_ns.is_some_and(|e| self.at(seq) >= e)
    }

    /// The probes due at `now_ns` starting from `next`: returns the end
    /// (exclusive) of the run of probes whose time has come, at least
    /// `next + 1` (the caller waited for `next`), at most `next + max`.
    pub(crate) fn due(&self, next: u64, now_ns: i64, max: usize) -> u64 {
        let mut end = next + 1;
        while end < next + max as u64 && !self.finished(end) && self.at(end) <= now_ns {
            end += 1;
        }
        end
    }
}

/// Gives the calling thread (one of the probe's receive threads) the
/// sender's SCHED_FIFO priority, so echoes and TX timestamps are picked up
/// as promptly as probes are sent. A failure is logged, not fatal: the
/// sender's own settings already failed loudly if they could not be had.
pub(crate) fn share_fifo_priority(rt: &RtSettings) {
    if let Some(prio) = rt.fifo_priority
        && let Err(e) = crate::sys::rt::set_fifo(0, prio)
    {
        log::warn!("SCHED_FIFO {prio} for a probe receive thread: {e}");
    }
}

/// Asks for exact timer wake-ups on this thread: a normal thread's sleeps
/// may otherwise end up to 50 µs late (the default timer slack), which is
/// most of a 100 µs interval.
fn tight_timer_slack() {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
}

/// What the sender does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Every probe is sent.
    Finished,
    /// Slept a slice of a long wait (time to look at the stop flag).
    Slice,
    /// Probes `first..end` are due: send them now.
    Due(Tick),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tick {
    /// The stream (target) whose probes are due.
    pub(crate) stream: usize,
    pub(crate) first: u64,
    pub(crate) end: u64,
    /// When the wait ended, on CLOCK_MONOTONIC.
    pub(crate) mono_ns: i64,
    /// The same time on CLOCK_REALTIME: the send time recorded.
    pub(crate) send_ns: i64,
}

/// One stream of probes in the sender's schedule (one target).
#[derive(Debug, Clone, Copy)]
struct Stream {
    sched: Schedule,
    /// The next probe of this stream to send.
    seq: u64,
}

/// The sender's clockwork: one schedule per stream (target) on
/// CLOCK_MONOTONIC, merged by a min-heap of their next deadlines so one
/// thread sends them all, the waiter, and the map that puts its times on
/// CLOCK_REALTIME for the records. With one stream it is the plain
/// absolute schedule.
pub(crate) struct Ticker<'c, C: PaceClock> {
    clock: &'c C,
    streams: Vec<Stream>,
    /// (next deadline, stream) of every stream not finished.
    heap: std::collections::BinaryHeap<std::cmp::Reverse<(i64, usize)>>,
    /// The stream of the current tick.
    current: usize,
    waiter: Waiter,
    map: RealtimeMap,
    /// After a sleep the next one ends no earlier than this much later
    /// (0: every probe at its own time); what falls due in between is
    /// sent at the next wake-up.
    wake_gap_ns: i64,
    /// No sleep ends before this monotonic time.
    next_wake_ns: i64,
}

impl<'c, C: PaceClock> Ticker<'c, C> {
    /// `sched` is on CLOCK_MONOTONIC.
    #[cfg(test)]
    pub(crate) fn new(clock: &'c C, sched: Schedule, mode: WakeMode, refresh_ns: i64) -> Self {
        Self::many(clock, vec![(sched, 0)], mode, refresh_ns)
    }

    /// One ticker over several schedules, each with the first seq it sends.
    pub(crate) fn many(
        clock: &'c C,
        scheds: Vec<(Schedule, u64)>,
        mode: WakeMode,
        refresh_ns: i64,
    ) -> Self {
        let streams: Vec<Stream> = scheds
            .into_iter()
            .map(|(sched, seq)| Stream { sched, seq })
            .collect();
        let heap = streams
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.sched.finished(s.seq))
            .map(|(i, s)| std::cmp::Reverse((s.sched.at(s.seq), i)))
            .collect();
        Self {
            clock,
            streams,
            heap,
            current: 0,
            waiter: Waiter::new(mode),
            map: RealtimeMap::new(clock, refresh_ns),
            wake_gap_ns: 0,
            next_wake_ns: i64::MIN,
        }
    }

    /// Sleeps at most once every `gap_ns`: what falls due in between goes
    /// at the next wake-up, late by up to `gap_ns`, never early.
    pub(crate) fn with_wake_gap(mut self, gap_ns: i64) -> Self {
        self.wake_gap_ns = gap_ns.max(0);
        self
    }

    /// The next seq of the stream due first (of stream 0 once all are done).
    #[cfg(test)]
    pub(crate) fn next_seq(&self) -> u64 {
        let i = self.heap.peek().map_or(0, |r| r.0.1);
        self.streams[i].seq
    }

    /// Waits for the next probe (or a slice of a long wait); `on_wake`
    /// runs when a sleep before a send ends ahead of it, with the time
    /// left (see [`Waiter::wait`]).
    pub(crate) fn wait_next(&mut self, on_wake: &mut dyn FnMut(i64)) -> Next {
        let Some(&std::cmp::Reverse((due_ns, i))) = self.heap.peek() else {
            return Next::Finished;
        };
        self.current = i;
        let st = self.streams[i];
        let now = self.clock.monotonic_ns();
        // Long intervals are slept in slices so a stop request is seen.
        let margin = self.waiter.margin_ns().min(STOP_CHECK_NS);
        // What is already due goes now; a sleep ends at the wake gap.
        let wake_ns = if due_ns <= now {
            due_ns
        } else {
            due_ns.max(self.next_wake_ns)
        };
        if wake_ns - now > STOP_CHECK_NS + margin {
            self.clock.sleep_until_monotonic(now + STOP_CHECK_NS);
            return Next::Slice;
        }
        let mono_ns = self.waiter.wait(self.clock, wake_ns, on_wake);
        if wake_ns > now {
            self.next_wake_ns = mono_ns.saturating_add(self.wake_gap_ns);
        }
        Next::Due(Tick {
            stream: i,
            first: st.seq,
            end: st.sched.due(st.seq, mono_ns, MAX_BATCH),
            mono_ns,
            send_ns: self.map.to_realtime(mono_ns),
        })
    }

    /// Scheduled time of probe `seq` of the current tick's stream on
    /// CLOCK_REALTIME (with the offset of the current tick's send time, so
    /// their difference is monotonic time).
    pub(crate) fn sched_ns(&self, seq: u64) -> i64 {
        self.map
            .to_realtime(self.streams[self.current].sched.at(seq))
    }

    /// The probes of the current tick's stream before `end` are sent.
    /// Re-measures the clock offset when it is due, between sends.
    pub(crate) fn sent_until(&mut self, end: u64) {
        let i = self.current;
        if let Some(pos) = self.heap.peek().map(|r| r.0.1)
            && pos == i
        {
            self.heap.pop();
        } else {
            self.heap.retain(|r| r.0.1 != i);
        }
        let st = &mut self.streams[i];
        st.seq = end;
        if !st.sched.finished(end) {
            self.heap.push(std::cmp::Reverse((st.sched.at(end), i)));
        }
        let now = self.clock.monotonic_ns();
        self.map.refresh(self.clock, now);
    }

    pub(crate) fn finished(&self) -> bool {
        self.heap.is_empty()
    }

    /// Monotonic time until the next probe is due.
    pub(crate) fn next_in(&self, now_mono_ns: i64) -> i64 {
        self.heap.peek().map_or(i64::MAX, |r| r.0.0 - now_mono_ns)
    }

    /// What pacing cost over `elapsed_ns` with `probes` sent.
    pub(crate) fn report(
        &self,
        elapsed_ns: i64,
        probes: u64,
        thread_cpu_ns: Option<i64>,
    ) -> Pacing {
        self.waiter
            .report(elapsed_ns, probes, thread_cpu_ns, self.map.steps())
    }
}

/// How the sender waits, from its options.
pub(crate) fn wake_mode(cfg: &ProbeConfig) -> WakeMode {
    let interval_ns = cfg.interval.as_nanos() as i64;
    match (cfg.busy_poll, cfg.spin) {
        (true, _) => WakeMode::BusyPoll,
        (false, Some(spin)) => WakeMode::Fixed(spin.as_nanos() as i64),
        (false, None) if cfg.rt.fifo_priority.is_some() => {
            WakeMode::Adaptive(Box::new(WakeMargin::new(interval_ns)))
        }
        // Without real-time priority spinning longer does not buy punctuality.
        (false, None) => WakeMode::Adaptive(Box::new(WakeMargin::with_cap(
            interval_ns,
            super::wake::NON_RT_MAX_MARGIN_NS,
        ))),
    }
}

/// The sender starts this long after it is spawned, so the first probe is paced too.
pub(crate) const START_AHEAD_NS: i64 = 10_000_000;

/// When the sender stops.
pub(crate) struct Until<'a> {
    /// No probe is scheduled at or after this CLOCK_MONOTONIC time (None:
    /// `--duration` after the sender's start, if given).
    pub(crate) end_ns: Option<i64>,
    /// Any stop level ends the sending.
    pub(crate) stop: &'a AtomicU8,
    /// The round pauses (a reload of the targets): sending ends too.
    pub(crate) pause: &'a (dyn Fn() -> bool + Sync),
}

/// Writes probe `seq` of leg `leg`, sent at `send_ns`, into the buffer.
pub(crate) type Encode<'a> = dyn FnMut(usize, u64, i64, &mut [u8]) + 'a;

/// Where the sender's events go, and what it does between its sends.
/// Every event pushed into [`Handover::batch`] is handed to the collector
/// by a later [`Handover::hand_over`].
pub(crate) trait Handover {
    /// The batch the sender's events join, aged on CLOCK_MONOTONIC.
    fn batch(&mut self) -> &mut EventBatch;
    /// Right after a tick's sends (and at every slice of a long wait):
    /// whatever the session's sockets hold, read without blocking, so
    /// that nobody has to sleep on them while probes go out.
    fn between_sends(&mut self);
    /// Hands the batch over. False once the collector is gone.
    fn hand_over(&mut self) -> bool;
}

/// A sender that reads nothing: it hands over its own events only (the
/// in-process reflector's I/O thread reads the sockets).
pub(crate) struct SendOnly<'a> {
    pending: EventBatch,
    ev: &'a mpsc::Sender<Vec<events::Tagged>>,
}

impl<'a> SendOnly<'a> {
    pub(crate) fn new(ev: &'a mpsc::Sender<Vec<events::Tagged>>) -> Self {
        Self {
            pending: EventBatch::new(),
            ev,
        }
    }
}

impl Handover for SendOnly<'_> {
    fn batch(&mut self) -> &mut EventBatch {
        &mut self.pending
    }
    fn between_sends(&mut self) {}
    fn hand_over(&mut self) -> bool {
        self.pending.flush(self.ev)
    }
}

/// One target's stream as the sender sees it.
pub(crate) struct PaceLeg<'a> {
    pub(crate) sock: &'a ProbeSocket,
    pub(crate) dst: SocketAddr,
    pub(crate) size: usize,
    pub(crate) interval_ns: i64,
    /// Its probes in all (None: until the run's end time, or stopped). A
    /// testbed's `--flow`s each send theirs over the same wall time.
    pub(crate) count: Option<u64>,
    /// CLOCK_MONOTONIC time its seq 0 is due (its schedule; a target
    /// carried over a reload keeps it, so probes due meanwhile go late,
    /// none is skipped). None: its next probe is due at the sender's start.
    pub(crate) anchor_ns: Option<i64>,
    /// Its probes tried so far (also its first seq not yet sent): a leg
    /// carried over a reload goes on from there.
    pub(crate) attempts: &'a AtomicU64,
}

/// Sends the probe streams of `legs` from this one thread, each probe's
/// bytes written by `encode(leg, seq, send_ns, buf)` (see
/// [`super::wire::Wire`]). `cfg` gives what they share: the duration,
/// the real-time settings and how to wait. Every probe it tries
/// to send produces exactly one `Sent` or `SendFailed` event and one count
/// in its leg's `attempts` (for the unaccounted-probe check), counted just
/// before its send: seqs are 0, 1, 2..., so `attempts` is also the first
/// seq not yet sent. Its events go into `out`'s batch, handed over at
/// most every [`events::MAX_AGE_NS`]; `out` reads the session's sockets
/// right after each tick's sends ([`Handover::between_sends`]). Returns
/// how the pacing went.
pub(crate) fn pace_with(
    legs: &[PaceLeg<'_>],
    cfg: &ProbeConfig,
    until: &Until<'_>,
    out: &mut dyn Handover,
    encode: &mut Encode<'_>,
) -> Result<Pacing> {
    tight_timer_slack();
    // Kept for the whole loop: dropping it puts the thread's policy back.
    let rt = if cfg.rt.is_empty() {
        None
    } else {
        Some(
            cfg.rt
                .apply_to_current_thread()
                .context("real-time settings for the sender")?,
        )
    };
    let first = legs
        .first()
        .context("internal: a session without a target")?;
    let (mode, wake_gap_ns) = shared_wait(cfg, legs);
    let mut warm = warmer(cfg, &mode, first);
    let c = SystemClock;
    let loop_start_ns = c.monotonic_ns();
    let cpu_start_ns = clock::thread_cpu_ns();
    let waits_start = cpu_wait::Snapshot::now();
    // Start a little ahead so the first probe is paced too.
    let start_ns = loop_start_ns + START_AHEAD_NS;
    let end_ns = until
        .end_ns
        .or(cfg.duration.map(|d| start_ns + d.as_nanos() as i64));
    let streams = schedules(legs, start_ns, end_ns);
    let warming = warm.is_some();
    let (mut warm_ns, mut warm_cost_ns) = (0i64, WARM_UP_FIRST_GUESS_NS);
    // In place of the spin's first part, when it fits twice over: never a
    // late send for it.
    let mut on_wake = |left_ns: i64| {
        if let Some(w) = warm.as_mut()
            && left_ns >= 2 * warm_cost_ns
        {
            let t = c.monotonic_ns();
            w.run();
            let took = c.monotonic_ns() - t;
            warm_ns += took;
            // The recent cost: a moving average over about 8 rehearsals.
            warm_cost_ns += (took - warm_cost_ns) / 8;
        }
    };
    let mut ticker = Ticker::many(&c, streams, mode, OFFSET_REFRESH_NS).with_wake_gap(wake_gap_ns);
    let (tried, send_errors) = send_all(legs, until, out, encode, &mut ticker, &mut on_wake);
    out.hand_over();
    let elapsed_ns = c.monotonic_ns() - loop_start_ns;
    let cpu_ns = clock::thread_cpu_ns() - cpu_start_ns;
    let mut report = ticker.report(elapsed_ns, tried, Some(cpu_ns));
    report.waits = Some(waits_start.since(&cpu_wait::Snapshot::now()));
    report.cpu_dma_latency_us = rt.as_ref().and_then(|g| g.cpu_dma_latency_us());
    report.warm_up_ns_per_probe = warming.then(|| warm_ns as f64 / tried.max(1) as f64);
    report.send_failures = send_errors.total;
    Ok(report)
}

/// Each leg's schedule and its first seq not yet sent: from its anchor,
/// else from `start_ns` less the probes it already sent.
fn schedules(legs: &[PaceLeg<'_>], start_ns: i64, end_ns: Option<i64>) -> Vec<(Schedule, u64)> {
    legs.iter()
        .map(|l| {
            let first = l.attempts.load(Ordering::SeqCst);
            let sched = Schedule {
                start_ns: l
                    .anchor_ns
                    .unwrap_or(start_ns - first as i64 * l.interval_ns),
                interval_ns: l.interval_ns,
                // Neither a count nor a duration: until stopped (--forever).
                count: l.count.unwrap_or(u64::MAX),
                end_ns,
            };
            (sched, first)
        })
        .collect()
}

/// The send loop of [`pace_with`]: each tick's probes as they fall due,
/// reading and handing over between sends, until the schedules end or
/// `until` stops it. Returns the probes it tried and their send errors.
fn send_all(
    legs: &[PaceLeg<'_>],
    until: &Until<'_>,
    out: &mut dyn Handover,
    encode: &mut Encode<'_>,
    ticker: &mut Ticker<'_, SystemClock>,
    on_wake: &mut dyn FnMut(i64),
) -> (u64, SendErrors) {
    let c = SystemClock;
    let first = &legs[0];
    let stop = until.stop;
    let stopped = || stop.load(Ordering::Relaxed) != 0 || (until.pause)();
    let mut batch = SendBatch::new(MAX_BATCH, first.size, first.dst);
    let mut batch_leg = 0;
    let mut tried = 0u64;
    let mut send_errors = SendErrors::default();
    while !stopped() {
        let tick = match ticker.wait_next(on_wake) {
            Next::Finished => break,
            Next::Slice => {
                // A long wait: what came meanwhile is read slice by slice.
                out.between_sends();
                if !out.hand_over() {
                    break;
                }
                continue;
            }
            Next::Due(t) => t,
        };
        // A stop that came during the wait sends nothing more. The first
        // wait matters most: a Ctrl-C during set-up can land in it, and a
        // sender thread that starts late would then send every probe
        // already due in one batch.
        if stopped() {
            break;
        }
        let leg = &legs[tick.stream];
        if tick.stream != batch_leg {
            batch.retarget(leg.dst, leg.size);
            batch_leg = tick.stream;
        }
        let failed = send_tick(leg, &tick, &mut batch, ticker, out.batch(), encode);
        tried += tick.end - tick.first;
        send_errors.note(leg.dst, failed, c.monotonic_ns());
        // On veth the probe's stamps and its echo are queued by now: read
        // before anything else can run on this CPU.
        out.between_sends();
        ticker.sent_until(tick.end);
        // Hand over when due, or now if the sender is about to sleep past it.
        let now = c.monotonic_ns();
        if (out.batch().due(now) || ticker.next_in(now) >= events::MAX_AGE_NS || ticker.finished())
            && !out.hand_over()
        {
            break;
        }
    }
    (tried, send_errors)
}

/// What a loopback warm-up is taken to cost before one has run.
const WARM_UP_FIRST_GUESS_NS: i64 = 10_000;

/// The loopback warm-up of a sender that wakes ahead of its sends (and
/// so has time for it): not with `--busy-poll` (it never sleeps) nor
/// where a sleep ends at the send time (several targets without
/// `--spin`, or `--spin 0`), and not with `--no-warm-up`.
fn warmer(cfg: &ProbeConfig, mode: &WakeMode, first: &PaceLeg<'_>) -> Option<Warmer> {
    let tos = cfg.tos;
    match mode {
        _ if cfg.no_warm_up => None,
        WakeMode::Adaptive(_) => Warmer::new(first.size, tos, first.dst.is_ipv6()),
        WakeMode::Fixed(ns) if *ns > 0 => Warmer::new(first.size, tos, first.dst.is_ipv6()),
        WakeMode::Fixed(_) | WakeMode::BusyPoll => None,
    }
}

/// How the sender of `legs` waits, and its wake gap (see
/// [`Ticker::with_wake_gap`]): as [`wake_mode`] says for the gap between
/// two of its sends, except with several targets and neither `--spin` nor
/// `--busy-poll`. Then it does not spin (each sleep ends at the send time,
/// so a send is late by the timer's wake-up latency, tens of µs here,
/// measured in the report's `wake_late_ns`) and sleeps at most once every
/// [`SHARED_WAKE_GAP_NS`]. The round trips start at the sends' own
/// stamps, so no figure moves. For 1000 targets x 10/s (a send every
/// 100 µs) the spin was 13 µs of the sender's 51 µs per probe, and the
/// sleeps and wake-ups (about 25 µs of its CPU each on this VM, more than
/// the send) three quarters of what was left.
fn shared_wait(cfg: &ProbeConfig, legs: &[PaceLeg<'_>]) -> (WakeMode, i64) {
    if legs.len() > 1 && !cfg.busy_poll && cfg.spin.is_none() {
        (WakeMode::Fixed(0), SHARED_WAKE_GAP_NS)
    } else {
        (wake_mode(&gap_config(cfg, legs)), 0)
    }
}

/// A fleet's sender sleeps at most once every this long and sends what
/// fell due meanwhile, each probe to its own target, late by up to this
/// much, never early.
pub(crate) const SHARED_WAKE_GAP_NS: i64 = 500_000;

/// The wait's options for the gaps between sends: with N targets the
/// sender wakes N times per interval, so it learns its margin for the
/// shortest interval over N.
fn gap_config(cfg: &ProbeConfig, legs: &[PaceLeg<'_>]) -> ProbeConfig {
    let n = legs.len().max(1) as i64;
    let gap_ns = legs.iter().map(|l| l.interval_ns).min().unwrap_or(1) / n;
    ProbeConfig {
        interval: std::time::Duration::from_nanos(gap_ns.max(1) as u64),
        ..cfg.clone()
    }
}

/// Sends the probes of one tick (one leg's probes due now) in as few
/// sendmmsg calls as it takes; returns how many it tried.
fn send_tick<C: PaceClock>(
    leg: &PaceLeg<'_>,
    tick: &Tick,
    batch: &mut SendBatch,
    ticker: &Ticker<'_, C>,
    pending: &mut EventBatch,
    encode: &mut Encode<'_>,
) -> Option<(u64, std::io::Error)> {
    let (seq, end, send_ns, mono_ns) = (tick.first, tick.end, tick.send_ns, tick.mono_ns);
    let tag = tick.stream as u32;
    batch.clear();
    for s in seq..end {
        encode(tick.stream, s, send_ns, batch.push(s as u32));
    }
    // Counted before the send: a seq at or above `attempts` has not
    // left this host, so the receive paths refuse an echo of it as forged.
    leg.attempts.fetch_add(batch.len() as u64, Ordering::SeqCst);
    let (mut i, mut failed) = (0, None::<(u64, std::io::Error)>);
    while i < batch.len() {
        match leg.sock.send_batch(batch, i) {
            Ok(n) => {
                for k in i..i + n {
                    let s = seq + k as u64;
                    let e = Event::Sent {
                        seq: s,
                        opt_id: batch.opt_id(k),
                        sched_ns: ticker.sched_ns(s),
                        send_ns,
                    };
                    pending.push(tag, e, mono_ns);
                }
                i += n.max(1);
            }
            Err(err) => {
                let s = seq + i as u64;
                log::debug!("send of probe {s} to {} failed: {err}", leg.dst);
                let e = Event::SendFailed {
                    seq: s,
                    sched_ns: ticker.sched_ns(s),
                    send_ns,
                };
                pending.push(tag, e, mono_ns);
                failed = Some((failed.map_or(0, |(n, _)| n) + 1, err));
                i += 1;
            }
        }
    }
    failed
}

/// A failed send is warned about at once, then at most every this long
/// per run (with the count since the last warning).
const SEND_ERROR_WARN_EVERY_NS: i64 = 10_000_000_000;

/// The sender's failed sends: counted for the report, and warned about,
/// rate-limited, naming the target and the error (a neighbour that does
/// not resolve, a full socket buffer, a route that went away), so a run
/// whose probes are lost before they leave this host says why.
#[derive(Debug, Default)]
struct SendErrors {
    total: u64,
    since_warn: u64,
    warned_at_ns: Option<i64>,
}

impl SendErrors {
    fn note(&mut self, dst: SocketAddr, failed: Option<(u64, std::io::Error)>, now_ns: i64) {
        let Some((n, err)) = failed else {
            return;
        };
        self.total += n;
        self.since_warn += n;
        if self
            .warned_at_ns
            .is_some_and(|t| now_ns - t < SEND_ERROR_WARN_EVERY_NS)
        {
            return;
        }
        log::warn!(
            "{} probe send(s) to {dst} failed ({} in all so far): {err}; they count as lost",
            self.since_warn,
            self.total
        );
        self.since_warn = 0;
        self.warned_at_ns = Some(now_ns);
    }
}

#[cfg(test)]
#[path = "pacer_tests.rs"]
mod tests;
