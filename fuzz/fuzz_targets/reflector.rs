//! Fuzzes the reflector's receive path (`rtprobe reflect`): a stream of
//! datagrams from a few sources through one `Core::handle`, for either
//! protocol, with and without a STAMP key, stateless and stateful, with
//! and without rate limits (per source, global, known peers' own); and
//! the STAMP Session-Sender decoder
//! (`SenderPacket::decode`) over the same datagrams.
//!
//! What must hold, whatever arrives:
//! - every datagram is counted exactly once;
//! - a reply is the request rewritten in place (never longer), a refused
//!   datagram is left as it was;
//! - an rtprobe reply is an echo of the request that the sender decodes,
//!   and is never answered again (no ping-pong between reflectors);
//! - a STAMP reply is a Session-Reflector packet (with a valid HMAC when
//!   keyed) that carries the request's fields back;
//! - the session and source tables stay bounded.
//!
//! The clock state is set once so that no datagram reads the kernel's.

#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use libfuzzer_sys::fuzz_target;
use rtprobe::probe::{
    ProtocolArg,
    packet::{FLAG_ECHO, FLAG_KERNEL_TIMES, HEADER_LEN, KTIMES_MIN_LEN, Probe},
    reflect::{
        Core, Counters, Drop, FLAG_REFLECTOR_STATE, MAX_PEER_SOURCES, MAX_SESSIONS, MAX_SOURCES,
        Peers, Policy, Prefix, RateLimits, STATE_MIN_LEN, Verdict, read_rtprobe_state,
    },
    stamp::{
        AUTH_LEN_BYTES, ClockSync, HMAC_COVERED_BYTES, HmacKey, Mode, ReflectorPacket,
        SenderPacket, StampError,
    },
};

const KEY: &[u8] = b"rtprobe fuzz key, 32 bytes long.";
/// Datagrams longer than this are rare on the wire and only cost time here
/// (the reflector refuses anything past a jumbo frame's payload anyway).
const MAX_DATAGRAM_BYTES: usize = 9100;

fuzz_target!(|data: &[u8]| run(&mut Input(data)));

/// The input, read front to back in a fixed layout (so seeds can be
/// written by hand; `fuzz/seeds/make-seeds.py` writes some):
///
/// ```text
/// policy  u8   bit 0 keyed, 1 STAMP, 2 stateful, 3-4 rate limit index, 5 clock synchronised,
///              6 global and peers' caps (the same index), 7 known peers (hosts 1-4 of
///              either family)
/// clock   u32  max error (µs), i16 TAI - UTC (s)
/// then per datagram:
///         u16  ms since the previous one
///         u8   source: bits 0-2 host, 3-4 port index, 7 IPv6
///         u8   bit 0 kernel RX stamp present, 1 TTL present, 2 sign (HMAC)
///         i64  RX stamp (ns), u8 TTL
///         u16  length, then that many bytes (fewer at the end of the input)
/// ```
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (head, tail) = self.0.split_at(n.min(self.0.len()));
        self.0 = tail;
        head
    }

    fn be<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let head = self.take(N);
        a[..head.len()].copy_from_slice(head);
        a
    }

    fn u8(&mut self) -> u8 {
        self.be::<1>()[0]
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.be())
    }
}

const RATE_LIMITS_PPS: [u32; 4] = [0, 1, 20, 10_000];
const PORTS: [u16; 4] = [862, 40_000, 40_001, 65_535];

fn run(input: &mut Input<'_>) {
    let key = HmacKey::new(KEY).expect("non-empty key");
    let bits = input.u8();
    let keyed = bits & 1 != 0;
    let rate = Some(RATE_LIMITS_PPS[usize::from(bits >> 3) & 3]).filter(|&r| r > 0);
    let caps = if bits & 64 != 0 { rate } else { None };
    let peers = if bits & 128 != 0 {
        let p = |s: &str| s.parse::<Prefix>().expect("a prefix");
        Peers::new([p("10.77.0.0/30"), p("10.77.0.4"), p("fd77::/126")]).expect("peers")
    } else {
        Peers::default()
    };
    let policy = Policy {
        protocol: if bits & 2 != 0 {
            ProtocolArg::Stamp
        } else {
            ProtocolArg::Rtprobe
        },
        key: keyed.then(|| key.clone()),
        limits: RateLimits {
            per_source_pps: rate,
            global_pps: caps,
            peers_pps: caps,
        },
        peers,
        stateful: bits & 4 != 0,
    };
    let mut core = Core::new(policy.clone());
    let clock = ClockSync {
        synchronized: bits & 32 != 0,
        max_error_ns: u64::from(u32::from_be_bytes(input.be())) * 1000,
        tai_offset_s: i16::from_be_bytes(input.be()).into(),
    };
    // Read at the end of time: the reflector never reads the kernel's.
    core.set_clock(Some(clock), i64::MAX);
    let mode = if keyed {
        Mode::Authenticated(&key)
    } else {
        Mode::Unauthenticated
    };
    let mut now_ns: i64 = 1_763_850_000_000_000_000;
    while !input.0.is_empty() {
        now_ns += i64::from(input.u16()) * 1_000_000;
        let src = source(input.u8());
        let has = input.u8();
        let rx_ns = Some(i64::from_be_bytes(input.be())).filter(|_| has & 1 != 0);
        let ttl = Some(input.u8()).filter(|_| has & 2 != 0);
        let len = usize::from(input.u16()).min(MAX_DATAGRAM_BYTES);
        let mut request = input.take(len).to_vec();
        if has & 4 != 0 && request.len() >= AUTH_LEN_BYTES {
            // A fuzzer cannot guess an HMAC: sign like a keyed sender.
            let tag = key.tag(&request[..HMAC_COVERED_BYTES]);
            request[HMAC_COVERED_BYTES..AUTH_LEN_BYTES].copy_from_slice(&tag);
        }
        sender_packet(&request, &key);

        let mut buf = request.clone();
        let before = core.counters.clone();
        let v = core.handle(&mut buf, src, rx_ns, ttl, now_ns);
        counted_once(&before, &core.counters, v);
        assert_eq!(buf.len(), request.len(), "a reply is the request's size");
        match (v, policy.protocol) {
            (Verdict::Drop(_), _) => assert_eq!(buf, request, "a refused datagram is untouched"),
            (Verdict::Reply { .. }, ProtocolArg::Rtprobe) => {
                rtprobe_reply(&request, &buf);
                // Fed back, an echo is refused before the rate limit.
                let mut again = buf.clone();
                let before = core.counters.clone();
                let v = core.handle(&mut again, src, rx_ns, ttl, now_ns);
                assert_eq!(v, Verdict::Drop(Drop::Malformed));
                counted_once(&before, &core.counters, v);
            }
            (Verdict::Reply { .. }, ProtocolArg::Stamp) => {
                stamp_reply(&request, &buf, mode, ttl, policy.stateful);
            }
        }
        assert!(core.sessions_held() <= MAX_SESSIONS);
        assert!(core.sources_held() <= MAX_SOURCES + MAX_PEER_SOURCES);
    }
}

/// One of a few IPv4 and IPv6 sources and ports, so that sessions and rate
/// limits are shared between datagrams.
fn source(bits: u8) -> SocketAddr {
    let host = 1 + (bits & 7);
    let ip: IpAddr = if bits & 0x80 != 0 {
        Ipv6Addr::new(0xfd77, 0, 0, 0, 0, 0, 0, host.into()).into()
    } else {
        Ipv4Addr::new(10, 77, 0, host).into()
    };
    SocketAddr::new(ip, PORTS[usize::from(bits >> 3) & 3])
}

fn counted_once(before: &Counters, after: &Counters, v: Verdict) {
    let step = |f: fn(&Counters) -> u64| f(after) - f(before);
    assert_eq!(step(|c| c.datagrams), 1);
    let outcomes = [
        (step(|c| c.reflected), matches!(v, Verdict::Reply { .. })),
        (
            step(|c| c.peer_reflected),
            matches!(v, Verdict::Reply { peer: true, .. }),
        ),
        (step(|c| c.malformed), v == Verdict::Drop(Drop::Malformed)),
        (
            step(|c| c.rate_limited),
            v == Verdict::Drop(Drop::RateLimited),
        ),
        (
            step(|c| c.global_limited),
            v == Verdict::Drop(Drop::GlobalLimited),
        ),
        (
            step(|c| c.peer_rate_limited),
            v == Verdict::Drop(Drop::PeerRateLimited),
        ),
        (
            step(|c| c.peer_global_limited),
            v == Verdict::Drop(Drop::PeerGlobalLimited),
        ),
        (
            step(|c| c.auth_failed),
            v == Verdict::Drop(Drop::AuthFailed),
        ),
    ];
    for (n, expected) in outcomes {
        assert_eq!(n, u64::from(expected), "{v:?}: {before:?} -> {after:?}");
    }
    assert_eq!(
        after.datagrams,
        after.reflected
            + after.malformed
            + after.rate_limited
            + after.global_limited
            + after.peer_rate_limited
            + after.peer_global_limited
            + after.auth_failed
    );
}

fn rtprobe_reply(request: &[u8], reply: &[u8]) {
    assert!(request.len() >= HEADER_LEN);
    let session = u64::from_be_bytes(request[8..16].try_into().expect("8 bytes"));
    let asked = Probe::decode(request, session).expect("an answered probe decodes");
    assert!(!asked.echo, "an echo was answered");
    let echo = Probe::decode(reply, session).expect("the sender decodes the echo");
    assert!(echo.echo);
    assert_eq!(
        (echo.seq, echo.flow, echo.send_ns),
        (asked.seq, asked.flow, asked.send_ns)
    );
    assert_eq!(
        read_rtprobe_state(reply).is_some(),
        reply.len() >= STATE_MIN_LEN
    );
    // Only the flags and the reflector's fields where there is room for
    // them (times at 32..48, state at 48..64) are written.
    let own_flags = FLAG_ECHO | FLAG_KERNEL_TIMES | FLAG_REFLECTOR_STATE;
    assert_eq!(reply[..5], request[..5]);
    assert_eq!(reply[5] & !own_flags, request[5] & !own_flags);
    assert_eq!(reply[5] & FLAG_ECHO, FLAG_ECHO);
    let written_to = match reply.len() {
        n if n >= STATE_MIN_LEN => STATE_MIN_LEN,
        n if n >= KTIMES_MIN_LEN => KTIMES_MIN_LEN,
        _ => HEADER_LEN,
    };
    assert_eq!(reply[6..HEADER_LEN], request[6..HEADER_LEN]);
    assert_eq!(reply[written_to..], request[written_to..]);
}

fn stamp_reply(request: &[u8], reply: &[u8], mode: Mode<'_>, ttl: Option<u8>, stateful: bool) {
    let base = mode.base_len_bytes();
    assert!(request.len() >= base);
    let sent = SenderPacket::decode(request, mode);
    let r = match ReflectorPacket::decode(reply, mode) {
        Ok(r) => r,
        // The request's timestamp is copied, not read (RFC 8762 §4.3): a
        // sender that wrote an invalid one gets it back as it was.
        Err(StampError::InvalidPtpNanoseconds { .. }) if sent.is_err() => return,
        Err(e) => panic!("the sender cannot decode the reply: {e}"),
    };
    let (seq_at, ssid_at) = match mode {
        Mode::Unauthenticated => (0, 14),
        Mode::Authenticated(_) => (0, 26),
    };
    let seq = u32::from_be_bytes(request[seq_at..seq_at + 4].try_into().expect("4 bytes"));
    let ssid = u16::from_be_bytes([request[ssid_at], request[ssid_at + 1]]);
    assert_eq!((r.sender_seq, r.ssid), (seq, ssid));
    assert_eq!(r.sender_ttl, ttl.unwrap_or(0));
    if !stateful {
        assert_eq!(
            r.seq, seq,
            "a stateless reflector mirrors the sequence number"
        );
    }
    if let Ok(s) = sent {
        assert_eq!(
            (s.timestamp, s.error_estimate),
            (r.sender_timestamp, r.sender_error_estimate)
        );
    }
    // Padding and TLVs after the base packet are copied unchanged.
    assert_eq!(reply[base..], request[base..]);
}

/// The Session-Sender decoder on what the reflector receives, both modes:
/// it never panics and refuses only for the stated reasons.
fn sender_packet(buf: &[u8], key: &HmacKey) {
    for mode in [Mode::Unauthenticated, Mode::Authenticated(key)] {
        match SenderPacket::decode(buf, mode) {
            Ok(p) => {
                assert!(buf.len() >= mode.base_len_bytes());
                let mut out = Vec::new();
                if buf.len() <= rtprobe::probe::stamp::MAX_PACKET_BYTES {
                    p.encode(mode, buf.len(), &mut out)
                        .expect("a decoded packet encodes again");
                    assert_eq!(SenderPacket::decode(&out, mode), Ok(p));
                }
            }
            Err(e) => assert!(!e.to_string().contains('\n')),
        }
    }
}
