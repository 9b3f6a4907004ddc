//! Unit tests of `io.rs` (kept apart so that the module itself stays short).

use std::{sync::atomic::AtomicU8, time::Duration};

use super::*;
use crate::{
    model::record::ProbeRecord,
    probe::{
        ProbeConfig, TimestampSource,
        engine::{
            Collecting, EchoSide, LegOut,
            collect::{HwSetup, collect},
        },
        matcher::NoHwClocks,
        socket::TsFlags,
        wire::Wire,
    },
    stats::RunStats,
    stats::observer::NoObserver,
};

/// The records a session wrote.
#[derive(Default)]
struct Rows(Vec<ProbeRecord>);

impl crate::model::record::RecordSink for Rows {
    fn write(&mut self, r: &ProbeRecord) -> anyhow::Result<()> {
        self.0.push(r.clone());
        Ok(())
    }
    fn flush(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

fn cfg(timeout: Duration) -> ProbeConfig {
    ProbeConfig {
        size: 64,
        interval: Duration::from_millis(10),
        count: Some(1),
        duration: None,
        tos: 0,
        port: 9,
        timestamps: TimestampSource::Software,
        timeout,
        flow: 0,
        spin: None,
        busy_poll: false,
        no_warm_up: false,
        rt: Default::default(),
        kernel_reflector: true,
    }
}

/// Runs the collector over one probe sent now, whose echo the kernel
/// took 1 ms later, while a reader that was kept from reading for
/// `stall` hands the echo over (`echo`) and moves its mark. Returns
/// the statistics.
fn collect_with_a_stalled_reader(stall: Duration, echo: bool) -> RunStats {
    let sock = ProbeSocket::bind(
        "127.0.0.1:0".parse().unwrap(),
        0,
        TsFlags {
            tx: false,
            rx: false,
            hardware: false,
        },
        0,
    )
    .unwrap();
    let wire = Wire::Rtprobe {
        session: 7,
        flow: 0,
    };
    let legs = [Leg {
        s: Session {
            sock: &sock,
            dst: "127.0.0.1:9".parse().unwrap(),
            wire: &wire,
            echo_side: EchoSide::Remote,
            on_echoes: None,
            foreign_before: 0,
        },
        cfg: cfg(Duration::from_millis(50)),
        attempts: AtomicU64::new(1),
        anchor_ns: None,
    }];
    let (tx, rx) = mpsc::channel();
    let mark = ReadMark::new();
    let sent_ns = clock::realtime_ns();
    let sent = Event::Sent {
        seq: 0,
        opt_id: 0,
        sched_ns: sent_ns,
        send_ns: sent_ns,
    };
    tx.send(vec![(0, sent)]).unwrap();
    mark.publish(sent_ns);
    let finished = AtomicBool::new(false);
    let (stop, mut rows, mut observer) = (AtomicU8::new(0), Rows::default(), NoObserver);
    std::thread::scope(|sc| {
        sc.spawn(|| {
            std::thread::sleep(stall);
            if echo {
                let e = Event::Echoed {
                    seq: 0,
                    sw_ns: Some(sent_ns + 1_000_000),
                    hw_ns: None,
                    user_ns: clock::realtime_ns(),
                    reflector: None,
                };
                tx.send(vec![(0, e)]).unwrap();
            }
            mark.publish(clock::realtime_ns());
            finished.store(true, Ordering::SeqCst);
        });
        let c = Collecting {
            legs: &legs,
            carried: Vec::new(),
            pause: &|| false,
            read: &mark,
        };
        let hw = HwSetup {
            echo_stamps: false,
            sender_tx: false,
            receiver_tx: false,
            clocks: std::sync::Arc::new(NoHwClocks),
        };
        let mut outs = [LegOut {
            csv: &mut rows,
            observer: &mut observer,
        }];
        let done = || finished.load(Ordering::SeqCst);
        let d = collect(&rx, c, hw, &mut outs, &stop, &done).unwrap();
        let mut got = d.finished().unwrap();
        got.pop().unwrap().0
    })
}

#[test]
fn a_reader_kept_from_a_cpu_past_the_timeout_loses_no_probe() {
    // Four timeouts without a read: the record waits, the echo counts.
    let s = collect_with_a_stalled_reader(Duration::from_millis(200), true);
    let c = s.counts();
    assert_eq!((c.received, c.lost, c.late_echoes), (1, 0, 0), "{c:?}");
    // The reader read past the timeout and saw no echo: lost.
    let s = collect_with_a_stalled_reader(Duration::from_millis(200), false);
    let c = s.counts();
    assert_eq!((c.received, c.lost), (0, 1), "{c:?}");
}

#[test]
fn the_mark_only_moves_forward_and_ends_at_the_end() {
    let m = ReadMark::new();
    m.publish(100);
    m.publish(50);
    assert_eq!(m.until_ns(), 100);
    m.end();
    assert_eq!(m.until_ns(), i64::MAX);
}

fn plain_socket() -> ProbeSocket {
    let no_stamps = TsFlags {
        tx: false,
        rx: false,
        hardware: false,
    };
    // Room for a few hundred small datagrams.
    ProbeSocket::bind("127.0.0.1:0".parse().unwrap(), 0, no_stamps, 1 << 20).unwrap()
}

/// A sender's socket connected to a peer on loopback, and the peer
/// (which knows the sender's address once it has its first datagram).
fn connected_pair() -> (ProbeSocket, std::net::UdpSocket, std::net::SocketAddr) {
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let peer_addr = peer.local_addr().unwrap();
    let sock = plain_socket();
    sock.connect(peer_addr).unwrap();
    sock.send_to(&[0u8; 64], peer_addr, 0).unwrap();
    let mut buf = [0u8; 64];
    let (_, sender_addr) = peer.recv_from(&mut buf).unwrap();
    (sock, peer, sender_addr)
}

fn remote_leg<'a>(sock: &'a ProbeSocket, dst: std::net::SocketAddr, wire: &'a Wire) -> Leg<'a> {
    Leg {
        s: Session {
            sock,
            dst,
            wire,
            echo_side: EchoSide::Remote,
            on_echoes: None,
            foreign_before: 0,
        },
        cfg: cfg(Duration::from_millis(50)),
        attempts: AtomicU64::new(1),
        anchor_ns: None,
    }
}

#[test]
fn between_sends_reads_the_echo_and_the_mark_moves_once_it_is_handed_over() {
    let (sock, peer, sender_addr) = connected_pair();
    let wire = Wire::Rtprobe {
        session: 7,
        flow: 0,
    };
    // The echo of probe 0, from the address probed.
    let (mut echo, mut scratch) = (vec![0u8; 64], Vec::new());
    wire.encode(0, clock::realtime_ns(), false, &mut echo, &mut scratch);
    echo[5] |= crate::probe::packet::FLAG_ECHO;
    peer.send_to(&echo, sender_addr).unwrap();
    let legs = [remote_leg(&sock, peer.local_addr().unwrap(), &wire)];
    let (tx, rx) = mpsc::channel();
    let mark = ReadMark::new();
    let mut io = Io::new(&legs, tx, &mark, ReadBy::Sender);
    // Loopback delivers within the send; give a loaded machine time.
    let before_ns = clock::realtime_ns();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while io.batch().len() == 0 && std::time::Instant::now() < deadline {
        io.between_sends();
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(io.batch().len(), 1, "the echo read without a wait");
    assert!(
        rx.try_recv().is_err(),
        "nothing handed over before hand_over"
    );
    assert_eq!(mark.until_ns(), i64::MIN, "the mark waits for the events");
    assert!(io.hand_over());
    let got = rx.try_recv().unwrap();
    assert!(
        matches!(got[..], [(0, Event::Echoed { seq: 0, .. })]),
        "{got:?}"
    );
    assert!(mark.until_ns() >= before_ns, "the mark covers the read");
    drop(io);
    assert_eq!(
        mark.until_ns(),
        i64::MAX,
        "a reader that ends ends the mark"
    );
}

#[test]
fn a_flood_is_read_a_batch_per_send_and_the_mark_waits_for_the_rest() {
    let (sock, peer, sender_addr) = connected_pair();
    let wire = Wire::Rtprobe {
        session: 7,
        flow: 0,
    };
    // 150 datagrams from the target: more than one read takes (64).
    for i in 0..150u8 {
        peer.send_to(&[i; 40], sender_addr).unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    let legs = [remote_leg(&sock, peer.local_addr().unwrap(), &wire)];
    let (tx, rx) = mpsc::channel();
    let mark = ReadMark::new();
    let mut io = Io::new(&legs, tx, &mark, ReadBy::Sender);
    let mut reads = Vec::new();
    while mark.until_ns() == i64::MIN && reads.len() < 10 {
        io.between_sends();
        // Foreign datagrams: one event each.
        reads.push(io.batch().len());
        io.hand_over();
    }
    assert_eq!(
        reads,
        [64, 64, 22],
        "a batch per send; the mark moved at the last"
    );
    assert_eq!(rx.try_iter().map(|b| b.len()).sum::<usize>(), 150);
}

#[test]
fn only_the_in_process_reflectors_thread_waits_and_never_on_the_sender() {
    let (tx_sock, rx_sock) = (plain_socket(), plain_socket());
    let wire = Wire::Rtprobe {
        session: 7,
        flow: 0,
    };
    let dst = "127.0.0.1:9".parse().unwrap();
    let fds = |legs: &[Leg<'_>], by| {
        let (ev, _) = mpsc::channel();
        let mark = ReadMark::new();
        let io = Io::new(legs, ev, &mark, by);
        io.polled.iter().map(|s| s.fd()).collect::<Vec<_>>()
    };
    let mut leg = remote_leg(&tx_sock, dst, &wire);
    leg.s.echo_side = EchoSide::InProcess {
        sock: &rx_sock,
        session: 7,
    };
    // The reflector's thread waits for probes, on the receiver's socket only.
    assert_eq!(fds(&[leg], ReadBy::IoThread), [rx_sock.fd()]);
    // Where the sender reads, its loop waits on both once it has sent all.
    let mut leg = remote_leg(&tx_sock, dst, &wire);
    leg.s.echo_side = EchoSide::Kernel {
        sock: &rx_sock,
        session: 7,
    };
    assert_eq!(fds(&[leg], ReadBy::Sender), [rx_sock.fd(), tx_sock.fd()]);
    let leg = remote_leg(&tx_sock, dst, &wire);
    assert_eq!(fds(&[leg], ReadBy::Sender), [tx_sock.fd()]);
}
