//! Root tests of the in-kernel reflector: BPF_PROG_TEST_RUN over a table
//! of crafted frames (no namespace needed: the program looks nothing up),
//! the replies checked field by field with independently computed checksums.

use std::time::{SystemTime, UNIX_EPOCH};

use aya::programs::{TestRun, TestRunOptions};
use xdp_common::{RTPB_FLAG_ECHO, RTPB_FLAG_KERNEL_TIMES, ReflectorOutcome, ipv4_checksum_ok};

use super::{
    Reflector,
    reflector::{Identity, RateLimits},
};
use crate::{
    probe::{
        packet::Probe,
        reflect::{Peers, Prefix},
        stamp::{ErrorEstimate, Mode, ReflectorPacket, SenderPacket, Timestamp},
    },
    sys::Addr,
    testbed::testutil::require_root,
};

const XDP_PASS: u32 = 2;
const XDP_TX: u32 = 3;
const PROBE_PORT: u16 = 5061;
const STAMP_PORT: u16 = 862;
const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0xaa];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0xbb];
const IP_A: [u8; 4] = [10, 9, 0, 2];
const IP_B: [u8; 4] = [10, 9, 0, 1];
const IP6_A: [u8; 16] = [0xfd, 0x71, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
const IP6_B: [u8; 16] = [0xfd, 0x71, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const SPORT: u16 = 40_000;

fn sum16(data: &[u8]) -> u32 {
    data.chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum()
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// The UDP checksum of `udp` (header + payload, checksum field zeroed)
/// from scratch, pseudo-header included (RFC 768; over IPv6 with 16-byte
/// addresses, RFC 8200 §8.1: the same sum).
fn udp_checksum(src: &[u8], dst: &[u8], udp: &[u8]) -> u16 {
    let mut u = udp.to_vec();
    u[6] = 0;
    u[7] = 0;
    let pseudo = sum16(src) + sum16(dst) + 17 + udp.len() as u32;
    match !fold(pseudo + sum16(&u)) {
        0 => 0xffff,
        c => c,
    }
}

/// Options of one IPv4/UDP (or IPv6/UDP) test frame from A to B.
#[derive(Clone)]
struct Frame {
    v6: bool,
    dport: u16,
    payload: Vec<u8>,
    ttl: u8,
    options: Vec<u8>,
    frag: u16,
    with_udp_csum: bool,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: [u8; 4],
    dst: [u8; 4],
    src6: [u8; 16],
    dst6: [u8; 16],
}

impl Frame {
    fn new(dport: u16, payload: Vec<u8>) -> Self {
        Frame {
            v6: false,
            dport,
            payload,
            ttl: 63,
            options: vec![],
            frag: 0x4000,
            with_udp_csum: true,
            src_mac: MAC_A,
            dst_mac: MAC_B,
            src: IP_A,
            dst: IP_B,
            src6: IP6_A,
            dst6: IP6_B,
        }
    }

    fn v6(dport: u16, payload: Vec<u8>) -> Self {
        Frame {
            v6: true,
            ..Frame::new(dport, payload)
        }
    }

    /// Where the UDP payload starts.
    fn payload_off(&self) -> usize {
        if self.v6 { 14 + 40 + 8 } else { 42 }
    }

    fn bytes(&self) -> Vec<u8> {
        if self.v6 {
            return self.bytes_v6();
        }
        let hlen = 20 + self.options.len();
        let udp_len = 8 + self.payload.len();
        let tot = hlen + udp_len;
        let mut f = Vec::new();
        f.extend_from_slice(&self.dst_mac);
        f.extend_from_slice(&self.src_mac);
        f.extend_from_slice(&0x0800u16.to_be_bytes());
        let mut ip = vec![0u8; hlen];
        ip[0] = 0x40 | (hlen / 4) as u8;
        ip[2..4].copy_from_slice(&(tot as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&0x4321u16.to_be_bytes());
        ip[6..8].copy_from_slice(&self.frag.to_be_bytes());
        ip[8] = self.ttl;
        ip[9] = 17;
        ip[12..16].copy_from_slice(&self.src);
        ip[16..20].copy_from_slice(&self.dst);
        ip[20..].copy_from_slice(&self.options);
        let c = !fold(sum16(&ip));
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&self.udp(&self.src, &self.dst));
        f
    }

    /// The UDP header and payload, with the checksum over `src` and `dst`
    /// if asked for.
    fn udp(&self, src: &[u8], dst: &[u8]) -> Vec<u8> {
        let mut udp = vec![0u8; 8];
        udp[0..2].copy_from_slice(&SPORT.to_be_bytes());
        udp[2..4].copy_from_slice(&self.dport.to_be_bytes());
        udp[4..6].copy_from_slice(&((8 + self.payload.len()) as u16).to_be_bytes());
        udp.extend_from_slice(&self.payload);
        if self.with_udp_csum {
            let c = udp_checksum(src, dst, &udp);
            udp[6..8].copy_from_slice(&c.to_be_bytes());
        }
        udp
    }

    fn bytes_v6(&self) -> Vec<u8> {
        let udp_len = 8 + self.payload.len();
        let mut f = Vec::new();
        f.extend_from_slice(&self.dst_mac);
        f.extend_from_slice(&self.src_mac);
        f.extend_from_slice(&0x86ddu16.to_be_bytes());
        let mut ip = vec![0x60, 0x0a, 0xbc, 0xde];
        ip.extend_from_slice(&(udp_len as u16).to_be_bytes());
        ip.push(17);
        ip.push(self.ttl);
        ip.extend_from_slice(&self.src6);
        ip.extend_from_slice(&self.dst6);
        f.extend_from_slice(&ip);
        f.extend_from_slice(&self.udp(&self.src6, &self.dst6));
        f
    }
}

fn probe_payload(len: usize, echo: bool) -> Vec<u8> {
    let mut p = vec![0u8; len];
    Probe {
        session: 0x0102_0304_0506_0708,
        seq: 77,
        flow: 3,
        echo,
        send_ns: 1_700_000_000_000_000_000,
        kernel_times: None,
    }
    .encode(&mut p);
    p
}

fn stamp_payload(len: usize) -> Vec<u8> {
    let ee = ErrorEstimate::from_error_ns(true, 1000, false);
    let mut out = Vec::new();
    SenderPacket {
        seq: 0xabcd_0001,
        timestamp: Timestamp::from_realtime_ns(1_700_000_000_123_456_789, false, 0).unwrap(),
        error_estimate: ee,
        ssid: 0x5eed,
    }
    .encode(Mode::Unauthenticated, len, &mut out)
    .unwrap();
    out
}

fn run(r: &Reflector, frame: &[u8]) -> (u32, Vec<u8>) {
    let mut out = vec![0u8; frame.len() + 64];
    let res = r
        .with_xdp(|prog| {
            Ok(prog.test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ..TestRunOptions::new()
            })?)
        })
        .expect("BPF_PROG_TEST_RUN");
    out.truncate(res.data_size_out as usize);
    (res.return_value, out)
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

/// Checks the headers of a reply to a frame built by [`Frame`]: MACs, IPs
/// and ports swapped, TTL 64, valid IP checksum, valid UDP checksum
/// (recomputed from scratch) or none when the probe had none.
fn check_reply_headers(input: &[u8], out: &[u8], with_udp_csum: bool) {
    if input[12..14] == [0x86, 0xdd] {
        return check_reply_headers_v6(input, out);
    }
    assert_eq!(out.len(), input.len(), "same length");
    assert_eq!(&out[0..6], &MAC_A, "dst MAC = the sender's");
    assert_eq!(&out[6..12], &MAC_B, "src MAC = ours");
    assert_eq!(&out[12..14], &[0x08, 0x00]);
    let ip = &out[14..34];
    assert_eq!(&ip[12..16], &IP_B, "src IP swapped");
    assert_eq!(&ip[16..20], &IP_A, "dst IP swapped");
    assert_eq!(ip[8], 64, "fresh TTL");
    assert!(ipv4_checksum_ok(ip.try_into().unwrap()), "IP checksum");
    assert_eq!(&ip[0..8], &input[14..22], "rest of the IP header unchanged");
    let udp = &out[34..];
    assert_eq!(
        u16::from_be_bytes([udp[0], udp[1]]),
        u16::from_be_bytes([input[36], input[37]])
    );
    assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), SPORT);
    assert_eq!(&udp[4..6], &input[38..40], "UDP length unchanged");
    let check = u16::from_be_bytes([udp[6], udp[7]]);
    if with_udp_csum {
        assert_eq!(check, udp_checksum(&IP_B, &IP_A, udp), "UDP checksum");
    } else {
        assert_eq!(check, 0, "no UDP checksum stays none");
    }
}

/// As [`check_reply_headers`] over IPv6: addresses swapped, hop limit 64,
/// the rest of the fixed header (flow label, length, next header)
/// unchanged, the UDP checksum valid (never zero over IPv6).
fn check_reply_headers_v6(input: &[u8], out: &[u8]) {
    assert_eq!(out.len(), input.len(), "same length");
    assert_eq!(&out[0..6], &MAC_A, "dst MAC = the sender's");
    assert_eq!(&out[6..12], &MAC_B, "src MAC = ours");
    assert_eq!(&out[12..14], &[0x86, 0xdd]);
    let ip = &out[14..54];
    assert_eq!(
        &ip[0..7],
        &input[14..21],
        "version, flow label, length, next header"
    );
    assert_eq!(ip[7], 64, "fresh hop limit");
    assert_eq!(&ip[8..24], &IP6_B, "src IP swapped");
    assert_eq!(&ip[24..40], &IP6_A, "dst IP swapped");
    let udp = &out[54..];
    assert_eq!(
        &udp[0..2],
        &input[56..58],
        "src port = the probe's dst port"
    );
    assert_eq!(u16::from_be_bytes([udp[2], udp[3]]), SPORT);
    assert_eq!(&udp[4..6], &input[58..60], "UDP length unchanged");
    let check = u16::from_be_bytes([udp[6], udp[7]]);
    assert_eq!(check, udp_checksum(&IP6_B, &IP6_A, udp), "UDP checksum");
}

fn counter(r: &Reflector, o: ReflectorOutcome) -> u64 {
    r.counters().unwrap()[o.name()].packets
}

/// B's identity: MAC_B, IP_B/24, IP6_B/64.
fn identity_b() -> Identity {
    Identity {
        mac: MAC_B,
        addrs: vec![
            Addr {
                addr: std::net::Ipv4Addr::from(IP_B).into(),
                prefix_len: 24,
            },
            Addr {
                addr: std::net::Ipv6Addr::from(IP6_B).into(),
                prefix_len: 64,
            },
        ],
    }
}

/// A reflector answering for B, with `limits`.
fn load_b(reply_ifindex: u32, limits: RateLimits) -> Reflector {
    load_b_with_peers(reply_ifindex, limits, &Peers::default())
}

/// [`load_b`] with `peers` as the known peers.
fn load_b_with_peers(reply_ifindex: u32, limits: RateLimits, peers: &Peers) -> Reflector {
    let r = Reflector::load(
        crate::sys::linux(),
        PROBE_PORT,
        STAMP_PORT,
        reply_ifindex,
        limits,
        peers,
    )
    .expect("load the reflector");
    r.set_identity(&identity_b()).expect("identity");
    r
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn reflector_test_run_table() {
    require_root();
    let r = load_b(0, RateLimits::NONE);
    let t0 = now_ns();

    answers_probes_with_room_for_times(&r, t0);
    answers_probes_too_short_for_times(&r);
    answers_stamp(&r);

    // Frames the reflector must pass unchanged.
    let table = [
        passed_ipv4_cases(),
        passed_ipv6_cases(),
        passed_malformed_ipv4_cases(),
    ]
    .concat();
    check_passed_unchanged(&r, &table);
}

/// A good probe with room for the times is answered with them.
fn answers_probes_with_room_for_times(r: &Reflector, t0: i64) {
    // A good probe with room for the times: IPv4 with and without a UDP
    // checksum, IPv6 (where it is mandatory).
    for (v6, with_csum) in [(false, true), (false, false), (true, true)] {
        let mut f = Frame::new(PROBE_PORT, probe_payload(64, false));
        f.v6 = v6;
        f.with_udp_csum = with_csum;
        let input = f.bytes();
        let (action, out) = run(r, &input);
        assert_eq!(action, XDP_TX, "good probe is answered (IPv6: {v6})");
        check_reply_headers(&input, &out, with_csum);
        let p = &out[f.payload_off()..];
        let echo = Probe::decode(p, 0x0102_0304_0506_0708).expect("still a probe");
        assert!(echo.echo);
        let kt = echo.kernel_times.expect("kernel times decoded");
        assert_eq!(
            (echo.seq, echo.flow, echo.send_ns),
            (77, 3, 1_700_000_000_000_000_000)
        );
        assert_eq!(p[5], RTPB_FLAG_ECHO | RTPB_FLAG_KERNEL_TIMES);
        let (rx, tx) = (kt.rx_ns, kt.tx_ns);
        assert_eq!(rx, i64::from_be_bytes(p[32..40].try_into().unwrap()));
        let t1 = now_ns();
        assert!(rx <= tx, "rx {rx} <= tx {tx}");
        // On CLOCK_REALTIME: within the test's own readings (1 ms slack for
        // the offset's whole-second rounding being exact but clocks coarse).
        assert!(
            rx >= t0 - 1_000_000 && tx <= t1 + 1_000_000,
            "{t0} <= {rx} <= {tx} <= {t1}"
        );
        assert!(tx - rx < 1_000_000, "turnaround {} ns", tx - rx);
        assert_eq!(&p[48..], &[0u8; 16], "padding after the times untouched");
    }
    assert_eq!(counter(r, ReflectorOutcome::ReflectedRtprobe), 3);
}

fn answers_probes_too_short_for_times(r: &Reflector) {
    // A probe too short for the times: answered, marked, counted.
    for v6 in [false, true] {
        let mut f = Frame::new(PROBE_PORT, probe_payload(40, false));
        f.v6 = v6;
        let input = f.bytes();
        let (action, out) = run(r, &input);
        assert_eq!(action, XDP_TX);
        check_reply_headers(&input, &out, true);
        let off = f.payload_off();
        assert_eq!(out[off + 5], RTPB_FLAG_ECHO, "echo, no kernel times");
        assert_eq!(
            &out[off + 6..],
            &input[off + 6..],
            "rest of the payload unchanged"
        );
    }
    assert_eq!(counter(r, ReflectorOutcome::NoRoomForTimes), 2);
    assert_eq!(counter(r, ReflectorOutcome::ReflectedRtprobe), 5);
}

fn answers_stamp(r: &Reflector) {
    // STAMP, 44 bytes and padded to 60, over both families.
    for (v6, len) in [(false, 44), (false, 60), (true, 44), (true, 60)] {
        let mut f = Frame::new(STAMP_PORT, stamp_payload(len));
        f.v6 = v6;
        f.ttl = 61;
        let input = f.bytes();
        let t_before = now_ns();
        let (action, out) = run(r, &input);
        let t_after = now_ns();
        assert_eq!(action, XDP_TX, "STAMP {len}");
        check_reply_headers(&input, &out, true);
        let off = f.payload_off();
        let sender = SenderPacket::decode(&input[off..], Mode::Unauthenticated).unwrap();
        let refl = ReflectorPacket::decode(&out[off..], Mode::Unauthenticated).unwrap();
        assert_eq!(refl.seq, sender.seq, "stateless: the sender's seq");
        assert_eq!(refl.sender_seq, sender.seq);
        assert_eq!(refl.sender_timestamp, sender.timestamp);
        assert_eq!(refl.sender_error_estimate, sender.error_estimate);
        assert_eq!(refl.ssid, 0x5eed);
        assert_eq!(refl.sender_ttl, 61);
        assert!(!refl.error_estimate.ptp(), "NTP timestamps");
        let t2 = refl.receive_timestamp.to_realtime_ns(0);
        let t3 = refl.timestamp.to_realtime_ns(0);
        assert!(t2 <= t3, "T2 {t2} <= T3 {t3}");
        // NTP fractions are truncated: 1 ns slack each side.
        assert!(t2 >= t_before - 1_000_001 && t3 <= t_after + 1_000_001);
        assert_eq!(&out[off + 44..], &input[off + 44..], "padding copied");
    }
    assert_eq!(counter(r, ReflectorOutcome::ReflectedStamp), 4);
}

/// A frame the reflector must pass unchanged: its name, the frame and the
/// counter it goes under.
type PassCase = (&'static str, Vec<u8>, ReflectorOutcome);

/// IPv4 frames that are no probe, or no IP.
fn passed_ipv4_cases() -> Vec<PassCase> {
    let mut bad_magic = probe_payload(64, false);
    bad_magic[0] = b'X';
    let mut bad_version = probe_payload(64, false);
    bad_version[4] = 9;
    let good = Frame::new(PROBE_PORT, probe_payload(64, false));
    let mut options = good.clone();
    options.options = vec![1, 1, 1, 0];
    let mut first_frag = good.clone();
    first_frag.frag = 0x2000;
    let mut later_frag = good.clone();
    later_frag.frag = 185;
    let full = good.bytes();
    let mut arp = full[..12].to_vec();
    arp.extend_from_slice(&0x0806u16.to_be_bytes());
    arp.extend_from_slice(&[0u8; 28]);
    let mut tcp = full.clone();
    tcp[23] = 6;
    tcp[24] = 0;
    tcp[25] = 0;
    let c = !fold(sum16(&tcp[14..34]));
    tcp[24..26].copy_from_slice(&c.to_be_bytes());

    use ReflectorOutcome::*;
    vec![
        (
            "echo",
            Frame::new(PROBE_PORT, probe_payload(64, true)).bytes(),
            Echo,
        ),
        (
            "short echo",
            Frame::new(PROBE_PORT, probe_payload(32, true)).bytes(),
            Echo,
        ),
        (
            "other port",
            Frame::new(5062, probe_payload(64, false)).bytes(),
            NotProbe,
        ),
        (
            "bad magic",
            Frame::new(PROBE_PORT, bad_magic).bytes(),
            NotProbe,
        ),
        (
            "bad version",
            Frame::new(PROBE_PORT, bad_version).bytes(),
            NotProbe,
        ),
        (
            "payload shorter than a probe header",
            Frame::new(PROBE_PORT, vec![0u8; 31]).bytes(),
            NotProbe,
        ),
        ("TCP", tcp, NotProbe),
        ("IP options", options.bytes(), NotProbe),
        ("first fragment", first_frag.bytes(), NotProbe),
        ("later fragment", later_frag.bytes(), NotProbe),
        ("ARP", arp, NotIp),
    ]
}

/// IPv6 frames that are no probe, or malformed.
fn passed_ipv6_cases() -> Vec<PassCase> {
    let good6 = Frame::v6(PROBE_PORT, probe_payload(64, false)).bytes();
    // A hop-by-hop options header before UDP: the kernel's.
    let mut ext6 = good6[..54].to_vec();
    ext6[20] = 0;
    ext6.extend_from_slice(&[17, 0, 1, 4, 0, 0, 0, 0]);
    ext6.extend_from_slice(&good6[54..]);
    let len6 = (good6.len() - 54 + 8) as u16;
    ext6[18..20].copy_from_slice(&len6.to_be_bytes());
    let mut not_v6 = good6.clone();
    not_v6[14] = 0x40;
    let mut udp_len_past_v6 = good6.clone();
    udp_len_past_v6[58..60].copy_from_slice(&200u16.to_be_bytes());
    let mut no_csum_v6 = Frame::v6(PROBE_PORT, probe_payload(64, false));
    no_csum_v6.with_udp_csum = false;

    use ReflectorOutcome::*;
    vec![
        (
            "IPv6 echo",
            Frame::v6(PROBE_PORT, probe_payload(64, true)).bytes(),
            Echo,
        ),
        (
            "IPv6 other port",
            Frame::v6(5062, probe_payload(64, false)).bytes(),
            NotProbe,
        ),
        ("IPv6 extension header before UDP", ext6, NotProbe),
        ("IPv6 ethertype, version 4", not_v6, Malformed),
        (
            "truncated IPv6 header",
            good6[..14 + 30].to_vec(),
            Malformed,
        ),
        (
            "IPv6 payload length past the frame",
            good6[..good6.len() - 8].to_vec(),
            Malformed,
        ),
        (
            "IPv6 UDP length past the payload",
            udp_len_past_v6,
            Malformed,
        ),
        ("IPv6 UDP without a checksum", no_csum_v6.bytes(), Malformed),
    ]
}

/// Malformed IPv4 frames.
fn passed_malformed_ipv4_cases() -> Vec<PassCase> {
    let good = Frame::new(PROBE_PORT, probe_payload(64, false));
    let full = good.bytes();
    let mut udp_len_too_long = full.clone();
    udp_len_too_long[38..40].copy_from_slice(&200u16.to_be_bytes());
    let mut ip_only_udp = full[..34 + 4].to_vec();
    ip_only_udp[16..18].copy_from_slice(&24u16.to_be_bytes());
    ip_only_udp[24] = 0;
    ip_only_udp[25] = 0;
    let c = !fold(sum16(&ip_only_udp[14..34]));
    ip_only_udp[24..26].copy_from_slice(&c.to_be_bytes());
    let mut bad_ip_csum = full.clone();
    bad_ip_csum[24] ^= 0xff;

    use ReflectorOutcome::*;
    vec![
        // BPF_PROG_TEST_RUN (like a driver) refuses frames shorter than an
        // Ethernet header, so the shortest frame is a bare header.
        ("Ethernet header only", full[..14].to_vec(), Malformed),
        ("truncated IP header", full[..14 + 12].to_vec(), Malformed),
        (
            "truncated datagram (tot_len past the frame)",
            full[..full.len() - 20].to_vec(),
            Malformed,
        ),
        ("truncated UDP header", ip_only_udp, Malformed),
        ("UDP length past the datagram", udp_len_too_long, Malformed),
        ("bad IP checksum", bad_ip_csum, Malformed),
        (
            "STAMP shorter than 44 bytes",
            Frame::new(STAMP_PORT, vec![0u8; 30]).bytes(),
            Malformed,
        ),
    ]
}

/// Each frame of `table` passed unchanged, and counted under its outcome.
fn check_passed_unchanged(r: &Reflector, table: &[PassCase]) {
    let before = r.counters().unwrap();
    for (name, frame, _) in table {
        let (action, out) = run(r, frame);
        assert_eq!(action, XDP_PASS, "{name}: passed");
        assert_eq!(&out, frame, "{name}: unchanged");
    }
    let after = r.counters().unwrap();
    for o in ReflectorOutcome::ALL {
        let want = table.iter().filter(|(_, _, w)| *w == o).count() as u64;
        assert_eq!(
            after[o.name()].packets - before[o.name()].packets,
            want,
            "counter {}",
            o.name()
        );
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn reflector_redirects_replies_when_given_an_ifindex() {
    require_root();
    // XDP_REDIRECT from bpf_redirect; the test run does not send it.
    const XDP_REDIRECT: u32 = 4;
    // Loopback's ifindex, 1 in every namespace; any existing one would do.
    let r = load_b(1, RateLimits::NONE);
    let input = Frame::new(PROBE_PORT, probe_payload(64, false)).bytes();
    let (action, out) = run(&r, &input);
    assert_eq!(action, XDP_REDIRECT, "good probe is answered by a redirect");
    check_reply_headers(&input, &out, true);
    assert_eq!(counter(&r, ReflectorOutcome::ReflectedRtprobe), 1);
    let echo = Frame::new(PROBE_PORT, probe_payload(64, true)).bytes();
    assert_eq!(run(&r, &echo).0, XDP_PASS, "echoes still pass");
}

/// Probes not addressed to B (passed) or from sources no reply may go to
/// (dropped): each unchanged and counted under its reason; a good probe
/// after them is still answered.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn reflector_refuses_probes_not_for_it_and_bad_sources() {
    require_root();
    let good = || Frame::new(PROBE_PORT, probe_payload(64, false));
    let good6 = || Frame::v6(PROBE_PORT, probe_payload(64, false));

    blank_reflector_answers_nothing();

    let r = load_b(0, RateLimits::NONE);
    let table = [not_for_us_cases(), bad_source_cases()].concat();
    check_refused_unchanged(&r, &table);
    for f in [good(), good6()] {
        let input = f.bytes();
        let (action, out) = run(&r, &input);
        assert_eq!(action, XDP_TX, "a good probe is still answered");
        check_reply_headers(&input, &out, true);
    }
}

/// Loaded but never told its interface: answers nothing.
fn blank_reflector_answers_nothing() {
    let good = || Frame::new(PROBE_PORT, probe_payload(64, false));
    let blank = Reflector::load(
        crate::sys::linux(),
        PROBE_PORT,
        STAMP_PORT,
        0,
        RateLimits::NONE,
        &Peers::default(),
    )
    .unwrap();
    let (action, _) = run(&blank, &good().bytes());
    assert_eq!(action, XDP_PASS, "no identity, no answer");
    assert_eq!(counter(&blank, ReflectorOutcome::NotForUs), 1);
}

/// Probes for another host or address, which B must leave to the kernel.
fn not_for_us_cases() -> Vec<PassCase> {
    let good = || Frame::new(PROBE_PORT, probe_payload(64, false));
    let good6 = || Frame::v6(PROBE_PORT, probe_payload(64, false));
    let with = |f: &dyn Fn(&mut Frame)| {
        let mut fr = good();
        f(&mut fr);
        fr.bytes()
    };
    let with6 = |f: &dyn Fn(&mut Frame)| {
        let mut fr = good6();
        f(&mut fr);
        fr.bytes()
    };
    let v6 = |s: &str| s.parse::<std::net::Ipv6Addr>().unwrap().octets();
    use ReflectorOutcome::*;
    vec![
        (
            "broadcast MAC and 255.255.255.255",
            with(&|f| {
                f.dst_mac = [0xff; 6];
                f.dst = [255; 4];
            }),
            NotForUs,
        ),
        (
            "broadcast MAC to our IP",
            with(&|f| f.dst_mac = [0xff; 6]),
            NotForUs,
        ),
        (
            "multicast MAC",
            with(&|f| f.dst_mac = [0x01, 0, 0x5e, 0, 0, 1]),
            NotForUs,
        ),
        (
            "another host's MAC",
            with(&|f| f.dst_mac = [2, 0, 0, 0, 0, 0xcc]),
            NotForUs,
        ),
        (
            "an IP B does not own",
            with(&|f| f.dst = [10, 9, 0, 77]),
            NotForUs,
        ),
        (
            "B's subnet broadcast as destination",
            with(&|f| f.dst = [10, 9, 0, 255]),
            NotForUs,
        ),
        (
            "IPv6: an address B does not own",
            with6(&|f| f.dst6 = v6("fd71:9::77")),
            NotForUs,
        ),
        (
            "IPv6: all-nodes multicast",
            with6(&|f| {
                f.dst6 = v6("ff02::1");
                f.dst_mac = [0x33, 0x33, 0, 0, 0, 1];
            }),
            NotForUs,
        ),
    ]
}

/// Probes from sources no reply may go to, which B must drop.
fn bad_source_cases() -> Vec<PassCase> {
    let good = || Frame::new(PROBE_PORT, probe_payload(64, false));
    let good6 = || Frame::v6(PROBE_PORT, probe_payload(64, false));
    let with = |f: &dyn Fn(&mut Frame)| {
        let mut fr = good();
        f(&mut fr);
        fr.bytes()
    };
    let with6 = |f: &dyn Fn(&mut Frame)| {
        let mut fr = good6();
        f(&mut fr);
        fr.bytes()
    };
    let v6 = |s: &str| s.parse::<std::net::Ipv6Addr>().unwrap().octets();
    use ReflectorOutcome::*;
    vec![
        (
            "from the subnet broadcast",
            with(&|f| f.src = [10, 9, 0, 255]),
            BadSource,
        ),
        (
            "from the subnet's network address",
            with(&|f| f.src = [10, 9, 0, 0]),
            BadSource,
        ),
        (
            "from 255.255.255.255",
            with(&|f| f.src = [255; 4]),
            BadSource,
        ),
        (
            "from 224.0.0.1",
            with(&|f| f.src = [224, 0, 0, 1]),
            BadSource,
        ),
        (
            "from loopback",
            with(&|f| f.src = [127, 0, 0, 1]),
            BadSource,
        ),
        ("from 0.0.0.0", with(&|f| f.src = [0; 4]), BadSource),
        ("from B itself", with(&|f| f.src = IP_B), BadSource),
        (
            "from a multicast MAC",
            with(&|f| f.src_mac = [0x01, 0, 0x5e, 0, 0, 1]),
            BadSource,
        ),
        (
            "IPv6 from ff02::1",
            with6(&|f| f.src6 = v6("ff02::1")),
            BadSource,
        ),
        ("IPv6 from ::1", with6(&|f| f.src6 = v6("::1")), BadSource),
        ("IPv6 from ::", with6(&|f| f.src6 = v6("::")), BadSource),
        ("IPv6 from B itself", with6(&|f| f.src6 = IP6_B), BadSource),
        (
            "STAMP from 224.0.0.1",
            {
                let mut f = Frame::new(STAMP_PORT, stamp_payload(44));
                f.src = [224, 0, 0, 1];
                f.bytes()
            },
            BadSource,
        ),
    ]
}

/// Each frame of `table` passed (not for us) or dropped (bad source)
/// unchanged, and counted under its reason.
fn check_refused_unchanged(r: &Reflector, table: &[PassCase]) {
    use ReflectorOutcome::*;
    let before = r.counters().unwrap();
    for (name, frame, why) in table {
        let (action, out) = run(r, frame);
        // For another host or address: the kernel's, as without us. From a
        // bad source: dropped, so no socket on the port answers it either.
        let want = if *why == BadSource {
            XDP_DROP
        } else {
            XDP_PASS
        };
        assert_eq!(action, want, "{name}: action");
        assert_eq!(&out, frame, "{name}: unchanged");
    }
    let after = r.counters().unwrap();
    for o in ReflectorOutcome::ALL {
        let want = table.iter().filter(|(_, _, w)| *w == o).count() as u64;
        assert_eq!(
            after[o.name()].packets - before[o.name()].packets,
            want,
            "counter {}",
            o.name()
        );
    }
}

/// Sends `n` probes from `src` as fast as BPF_PROG_TEST_RUN goes; returns
/// (answered, dropped, seconds it took).
fn burst_from(r: &Reflector, src: [u8; 4], n: u32) -> (u64, u64, f64) {
    let mut f = Frame::new(PROBE_PORT, probe_payload(64, false));
    f.src = src;
    burst_of(r, &f.bytes(), n)
}

/// [`burst_from`] over IPv6 from `src6`.
fn burst_from6(r: &Reflector, src6: [u8; 16], n: u32) -> (u64, u64, f64) {
    let mut f = Frame::v6(PROBE_PORT, probe_payload(64, false));
    f.src6 = src6;
    burst_of(r, &f.bytes(), n)
}

fn burst_of(r: &Reflector, frame: &[u8], n: u32) -> (u64, u64, f64) {
    let t0 = std::time::Instant::now();
    let (mut tx, mut dropped) = (0, 0);
    for _ in 0..n {
        match run(r, frame).0 {
            XDP_TX => tx += 1,
            XDP_DROP => dropped += 1,
            a => panic!("action {a}"),
        }
    }
    (tx, dropped, t0.elapsed().as_secs_f64())
}

const XDP_DROP: u32 = 1;

/// The per-source bucket: a burst, then the rate; another source has its
/// own bucket; what is over the limit is dropped and counted.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn reflector_limits_each_source() {
    require_root();
    // 10/s: a token every 100 ms, so the loop below gets the burst alone.
    let rate = 10;
    let burst = u64::from(RateLimits::burst(rate));
    let r = load_b(
        0,
        RateLimits {
            per_source_pps: Some(rate),
            global_pps: None,
            ..RateLimits::NONE
        },
    );
    let (tx, dropped, secs) = burst_from(&r, IP_A, 100);
    eprintln!(
        "per source {rate}/s, burst {burst}: {tx} answered, {dropped} dropped in {secs:.3} s"
    );
    let bound = burst + (secs * f64::from(rate)).ceil() as u64;
    assert!(
        tx >= burst && tx <= bound,
        "{tx} answered, {burst}..={bound}"
    );
    assert_eq!(counter(&r, ReflectorOutcome::RateLimited), dropped);
    assert_eq!(counter(&r, ReflectorOutcome::ReflectedRtprobe), tx);
    let (tx2, _, _) = burst_from(&r, [10, 9, 0, 3], 100);
    assert!(tx2 >= burst, "another source has its own bucket: {tx2}");
    assert_eq!(counter(&r, ReflectorOutcome::GlobalLimited), 0);
}

/// The global cap over many sources, each under its own limit.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn reflector_caps_all_sources_together() {
    require_root();
    let global = 20;
    let burst = u64::from(RateLimits::burst(global));
    let r = load_b(
        0,
        RateLimits {
            per_source_pps: Some(10_000),
            global_pps: Some(global),
            ..RateLimits::NONE
        },
    );
    let t0 = std::time::Instant::now();
    let (mut tx, mut dropped) = (0, 0);
    for i in 0..100u8 {
        let (t, d, _) = burst_from(&r, [10, 9, 1, i], 1);
        tx += t;
        dropped += d;
    }
    let secs = t0.elapsed().as_secs_f64();
    eprintln!("global {global}/s, burst {burst}: {tx} answered, {dropped} dropped in {secs:.3} s");
    let bound = burst + (secs * f64::from(global)).ceil() as u64;
    assert!(
        tx >= burst && tx <= bound,
        "{tx} answered, {burst}..={bound}"
    );
    assert_eq!(counter(&r, ReflectorOutcome::GlobalLimited), dropped);
    assert_eq!(counter(&r, ReflectorOutcome::RateLimited), 0);
}

/// Over IPv6 the bucket is the source's /64 (one host's worth): a second
/// address of the same /64 draws from the bucket the first emptied;
/// another /64 has its own.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn reflector_limits_each_ipv6_64() {
    require_root();
    let rate = 10;
    let burst = u64::from(RateLimits::burst(rate));
    let r = load_b(
        0,
        RateLimits {
            per_source_pps: Some(rate),
            global_pps: None,
            ..RateLimits::NONE
        },
    );
    // fd71:9::2 and fd71:9::5eed:1:2:3, both in fd71:9::/64 (B's too).
    let a1 = IP6_A;
    let mut a2 = IP6_A;
    a2[8..].copy_from_slice(&[0, 0, 0x5e, 0xed, 0, 1, 0, 2]);
    let t0 = std::time::Instant::now();
    let (tx1, _, _) = burst_from6(&r, a1, 100);
    let (tx2, _, _) = burst_from6(&r, a2, 100);
    let secs = t0.elapsed().as_secs_f64();
    let bound = burst + (secs * f64::from(rate)).ceil() as u64;
    eprintln!(
        "per /64 {rate}/s, burst {burst}: {tx1} + {tx2} answered from two addresses of one /64 \
         in {secs:.3} s (bound {bound})"
    );
    assert!(tx1 >= burst, "the first address gets the burst: {tx1}");
    assert!(tx1 + tx2 <= bound, "{tx1} + {tx2} answered, bound {bound}");
    assert_eq!(counter(&r, ReflectorOutcome::RateLimited), 200 - tx1 - tx2);
    // fd71:9:0:1::2: the next /64, its own bucket.
    let mut other = IP6_A;
    other[7] = 1;
    let (tx3, _, _) = burst_from6(&r, other, 100);
    eprintln!("another /64: {tx3} answered");
    assert!(tx3 >= burst, "another /64 has its own bucket: {tx3}");
    assert_eq!(counter(&r, ReflectorOutcome::GlobalLimited), 0);
}

/// Known peers draw from budgets of their own: with the strangers' global
/// cap spent by 100 sources, a peer (IPv4 by address, IPv6 by a prefix)
/// still gets its burst, counted as `peer_reflected`; past its own bucket
/// it is `peer_rate_limited`, past the peers' cap `peer_global_limited`.
/// An IPv6 prefix (::/0) does not make IPv4 sources peers.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn reflector_keeps_a_budget_for_known_peers() {
    require_root();
    // Peers' cap: bursts of 40, so two peers' bursts of 16 fit in it.
    let (per_source, global, peers_cap) = (10u32, 20u32, 400u32);
    let burst = |r| u64::from(RateLimits::burst(r));
    let prefix = |s: &str| s.parse::<Prefix>().unwrap();
    let peers = Peers::new([prefix("10.9.0.2"), prefix("::/0")]).unwrap();
    let r = load_b_with_peers(
        0,
        RateLimits {
            per_source_pps: Some(per_source),
            global_pps: Some(global),
            peers_pps: Some(peers_cap),
        },
        &peers,
    );
    let t0 = std::time::Instant::now();
    let mut strangers = 0;
    for i in 0..100u8 {
        strangers += burst_from(&r, [10, 9, 1, i], 1).0;
    }
    let global_limited = counter(&r, ReflectorOutcome::GlobalLimited);
    // The peer IP_A (10.9.0.2) after the flood: its own bucket.
    let (peer, peer_dropped, _) = burst_from(&r, IP_A, 100);
    // An IPv6 peer (::/0 holds every IPv6 source) from another /64.
    let mut other = IP6_A;
    other[7] = 7;
    let (peer6, _, _) = burst_from6(&r, other, 100);
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "strangers {strangers} answered, {global_limited} global-limited; peer {peer} answered, \
         {peer_dropped} dropped; IPv6 peer {peer6} answered in {secs:.3} s"
    );
    let most = |rate, b| b + (secs * f64::from(rate)).ceil() as u64;
    assert!(strangers <= most(global, burst(global)), "{strangers}");
    assert!(global_limited >= 100 - most(global, burst(global)));
    // Each peer gets its own burst although the strangers' cap is spent.
    assert!(peer >= burst(per_source) && peer <= most(per_source, burst(per_source)));
    assert!(peer6 >= burst(per_source) && peer6 <= most(per_source, burst(per_source)));
    assert_eq!(counter(&r, ReflectorOutcome::PeerReflected), peer + peer6);
    assert_eq!(
        counter(&r, ReflectorOutcome::PeerRateLimited),
        200 - peer - peer6,
        "both peers over their own buckets, within the peers' cap"
    );
    assert_eq!(counter(&r, ReflectorOutcome::PeerGlobalLimited), 0);
    assert_eq!(
        counter(&r, ReflectorOutcome::ReflectedRtprobe),
        strangers + peer + peer6
    );
    // Eight more IPv6 peers, each with a fresh bucket: the peers' cap
    // (bursts of 40) is what stops them now.
    for n in 8u8..16 {
        let mut a = IP6_A;
        a[7] = n;
        burst_from6(&r, a, 16);
    }
    assert!(
        counter(&r, ReflectorOutcome::PeerGlobalLimited) > 0,
        "the peers' own cap holds too"
    );
    assert!(
        counter(&r, ReflectorOutcome::PeerReflected) <= most(peers_cap, burst(peers_cap)),
        "never more than the peers' cap"
    );
    // IPv4 from outside the list is a stranger still: the global cap.
    let before = counter(&r, ReflectorOutcome::GlobalLimited);
    burst_from(&r, [10, 9, 2, 1], 5);
    assert!(
        counter(&r, ReflectorOutcome::GlobalLimited) > before,
        "::/0 is not IPv4"
    );
}
