//! End-to-end: the sender (`rtprobe --target`, as user nobody in namespace
//! A) facing hostile echoes. (a) A fake reflector in namespace B answers
//! every probe and adds echoes carrying seqs that were never sent
//! (0xFFFFFFFF, 0x7FFFFFFF, and seqs past the run's count); (b) while a
//! normal STAMP run against `rtprobe reflect` goes on, 32,767 STAMP replies
//! (one per 15-bit SSID) arrive from an off-path address, then as many
//! from the target's own address. The sender's peak RSS must stay within
//! a few MiB of a clean run's, the run's figures must not move, and the
//! refused datagrams must be counted (never-sent, foreign; off-path ones
//! never reach the connected socket: the kernel counts them, UDP NoPorts).
//! Needs root; run by `cargo xtask test` with `--ignored --test-threads=1`.

mod common;

use std::{
    net::{SocketAddr, SocketAddrV4, UdpSocket},
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use common::{pair::*, *};
use rtprobe::probe::{
    packet::FLAG_ECHO,
    reflect::FLAG_WARMUP,
    stamp::{Mode, ReflectorPacket, SenderPacket},
};

/// A peak RSS this much above the clean run's fails the test.
const RSS_SLACK_KIB: u64 = 4096;
const FAKE_PORT: u16 = 40862;
/// A second address of namespace B: a host beside the target.
const OFF_PATH_IP: &str = "10.77.0.3";

/// The seqs the fake reflector forges after the echo of probe `seq`.
fn forged_seqs(seq: u64) -> [u64; 3] {
    [0xFFFF_FFFF, 0x7FFF_FFFF, seq + 100_000]
}

/// One real echo of `probe`, and (with `forge`, for the run's probes, not
/// the warm-up or status probes) echoes of seqs never sent.
fn answers(probe: &[u8], stamp: bool, forge: bool, reflector_seq: &mut u32) -> Vec<Vec<u8>> {
    if stamp {
        let Ok(p) = SenderPacket::decode(probe, Mode::Unauthenticated) else {
            return vec![];
        };
        let reply = |sender_seq: u32, seq: u32| {
            let r = ReflectorPacket {
                seq,
                timestamp: p.timestamp,
                error_estimate: p.error_estimate,
                ssid: p.ssid,
                receive_timestamp: p.timestamp,
                sender_seq,
                sender_timestamp: p.timestamp,
                sender_error_estimate: p.error_estimate,
                sender_ttl: 64,
            };
            let mut out = Vec::new();
            r.encode(Mode::Unauthenticated, probe.len(), &mut out)
                .expect("encode a STAMP reply");
            out
        };
        let mut v = vec![reply(p.seq, *reflector_seq)];
        *reflector_seq += 1;
        if forge && p.ssid & 0x8000 == 0 && p.seq < 100_000 {
            v.extend(
                forged_seqs(p.seq.into())
                    .iter()
                    .map(|&s| reply(s as u32, *reflector_seq)),
            );
        }
        v
    } else {
        if probe.len() < 32 || &probe[0..4] != b"RTPB" {
            return vec![];
        }
        let mut echo = probe.to_vec();
        echo[5] |= FLAG_ECHO;
        let seq = u64::from_be_bytes(probe[16..24].try_into().unwrap());
        let mut v = vec![echo.clone()];
        if forge && probe[5] & FLAG_WARMUP == 0 {
            for s in forged_seqs(seq) {
                let mut f = echo.clone();
                f[16..24].copy_from_slice(&s.to_be_bytes());
                v.push(f);
            }
        }
        v
    }
}

/// A reflector in namespace `ns` on B_IP:FAKE_PORT until `stop`; returns
/// how many forged echoes it sent.
fn fake_reflector(
    ns: &str,
    stamp: bool,
    forge: bool,
    stop: &AtomicBool,
    ready: &AtomicBool,
) -> u64 {
    let ns_file = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
    nix::sched::setns(&ns_file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
    let sock = UdpSocket::bind(SocketAddr::from((
        B_IP.parse::<std::net::Ipv4Addr>().unwrap(),
        FAKE_PORT,
    )))
    .expect("bind the fake reflector");
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    ready.store(true, Ordering::SeqCst);
    let mut buf = [0u8; 2048];
    let mut forged = 0u64;
    let mut reflector_seq = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let out = answers(&buf[..n], stamp, forge, &mut reflector_seq);
        for (i, d) in out.iter().enumerate() {
            if sock.send_to(d, from).is_ok() && i > 0 {
                forged += 1;
            }
        }
    }
    forged
}

fn n(j: &serde_json::Value, k: &str) -> u64 {
    j[k].as_u64().unwrap_or_else(|| panic!("no {k} in {j}"))
}

fn peak_rss(t: &Run) -> u64 {
    t.json["extra"]["peak_rss_kib"]
        .as_u64()
        .unwrap_or_else(|| panic!("no peak_rss_kib: {}", t.stdout))
}

/// One `--count 2000` run against the fake reflector: the run, and the
/// number of forged echoes sent at it.
fn run_against_fake(p: &Pair, protocol: &str, forge: bool) -> (Run, u64) {
    let (stop, ready) = (AtomicBool::new(false), AtomicBool::new(false));
    let stamp = protocol == "stamp";
    std::thread::scope(|s| {
        let fake = s.spawn(|| fake_reflector(&p.b, stamp, forge, &stop, &ready));
        while !ready.load(Ordering::SeqCst) && !fake.is_finished() {
            std::thread::sleep(Duration::from_millis(5));
        }
        let dst = format!("{B_IP}:{FAKE_PORT}");
        let t = target(
            p,
            &[
                "--target",
                &dst,
                "--protocol",
                protocol,
                "--count",
                "2000",
                "--interval",
                "1ms",
            ],
        );
        stop.store(true, Ordering::SeqCst);
        (t, fake.join().expect("fake reflector"))
    })
}

/// Datagrams the kernel of namespace `ns` dropped before a socket read
/// them (a full receive buffer), or had no socket for (one closed at the
/// run's end): the UDP counters RcvbufErrors + InErrors + NoPorts.
fn udp_dropped(ns: &str) -> u64 {
    ["RcvbufErrors", "InErrors", "NoPorts"]
        .iter()
        .map(|c| udp_counter(ns, c))
        .sum()
}

fn forged_echoes_from_the_target(protocol: &str) {
    let p = Pair::new();
    let (clean, _) = run_against_fake(&p, protocol, false);
    assert_eq!(clean.code, 0, "{}\n{}", clean.stderr, clean.stdout);
    let dropped_before = udp_dropped(&p.a);
    let (t, forged) = run_against_fake(&p, protocol, true);
    // What the kernel dropped on the sender's side, not rtprobe: a sender
    // starved of CPU for tens of ms overflows its socket's buffer, and a
    // forgery that follows the last echo can arrive after the run.
    let dropped = udp_dropped(&p.a) - dropped_before;
    assert_eq!(t.code, 0, "{}\n{}", t.stderr, t.stdout);
    let (rss_clean, rss) = (peak_rss(&clean), peak_rss(&t));
    eprintln!(
        "{protocol}: peak RSS clean {rss_clean} KiB, with {forged} forged echoes \
         (seq 0xFFFFFFFF, 0x7FFFFFFF, seq+100000) {rss} KiB; \
         never_sent {}, foreign {}, late {}, lost {}",
        t.json["never_sent"], t.json["foreign_packets"], t.json["late_echoes"], t.json["lost"]
    );
    assert_eq!(
        forged,
        3 * 2000,
        "the fake reflector forged after every probe"
    );
    assert!(
        rss <= rss_clean + RSS_SLACK_KIB,
        "peak RSS {rss} KiB against {rss_clean} KiB clean"
    );
    // Each forged echo that reached the socket is counted as never sent,
    // and nothing else moved: the legitimate echoes were all matched but
    // for those the kernel dropped.
    let never_sent = n(&t.json, "never_sent");
    assert!(
        never_sent <= forged && forged - never_sent <= dropped,
        "{never_sent} of {forged} forged echoes counted never sent; the kernel dropped {dropped}: {}",
        t.stdout
    );
    assert_eq!(n(&t.json, "late_echoes"), 0);
    assert_eq!(n(&t.json, "foreign_packets"), 0);
    assert_eq!(n(&t.json, "sent"), 2000);
    assert!(n(&t.json, "lost") <= dropped, "{}", t.stdout);
    assert_eq!(n(&clean.json, "never_sent"), 0);
    assert!(
        t.stdout.contains(&format!("never-sent seqs {never_sent}")),
        "{}",
        t.stdout
    );
    assert_eq!(t.rows.len(), 2000, "one record per probe sent, none forged");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn forged_stamp_echoes_leave_rss_flat_and_are_counted_never_sent() {
    if !is_root("forged_stamp_echoes_leave_rss_flat_and_are_counted_never_sent") {
        return;
    }
    forged_echoes_from_the_target("stamp");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn forged_rtprobe_echoes_leave_rss_flat_and_are_counted_never_sent() {
    if !is_root("forged_rtprobe_echoes_leave_rss_flat_and_are_counted_never_sent") {
        return;
    }
    forged_echoes_from_the_target("rtprobe");
}

/// Namespace `ns`'s UDP counter `name` (/proc/net/snmp).
fn udp_counter(ns: &str, name: &str) -> u64 {
    let snmp = sh_ok(&format!("ip netns exec {ns} cat /proc/net/snmp"));
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (head, vals) = (udp.next().unwrap(), udp.next().unwrap());
    let i = head
        .split_whitespace()
        .position(|h| h == name)
        .unwrap_or_else(|| panic!("no Udp {name}"));
    vals.split_whitespace().nth(i).unwrap().parse().unwrap()
}

/// The local port of the one UDP socket in `ns` off loopback (the
/// sender's probe socket; any state, so that a build whose socket is not
/// connected is measured too; its send-path warm-up socket is on
/// loopback).
fn sender_port(ns: &str) -> Option<u16> {
    for _ in 0..200 {
        let out = sh_ok(&format!("ip netns exec {ns} ss -Huan"));
        // State, Recv-Q, Send-Q, local address:port, peer.
        let local = out
            .lines()
            .filter_map(|l| l.split_whitespace().nth(3))
            .find(|a| !a.starts_with("127.") && !a.starts_with("[::1]"));
        if let Some(port) = local.and_then(|a| a.rsplit(':').next()) {
            return port.parse().ok();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// A STAMP reply of session `ssid` with sender seq 0xFFFFFFFF.
fn forged_stamp_reply(ssid: u16) -> Vec<u8> {
    let ts = rtprobe::probe::stamp::Timestamp::from_bits(0, false).unwrap();
    let ee = rtprobe::probe::stamp::ErrorEstimate::from_error_ns(false, 0, false);
    let r = ReflectorPacket {
        seq: 0,
        timestamp: ts,
        error_estimate: ee,
        ssid,
        receive_timestamp: ts,
        sender_seq: 0xFFFF_FFFF,
        sender_timestamp: ts,
        sender_error_estimate: ee,
        sender_ttl: 64,
    };
    let mut out = Vec::new();
    r.encode(Mode::Unauthenticated, 64, &mut out).unwrap();
    out
}

/// Runs `args` against the STAMP reflector while another host sends
/// forged STAMP replies to the sender: off-path ones, then ones spoofing
/// the target. Returns the run and how many of each the kernel took.
fn run_under_forged_stamp_replies(p: &Pair, args: &[&str]) -> (Run, u64, u64) {
    std::thread::scope(|s| {
        let run = s.spawn(|| target(p, args));
        let port = sender_port(&p.a).expect("the sender's connected socket in A");
        let to = SocketAddrV4::new(A_IP.parse().unwrap(), port);
        // Off-path: one reply per 15-bit SSID from another address.
        let off = send_forged(&p.b, to, 32_767, 40_000, 1.5, |i| Forged {
            src: SocketAddrV4::new(OFF_PATH_IP.parse().unwrap(), 862),
            payload: forged_stamp_reply(i as u16 + 1),
        });
        // The target's own address and port, forged: past the kernel.
        // Slower: a flood at the sender's socket costs its reader (the
        // sender thread) CPU (a debug build here), which is not what this
        // test measures.
        let spoofed = send_forged(&p.b, to, 32_767, 10_000, 4.0, |i| Forged {
            src: SocketAddrV4::new(B_IP.parse().unwrap(), 862),
            payload: forged_stamp_reply(i as u16 + 1),
        });
        (run.join().unwrap(), off, spoofed)
    })
}

/// From the target's address: every other session's is foreign; the
/// one with this run's SSID carries a seq never sent. Every spoofed
/// reply the socket got is one of the two.
fn check_spoofed_replies_counted(t: &Run, spoofed: u64, overflowed: u64) {
    let (foreign, never_sent) = (n(&t.json, "foreign_packets"), n(&t.json, "never_sent"));
    assert!(
        foreign + never_sent <= spoofed && foreign + never_sent + overflowed >= spoofed,
        "{foreign} foreign + {never_sent} never sent of {spoofed} spoofed; the kernel dropped \
         {overflowed}: {}",
        t.stdout
    );
    assert!(never_sent <= 1, "{}", t.stdout);
    assert_eq!(n(&t.json, "late_echoes"), 0);
    assert!(
        t.stdout.contains(&format!("foreign packets {foreign}")),
        "{}",
        t.stdout
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn off_path_stamp_replies_leave_the_run_alone_and_are_counted() {
    if !is_root("off_path_stamp_replies_leave_the_run_alone_and_are_counted") {
        return;
    }
    let p = Pair::new();
    // Another host on the target's network: the off-path attacker.
    sh_ok(&format!(
        "ip -n {} addr add {OFF_PATH_IP}/24 dev {}",
        p.b, p.vb
    ));
    let r = Reflector::start(&p, &["--protocol", "stamp"]);
    let args = [
        "--target",
        &format!("{B_IP}:862"),
        "--protocol",
        "stamp",
        "--count",
        "6000",
        "--interval",
        "1ms",
    ];
    let clean = target(&p, &args);
    assert_eq!(clean.code, 0, "{}\n{}", clean.stderr, clean.stdout);
    let no_ports_before = udp_counter(&p.a, "NoPorts");
    let overflow = || udp_counter(&p.a, "RcvbufErrors") + udp_counter(&p.a, "InErrors");
    let overflow_before = overflow();
    let (t, off, spoofed) = run_under_forged_stamp_replies(&p, &args);
    let (refl, _) = r.stop();
    assert_eq!(t.code, 0, "{}\n{}", t.stderr, t.stdout);
    let no_ports = udp_counter(&p.a, "NoPorts") - no_ports_before;
    // What a sender starved of CPU lost to its full socket buffer: the
    // kernel's count, not rtprobe's.
    let overflowed = overflow() - overflow_before;
    let (rss_clean, rss) = (peak_rss(&clean), peak_rss(&t));
    eprintln!(
        "off-path: peak RSS clean {rss_clean} KiB, under {off} off-path + {spoofed} \
         target-spoofed STAMP replies {rss} KiB; refused by the kernel (Udp NoPorts) \
         {no_ports}; counted by the sender: foreign {}, never_sent {}, late {}; \
         lost {} of {}",
        t.json["foreign_packets"],
        t.json["never_sent"],
        t.json["late_echoes"],
        t.json["lost"],
        t.json["sent"]
    );
    assert_eq!(
        (off, spoofed),
        (32_767, 32_767),
        "the kernel took every forged datagram"
    );
    assert!(
        rss <= rss_clean + RSS_SLACK_KIB,
        "peak RSS {rss} KiB against {rss_clean} KiB clean"
    );
    // The run's figures are untouched: nothing lost but what the kernel
    // dropped at a full socket buffer, and nothing on the way out.
    assert_eq!(n(&t.json, "sent"), 6000);
    assert!(n(&t.json, "lost") <= overflowed, "{}", t.stdout);
    assert_eq!(t.rows.len(), 6000);
    let split = &t.json["extra"]["loss_split"];
    assert_eq!(split["forward"].as_u64(), Some(0), "{split}");
    // Off-path replies never reach the connected socket.
    assert!(
        no_ports >= off,
        "NoPorts rose by {no_ports} for {off} off-path replies"
    );
    check_spoofed_replies_counted(&t, spoofed, overflowed);
    assert_eq!(refl["counters"]["malformed"], 0, "{refl}");
}
