//! Unit tests of `matcher.rs` (kept apart so that the module itself stays short).

use super::*;
use crate::model::record::{StartSrc, TsSource};

const ALL: Expect = Expect {
    tx: true,
    tx_hw: false,
    echo_tx: false,
    echo_tx_hw: false,
};

fn sent(seq: u64) -> Event {
    Event::Sent {
        seq,
        opt_id: seq as u32,
        sched_ns: 1000 * seq as i64,
        send_ns: 1000 * seq as i64 + 1,
    }
}

fn tx(opt_id: u32, kind: TxKind, ts_ns: i64) -> Event {
    Event::TxTimestamp {
        opt_id,
        kind,
        ts_ns,
    }
}

fn arrived(seq: u64, sw: Option<i64>) -> Event {
    Event::Arrived {
        seq,
        sw_ns: sw,
        hw_ns: None,
        user_ns: sw.unwrap_or(0) + 3,
        echo_send_ns: sw.map(|t| t + 4),
    }
}

fn echoed(seq: u64, sw: Option<i64>) -> Event {
    Event::Echoed {
        seq,
        sw_ns: sw,
        hw_ns: None,
        user_ns: sw.unwrap_or(0) + 2,
        reflector: None,
    }
}

fn run(m: &mut Matcher, evs: &[Event], now: i64, all: bool) -> (Vec<ProbeRecord>, RunStats) {
    let mut st = RunStats::new();
    for e in evs {
        m.on_event(*e, &mut st);
    }
    let mut v = vec![];
    m.drain(now, all, |r| v.push(r));
    (v, st)
}

#[test]
fn complete_probe_any_event_order_every_stamp_kept() {
    let mut m = Matcher::new(64, 0, 1_000_000, ALL);
    let evs = [
        arrived(0, Some(50)),
        tx(0, TxKind::Software, 10),
        sent(0),
        tx(0, TxKind::Sched, 4),
        Event::EchoTx {
            opt_id: 0,
            kind: TxKind::Sched,
            ts_ns: 58,
        },
        Event::EchoTx {
            opt_id: 0,
            kind: TxKind::Software,
            ts_ns: 62,
        },
        echoed(0, Some(90)),
    ];
    let (v, _) = run(&mut m, &evs, 0, false);
    assert_eq!(v.len(), 1);
    let r = &v[0];
    assert_eq!(
        (r.tx_sched_ns, r.tx_ns, r.rx_ns, r.echo_ns),
        (Some(4), Some(10), Some(50), Some(90))
    );
    assert_eq!((r.rx_user_ns, r.echo_send_ns), (Some(53), Some(54)));
    assert_eq!(
        (r.echo_tx_sched_ns, r.echo_tx_ns, r.echo_user_ns),
        (Some(58), Some(62), Some(92))
    );
    assert_eq!(r.start_src, Some(StartSrc::Sched));
    assert_eq!(
        (r.one_way_ns, r.rtt_ns),
        (Some(46), Some(86)),
        "from the SCHED stamp"
    );
    assert_eq!(r.path_ns, Some(40), "the old tx->rx figure");
    assert_eq!(r.sender_queue_ns, Some(6));
    assert_eq!(r.ts_source, Some(TsSource::Software));
    assert_eq!(
        r.turnaround_ns,
        Some(12),
        "the echo left 12 ns after the probe's RX stamp"
    );
    assert!(!r.lost);
}

#[test]
fn waits_in_order_then_times_out() {
    let mut m = Matcher::new(64, 0, 500, ALL);
    // seq 1 complete, seq 0 still missing its arrival.
    let evs = [
        sent(0),
        sent(1),
        tx(0, TxKind::Software, 5),
        tx(1, TxKind::Software, 1005),
        arrived(1, Some(1100)),
        echoed(1, Some(1200)),
    ];
    let (v, _) = run(&mut m, &evs, 100, false);
    assert!(v.is_empty(), "seq 1 must wait for seq 0");
    let mut out = vec![];
    m.drain(600, false, |r| out.push(r));
    assert_eq!(out.len(), 2);
    assert!(out[0].lost && out[0].one_way_ns.is_none());
    assert_eq!(out[0].tx_ns, Some(5), "a lost probe keeps its TX stamp");
    assert_eq!(
        out[1].one_way_ns,
        Some(99),
        "no SCHED stamp: from the user-space send (1001)"
    );
    assert_eq!(out[1].start_src, Some(StartSrc::User));
    // Arrives after being given up.
    let mut st = RunStats::new();
    m.on_event(arrived(0, None), &mut st);
    assert_eq!(m.late_arrivals(), 1);
}

#[test]
fn duplicate_stamps_keep_first_late_ones_are_counted_apart() {
    let mut m = Matcher::new(64, 0, 1_000, ALL);
    let evs = [
        sent(0),
        tx(0, TxKind::Software, 10),
        tx(0, TxKind::Software, 30),
        arrived(0, Some(50)),
        echoed(0, Some(90)),
    ];
    let (v, st) = run(&mut m, &evs, 0, false);
    assert_eq!(v[0].tx_ns, Some(10));
    assert_eq!(st.summary().tx_timestamp_duplicates, 1);
    // After finalization: a kind it had is a duplicate, one it lacked is late.
    let mut st = RunStats::new();
    m.on_event(tx(0, TxKind::Software, 40), &mut st);
    m.on_event(tx(0, TxKind::Sched, 5), &mut st);
    m.on_event(tx(0, TxKind::Sched, 6), &mut st);
    let s = st.summary();
    assert_eq!(s.tx_timestamp_duplicates, 2);
    assert_eq!(s.tx_timestamp_late, 1);
    assert_eq!(m.late_tx(), 1);
}

#[test]
fn duplicate_tx_timestamps_before_the_send_event_keep_the_first() {
    let mut m = Matcher::new(64, 0, 1_000, ALL);
    let evs = [
        tx(0, TxKind::Sched, 3),
        tx(0, TxKind::Software, 10),
        tx(0, TxKind::Software, 30),
        sent(0),
        arrived(0, Some(50)),
        echoed(0, Some(90)),
    ];
    let (v, st) = run(&mut m, &evs, 0, false);
    assert_eq!(v[0].tx_ns, Some(10));
    assert_eq!(v[0].tx_sched_ns, Some(3));
    assert_eq!(v[0].one_way_ns, Some(47));
    assert_eq!(st.summary().tx_timestamp_duplicates, 1);
}

struct Offset(i64);
impl HwClocks for Offset {
    fn sender(&self, raw: i64) -> Option<i64> {
        Some(raw + self.0)
    }
    fn receiver(&self, raw: i64) -> Option<i64> {
        Some(raw + 2 * self.0)
    }
}

#[test]
fn hardware_stamps_are_kept_beside_software_ones_and_converted() {
    let expect = Expect { tx_hw: true, ..ALL };
    let mut m = Matcher::new(64, 0, 1_000, expect).with_hw_clocks(std::sync::Arc::new(Offset(100)));
    let evs = [
        sent(0),
        tx(0, TxKind::Software, 10),
        arrived(0, Some(50)),
        Event::Echoed {
            seq: 0,
            sw_ns: Some(95),
            hw_ns: Some(-20),
            user_ns: 99,
            reflector: None,
        },
    ];
    let (v, _) = run(&mut m, &evs, 0, false);
    assert!(v.is_empty(), "waits for the hardware TX stamp");
    let (v, st) = run(&mut m, &[tx(0, TxKind::Hardware, -88)], 0, false);
    assert_eq!(v[0].tx_ns, Some(10), "tx_ns stays the software stamp");
    assert_eq!(v[0].tx_hw_ns, Some(12), "PHC -88 + 100 on the system clock");
    assert_eq!(v[0].echo_hw_ns, Some(80));
    assert_eq!(v[0].driver_ns, Some(2));
    assert_eq!(v[0].tx_src, Some(TsSource::Hardware));
    assert_eq!(st.summary().tx_timestamp_duplicates, 0);
    // Without a PHC conversion the hardware stamps are left out and counted.
    let mut m = Matcher::new(64, 0, 1_000, ALL);
    let (v, _) = run(
        &mut m,
        &[
            sent(0),
            tx(0, TxKind::Software, 10),
            tx(0, TxKind::Hardware, 11),
            arrived(0, Some(50)),
            echoed(0, None),
        ],
        0,
        false,
    );
    assert_eq!(v[0].tx_hw_ns, None);
    assert_eq!(m.hw_unconverted(), 1);
    assert_eq!(v[0].rtt_ns, None);
}

#[test]
fn duplicates_reorder_and_foreign() {
    let mut m = Matcher::new(64, 0, 1_000, Expect::default());
    let evs = [
        sent(0),
        sent(1),
        arrived(1, None),
        arrived(0, None),
        arrived(0, None),
        arrived(u64::MAX, None),
        Event::Foreign,
    ];
    let (v, st) = run(&mut m, &evs, 5000, false);
    assert_eq!(v.len(), 2);
    let s = st.summary();
    assert_eq!((s.reordered, s.duplicates, s.foreign_packets), (1, 1, 2));
}

#[test]
fn echo_tx_stamps_by_low_seq_bits_and_waited_for() {
    let expect = Expect {
        echo_tx: true,
        ..ALL
    };
    let mut m = Matcher::new(64, 0, 1_000, expect);
    let done = |seq: u64| {
        [
            sent(seq),
            tx(seq as u32, TxKind::Software, 1),
            arrived(seq, Some(10)),
            echoed(seq, Some(30)),
        ]
    };
    let (v, _) = run(&mut m, &done(0), 0, false);
    assert!(v.is_empty(), "waits for the echo's TX stamp");
    let (v, st) = run(
        &mut m,
        &[
            Event::EchoTx {
                opt_id: 0,
                kind: TxKind::Software,
                ts_ns: 14,
            },
            Event::EchoTx {
                opt_id: 0,
                kind: TxKind::Software,
                ts_ns: 15,
            },
        ],
        0,
        false,
    );
    assert_eq!(v[0].turnaround_ns, Some(4));
    assert_eq!(v[0].reflector_ns, Some(1), "read at 13, echo stamped at 14");
    assert_eq!(v[0].return_ns, Some(16));
    assert_eq!(st.summary().echo_tx_duplicates, 1);
    // Low bits resolve across the 2^32 wrap relative to the window base.
    assert_eq!(m.seq_of_low_bits(1), Some(1));
    let mut far = Matcher::new(64, 0, 1_000, ALL);
    far.base = (1 << 32) - 2;
    assert_eq!(far.seq_of_low_bits(1), Some((1 << 32) + 1));
    assert_eq!(far.seq_of_low_bits(u32::MAX - 1), Some((1 << 32) - 2));
    assert_eq!(far.seq_of_low_bits(u32::MAX - 2), None, "behind the window");
}

#[test]
fn send_failure_is_accounted_as_lost() {
    let mut m = Matcher::new(64, 0, 1_000, ALL);
    let (v, _) = run(
        &mut m,
        &[Event::SendFailed {
            seq: 0,
            sched_ns: 0,
            send_ns: 1,
        }],
        0,
        false,
    );
    assert_eq!(v.len(), 1);
    assert!(v[0].lost && v[0].tx_ns.is_none());
}

#[test]
fn flush_all_finalizes_everything_sent_and_counts_unmatched_slots() {
    let mut m = Matcher::new(64, 0, i64::MAX / 2, ALL);
    let (v, _) = run(&mut m, &[sent(0), sent(1), sent(2)], 0, true);
    assert_eq!(v.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![0, 1, 2]);
    assert_eq!(m.in_flight(), 0);
    assert_eq!(m.unmatched(), 0);
    // Seq 3 arrived but its send was never recorded: no record, counted.
    let (v, _) = run(&mut m, &[arrived(3, Some(5)), sent(4)], 0, true);
    assert_eq!(v.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![4]);
    assert_eq!(m.unmatched(), 1);
}

#[test]
fn finalized_memory_is_bounded() {
    let mut m = Matcher::new(64, 0, 0, Expect::default());
    let mut st = RunStats::new();
    for seq in 0..(FINALIZED_MEMORY as u64 + 100) {
        m.on_event(sent(seq), &mut st);
        m.drain(i64::MAX, false, |_| {});
    }
    assert_eq!(m.finalized.len(), FINALIZED_MEMORY);
    assert_eq!(m.finalized_order.len(), FINALIZED_MEMORY);
}

/// A slow stream remembers the sends of the last seconds, not 64 Ki.
#[test]
fn finalized_memory_of_a_slow_stream_is_its_last_seconds() {
    let timeout_ns = 1_000_000_000;
    let mut m = Matcher::new(64, 0, timeout_ns, Expect::default());
    let mut st = RunStats::new();
    let interval_ns = 100_000_000;
    for seq in 0..20_000u64 {
        let t = seq as i64 * interval_ns;
        m.on_event(
            Event::Sent {
                seq,
                opt_id: seq as u32,
                sched_ns: t,
                send_ns: t,
            },
            &mut st,
        );
        m.drain(t + 2 * timeout_ns, false, |_| {});
    }
    let kept = ((timeout_ns + FINALIZED_HORIZON_NS) / interval_ns + 1) as usize;
    assert_eq!(m.finalized.len(), kept);
    assert_eq!(m.finalized_order.len(), kept);
    assert!(m.finalized.capacity() <= 4 * KEEP_CAPACITY);
    // A stamp of a send within the horizon is still told late.
    m.on_event(
        Event::TxTimestamp {
            opt_id: 19_999,
            kind: TxKind::Software,
            ts_ns: 0,
        },
        &mut st,
    );
    assert_eq!(m.late_tx, 1);
}

#[test]
fn kernel_reflector_echo_stands_for_the_arrival() {
    let mut m = Matcher::new(64, 0, 1_000, ALL).with_kernel_reflector(true);
    let kernel_echo = |seq: u64, times: Option<KernelTimes>| Event::Echoed {
        seq,
        sw_ns: Some(200 + seq as i64 * 1000),
        hw_ns: None,
        user_ns: 210 + seq as i64 * 1000,
        reflector: times,
    };
    let evs = [
        sent(0),
        tx(0, TxKind::Software, 10),
        kernel_echo(
            0,
            Some(KernelTimes {
                rx_ns: 100,
                tx_ns: 102,
            }),
        ),
        // Too short for times: arrived, but no reflector stamps.
        sent(1),
        tx(1, TxKind::Software, 1010),
        kernel_echo(1, None),
        // Never echoed: lost.
        sent(2),
        tx(2, TxKind::Software, 2010),
    ];
    let (v, st) = run(&mut m, &evs, 10_000, true);
    assert_eq!(v.len(), 3);
    let r = &v[0];
    assert!(!r.lost);
    assert_eq!((r.rx_ns, r.echo_tx_ns), (Some(100), Some(102)));
    assert_eq!(
        (r.rx_user_ns, r.echo_send_ns, r.echo_tx_sched_ns),
        (None, None, None)
    );
    assert_eq!(r.turnaround_ns, Some(2));
    assert_eq!(r.echo_ns, Some(200));
    assert!(!v[1].lost);
    assert_eq!((v[1].rx_ns, v[1].echo_tx_ns), (None, None));
    assert_eq!(v[1].echo_ns, Some(1200));
    assert!(v[2].lost);
    assert_eq!(st.summary().duplicates, 0);
    // A duplicate echo counts as a duplicate arrival; a late one as late.
    let mut st = RunStats::new();
    let mut m = Matcher::new(64, 0, 1_000, ALL).with_kernel_reflector(true);
    for e in [sent(0), kernel_echo(0, None), kernel_echo(0, None)] {
        m.on_event(e, &mut st);
    }
    assert_eq!(st.summary().duplicates, 1);
    m.drain(i64::MAX, true, |_| {});
    m.on_event(kernel_echo(0, None), &mut st);
    assert_eq!(m.late_arrivals(), 1);
}

#[test]
fn late_and_never_sent_echoes_are_counted_apart_and_grow_nothing() {
    let mut m = Matcher::new(64, 0, 1_000, ALL).with_kernel_reflector(true);
    let mut st = RunStats::new();
    m.on_event(sent(0), &mut st);
    m.on_event(echoed(0, Some(5)), &mut st);
    m.drain(i64::MAX, true, |_| {});
    // The record of seq 0 is written: its echo again is late.
    m.on_event(echoed(0, Some(6)), &mut st);
    // Told by the reader, and beyond any window: both never sent.
    m.on_event(Event::NeverSent, &mut st);
    m.on_event(echoed(u64::MAX, Some(7)), &mut st);
    // An echo's TX stamp for a seq the window does not hold.
    m.on_event(
        Event::EchoTx {
            opt_id: 1 << 20,
            kind: TxKind::Software,
            ts_ns: 9,
        },
        &mut st,
    );
    let s = st.summary();
    assert_eq!((s.late_echoes, s.never_sent, s.foreign_packets), (1, 2, 0));
    assert_eq!(
        m.in_flight(),
        0,
        "nothing keyed by a seq from the wire was kept"
    );
    assert!(m.window.capacity() <= KEEP_CAPACITY);
}

#[test]
fn the_window_gives_memory_back_after_a_stall() {
    let mut m = Matcher::new(64, 0, 1_000, ALL);
    let mut stats = RunStats::new();
    // 100 000 probes in flight at once (a stall), then all finalized.
    for seq in 0..100_000 {
        m.on_event(sent(seq), &mut stats);
    }
    assert!(m.window.capacity() >= 100_000);
    m.drain(i64::MAX, false, |_| {});
    assert_eq!(m.in_flight(), 0);
    assert!(
        m.window.capacity() <= 2 * KEEP_CAPACITY,
        "{}",
        m.window.capacity()
    );
    assert!(
        m.opt_to_seq.capacity() <= 2 * KEEP_CAPACITY,
        "{}",
        m.opt_to_seq.capacity()
    );
}

mod echo_rules {
    use super::super::*;
    use crate::probe::wire::ProtocolArg;
    use crate::probe::{
        stamp::{ErrorEstimate, Mode, ReflectorPacket, Timestamp},
        wire::SSID_WARMUP_BIT,
    };
    use std::sync::atomic::Ordering;

    /// The sender's wire of `protocol`.
    fn wire_of(protocol: ProtocolArg) -> Wire {
        match protocol {
            ProtocolArg::Rtprobe => Wire::Rtprobe {
                session: 0x1234,
                flow: 0,
            },
            ProtocolArg::Stamp => Wire::Stamp {
                ssid: 77,
                key: None,
                ee: ErrorEstimate::from_error_ns(false, 0, false),
                tai_offset_s: 0,
            },
        }
    }

    /// The echo of probe `seq` as the reflector of `w` sends it.
    fn echo(w: &Wire, seq: u64, warmup: bool) -> Vec<u8> {
        let mut buf = vec![0u8; 64];
        let mut scratch = Vec::new();
        w.encode(
            seq,
            1_763_850_000_000_000_000,
            warmup,
            &mut buf,
            &mut scratch,
        );
        match w {
            // The reflector's answer: the echo flag (rtprobe); STAMP's
            // reflector packet carries the sender's seq and SSID.
            Wire::Rtprobe { .. } => buf[5] |= crate::probe::packet::FLAG_ECHO,
            Wire::Stamp { ssid, .. } => {
                let ssid = if warmup {
                    ssid | SSID_WARMUP_BIT
                } else {
                    *ssid
                };
                let r = ReflectorPacket {
                    seq: 0,
                    timestamp: Timestamp::from_bits(0, false).unwrap(),
                    error_estimate: ErrorEstimate::from_error_ns(false, 0, false),
                    ssid,
                    receive_timestamp: Timestamp::from_bits(0, false).unwrap(),
                    sender_seq: seq as u32,
                    sender_timestamp: Timestamp::from_bits(0, false).unwrap(),
                    sender_error_estimate: ErrorEstimate::from_error_ns(false, 0, false),
                    sender_ttl: 64,
                };
                r.encode(Mode::Unauthenticated, 64, &mut scratch).unwrap();
                buf.copy_from_slice(&scratch);
            }
        }
        buf
    }

    /// The wire of another session than `wire`'s.
    fn other_session(wire: &Wire) -> Wire {
        match wire {
            Wire::Rtprobe { flow, .. } => Wire::Rtprobe {
                session: 0x4321,
                flow: *flow,
            },
            Wire::Stamp { ee, .. } => Wire::Stamp {
                ssid: 78,
                key: None,
                ee: *ee,
                tai_offset_s: 0,
            },
        }
    }

    fn rules_check(protocol: ProtocolArg) {
        let wire = wire_of(protocol);
        let target: SocketAddr = "192.0.2.1:862".parse().unwrap();
        let issued = AtomicU64::new(10);
        let rules = EchoRules {
            wire: &wire,
            target,
            issued: &issued,
        };
        let judge = |b: &[u8], src: SocketAddr| rules.judge(b, src, issued.load(Ordering::SeqCst));
        assert!(matches!(judge(&echo(&wire, 9, false), target), Verdict::Probe(e) if e.seq == 9));
        assert!(matches!(
            judge(&echo(&wire, WARMUP_SEQ, true), target),
            Verdict::WarmUp(_)
        ));
        // Foreign: another source (even with the right session), another
        // session, bytes that decode as nothing.
        let elsewhere: SocketAddr = "192.0.2.99:862".parse().unwrap();
        let other_port: SocketAddr = "192.0.2.1:863".parse().unwrap();
        assert_eq!(judge(&echo(&wire, 1, false), elsewhere), Verdict::Foreign);
        assert_eq!(judge(&echo(&wire, 1, false), other_port), Verdict::Foreign);
        let other = other_session(&wire);
        assert_eq!(judge(&echo(&other, 1, false), target), Verdict::Foreign);
        assert_eq!(judge(&[0u8; 7], target), Verdict::Foreign);
        // Never sent: at or past the pacer's count, or a warm-up-marked
        // echo of another seq.
        for seq in [10, 0x7FFF_FFFF, 0xFFFF_FFFF] {
            assert_eq!(
                judge(&echo(&wire, seq, false), target),
                Verdict::NeverSent,
                "{seq}"
            );
        }
        assert_eq!(judge(&echo(&wire, 3, true), target), Verdict::NeverSent);
        issued.store(11, Ordering::SeqCst);
        assert!(matches!(
            judge(&echo(&wire, 10, false), target),
            Verdict::Probe(_)
        ));
    }

    #[test]
    fn echoes_only_from_the_target_of_this_session_for_a_seq_sent() {
        rules_check(ProtocolArg::Rtprobe);
        rules_check(ProtocolArg::Stamp);
    }
}
