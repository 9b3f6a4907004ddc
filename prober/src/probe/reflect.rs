//! The user-space reflector: answers rtprobe probes or STAMP session-sender
//! packets (RFC 8762 §4.3, stateless or stateful, unauthenticated or
//! authenticated). [`Core`] decides per datagram and rewrites the reply in
//! place (pure, unit-tested); [`serve`] is the socket loop that `rtprobe
//! reflect` (`app::reflect`) and testbed runs with `--protocol stamp` both
//! run.
//!
//! Safe to leave running on a network:
//! - only datagrams addressed to one of this host's unicast addresses
//!   (not broadcast or multicast, told by IP_PKTINFO / IPV6_RECVPKTINFO)
//!   from a source one host can have (not broadcast, multicast,
//!   unspecified, 0/8, 240/4 or a subnet broadcast of this host; loopback
//!   only on loopback) are looked at: [`super::addresses`];
//! - only well-formed probes of the served protocol are answered (with a
//!   key: only valid HMACs); echoes are never answered again;
//! - a reply is the request's own buffer rewritten, never longer;
//! - a token bucket per source limits answers (counted): per address for
//!   IPv4, per /64 for IPv6, since one host owns a /64 (SLAAC, privacy
//!   addresses) and could otherwise rotate through it for fresh buckets
//!   (`xdp_common::rate_key`, the in-kernel reflector's rule too);
//!   sessions stay per full source address;
//! - the session and source tables are bounded ([`MAX_SESSIONS`],
//!   [`MAX_SOURCES`]) LRU maps: constant work per datagram at any number
//!   of sources. A full session table forgets its least recently seen
//!   session; a full source table forgets its least recently seen source
//!   only once that source's bucket has refilled (so forgetting it gives
//!   it nothing), else the new source is refused (counted rate-limited);
//! - "new session" lines and receive errors are logged at most
//!   [`LOG_LINES_PER_S`] a second, with a count of those held back.
//!
//! Every datagram is counted exactly once: reflected, not_for_us,
//! bad_source, malformed, rate_limited or auth_failed.
//!
//! rtprobe-protocol echoes carry, beyond the in-kernel reflector's times
//! (flag bit 2, bytes 32..48), the reflector's state (flag bit 3, payload
//! of at least 64 bytes):
//!
//! ```text
//! 48                56       58
//! | received (u64)  | EE u16 | zero
//! ```
//! `received`: probes of this session (not warm-ups) the reflector has
//! seen, this one included, so the sender can tell forward from return
//! loss; EE: the reflector clock's STAMP Error Estimate (RFC 4656 §4.1.2).
//!
//! Kernel interfaces (in [`serve`]): UDP sockets with SO_TIMESTAMPING
//! (software RX stamps, Linux >= 2.6.30; a software TX stamp asked for per
//! reply, >= 4.6, with its id set per reply, SCM_TS_OPT_ID, >= 6.13: older
//! kernels get no turnaround), IP_RECVTTL or IPV6_RECVHOPLIMIT (IPv6
//! sockets, `--listen [::]:862`), and IP_PKTINFO or IPV6_RECVPKTINFO (each
//! datagram's destination and interface).
//!
//! The turnaround (probe RX stamp to reply TX stamp) is sampled: at most
//! [`TX_STAMPS_PER_S`] replies a second are TX-stamped ([`StampBudget`]).
//! Every stamp is an error-queue message charged to the receive buffer the
//! probes arrive in; stamping every reply let a flood fill that buffer
//! with stamps (measured: a CPU-starved reflector received 387-447 k of
//! 570 k datagrams and a legitimate client lost 25-100 %; 572 k and 0 %
//! without stamps).

use std::{
    net::{IpAddr, SocketAddr},
    num::NonZeroUsize,
    sync::atomic::{AtomicU8, Ordering},
    time::Duration,
};

use anyhow::{Context, Result};
use lru::LruCache;
use serde::Serialize;
use xdp_common::{AddrKey, addr_key, rate_key};

use super::{
    addresses::LocalNets,
    clock,
    packet::{FLAG_ECHO, FLAG_KERNEL_TIMES, HEADER_LEN, MAGIC, VERSION},
    socket::{ProbeSocket, RecvBatch},
    stamp::{self, ClockSync, ErrorEstimate, HmacKey, Mode, ReflectParams, Sequencing},
};
use crate::spec::remote::ProtocolArg;

/// Echo flag bit: bytes [`STATE_OFFSET`].. hold the reflector's state.
pub const FLAG_REFLECTOR_STATE: u8 = 8;
/// Warm-up probes (see `probe/engine.rs`): answered, not counted.
pub const FLAG_WARMUP: u8 = 2;
pub const STATE_OFFSET: usize = 48;
/// Smallest payload the state is written into.
pub const STATE_MIN_LEN: usize = 64;
/// Sessions (source + session id or SSID) remembered at once. About 130
/// bytes each (see `table_memory_per_entry`): 8.5 MiB when full.
pub const MAX_SESSIONS: usize = 65_536;
/// Sources with a rate-limit bucket at once: the per-source limit holds
/// for this many sources seen within a bucket's refill time. About 100
/// bytes each (see `table_memory_per_entry`): 13 MiB when full.
pub const MAX_SOURCES: usize = 131_072;
/// "new session" lines (and, separately, receive errors) logged a second
/// at most; the rest are counted in one line.
pub const LOG_LINES_PER_S: u32 = 10;
/// Replies TX-stamped a second at most (for the turnaround): a client at
/// 1 kHz keeps every stamp; a flood adds at most this many error-queue
/// messages a second, whatever its rate.
pub(crate) const TX_STAMPS_PER_S: u32 = 2000;
/// Stamps that may be taken at once after a quiet spell (0.1 s worth).
pub(crate) const TX_STAMP_BURST: u32 = TX_STAMPS_PER_S / 10;
/// Largest datagram answered: a jumbo frame's payload. Anything longer is
/// malformed (no probe rtprobe or a STAMP sender builds is that long).
pub(crate) const MAX_REQUEST_BYTES: usize = 9000;

/// How the reflector answers.
#[derive(Debug, Clone)]
pub struct Policy {
    pub protocol: ProtocolArg,
    /// STAMP authenticated mode.
    pub key: Option<HmacKey>,
    /// Answers per second per source (IPv4 address, IPv6 /64); 0: no limit.
    pub rate_limit_pps: u32,
    /// STAMP: per-session sequence numbers (RFC 8762 §4.3 stateful).
    pub stateful: bool,
}

pub use crate::stats::report::ReflectorCounters as Counters;

/// Why a datagram was not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    NotForUs,
    BadSource,
    Malformed,
    RateLimited,
    AuthFailed,
}

/// The answer to one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The buffer now holds the reply (same length as the request).
    /// `new_session` is set on the first probe of a session.
    Reply {
        new_session: Option<u64>,
    },
    Drop(Drop),
}

/// Recency lives in the LRU order, not here.
#[derive(Debug, Clone, Copy)]
struct Session {
    received: u64,
    next_seq: u32,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    last_ns: i64,
}

/// Where a datagram came from and was sent to, as its socket said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Addressing {
    pub src: SocketAddr,
    /// The destination in its IP header (None: the kernel did not say).
    pub dst: Option<IpAddr>,
    /// The interface it arrived on (None: not known).
    pub ifindex: Option<u32>,
}

/// One new session, for the log and the JSON.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SessionInfo {
    pub source: String,
    /// rtprobe session id (hex) or STAMP SSID.
    pub id: String,
    pub first_seen: String,
}

/// The reflector's decisions and bounded state.
pub struct Core {
    policy: Policy,
    sessions: LruCache<(SocketAddr, u64), Session>,
    /// Keyed by [`rate_key`]: an IPv4 address or an IPv6 /64.
    buckets: LruCache<AddrKey, Bucket>,
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
    pub fn with_capacity(policy: Policy, sessions: usize, sources: usize) -> Self {
        let cap = |n: usize| NonZeroUsize::new(n.max(1)).expect("at least 1");
        Self {
            policy,
            sessions: LruCache::new(cap(sessions)),
            buckets: LruCache::new(cap(sources)),
            nets: LocalNets::default(),
            counters: Counters::default(),
            clock: None,
            error_estimate: estimate_of(None),
            clock_read_ns: i64::MIN,
            scratch: Vec::with_capacity(2048),
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// What this host's interfaces are now ([`serve`] reads them at most
    /// once a second).
    pub fn set_local_nets(&mut self, nets: LocalNets) {
        self.nets = nets;
    }

    /// The clock state replies carry, read from the kernel at most once a
    /// second (a leap or a daemon's update changes it); `None` when the
    /// kernel would not say.
    pub fn clock(&mut self, now_ns: i64) -> Option<ClockSync> {
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
    pub fn handle_addressed(
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
        match v {
            Verdict::Reply { new_session } => {
                self.counters.reflected += 1;
                self.counters.bytes_out += buf.len() as u64;
                if new_session.is_some() {
                    self.counters.sessions += 1;
                }
            }
            Verdict::Drop(Drop::NotForUs) => self.counters.not_for_us += 1,
            Verdict::Drop(Drop::BadSource) => self.counters.bad_source += 1,
            Verdict::Drop(Drop::Malformed) => self.counters.malformed += 1,
            Verdict::Drop(Drop::RateLimited) => self.counters.rate_limited += 1,
            Verdict::Drop(Drop::AuthFailed) => self.counters.auth_failed += 1,
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
        if !self.admit(src.ip(), now_ns) {
            return Verdict::Drop(Drop::RateLimited);
        }
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
        if !self.admit(src.ip(), now_ns) {
            return Verdict::Drop(Drop::RateLimited);
        }
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
                }
            }
        };
        self.scratch = reply;
        verdict
    }

    /// Takes a token from the bucket of `ip`'s [`rate_key`] (IPv6: its
    /// /64; burst: a tenth of a second's worth, at least 16). A new source takes the least recently seen source's
    /// place in a full table only if that bucket has refilled: forgetting
    /// it then changes nothing, while forgetting a half-empty bucket would
    /// hand its source a fresh burst. Otherwise the new source is refused
    /// until one has.
    fn admit(&mut self, ip: IpAddr, now_ns: i64) -> bool {
        let rate = self.policy.rate_limit_pps;
        if rate == 0 {
            return true;
        }
        let rate = rate as f64;
        let burst = (rate / 10.0).max(16.0);
        let refill = |b: &Bucket| {
            let dt_s = (now_ns - b.last_ns).max(0) as f64 / 1e9;
            (b.tokens + dt_s * rate).min(burst)
        };
        let take = |b: &mut Bucket| {
            b.tokens = refill(b);
            b.last_ns = now_ns;
            let ok = b.tokens >= 1.0;
            if ok {
                b.tokens -= 1.0;
            }
            ok
        };
        let key = rate_key(&addr_key(ip));
        if let Some(b) = self.buckets.get_mut(&key) {
            return take(b);
        }
        if self.buckets.len() >= self.buckets.cap().get() {
            let refilled = self
                .buckets
                .peek_lru()
                .is_some_and(|(_, b)| refill(b) >= burst);
            if !refilled {
                return false;
            }
            self.buckets.pop_lru();
        }
        let mut b = Bucket {
            tokens: burst,
            last_ns: now_ns,
        };
        let ok = take(&mut b);
        self.buckets.push(key, b);
        ok
    }

    fn session(&mut self, src: SocketAddr, id: u64) -> (&mut Session, bool) {
        let full = self.sessions.len() >= self.sessions.cap().get();
        let mut new = false;
        let s = self.sessions.get_or_insert_mut((src, id), || {
            new = true;
            Session {
                received: 0,
                next_seq: 0,
            }
        });
        if new && full {
            self.counters.sessions_evicted += 1;
        }
        (s, new)
    }

    pub fn sessions_held(&self) -> usize {
        self.sessions.len()
    }

    pub fn sources_held(&self) -> usize {
        self.buckets.len()
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

/// Turns an rtprobe probe into its echo: the echo flag, the reflector's
/// receive and transmit times where there is room (as the in-kernel
/// reflector writes them), and its state where there is room for that.
pub(crate) fn write_rtprobe_echo(
    buf: &mut [u8],
    rx_ns: i64,
    tx_ns: i64,
    received: u64,
    ee: ErrorEstimate,
) {
    buf[5] |= FLAG_ECHO;
    if buf.len() >= super::packet::KTIMES_MIN_LEN {
        buf[5] |= FLAG_KERNEL_TIMES;
        buf[32..40].copy_from_slice(&rx_ns.to_be_bytes());
        buf[40..48].copy_from_slice(&tx_ns.to_be_bytes());
    }
    if buf.len() >= STATE_MIN_LEN {
        buf[5] |= FLAG_REFLECTOR_STATE;
        buf[48..56].copy_from_slice(&received.to_be_bytes());
        buf[56..58].copy_from_slice(&ee.to_bits().to_be_bytes());
        buf[58..64].fill(0);
    }
}

/// The reflector state in an rtprobe echo, if it carries one.
pub fn read_rtprobe_state(buf: &[u8]) -> Option<(u64, ErrorEstimate)> {
    if buf.len() < STATE_MIN_LEN || buf[5] & FLAG_REFLECTOR_STATE == 0 {
        return None;
    }
    Some((
        u64::from_be_bytes(buf[48..56].try_into().expect("8 bytes")),
        ErrorEstimate::from_bits(u16::from_be_bytes([buf[56], buf[57]])),
    ))
}

/// What [`serve`] reports when it returns.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ServeReport {
    pub protocol: &'static str,
    pub listen: Vec<String>,
    pub authenticated: bool,
    pub stateful: bool,
    pub rate_limit_pps: u32,
    pub duration_s: f64,
    pub counters: Counters,
    /// From the probe's kernel RX stamp to the echo's kernel TX stamp,
    /// over the replies that were stamped and whose stamp came back.
    pub turnaround_ns: crate::stats::Latency,
    /// Replies sent with a TX stamp asked for: at most
    /// `turnaround_stamps_per_s` a second, so under a flood a sample.
    pub turnaround_sampled: u64,
    /// The stamp budget ([`TX_STAMPS_PER_S`]).
    pub turnaround_stamps_per_s: u32,
    /// Sessions seen, first ones first (at most 1000 kept).
    pub session_list: Vec<SessionInfo>,
    /// The clock state replies carried at the end: unknown (adjtimex
    /// failed) is unsynchronised with `clock_max_error_ns` null, never 0.
    pub clock_synchronized: bool,
    pub clock_max_error_ns: Option<u64>,
}

impl ServeReport {
    /// One line on the clock, for the exit summary.
    pub fn clock_line(&self) -> String {
        let state = if self.clock_synchronized {
            "synchronised"
        } else {
            "unsynchronised"
        };
        match self.clock_max_error_ns {
            Some(ns) => format!("{state}, max error {:.3} ms", ns as f64 / 1e6),
            None => format!("{state}, max error unknown (adjtimex failed)"),
        }
    }
}

/// Lets at most `per_s` log lines through in each second and counts the
/// rest, so that a flood cannot turn the log into the bottleneck (or fill
/// the disk) while the log still says how much was held back.
#[derive(Debug, Clone)]
pub(crate) struct LineLimit {
    per_s: u32,
    window_start_ns: i64,
    shown: u32,
    held_back: u64,
}

impl LineLimit {
    pub fn new(per_s: u32) -> Self {
        Self {
            per_s,
            window_start_ns: i64::MIN,
            shown: 0,
            held_back: 0,
        }
    }

    /// Starts a new window once a second has passed: returns how many
    /// lines the window that ended held back, if any (to be said first).
    pub fn roll(&mut self, now_ns: i64) -> Option<u64> {
        if now_ns.saturating_sub(self.window_start_ns) < 1_000_000_000 {
            return None;
        }
        self.window_start_ns = now_ns;
        self.shown = 0;
        Some(std::mem::take(&mut self.held_back)).filter(|&k| k > 0)
    }

    /// Whether one more line may be shown in this window (call
    /// [`Self::roll`] first); a refused line is counted as held back.
    pub fn admit(&mut self) -> bool {
        if self.shown < self.per_s {
            self.shown += 1;
            true
        } else {
            self.held_back += 1;
            false
        }
    }

    /// Lines held back and not yet reported (at exit).
    pub fn take_held_back(&mut self) -> Option<u64> {
        Some(std::mem::take(&mut self.held_back)).filter(|&k| k > 0)
    }
}

/// A token bucket of TX stamps: which replies get one. Shared by every
/// source (the point is to bound the reflector's own error queue, not to
/// be fair): under a flood the stamped replies are a sample of all.
#[derive(Debug, Clone)]
pub(crate) struct StampBudget {
    /// Time one stamp costs, ns.
    cost_ns: i64,
    /// Credit saved up to the burst, ns; `last_ns` is when it was.
    credit_ns: i64,
    cap_ns: i64,
    last_ns: Option<i64>,
}

impl StampBudget {
    /// `per_s` stamps a second after a first `burst`; `per_s` 0: none.
    pub fn new(per_s: u32, burst: u32) -> Self {
        let cost_ns = if per_s == 0 {
            i64::MAX
        } else {
            1_000_000_000 / i64::from(per_s)
        };
        let cap_ns = cost_ns.saturating_mul(i64::from(burst.max(1)));
        Self {
            cost_ns,
            credit_ns: if per_s == 0 { 0 } else { cap_ns },
            cap_ns,
            last_ns: None,
        }
    }

    /// Whether a reply sent at `now_ns` may be stamped (and takes the stamp).
    pub fn take(&mut self, now_ns: i64) -> bool {
        if let Some(last) = self.last_ns {
            // A clock stepped back refills nothing.
            let refill = now_ns.saturating_sub(last).max(0);
            self.credit_ns = self.credit_ns.saturating_add(refill).min(self.cap_ns);
        }
        self.last_ns = Some(now_ns);
        if self.credit_ns >= self.cost_ns {
            self.credit_ns -= self.cost_ns;
            true
        } else {
            false
        }
    }
}

/// Sessions listed in the JSON at most.
const SESSION_LIST_MAX: usize = 1000;
/// RX stamps kept for matching TX stamps (OPT_ID modulo this).
const TURNAROUND_RING: usize = 4096;

/// The errno under an error's chain, if an OS call failed.
fn errno_of(e: &anyhow::Error) -> Option<i32> {
    e.chain()
        .find_map(|c| c.downcast_ref::<std::io::Error>())
        .and_then(|io| io.raw_os_error())
}

/// The default `--listen`: `0.0.0.0:PORT` and `[::]:PORT` (each socket
/// answers its own family), or IPv4 alone on a host without IPv6, which it
/// says.
pub(crate) fn bind_both_families(port: u16) -> Result<(Vec<SocketAddr>, Vec<ProbeSocket>)> {
    bind_both_families_with(port, bind)
}

fn bind_both_families_with<S>(
    port: u16,
    bind: impl Fn(&[SocketAddr]) -> Result<Vec<S>>,
) -> Result<(Vec<SocketAddr>, Vec<S>)> {
    let v4 = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), port);
    let v6 = SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), port);
    let mut socks = bind(&[v4])?;
    match bind(&[v6]) {
        Ok(s) => {
            socks.extend(s);
            Ok((vec![v4, v6], socks))
        }
        Err(e) if matches!(errno_of(&e), Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)) => {
            eprintln!("rtprobe reflect: this host has no IPv6 ({e:#}): answering IPv4 only");
            Ok((vec![v4], socks))
        }
        Err(e) => Err(e),
    }
}

/// Binds the reflector's sockets (in the calling thread's namespace).
pub fn bind(listen: &[SocketAddr]) -> Result<Vec<ProbeSocket>> {
    listen
        .iter()
        .map(|&a| {
            // TX stamps only for the replies serve() samples.
            let s = ProbeSocket::bind_tx_on_request(a, 0, true, 32 << 20)
            .map_err(|e| {
                match errno_of(&e) {
                    // One line that says what to do, not the socket's chain.
                    Some(libc::EADDRINUSE) => anyhow::anyhow!(
                        "cannot answer on {a}: the port is already in use (another `rtprobe reflect`?): stop that program or answer on another port with --listen ADDR:PORT"
                    ),
                    Some(libc::EACCES) if a.port() < 1024 => anyhow::anyhow!(
                        "cannot answer on {a}: ports below 1024 need root or CAP_NET_BIND_SERVICE (or use --listen with another port)"
                    ),
                    _ => e.context(format!("cannot answer on {a}")),
                }
            })?;
            // Each datagram's destination and interface (IP_PKTINFO,
            // IPV6_RECVPKTINFO): a socket bound to the wildcard address
            // also gets broadcasts, and only this tells them apart.
            // Without it the reflector could not keep its promise, so a
            // failure is an error.
            let pktinfo = match a {
                SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_PKTINFO, "IP_PKTINFO"),
                SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, "IPV6_RECVPKTINFO"),
            };
            turn_on(&s, pktinfo)
                .map_err(|e| anyhow::anyhow!("cannot answer on {a}: {}: {e}", pktinfo.2))?;
            // The arrival TTL (IPv4) or hop limit (IPv6) for STAMP's reply.
            let ttl = match a {
                SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_RECVTTL, "IP_RECVTTL"),
                SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, "IPV6_RECVHOPLIMIT"),
            };
            if let Err(e) = turn_on(&s, ttl) {
                log::warn!("{} on {a}: {e}", ttl.2);
            }
            Ok(s)
        })
        .collect()
}

/// Sets the integer socket option `(level, name, _)` to 1.
fn turn_on(
    s: &ProbeSocket,
    (level, name, _): (libc::c_int, libc::c_int, &str),
) -> std::io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: plain setsockopt on an owned socket with a live int.
    let r = unsafe {
        libc::setsockopt(
            s.fd(),
            level,
            name,
            (&on as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Answers on `socks` until `stop` is set or `duration` passes.
/// `session_line` gets the "new session ... from ..." lines, at most
/// [`LOG_LINES_PER_S`] a second, then one "... not shown" line for the rest.
/// A failed receive is counted, logged (as often) and survived.
pub(crate) fn serve(
    socks: &[ProbeSocket],
    core: &mut Core,
    stop: &AtomicU8,
    duration: Option<Duration>,
    session_line: impl FnMut(&str),
    mut on_tick: impl FnMut(&Counters),
) -> Result<ServeReport> {
    let start = std::time::Instant::now();
    let mut last_tick = start;
    let mut server = Server::new(core, session_line)?;
    let refs: Vec<&ProbeSocket> = socks.iter().collect();
    server
        .core
        .set_local_nets(LocalNets::read().context("read this host's addresses")?);
    let mut nets_read = start;
    while stop.load(Ordering::SeqCst) == 0 && duration.is_none_or(|d| start.elapsed() < d) {
        super::socket::poll_any(&refs, 100).context("reflector poll")?;
        // Addresses come and go (DHCP, a new interface): a subnet broadcast
        // may be new. Once a second bounds both the cost and the window.
        if nets_read.elapsed() >= Duration::from_secs(1) {
            nets_read = std::time::Instant::now();
            match LocalNets::read() {
                Ok(n) => server.core.set_local_nets(n),
                Err(e) => log::warn!("reflector: {e:#}; keeping the addresses read before"),
            }
        }
        for sock in socks {
            server.serve_socket(sock);
        }
        if last_tick.elapsed() >= Duration::from_millis(250) {
            last_tick = std::time::Instant::now();
            on_tick(&server.core.counters);
            // A flood that stopped still gets its count said.
            if let Some(k) = server.session_lines.roll(clock::realtime_ns()) {
                (server.session_line)(&held_back_line(k));
            }
        }
    }
    if let Some(k) = server.session_lines.take_held_back() {
        (server.session_line)(&held_back_line(k));
    }
    if let Some(k) = server.error_lines.take_held_back() {
        log::warn!("reflector: {k} more receive errors not shown");
    }
    on_tick(&server.core.counters);
    Ok(server.report(start.elapsed()))
}

fn held_back_line(k: u64) -> String {
    format!("{k} more new sessions in the last second not shown")
}

/// The user-space reflector's state between polls: the core answering
/// probes, the receive batches, the echo TX stamps that give the
/// turnaround, and the rate-limited session and error lines.
struct Server<'c, F: FnMut(&str)> {
    core: &'c mut Core,
    batch: RecvBatch,
    errq: RecvBatch,
    /// Datagrams of the batch to send back, and the OPT_ID each asks a TX
    /// stamp for.
    echo: Vec<usize>,
    stamps: Vec<Option<u32>>,
    /// RX stamp per OPT_ID, for the most recent [`TURNAROUND_RING`] ids.
    ring: Vec<i64>,
    next_id: u32,
    budget: StampBudget,
    /// Echoes sent with a TX stamp asked for.
    sampled: u64,
    turnaround: hdrhistogram::Histogram<u64>,
    sessions: Vec<SessionInfo>,
    session_lines: LineLimit,
    error_lines: LineLimit,
    session_line: F,
}

impl<'c, F: FnMut(&str)> Server<'c, F> {
    fn new(core: &'c mut Core, session_line: F) -> Result<Self> {
        Ok(Server {
            core,
            batch: RecvBatch::new(64, 65536),
            errq: RecvBatch::new(64, 256),
            echo: Vec::with_capacity(64),
            stamps: Vec::with_capacity(64),
            ring: vec![0i64; TURNAROUND_RING],
            next_id: 0,
            budget: StampBudget::new(TX_STAMPS_PER_S, TX_STAMP_BURST),
            sampled: 0,
            turnaround: hdrhistogram::Histogram::<u64>::new(3).context("histogram")?,
            sessions: Vec::new(),
            session_lines: LineLimit::new(LOG_LINES_PER_S),
            error_lines: LineLimit::new(LOG_LINES_PER_S),
            session_line,
        })
    }

    /// Answers every datagram waiting on `sock`, a batch at a time, and
    /// collects the echoes' TX stamps.
    fn serve_socket(&mut self, sock: &ProbeSocket) {
        loop {
            let n = match sock.recv_batch(&mut self.batch, false) {
                Ok(n) => n,
                Err(e) => {
                    self.receive_failed(&e);
                    break;
                }
            };
            if n == 0 {
                break;
            }
            self.answer_batch(sock, n, clock::realtime_ns());
            if !self.echo.is_empty() {
                self.send_echoes(sock);
            }
            self.drain_tx_stamps(sock);
            if n < self.batch.capacity() {
                break;
            }
        }
        self.drain_tx_stamps(sock);
    }

    /// E.g. ENOMEM, or an error a socket option queued: the next datagram
    /// may well be fine, so it is counted and logged (rate-limited) only.
    fn receive_failed(&mut self, e: &std::io::Error) {
        self.core.counters.recv_errors += 1;
        let now = clock::realtime_ns();
        if let Some(k) = self.error_lines.roll(now) {
            log::warn!("reflector: {k} more receive errors in the last second");
        }
        if self.error_lines.admit() {
            log::warn!("reflector: receive failed ({e}); going on");
        }
    }

    /// Runs the first `n` datagrams of the batch through the core, and
    /// lists the replies to send with the TX stamps they ask for.
    fn answer_batch(&mut self, sock: &ProbeSocket, n: usize, now: i64) {
        self.echo.clear();
        self.stamps.clear();
        for i in 0..n {
            let (payload, src, c) = self.batch.get(i);
            let at = Addressing {
                src,
                dst: c.dst,
                ifindex: c.ifindex,
            };
            let v = self.core.handle_addressed(payload, at, c.sw_ns, c.ttl, now);
            let Verdict::Reply { new_session } = v else {
                continue;
            };
            if let Some(id) = new_session {
                self.new_session(src, id, now);
            }
            // Only a reply with an RX stamp can give a turnaround.
            let stamp = c.sw_ns.is_some() && sock.per_send_opt_id() && self.budget.take(now);
            if stamp {
                self.ring[self.next_id as usize % TURNAROUND_RING] = c.sw_ns.unwrap_or(0);
                self.stamps.push(Some(self.next_id));
                self.next_id = self.next_id.wrapping_add(1);
            } else {
                self.stamps.push(None);
            }
            self.echo.push(i);
        }
    }

    /// Says a new session (rate-limited) and keeps it for the report's
    /// list (the first [`SESSION_LIST_MAX`]).
    fn new_session(&mut self, src: SocketAddr, id: u64, now: i64) {
        if let Some(k) = self.session_lines.roll(now) {
            (self.session_line)(&held_back_line(k));
        }
        let show = self.session_lines.admit();
        // Built only when used: under a flood of new sessions, formatting
        // each would cost more than answering it.
        if show || self.sessions.len() < SESSION_LIST_MAX {
            let info = session_info(self.core.policy.protocol, src, id);
            if show {
                (self.session_line)(&format!("new session {} from {}", info.id, info.source));
            }
            if self.sessions.len() < SESSION_LIST_MAX {
                self.sessions.push(info);
            }
        }
    }

    fn send_echoes(&mut self, sock: &ProbeSocket) {
        match sock.send_back_stamping(&mut self.batch, &self.echo, &self.stamps) {
            Ok(sent) => {
                self.core.counters.send_errors += (self.echo.len() - sent) as u64;
                // Asked for (a kernel without per-send ids was asked for
                // none); a refused send gets no stamp.
                if sock.per_send_opt_id() {
                    self.sampled += self.stamps.iter().flatten().count() as u64;
                }
            }
            Err(e) => {
                log::debug!("reflector send: {e}");
                self.core.counters.send_errors += self.echo.len() as u64;
            }
        }
    }

    fn drain_tx_stamps(&mut self, sock: &ProbeSocket) {
        drain_tx_stamps(
            sock,
            &mut self.errq,
            &self.ring,
            self.next_id,
            &mut self.turnaround,
        );
    }

    fn report(self, elapsed: Duration) -> ServeReport {
        let core = self.core;
        let clock = core.clock(clock::realtime_ns());
        ServeReport {
            protocol: core.policy.protocol.name(),
            listen: Vec::new(),
            authenticated: core.policy.key.is_some(),
            stateful: core.policy.stateful || core.policy.protocol == ProtocolArg::Rtprobe,
            rate_limit_pps: core.policy.rate_limit_pps,
            duration_s: elapsed.as_secs_f64(),
            counters: core.counters.clone(),
            turnaround_ns: crate::stats::Latency::from_hist(&self.turnaround),
            turnaround_sampled: self.sampled,
            turnaround_stamps_per_s: TX_STAMPS_PER_S,
            session_list: self.sessions,
            clock_synchronized: clock.is_some_and(|c| c.synchronized),
            clock_max_error_ns: clock.map(|c| c.max_error_ns),
        }
    }
}

fn session_info(protocol: ProtocolArg, src: SocketAddr, id: u64) -> SessionInfo {
    SessionInfo {
        source: src.to_string(),
        id: match protocol {
            ProtocolArg::Rtprobe => format!("{id:#018x}"),
            ProtocolArg::Stamp => format!("ssid {id}"),
        },
        first_seen: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    }
}

/// Echo TX stamps: turnaround = TX stamp - the probe's RX stamp (matched
/// by OPT_ID; only the recent ring of them, which is all a live queue holds).
fn drain_tx_stamps(
    sock: &ProbeSocket,
    errq: &mut RecvBatch,
    ring: &[i64],
    next_id: u32,
    h: &mut hdrhistogram::Histogram<u64>,
) {
    loop {
        let got = sock.recv_batch(errq, true).unwrap_or(0);
        for i in 0..got {
            let (_, _, c) = errq.get(i);
            if let Some((id, super::cmsg::TxKind::Software, tx_ns)) = c.tx_stamp()
                && sock.per_send_opt_id()
                && next_id.wrapping_sub(id) as usize <= TURNAROUND_RING
            {
                let rx = ring[id as usize % TURNAROUND_RING];
                if rx > 0 && tx_ns >= rx {
                    let _ = h.record((tx_ns - rx) as u64);
                }
            }
        }
        if got < errq.capacity() {
            break;
        }
    }
}

/// The interface holding `addr` in this namespace (for `--kernel`).
fn interface_of(addr: IpAddr) -> Result<String> {
    let addrs = nix::ifaddrs::getifaddrs().context("getifaddrs")?;
    for a in addrs {
        let Some(s) = a.address.as_ref() else {
            continue;
        };
        let ip = match (s.as_sockaddr_in(), s.as_sockaddr_in6()) {
            (Some(v4), _) => IpAddr::V4(v4.ip()),
            (_, Some(v6)) => IpAddr::V6(v6.ip()),
            _ => continue,
        };
        if ip == addr {
            return Ok(a.interface_name);
        }
    }
    anyhow::bail!("no interface in this namespace has the address {addr}")
}

/// `--kernel`: the in-kernel reflector on the interface of the one
/// `--listen` address, or why not.
pub(crate) fn attach_kernel(
    sys: crate::sys::SysRef,
    listen: &[SocketAddr],
    protocol: ProtocolArg,
    key: bool,
    limits: crate::ebpf::reflector::RateLimits,
) -> Result<crate::ebpf::reflector::Reflector> {
    let [a] = listen else {
        anyhow::bail!(
            "give exactly one --listen address: the kernel reflector goes on its interface"
        );
    };
    if a.ip().is_unspecified() {
        anyhow::bail!(
            "--listen {a} names no interface: give the address of the interface to attach to"
        );
    }
    if key {
        anyhow::bail!("the in-kernel reflector answers unauthenticated STAMP only");
    }
    let ifname = interface_of(a.ip())?;
    let (probe_port, stamp_port) = match protocol {
        ProtocolArg::Rtprobe => (a.port(), 0),
        ProtocolArg::Stamp => (0, a.port()),
    };
    // On a veth, XDP_TX frames reach the peer only when the peer's NAPI
    // runs (an XDP program there, or GRO requested): replies are
    // redirected to the interface itself, as in rtprobe's own testbed.
    use crate::sys::Ns;
    let veth = sys.driver(Ns::Host, &ifname).is_ok_and(|d| d == "veth");
    let reply_ifindex = if veth {
        sys.link(Ns::Host, &ifname)?
            .with_context(|| format!("{ifname} is gone"))?
            .index
    } else {
        0
    };
    let mut r = crate::ebpf::reflector::Reflector::load(
        sys,
        probe_port,
        stamp_port,
        reply_ifindex,
        limits,
    )?;
    let mode = r
        .attach(Ns::Host, &ifname, crate::ebpf::XdpMode::Auto)
        .with_context(|| format!("attach to {ifname}"))?;
    eprintln!(
        "rtprobe reflect: in-kernel reflector on {ifname} ({mode} mode): answers only unicast \
         probes to {ifname}'s MAC and addresses from unicast sources; {}",
        kernel_limits_text(limits)
    );
    if veth {
        eprintln!(
            "rtprobe reflect: {ifname} is a veth: its peer receives the kernel's replies only with GRO \
             requested and sends probes with full UDP checksums, which rtprobe cannot set from here: \
             on the peer run `ethtool -K PEER gro off; ethtool -K PEER gro on; ethtool -K PEER tx off`"
        );
    }
    Ok(r)
}

/// What the in-kernel reflector's limits are, for its banner.
fn kernel_limits_text(l: crate::ebpf::reflector::RateLimits) -> String {
    use crate::ebpf::reflector::RateLimits;
    let one = |what: &str, pps: Option<u32>| match pps {
        Some(r) => format!("at most {r}/s {what} (bursts of {})", RateLimits::burst(r)),
        None => format!("no limit {what}"),
    };
    format!(
        "{}, {}; probes over a limit are dropped",
        one("per IPv4 address or IPv6 /64", l.per_source_pps),
        one("in total", l.global_pps)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_listen_is_both_families_or_ipv4_without_ipv6() {
        let os = |errno| Err(anyhow::Error::new(std::io::Error::from_raw_os_error(errno)));
        let both = bind_both_families_with(862, |a| Ok(vec![a[0]])).unwrap();
        assert_eq!(
            both.0.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            ["0.0.0.0:862", "[::]:862"]
        );
        assert_eq!(both.0, both.1);
        // No IPv6 on this host: IPv4 alone.
        let v4 = bind_both_families_with(862, |a| {
            if a[0].is_ipv6() {
                os(libc::EAFNOSUPPORT)
            } else {
                Ok(vec![a[0]])
            }
        })
        .unwrap();
        assert_eq!(v4.0.len(), 1);
        // Any other failure (the IPv6 port taken) is the user's to see.
        let taken = bind_both_families_with(862, |a| {
            if a[0].is_ipv6() {
                os(libc::EADDRINUSE)
            } else {
                Ok(vec![a[0]])
            }
        });
        assert!(taken.is_err());
        // IPv4 first: its failure stops everything.
        assert!(bind_both_families_with(862, |_| os(libc::EACCES)).is_err());
    }
    use crate::probe::{
        packet::Probe,
        stamp::{ReflectorPacket, SenderPacket, Timestamp},
    };

    const NOW: i64 = 1_763_850_000_000_000_000;

    fn core(protocol: ProtocolArg, key: Option<HmacKey>, rate: u32, stateful: bool) -> Core {
        let mut c = Core::new(Policy {
            protocol,
            key,
            rate_limit_pps: rate,
            stateful,
        });
        c.set_clock(
            Some(ClockSync {
                synchronized: true,
                max_error_ns: 1_000_000,
                tai_offset_s: 37,
            }),
            NOW,
        );
        c
    }

    fn src(port: u16) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, 1], port))
    }

    fn probe(session: u64, seq: u64, size: usize) -> Vec<u8> {
        let mut b = vec![0u8; size];
        Probe {
            session,
            seq,
            flow: 0,
            echo: false,
            send_ns: NOW,
            kernel_times: None,
        }
        .encode(&mut b);
        b
    }

    #[test]
    fn rtprobe_echo_counts_the_session_and_never_grows() {
        let mut c = core(ProtocolArg::Rtprobe, None, 0, false);
        for seq in 0..3 {
            let mut b = probe(7, seq, 64);
            let v = c.handle(&mut b, src(1), Some(NOW + 10), None, NOW + 20);
            assert_eq!(
                v,
                Verdict::Reply {
                    new_session: (seq == 0).then_some(7)
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
    fn rate_limit_per_source_refills_with_time() {
        let mut c = core(ProtocolArg::Rtprobe, None, 100, false);
        let mut answered = 0;
        for i in 0..100 {
            let mut b = probe(1, i, 64);
            if matches!(
                c.handle(&mut b, src(4), None, None, NOW),
                Verdict::Reply { .. }
            ) {
                answered += 1;
            }
        }
        assert_eq!(answered, 16, "the burst");
        assert_eq!(c.counters.rate_limited, 84);
        // Another source has its own bucket; a second later the first refilled.
        let mut b = probe(2, 0, 64);
        let other = SocketAddr::from(([192, 0, 2, 2], 4));
        assert!(matches!(
            c.handle(&mut b, other, None, None, NOW),
            Verdict::Reply { .. }
        ));
        let mut b = probe(1, 200, 64);
        assert!(matches!(
            c.handle(&mut b, src(4), None, None, NOW + 1_000_000_000),
            Verdict::Reply { .. }
        ));
    }

    #[test]
    fn tables_stay_bounded_under_a_flood_of_sessions_and_sources() {
        let policy = core(ProtocolArg::Rtprobe, None, 1000, false).policy;
        let mut c = Core::with_capacity(policy, 64, 128);
        for i in 0..(64 * 3) {
            let mut b = probe(i, 0, 64);
            let ip = SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 9));
            // A second apart: every bucket has refilled when it is forgotten.
            c.handle(&mut b, ip, None, None, NOW + i as i64 * 1_000_000_000);
        }
        assert_eq!(c.sessions_held(), 64);
        assert_eq!(c.sources_held(), 128);
        assert_eq!(c.counters.sessions_evicted, 64 * 2);
        assert_eq!(c.counters.reflected, 64 * 3);
    }

    /// Bytes one table entry costs: the LRU's boxed node (key, value, two
    /// links; rounded up to malloc's 16-byte chunks plus its 8-byte
    /// header) and the hash table's slot (key pointer, node pointer, one
    /// control byte) at hashbrown's worst load of 7/16.
    fn table_memory_per_entry<K, V>() -> usize {
        let node = size_of::<K>() + size_of::<V>() + 2 * size_of::<usize>();
        let malloc = (node + 8).div_ceil(16) * 16;
        let slot = (2 * size_of::<usize>() + 1) * 16 / 7;
        malloc + slot
    }

    #[test]
    fn table_memory_is_what_the_docs_say() {
        let per_source = table_memory_per_entry::<AddrKey, Bucket>();
        let per_session = table_memory_per_entry::<(SocketAddr, u64), Session>();
        eprintln!("bytes per entry: source {per_source}, session {per_session}");
        assert!(per_source <= 110, "{per_source}");
        assert!(per_session <= 140, "{per_session}");
        assert!(per_source * MAX_SOURCES <= 14 << 20);
        assert!(per_session * MAX_SESSIONS <= 9 << 20);
    }

    /// 100 k sources, 17 datagrams each in turn within 2 ms, 1/s each: every
    /// source gets its burst of 16 and no more, and each keeps its own
    /// bucket (the old 4096-entry table forgot them and gave each a new
    /// burst: nothing was limited).
    #[test]
    fn per_source_limit_holds_at_100k_sources() {
        const SOURCES: u32 = 100_000;
        let mut c = core(ProtocolArg::Rtprobe, None, 1, false);
        let template = probe(1, 0, 32);
        let mut b = template.clone();
        let t0 = std::time::Instant::now();
        for round in 0..17u32 {
            for i in 0..SOURCES {
                b.copy_from_slice(&template);
                let ip = SocketAddr::from(([10, (i >> 16) as u8, (i >> 8) as u8, i as u8], 9));
                let now = NOW + (round * SOURCES + i) as i64;
                c.handle(&mut b, ip, None, None, now);
            }
        }
        let k = &c.counters;
        eprintln!(
            "100k sources x 17: {:?}; reflected {} rate_limited {} sources held {}",
            t0.elapsed(),
            k.reflected,
            k.rate_limited,
            c.sources_held()
        );
        assert_eq!(k.reflected, 16 * SOURCES as u64);
        assert_eq!(k.rate_limited, SOURCES as u64);
        assert_eq!(c.sources_held(), SOURCES as usize);
        assert!(c.sources_held() <= MAX_SOURCES);
        assert!(c.sessions_held() <= MAX_SESSIONS);
    }

    /// `count` probes from `sources` in turn, evenly over `secs` seconds;
    /// returns how many were answered.
    fn flood(c: &mut Core, sources: &[IpAddr], count: u64, secs: u64) -> u64 {
        let gap_ns = (secs * 1_000_000_000 / count) as i64;
        let template = probe(7, 0, 32);
        let mut b = template.clone();
        let before = c.counters.reflected;
        for i in 0..count {
            b.copy_from_slice(&template);
            let ip = sources[(i % sources.len() as u64) as usize];
            c.handle(
                &mut b,
                SocketAddr::new(ip, 9),
                None,
                None,
                NOW + i as i64 * gap_ns,
            );
        }
        c.counters.reflected - before
    }

    /// `n` addresses of the /64 `prefix` (a host rotating privacy addresses).
    fn addrs_in_64(prefix: &str, n: u64) -> Vec<IpAddr> {
        let base = prefix.parse::<std::net::Ipv6Addr>().unwrap().octets();
        (0..n)
            .map(|i| {
                let mut a = base;
                let iid = 0x5eed_0000_0000_0000u64 ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                a[8..].copy_from_slice(&iid.to_be_bytes());
                IpAddr::from(a)
            })
            .collect()
    }

    /// One IPv6 host owns a /64: 1000 of its addresses draw from one
    /// bucket (at most rate x seconds + burst answered), another /64 has
    /// its own, IPv4 stays per address, sessions stay per full address.
    #[test]
    fn ipv6_sources_are_limited_per_64() {
        let (rate, secs, count) = (100u32, 2u64, 20_000u64);
        let burst = 16; // a tenth of a second's worth, at least 16
        let bound = u64::from(rate) * secs + burst;
        let one = addrs_in_64("2001:db8:1:2::", 1000);
        let mut c = core(ProtocolArg::Rtprobe, None, rate, false);
        let answered = flood(&mut c, &one, count, secs);
        eprintln!(
            "1000 addresses of one /64, {count} probes in {secs} s at {rate}/s: \
             {answered} answered (bound {bound}), {} rate-limited, {} bucket(s), {} sessions",
            c.counters.rate_limited,
            c.sources_held(),
            c.counters.sessions
        );
        assert!(answered <= bound && answered >= bound - 1, "{answered}");
        assert_eq!(c.sources_held(), 1);
        // The same session id from two addresses of the /64: two sessions.
        let mut c = core(ProtocolArg::Rtprobe, None, rate, false);
        assert_eq!(flood(&mut c, &one[..2], 2, 1), 2);
        assert_eq!((c.counters.sessions, c.sources_held()), (2, 1));

        let mut two = addrs_in_64("2001:db8:1:2::", 500);
        two.extend(addrs_in_64("2001:db8:1:3::", 500));
        let mut c = core(ProtocolArg::Rtprobe, None, rate, false);
        let answered = flood(&mut c, &two, count, secs);
        eprintln!("two /64s: {answered} answered (bound {})", 2 * bound);
        assert!(answered > bound && answered <= 2 * bound, "{answered}");
        assert_eq!(c.sources_held(), 2);

        // IPv4, and IPv4 as a dual-stack socket reports it: per address.
        for mapped in [false, true] {
            let v4: Vec<IpAddr> = (0..1000u32)
                .map(|i| {
                    let a = std::net::Ipv4Addr::new(10, 1, (i >> 8) as u8, i as u8);
                    if mapped {
                        IpAddr::V6(a.to_ipv6_mapped())
                    } else {
                        IpAddr::V4(a)
                    }
                })
                .collect();
            let mut c = core(ProtocolArg::Rtprobe, None, rate, false);
            let answered = flood(&mut c, &v4, count, secs);
            assert_eq!(answered, count, "20 each in 2 s: within each burst");
            assert_eq!(c.sources_held(), 1000, "mapped: {mapped}");
        }
    }

    /// A full source table takes a new source only in place of one whose
    /// bucket has refilled; until then the newcomer is refused, so cycling
    /// through more sources than the table holds earns no extra bursts.
    #[test]
    fn a_full_source_table_refuses_newcomers_until_a_bucket_refilled() {
        let policy = core(ProtocolArg::Rtprobe, None, 10, false).policy;
        let mut c = Core::with_capacity(policy, 16, 4);
        let ip = |i: u8| SocketAddr::from(([10, 1, 0, i], 9));
        for i in 0..4 {
            // Each spends its whole burst.
            for seq in 0..16 {
                let mut b = probe(1, seq, 64);
                assert!(matches!(
                    c.handle(&mut b, ip(i), None, None, NOW),
                    Verdict::Reply { .. }
                ));
            }
        }
        let mut b = probe(1, 0, 64);
        assert_eq!(
            c.handle(&mut b, ip(9), None, None, NOW + 1_000_000_000),
            Verdict::Drop(Drop::RateLimited),
            "burst 16 at 10/s: 1.6 s to refill"
        );
        let mut b = probe(1, 0, 64);
        assert!(matches!(
            c.handle(&mut b, ip(9), None, None, NOW + 2_000_000_000),
            Verdict::Reply { .. }
        ));
        assert_eq!(c.sources_held(), 4);
        assert_eq!(c.counters.rate_limited, 1);
    }

    /// How many of `count` replies at `pps` from `start_ns` get a stamp.
    fn stamped(b: &mut StampBudget, start_ns: i64, count: u64, pps: u64) -> u64 {
        let gap_ns = 1_000_000_000 / pps as i64;
        (0..count)
            .filter(|&i| b.take(start_ns + i as i64 * gap_ns))
            .count() as u64
    }

    #[test]
    fn stamp_budget_keeps_every_stamp_of_a_1khz_client() {
        let mut b = StampBudget::new(TX_STAMPS_PER_S, TX_STAMP_BURST);
        assert_eq!(stamped(&mut b, NOW, 10_000, 1000), 10_000);
        // Up to the budget itself, still every one.
        let mut b = StampBudget::new(TX_STAMPS_PER_S, TX_STAMP_BURST);
        assert_eq!(stamped(&mut b, NOW, 10_000, 2000), 10_000);
    }

    #[test]
    fn stamp_budget_holds_a_flood_to_its_rate_plus_the_burst() {
        // The hostile test's flood: 57 k replies/s for 5 s.
        let mut b = StampBudget::new(TX_STAMPS_PER_S, TX_STAMP_BURST);
        let got = stamped(&mut b, NOW, 285_000, 57_000);
        let most = u64::from(TX_STAMP_BURST) + 5 * u64::from(TX_STAMPS_PER_S);
        assert!(got <= most && got >= most - 2, "{got} of at most {most}");
        // A batch arriving at one instant: the burst, then nothing.
        let mut b = StampBudget::new(TX_STAMPS_PER_S, TX_STAMP_BURST);
        let at_once = (0..1000).filter(|_| b.take(NOW)).count();
        assert_eq!(at_once, TX_STAMP_BURST as usize);
    }

    #[test]
    fn stamp_budget_saves_up_only_a_burst_and_survives_clock_steps() {
        let mut b = StampBudget::new(1000, 10);
        assert_eq!((0..20).filter(|_| b.take(NOW)).count(), 10);
        // An hour of quiet buys the burst, not an hour of stamps.
        let later = NOW + 3_600_000_000_000;
        assert_eq!((0..20).filter(|_| b.take(later)).count(), 10);
        // The clock stepped back: nothing refilled, nothing panics.
        assert!(!b.take(NOW));
        assert!(!b.take(i64::MIN));
        assert!(b.take(i64::MIN + 1_000_000));
        // Back to the far future: a burst again, no overflow.
        assert_eq!((0..20).filter(|_| b.take(i64::MAX)).count(), 10);
        // No budget: no stamps.
        let mut none = StampBudget::new(0, 10);
        assert_eq!(stamped(&mut none, NOW, 1000, 1000), 0);
    }

    #[test]
    fn line_limit_shows_per_second_then_counts_the_rest() {
        let mut l = LineLimit::new(3);
        assert_eq!(l.roll(NOW), None);
        let shown = (0..10).filter(|_| l.admit()).count();
        assert_eq!(shown, 3);
        assert_eq!(l.roll(NOW + 999_999_999), None, "same second");
        assert!(!l.admit());
        assert_eq!(l.roll(NOW + 1_000_000_000), Some(8));
        assert!(l.admit());
        assert_eq!(l.take_held_back(), None);
        assert!(l.admit() && l.admit() && !l.admit());
        assert_eq!(l.take_held_back(), Some(1));
        assert_eq!(l.roll(NOW + 2_000_000_000), None, "already reported");
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

    /// A reply the kernel refuses counts as a send error (the socket is
    /// shut down for writing: every send fails with EPIPE), not as sent.
    #[test]
    fn refused_replies_count_as_send_errors() {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        let port = std::net::UdpSocket::bind(any)
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let at = SocketAddr::from(([127, 0, 0, 1], port));
        let socks = bind(&[at]).unwrap();
        // SAFETY: shutdown on an fd the ProbeSocket owns and keeps open.
        unsafe { libc::shutdown(socks[0].fd(), libc::SHUT_WR) };
        let client = std::net::UdpSocket::bind(any).unwrap();
        for seq in 0..3 {
            client.send_to(&probe(5, seq, 64), at).unwrap();
        }
        let mut c = core(ProtocolArg::Rtprobe, None, 0, false);
        let stop = AtomicU8::new(0);
        let report = serve(
            &socks,
            &mut c,
            &stop,
            Some(Duration::from_millis(300)),
            |_| {},
            |_| {},
        )
        .unwrap();
        let k = &report.counters;
        assert_eq!((k.reflected, k.send_errors), (3, 3), "{k:?}");
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
