//! [`Core`]: the reflector's decision on one datagram (answer it, or why
//! not) and, for an answer, the request rewritten in place into the reply
//! (rtprobe echo or STAMP reply). Pure and unit-tested: the sockets are
//! `serve.rs`'s, the clock state is read at most once a second.

use std::net::{IpAddr, SocketAddr};

use super::{
    Counters, Peers, RateLimits,
    echo::{FLAG_REFLECTOR_STATE, FLAG_WARMUP, write_rtprobe_echo},
    tables::{Limiter, MAX_SESSIONS, MAX_SOURCES, Session, Sessions},
};
use crate::{
    probe::wire::ProtocolArg,
    probe::{
        addresses::LocalNets,
        clock,
        packet::{FLAG_ECHO, FLAG_KERNEL_TIMES, HEADER_LEN, MAGIC, VERSION},
        stamp::{self, ClockSync, ErrorEstimate, HmacKey, Mode, ReflectParams, Sequencing},
    },
};

/// Largest datagram answered: a jumbo frame's payload. Anything longer is
/// malformed (no probe rtprobe or a STAMP sender builds is that long).
const MAX_REQUEST_BYTES: usize = 9000;

/// How the reflector answers.
#[derive(Debug, Clone)]
pub struct Policy {
    pub protocol: ProtocolArg,
    /// STAMP authenticated mode.
    pub key: Option<HmacKey>,
    /// Answers per second: per source (IPv4 address, IPv6 /64), over
    /// strangers, over known peers.
    pub limits: RateLimits,
    /// The known peers, whose budgets strangers cannot spend.
    pub peers: Peers,
    /// STAMP: per-session sequence numbers (RFC 8762 §4.3 stateful).
    pub stateful: bool,
}

impl Policy {
    /// rtprobe's own protocol with no limit and no key: the testbed's
    /// reflector, which answers only the testbed's sender at whatever
    /// rate the run asks for.
    pub(crate) fn unlimited(protocol: ProtocolArg) -> Self {
        Policy {
            protocol,
            key: None,
            limits: RateLimits::NONE,
            peers: Peers::default(),
            stateful: true,
        }
    }
}

/// Why a datagram was not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    NotForUs,
    BadSource,
    Malformed,
    /// Over its source's limit.
    RateLimited,
    /// Over the cap of every source but the known peers.
    GlobalLimited,
    /// A known peer over its own limit.
    PeerRateLimited,
    /// A known peer over the cap of all known peers.
    PeerGlobalLimited,
    AuthFailed,
}

/// The answer to one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The buffer now holds the reply (same length as the request).
    /// `new_session` is set on the first probe of a session; `peer`: the
    /// source is a known peer.
    Reply {
        new_session: Option<u64>,
        peer: bool,
    },
    Drop(Drop),
}

/// Where a datagram came from and was sent to, as its socket said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Addressing {
    pub(crate) src: SocketAddr,
    /// The destination in its IP header (None: the kernel did not say).
    pub(crate) dst: Option<IpAddr>,
    /// The interface it arrived on (None: not known).
    pub(crate) ifindex: Option<u32>,
}

/// The reflector's decisions and bounded state.
pub struct Core {
    policy: Policy,
    sessions: Sessions,
    limiter: Limiter,
    /// This host's subnet broadcasts and loopback interfaces (empty until
    /// [`Core::set_local_nets`]: only the fixed rules apply).
    nets: LocalNets,
    pub counters: Counters,
    /// `None`: adjtimex failed, the clock's state is unknown.
    clock: Option<ClockSync>,
    /// What replies carry, worked out once per clock read, not per reply.
    error_estimate: ErrorEstimate,
    clock_read_ns: i64,
    scratch: Vec<u8>,
}

impl Core {
    pub fn new(policy: Policy) -> Self {
        Self::with_capacity(policy, MAX_SESSIONS, MAX_SOURCES)
    }

    /// Smaller tables (tests of what a full table does).
    pub(crate) fn with_capacity(policy: Policy, sessions: usize, sources: usize) -> Self {
        Self {
            limiter: Limiter::new(policy.limits, policy.peers.clone(), sources),
            policy,
            sessions: Sessions::new(sessions),
            nets: LocalNets::default(),
            counters: Counters::default(),
            clock: None,
            error_estimate: estimate_of(None),
            clock_read_ns: i64::MIN,
            scratch: Vec::with_capacity(2048),
        }
    }

    pub(crate) fn policy(&self) -> &Policy {
        &self.policy
    }

    /// What this host's interfaces are now ([`super::serve`] reads them at most
    /// once a second).
    pub(crate) fn set_local_nets(&mut self, nets: LocalNets) {
        self.nets = nets;
    }

    /// The clock state replies carry, read from the kernel at most once a
    /// second (a leap or a daemon's update changes it); `None` when the
    /// kernel would not say.
    pub(crate) fn clock(&mut self, now_ns: i64) -> Option<ClockSync> {
        if now_ns.saturating_sub(self.clock_read_ns) >= 1_000_000_000 {
            self.set_clock(ClockSync::read_kernel().ok(), now_ns);
        }
        self.clock
    }

    /// Sets the clock state instead of reading the kernel (tests; `None`:
    /// as if adjtimex failed).
    pub fn set_clock(&mut self, c: Option<ClockSync>, now_ns: i64) {
        self.clock = c;
        self.error_estimate = estimate_of(c);
        self.clock_read_ns = now_ns;
    }

    fn error_estimate(&mut self, now_ns: i64) -> ErrorEstimate {
        self.clock(now_ns);
        self.error_estimate
    }

    /// [`Core::handle_addressed`] for a datagram from `src` whose
    /// destination and interface are not known.
    pub fn handle(
        &mut self,
        buf: &mut [u8],
        src: SocketAddr,
        rx_ns: Option<i64>,
        ttl: Option<u8>,
        now_ns: i64,
    ) -> Verdict {
        let at = Addressing {
            src,
            dst: None,
            ifindex: None,
        };
        self.handle_addressed(buf, at, rx_ns, ttl, now_ns)
    }

    /// Decides on one datagram of `len` bytes at the start of `buf` and,
    /// for an answer, rewrites it into the reply. `rx_ns`: its kernel RX
    /// stamp (else `now_ns`), `ttl`: the TTL it arrived with.
    pub(crate) fn handle_addressed(
        &mut self,
        buf: &mut [u8],
        at: Addressing,
        rx_ns: Option<i64>,
        ttl: Option<u8>,
        now_ns: i64,
    ) -> Verdict {
        self.counters.datagrams += 1;
        self.counters.bytes_in += buf.len() as u64;
        // Before anything else: such a datagram must not even take a token
        // from a bucket or open a session.
        let v = if self.nets.is_not_for_us(at.dst) {
            Verdict::Drop(Drop::NotForUs)
        } else if self.nets.is_bad_source(at.src.ip(), at.ifindex) {
            Verdict::Drop(Drop::BadSource)
        } else {
            self.decide(buf, at.src, rx_ns.unwrap_or(now_ns), ttl, now_ns)
        };
        let k = &mut self.counters;
        match v {
            Verdict::Reply { new_session, peer } => {
                k.reflected += 1;
                k.bytes_out += buf.len() as u64;
                k.sessions += u64::from(new_session.is_some());
                k.peer_reflected += u64::from(peer);
            }
            Verdict::Drop(Drop::NotForUs) => k.not_for_us += 1,
            Verdict::Drop(Drop::BadSource) => k.bad_source += 1,
            Verdict::Drop(Drop::Malformed) => k.malformed += 1,
            Verdict::Drop(Drop::RateLimited) => k.rate_limited += 1,
            Verdict::Drop(Drop::GlobalLimited) => k.global_limited += 1,
            Verdict::Drop(Drop::PeerRateLimited) => k.peer_rate_limited += 1,
            Verdict::Drop(Drop::PeerGlobalLimited) => k.peer_global_limited += 1,
            Verdict::Drop(Drop::AuthFailed) => k.auth_failed += 1,
        }
        v
    }

    fn decide(
        &mut self,
        buf: &mut [u8],
        src: SocketAddr,
        rx_ns: i64,
        ttl: Option<u8>,
        now_ns: i64,
    ) -> Verdict {
        if buf.len() > MAX_REQUEST_BYTES {
            return Verdict::Drop(Drop::Malformed);
        }
        match self.policy.protocol {
            ProtocolArg::Rtprobe => self.rtprobe(buf, src, rx_ns, now_ns),
            ProtocolArg::Stamp => self.stamp(buf, src, rx_ns, ttl, now_ns),
        }
    }

    fn rtprobe(&mut self, buf: &mut [u8], src: SocketAddr, rx_ns: i64, now_ns: i64) -> Verdict {
        if buf.len() < HEADER_LEN || buf[0..4] != MAGIC || buf[4] != VERSION {
            return Verdict::Drop(Drop::Malformed);
        }
        // Echoes (and anything claiming to carry a reflector's fields) are
        // never answered: two reflectors must not play ping-pong.
        if buf[5] & (FLAG_ECHO | FLAG_KERNEL_TIMES | FLAG_REFLECTOR_STATE) != 0 {
            return Verdict::Drop(Drop::Malformed);
        }
        let peer = match self.limiter.admit(src.ip(), now_ns) {
            Ok(peer) => peer,
            Err(d) => return Verdict::Drop(d),
        };
        let id = u64::from_be_bytes(buf[8..16].try_into().expect("8 bytes"));
        let warmup = buf[5] & FLAG_WARMUP != 0;
        let (s, new) = self.session(src, id);
        if !warmup {
            s.received += 1;
        }
        let received = s.received;
        let ee = self.error_estimate(now_ns);
        write_rtprobe_echo(buf, rx_ns, clock::realtime_ns(), received, ee);
        Verdict::Reply {
            new_session: new.then_some(id),
            peer,
        }
    }

    fn stamp(
        &mut self,
        buf: &mut [u8],
        src: SocketAddr,
        rx_ns: i64,
        ttl: Option<u8>,
        now_ns: i64,
    ) -> Verdict {
        let key = self.policy.key.clone();
        let mode = match &key {
            Some(k) => Mode::Authenticated(k),
            None => Mode::Unauthenticated,
        };
        if buf.len() < mode.base_len_bytes() {
            return Verdict::Drop(Drop::Malformed);
        }
        let peer = match self.limiter.admit(src.ip(), now_ns) {
            Ok(peer) => peer,
            Err(d) => return Verdict::Drop(d),
        };
        let params = ReflectParams {
            rx_realtime_ns: rx_ns,
            tx_realtime_ns: clock::realtime_ns(),
            // No IP_TTL control message: the TTL is unknown, which RFC 8762
            // has no value for; 0 cannot be a TTL a packet arrived with.
            ttl: ttl.unwrap_or(0),
            error_estimate: self.error_estimate(now_ns),
            tai_offset_s: self.clock(now_ns).map_or(0, |c| c.tai_offset_s),
        };
        let mut reply = std::mem::take(&mut self.scratch);
        let r = stamp::reflect(buf, mode, Sequencing::Stateless, &params, &mut reply);
        let verdict = match r {
            Err(stamp::StampError::BadHmac) => Verdict::Drop(Drop::AuthFailed),
            Err(_) => Verdict::Drop(Drop::Malformed),
            Ok(()) => {
                // The SSID sits at 14 (unauthenticated) or 26 (authenticated).
                let at = if key.is_some() { 26 } else { 14 };
                let ssid = u16::from_be_bytes([buf[at], buf[at + 1]]);
                let stateful = self.policy.stateful;
                let (s, new) = self.session(src, ssid as u64);
                s.received += 1;
                if stateful {
                    // RFC 8762 §4.3: the reflector's own counter per session.
                    let seq = s.next_seq;
                    s.next_seq = seq.wrapping_add(1);
                    reply[0..4].copy_from_slice(&seq.to_be_bytes());
                    if let Some(k) = &key {
                        let tag = k.tag(&reply[..stamp::HMAC_COVERED_BYTES]);
                        reply[stamp::HMAC_COVERED_BYTES..stamp::AUTH_LEN_BYTES]
                            .copy_from_slice(&tag);
                    }
                }
                debug_assert_eq!(reply.len(), buf.len());
                buf.copy_from_slice(&reply[..buf.len()]);
                Verdict::Reply {
                    new_session: new.then_some(ssid as u64),
                    peer,
                }
            }
        };
        self.scratch = reply;
        verdict
    }

    /// The session `id` from `src`, and whether it is new (a full table
    /// forgets one, counted).
    fn session(&mut self, src: SocketAddr, id: u64) -> (&mut Session, bool) {
        let (s, new, evicted) = self.sessions.open(src, id);
        if evicted {
            self.counters.sessions_evicted += 1;
        }
        (s, new)
    }

    pub fn sessions_held(&self) -> usize {
        self.sessions.len()
    }

    pub fn sources_held(&self) -> usize {
        self.limiter.len()
    }
}

/// The Error Estimate replies carry: an unknown clock is unsynchronised
/// with the largest error the field holds, never a small one.
fn estimate_of(clock: Option<ClockSync>) -> ErrorEstimate {
    match clock {
        Some(c) => ErrorEstimate::from_clock_sync(&c, false),
        None => ErrorEstimate::from_error_ns(false, u64::MAX, false),
    }
}

#[cfg(test)]
mod tests {
    use super::{super::testutil::*, *};
    use crate::probe::{
        packet::Probe,
        reflect::{read_rtprobe_state, serve::serve},
        stamp::{ReflectorPacket, SenderPacket, Timestamp},
    };
    use std::sync::atomic::AtomicU8;

    #[test]
    fn rtprobe_echo_counts_the_session_and_never_grows() {
        let mut c = core(ProtocolArg::Rtprobe, None, 0, false);
        for seq in 0..3 {
            let mut b = probe(7, seq, 64);
            let v = c.handle(&mut b, src(1), Some(NOW + 10), None, NOW + 20);
            assert_eq!(
                v,
                Verdict::Reply {
                    new_session: (seq == 0).then_some(7),
                    peer: false,
                }
            );
            assert_eq!(b.len(), 64);
            let p = Probe::decode(&b, 7).unwrap();
            assert!(p.echo);
            assert_eq!(p.seq, seq);
            assert_eq!(p.kernel_times.unwrap().rx_ns, NOW + 10);
            let (received, ee) = read_rtprobe_state(&b).unwrap();
            assert_eq!(received, seq + 1);
            assert!(ee.synchronized());
            assert!(ee.to_error_ns().unwrap() >= 1_000_000);
            // The echo is not answered again.
            assert_eq!(
                c.handle(&mut b, src(1), None, None, NOW),
                Verdict::Drop(Drop::Malformed)
            );
        }
        // Warm-ups are answered but not counted; a 32-byte probe gets no fields.
        let mut w = probe(7, u64::MAX, 64);
        w[5] = FLAG_WARMUP;
        c.handle(&mut w, src(1), None, None, NOW);
        assert_eq!(read_rtprobe_state(&w).unwrap().0, 3);
        let mut short = probe(7, 9, 32);
        assert!(matches!(
            c.handle(&mut short, src(1), None, None, NOW),
            Verdict::Reply { .. }
        ));
        assert_eq!(short[5], FLAG_ECHO);
        let k = &c.counters;
        assert_eq!(
            k.datagrams,
            k.reflected + k.malformed + k.rate_limited + k.auth_failed
        );
        assert_eq!((k.sessions, k.reflected, k.malformed), (1, 5, 3));
    }

    #[test]
    fn stamp_stateful_counts_per_session_and_copies_ttl_and_padding() {
        let mut c = core(ProtocolArg::Stamp, None, 0, true);
        for (i, sender_seq) in [10u32, 11, 13].into_iter().enumerate() {
            let mut b = Vec::new();
            SenderPacket {
                seq: sender_seq,
                timestamp: Timestamp::from_realtime_ns(NOW, false, 0).unwrap(),
                error_estimate: ErrorEstimate::from_error_ns(false, 0, false),
                ssid: 0x1234,
            }
            .encode(Mode::Unauthenticated, 100, &mut b)
            .unwrap();
            b[60] = 0xAB;
            let v = c.handle(&mut b, src(2), Some(NOW + 5), Some(63), NOW + 9);
            assert!(matches!(v, Verdict::Reply { .. }));
            assert_eq!(b.len(), 100);
            assert_eq!(b[60], 0xAB, "padding mirrored");
            let r = ReflectorPacket::decode(&b, Mode::Unauthenticated).unwrap();
            assert_eq!(r.seq, i as u32, "the reflector's own count");
            assert_eq!(r.sender_seq, sender_seq);
            assert_eq!(r.ssid, 0x1234);
            assert_eq!(r.sender_ttl, 63);
            assert!(r.error_estimate.synchronized());
        }
        let mut short = vec![0u8; 43];
        assert_eq!(
            c.handle(&mut short, src(2), None, None, NOW),
            Verdict::Drop(Drop::Malformed)
        );
        let mut huge = vec![0u8; MAX_REQUEST_BYTES + 1];
        assert_eq!(
            c.handle(&mut huge, src(2), None, None, NOW),
            Verdict::Drop(Drop::Malformed)
        );
        assert_eq!(c.counters.sessions, 1);
    }

    #[test]
    fn stamp_authenticated_answers_only_the_right_key() {
        let good = HmacKey::new(&[1u8; 32]).unwrap();
        let bad = HmacKey::new(&[2u8; 32]).unwrap();
        let mut c = core(ProtocolArg::Stamp, Some(good.clone()), 0, true);
        let pkt = |k: &HmacKey| {
            let mut b = Vec::new();
            SenderPacket {
                seq: 5,
                timestamp: Timestamp::from_realtime_ns(NOW, false, 0).unwrap(),
                error_estimate: ErrorEstimate::from_error_ns(false, 0, false),
                ssid: 9,
            }
            .encode(Mode::Authenticated(k), 112, &mut b)
            .unwrap();
            b
        };
        let mut b = pkt(&bad);
        assert_eq!(
            c.handle(&mut b, src(3), None, None, NOW),
            Verdict::Drop(Drop::AuthFailed)
        );
        let mut b = pkt(&good);
        assert!(matches!(
            c.handle(&mut b, src(3), None, None, NOW),
            Verdict::Reply { .. }
        ));
        let r = ReflectorPacket::decode(&b, Mode::Authenticated(&good)).unwrap();
        assert_eq!((r.seq, r.sender_seq), (0, 5));
        // A 44-byte unauthenticated packet is too short for this mode.
        let mut u = vec![0u8; 44];
        assert_eq!(
            c.handle(&mut u, src(3), None, None, NOW),
            Verdict::Drop(Drop::Malformed)
        );
        assert_eq!(c.counters.auth_failed, 1);
    }

    #[test]
    fn only_unicast_datagrams_from_good_sources_are_looked_at() {
        let mut c = core(ProtocolArg::Rtprobe, None, 100, false);
        c.set_local_nets(LocalNets::new(
            [("10.77.0.2".parse().unwrap(), 24, None)],
            vec![1],
        ));
        let at = |src: &str, dst: &str, ifindex: u32| Addressing {
            src: SocketAddr::new(src.parse().unwrap(), 9),
            dst: Some(dst.parse().unwrap()),
            ifindex: Some(ifindex),
        };
        let mut go = |a: Addressing| c.handle_addressed(&mut probe(1, 0, 64), a, None, None, NOW);
        let reply = Verdict::Reply {
            new_session: Some(1),
            peer: false,
        };
        for dst in ["255.255.255.255", "10.77.0.255", "224.0.0.1"] {
            assert_eq!(
                go(at("10.77.0.1", dst, 3)),
                Verdict::Drop(Drop::NotForUs),
                "{dst}"
            );
        }
        for src in [
            "10.77.0.255",
            "224.0.0.1",
            "255.255.255.255",
            "0.0.0.0",
            "240.1.1.1",
        ] {
            assert_eq!(
                go(at(src, "10.77.0.2", 3)),
                Verdict::Drop(Drop::BadSource),
                "{src}"
            );
        }
        assert_eq!(
            go(at("127.0.0.1", "10.77.0.2", 3)),
            Verdict::Drop(Drop::BadSource)
        );
        assert_eq!(go(at("10.77.0.1", "10.77.0.2", 3)), reply);
        assert_eq!(go(at("127.0.0.1", "127.0.0.1", 1)), reply);
        let n = &c.counters;
        assert_eq!((n.not_for_us, n.bad_source, n.reflected), (3, 6, 2));
        assert_eq!(
            n.datagrams,
            n.reflected
                + n.not_for_us
                + n.bad_source
                + n.malformed
                + n.rate_limited
                + n.auth_failed
        );
        // Refused before the rate limit: no bucket, no session for them.
        assert_eq!((c.sources_held(), c.sessions_held()), (2, 2));
    }

    #[test]
    fn an_unknown_clock_is_unsynchronised_and_never_a_small_error() {
        let huge = |ee: ErrorEstimate| {
            !ee.synchronized() && ee.to_error_ns().is_some_and(|ns| ns >= 1_000_000_000_000)
        };
        let mut c = core(ProtocolArg::Rtprobe, None, 0, false);
        c.set_clock(None, NOW);
        let mut b = probe(7, 0, 64);
        c.handle(&mut b, src(1), None, None, NOW);
        let (_, ee) = read_rtprobe_state(&b).unwrap();
        assert!(huge(ee), "{ee:?}");

        let mut c = core(ProtocolArg::Stamp, None, 0, true);
        c.set_clock(None, NOW);
        let mut b = Vec::new();
        SenderPacket {
            seq: 1,
            timestamp: Timestamp::from_realtime_ns(NOW, false, 0).unwrap(),
            error_estimate: ErrorEstimate::from_error_ns(false, 0, false),
            ssid: 1,
        }
        .encode(Mode::Unauthenticated, 44, &mut b)
        .unwrap();
        c.handle(&mut b, src(1), None, None, NOW);
        let r = ReflectorPacket::decode(&b, Mode::Unauthenticated).unwrap();
        assert!(huge(r.error_estimate), "{:?}", r.error_estimate);

        // The report: null and "unsynchronised", never 0.
        let mut c = core(ProtocolArg::Rtprobe, None, 0, false);
        c.set_clock(None, clock::realtime_ns());
        let report = serve(&[], &mut c, &AtomicU8::new(1), None, |_| {}, |_| {}).unwrap();
        let v = serde_json::to_value(&report).unwrap();
        assert_eq!(v["clock_max_error_ns"], serde_json::Value::Null);
        assert_eq!(v["clock_synchronized"], false);
        assert_eq!(
            report.clock_line(),
            "unsynchronised, max error unknown (adjtimex failed)"
        );
    }

    proptest::proptest! {
        #[test]
        fn any_bytes_are_counted_once_and_never_grow(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200),
            stamp in proptest::bool::ANY,
        ) {
            let proto = if stamp { ProtocolArg::Stamp } else { ProtocolArg::Rtprobe };
            let mut c = core(proto, None, 0, true);
            let mut b = bytes.clone();
            let v = c.handle(&mut b, src(5), None, None, NOW);
            proptest::prop_assert_eq!(b.len(), bytes.len());
            let k = &c.counters;
            proptest::prop_assert_eq!(k.datagrams, 1);
            proptest::prop_assert_eq!(k.reflected + k.malformed + k.rate_limited + k.auth_failed, 1);
            if let Verdict::Reply { .. } = v {
                proptest::prop_assert!(bytes.len() >= 32);
            }
        }
    }
}
