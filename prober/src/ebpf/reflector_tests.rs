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

/// The test_run tables: what is answered, passed and dropped.
#[path = "reflector_tests_tables.rs"]
mod tables;

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
