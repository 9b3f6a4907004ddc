//! Unit tests of `pacer.rs` (kept apart so that the module itself stays short).

use super::*;
use crate::probe::clock::fake::FakeClock;

fn sched(count: u64, end_ns: Option<i64>) -> Schedule {
    Schedule {
        start_ns: 1000,
        interval_ns: 10,
        count,
        end_ns,
    }
}

#[test]
fn absolute_times_do_not_drift() {
    let s = sched(u64::MAX, None);
    assert_eq!(s.at(0), 1000);
    assert_eq!(s.at(1_000_000), 1000 + 10_000_000);
}

#[test]
fn due_batches_only_what_has_come() {
    let s = sched(100, None);
    // On time: one probe.
    assert_eq!(s.due(0, 1000, 64), 1);
    assert_eq!(s.due(0, 1009, 64), 1);
    // Woke up 25 ns late: probes 0, 1, 2 are due (at 1000, 1010, 1020).
    assert_eq!(s.due(0, 1025, 64), 3);
    // Far behind: capped by the batch size.
    assert_eq!(s.due(0, 1_000_000, 8), 8);
    // Never past the count.
    assert_eq!(s.due(95, 1_000_000, 64), 100);
}

#[test]
fn finished_by_count_or_end_time() {
    let s = sched(3, None);
    assert!(!s.finished(2));
    assert!(s.finished(3));
    let s = sched(u64::MAX, Some(1050));
    assert!(!s.finished(4));
    assert!(s.finished(5), "probe 5 is due at 1050, the end");
    assert_eq!(s.due(0, 5000, 64), 5);
}

/// Runs a fake sender through 20 probes at 1 ms, calling `at(n)` before
/// waiting for probe n; returns the ticks.
fn run_fake(c: &FakeClock, mode: WakeMode, mut at: impl FnMut(u64)) -> Vec<(Tick, i64)> {
    let sched = Schedule {
        start_ns: 10_000_000,
        interval_ns: 1_000_000,
        count: 20,
        end_ns: None,
    };
    let mut t = Ticker::new(c, sched, mode, 2_000_000);
    let mut out = Vec::new();
    loop {
        at(t.next_seq());
        match t.wait_next(&mut |_| {}) {
            Next::Finished => break,
            Next::Slice => continue,
            Next::Due(tick) => {
                out.push((tick, t.sched_ns(tick.first)));
                t.sent_until(tick.end);
            }
        }
    }
    out
}

#[test]
fn a_wall_clock_step_neither_bursts_nor_stalls() {
    const HOUR: i64 = 3_600_000_000_000;
    let epoch = 1_800_000_000_000_000_000;
    let c = FakeClock::new(0, epoch, 50);
    c.wake_late_ns.set(20_000);
    let ticks = run_fake(&c, WakeMode::Fixed(50_000), |n| match n {
        // The wall clock jumps an hour ahead, then two hours back.
        8 => c.step_realtime(HOUR),
        14 => c.step_realtime(-2 * HOUR),
        _ => {}
    });
    assert_eq!(ticks.len(), 20, "one tick per probe: no burst");
    for (n, (tick, sched_ns)) in ticks.iter().enumerate() {
        assert_eq!((tick.first, tick.end), (n as u64, n as u64 + 1));
        // Every send at its monotonic deadline (clock reads are 50 ns).
        let due = 10_000_000 + n as i64 * 1_000_000;
        assert!(
            (due..due + 200).contains(&tick.mono_ns),
            "probe {n} at {} for {due}: stalled",
            tick.mono_ns
        );
        // Send error is monotonic time whatever the wall clock did.
        assert!((0..200).contains(&(tick.send_ns - sched_ns)));
    }
    assert_eq!(c.sleeps.get(), 20);
    // The stamps follow the wall clock within one refresh period (2 ms).
    let wall = |n: usize| ticks[n].1 - (10_000_000 + n as i64 * 1_000_000);
    assert!((wall(7) - epoch).abs() < 1_000);
    assert!((wall(11) - (epoch + HOUR)).abs() < 1_000);
    assert!((wall(19) - (epoch - HOUR)).abs() < 1_000);
    let r = Ticker::new(&c, sched(1, None), WakeMode::BusyPoll, 1).report(1, 1, None);
    assert_eq!(r.clock_steps, 0);
}

#[test]
fn steps_are_counted_in_the_report() {
    let c = FakeClock::new(0, 0, 50);
    let sched = Schedule {
        start_ns: 1_000_000,
        interval_ns: 1_000_000,
        count: 10,
        end_ns: None,
    };
    let mut t = Ticker::new(&c, sched, WakeMode::Fixed(10_000), 1_500_000);
    while let Next::Due(tick) = t.wait_next(&mut |_| {}) {
        if tick.first == 4 {
            c.step_realtime(-10_000_000_000);
        }
        t.sent_until(tick.end);
    }
    assert_eq!(t.report(10_000_000, 10, None).clock_steps, 1);
}

#[test]
fn streams_are_spread_by_their_phase_and_go_on_from_their_seq() {
    // Three streams at 3 ms, phases 0, 1 and 2 ms; the third was
    // carried over a reload and goes on from seq 5.
    let c = FakeClock::new(0, 0, 50);
    let s = |phase: i64, first: u64| {
        let sched = Schedule {
            start_ns: 10_000_000 + phase - first as i64 * 3_000_000,
            interval_ns: 3_000_000,
            count: first + 4,
            end_ns: None,
        };
        (sched, first)
    };
    let mut t = Ticker::many(
        &c,
        vec![s(0, 0), s(1_000_000, 0), s(2_000_000, 5)],
        WakeMode::Fixed(10_000),
        1_000_000,
    );
    let mut ticks = Vec::new();
    while let Next::Due(tick) = t.wait_next(&mut |_| {}) {
        ticks.push((tick.stream, tick.first, tick.mono_ns));
        t.sent_until(tick.end);
    }
    assert_eq!(ticks.len(), 12, "4 probes of each stream, one per tick");
    for (k, &(stream, seq, at)) in ticks.iter().enumerate() {
        assert_eq!(stream, k % 3, "round robin: no burst per interval");
        let first = if stream == 2 { 5 } else { 0 };
        assert_eq!(seq, first + k as u64 / 3);
        let due = 10_000_000 + k as i64 * 1_000_000;
        assert!((due..due + 200).contains(&at), "tick {k} at {at} for {due}");
    }
    assert!(t.finished());
}

#[test]
fn late_wake_up_batches_what_is_due() {
    // Every wake-up 2.5 ms late at a 1 ms interval: the sender catches
    // up by batching, without ever sending early.
    let c = FakeClock::new(0, 0, 50);
    c.wake_late_ns.set(2_500_000);
    let ticks = run_fake(&c, WakeMode::Fixed(50_000), |_| {});
    let sent: u64 = ticks.iter().map(|(t, _)| t.end - t.first).sum();
    assert_eq!(sent, 20);
    assert!(ticks.len() < 20);
    assert!(ticks.iter().all(|(t, s)| t.send_ns >= *s));
}

#[test]
fn a_wake_gap_sends_what_fell_due_meanwhile_and_never_early() {
    // Ten streams at 1 ms, 100 µs apart; at most one sleep per 500 µs.
    let c = FakeClock::new(0, 0, 50);
    let scheds = (0..10)
        .map(|k| {
            let sched = Schedule {
                start_ns: 10_000_000 + k * 100_000,
                interval_ns: 1_000_000,
                count: 20,
                end_ns: None,
            };
            (sched, 0)
        })
        .collect();
    let mut t = Ticker::many(&c, scheds, WakeMode::Fixed(0), 1_000_000).with_wake_gap(500_000);
    let mut sent = 0;
    while let Next::Due(tick) = t.wait_next(&mut |_| {}) {
        let due = 10_000_000 + tick.stream as i64 * 100_000 + tick.first as i64 * 1_000_000;
        assert!(
            (due..=due + 500_000 + 1_000).contains(&tick.mono_ns),
            "stream {} seq {} at {} for {due}",
            tick.stream,
            tick.first,
            tick.mono_ns
        );
        sent += tick.end - tick.first;
        t.sent_until(tick.end);
    }
    assert_eq!(sent, 200);
    // 20 ms of sending, one sleep per 500 µs at most (the first one
    // ends at the first probe).
    let sleeps = c.sleeps.get();
    assert!(
        (38..=42).contains(&sleeps),
        "{sleeps} sleeps for 200 probes"
    );
}

/// A reader that flushes at every read, so each read's view of the
/// batch can be looked at, and counts the hand-overs.
struct Recorder {
    batch: EventBatch,
    tx: mpsc::Sender<Vec<events::Tagged>>,
    rx: mpsc::Receiver<Vec<events::Tagged>>,
    /// What the batch held at each read.
    reads: Vec<Vec<events::Tagged>>,
    hand_overs: usize,
}

impl Handover for Recorder {
    fn batch(&mut self) -> &mut EventBatch {
        &mut self.batch
    }
    fn between_sends(&mut self) {
        self.batch.flush(&self.tx);
        self.reads.push(self.rx.try_recv().unwrap_or_default());
    }
    fn hand_over(&mut self) -> bool {
        self.hand_overs += 1;
        true
    }
}

/// Paces `count` probes every `interval` to a loopback peer through a
/// [`Recorder`].
fn paced(count: u64, interval: std::time::Duration) -> Recorder {
    paced_with_cfg(count, interval, None, |_| {}).0
}

/// [`paced`], to `dst` (default: a loopback peer) with `adjust`
/// applied to the configuration; also returns the sender's report.
fn paced_with_cfg(
    count: u64,
    interval: std::time::Duration,
    dst: Option<SocketAddr>,
    adjust: impl FnOnce(&mut ProbeConfig),
) -> (Recorder, Pacing) {
    let no_stamps = crate::probe::socket::TsFlags {
        tx: false,
        rx: false,
        hardware: false,
    };
    let sock = ProbeSocket::bind("127.0.0.1:0".parse().unwrap(), 0, no_stamps, 0).unwrap();
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let attempts = AtomicU64::new(0);
    let legs = [PaceLeg {
        sock: &sock,
        dst: dst.unwrap_or(peer.local_addr().unwrap()),
        size: 64,
        interval_ns: interval.as_nanos() as i64,
        count: Some(count),
        anchor_ns: None,
        attempts: &attempts,
    }];
    let mut cfg = ProbeConfig {
        size: 64,
        interval,
        count: Some(count),
        duration: None,
        tos: 0,
        port: 9,
        timestamps: crate::probe::TimestampSource::Software,
        timeout: std::time::Duration::from_secs(1),
        flow: 0,
        spin: Some(std::time::Duration::from_micros(20)),
        busy_poll: false,
        no_warm_up: false,
        rt: Default::default(),
        kernel_reflector: false,
    };
    adjust(&mut cfg);
    let stop = AtomicU8::new(0);
    let until = Until {
        end_ns: None,
        stop: &stop,
        pause: &|| false,
    };
    let (tx, rx) = mpsc::channel();
    let mut r = Recorder {
        batch: EventBatch::new(),
        tx,
        rx,
        reads: Vec::new(),
        hand_overs: 0,
    };
    let report = pace_with(&legs, &cfg, &until, &mut r, &mut |_, _, _, buf| buf.fill(0)).unwrap();
    assert_eq!(attempts.load(Ordering::SeqCst), count);
    (r, report)
}

#[test]
fn a_sender_that_sleeps_warms_up_unless_told_not_to() {
    let ms = std::time::Duration::from_millis(2);
    let (_, warm) = paced_with_cfg(5, ms, None, |c| c.spin = Some(ms / 2));
    assert!(warm.warm_up_ns_per_probe.is_some(), "{warm:?}");
    let (_, cold) = paced_with_cfg(5, ms, None, |c| {
        c.spin = Some(ms / 2);
        c.no_warm_up = true;
    });
    assert_eq!(cold.warm_up_ns_per_probe, None);
}

#[test]
fn failed_sends_are_counted_and_recorded_as_failed() {
    // UDP to port 0 is refused by the kernel (EINVAL) at every send.
    let nowhere = "127.0.0.1:0".parse().unwrap();
    let (r, report) = paced_with_cfg(
        4,
        std::time::Duration::from_millis(1),
        Some(nowhere),
        |_| {},
    );
    assert_eq!(report.send_failures, 4);
    let failed = r
        .reads
        .iter()
        .flatten()
        .filter(|(_, e)| matches!(e, Event::SendFailed { .. }))
        .count();
    assert_eq!(failed, 4);
}

#[test]
fn send_errors_warn_at_once_then_at_most_every_ten_seconds() {
    let dst: SocketAddr = "192.0.2.1:5061".parse().unwrap();
    let err = || Some((1, std::io::Error::from_raw_os_error(libc::ENETUNREACH)));
    let mut e = SendErrors::default();
    e.note(dst, err(), 0);
    assert_eq!((e.total, e.since_warn, e.warned_at_ns), (1, 0, Some(0)));
    e.note(dst, err(), 1_000_000_000);
    e.note(dst, None, 2_000_000_000);
    assert_eq!((e.total, e.since_warn), (2, 1), "held back");
    e.note(dst, err(), SEND_ERROR_WARN_EVERY_NS);
    assert_eq!((e.total, e.since_warn), (3, 0), "warned again");
}

#[test]
fn every_tick_is_read_right_after_its_sends() {
    let r = paced(10, std::time::Duration::from_millis(1));
    // One read per tick, and it comes after the tick's Sent events.
    let sent: Vec<u64> = r
        .reads
        .iter()
        .flatten()
        .map(|(_, e)| match e {
            Event::Sent { seq, .. } => *seq,
            other => panic!("only Sent events here: {other:?}"),
        })
        .collect();
    assert_eq!(sent, (0..10).collect::<Vec<_>>());
    assert!(r.reads.len() <= 10, "{} reads", r.reads.len());
    assert!(r.reads.iter().all(|evs| !evs.is_empty()), "a read per tick");
    assert!(r.hand_overs >= 1, "the last events are handed over");
}

#[test]
fn a_long_wait_is_read_slice_by_slice() {
    // 250 ms between the two probes: slept in 100 ms slices, each read.
    let r = paced(2, std::time::Duration::from_millis(250));
    let empty = r.reads.iter().filter(|evs| evs.is_empty()).count();
    assert!(empty >= 1, "no read during the wait: {:?}", r.reads);
    assert!(r.hand_overs > empty, "each slice hands over");
}
