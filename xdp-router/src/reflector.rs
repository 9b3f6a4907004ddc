//! rtprobe's in-kernel reflector: answers rtprobe probes and unauthenticated
//! STAMP session-sender packets (RFC 8762 §4.3.1 stateless, RFC 8972 SSID)
//! with XDP_TX, so the reply leaves without waking a user-space process.
//! With `REPLY_IFINDEX` set (to its own interface) it sends the reply with
//! `bpf_redirect` there instead: on a veth, XDP_TX puts the frame into the
//! peer's ring but wakes the peer's NAPI only when the peer runs an XDP
//! program of its own (`veth_xdp_flush` checks the peer queue's
//! `xdp_prog`), so without one the replies wait there unseen; a redirect
//! goes through `ndo_xdp_xmit`, whose flush wakes the peer's NAPI whenever
//! it exists (an XDP program or GRO on the peer).
//!
//! For each frame: bounds-checked Ethernet + IPv4 (no options, no
//! fragments) or IPv6 (UDP right after the fixed header, no extension
//! headers) + UDP parse; UDP to `REFLECT_PORT` with an rtprobe probe
//! payload, or to `STAMP_PORT` with at least 44 bytes, is rewritten in
//! place: MACs, IP addresses and UDP ports swapped, TTL / hop limit set to
//! 64, the payload turned into the reply with the reflector's receive and
//! transmit times. Echoes and everything else go to the kernel (XDP_PASS).
//! Every frame is counted per outcome in a per-CPU array; nothing is logged
//! per packet.
//!
//! Only probes addressed to the interface are answered: destination MAC
//! the interface's own (`REFLECTOR_IFACE`), destination IP one of its
//! addresses (`REFLECTOR_ADDRS`), and from a source that can take a
//! unicast reply: not a group MAC, not broadcast (limited or a subnet's),
//! multicast, loopback, unspecified or one of its own addresses. User
//! space fills both maps before attaching; empty, nothing is answered.
//! Probes to another MAC or address pass to the kernel, counted as
//! `not_for_us`; probes from a bad source are dropped, counted as
//! `bad_source` (the kernel would hand some, a subnet broadcast source,
//! to `rtprobe reflect`'s socket on the same port).
//!
//! Rate limits (load-time globals; zero interval: none): a token bucket per
//! source in an LRU hash (`REFLECTOR_SOURCES`), keyed by `rate_key`: the
//! address for IPv4, the /64 for IPv6 (one host owns a /64, so rotating
//! addresses inside it buys no fresh burst), then one global
//! bucket (`REFLECTOR_GLOBAL`), both as GCRA theoretical arrival times in
//! `bpf_ktime_get_ns` (monotonic) ns: integers only, one word per bucket.
//! Every CPU shares them; a token is taken by one BPF_CMPXCHG of the word
//! it read, so a concurrent update makes the swap fail and the probe is
//! refused (after one retry): races only ever refuse more, and no window
//! of S seconds gets more than `burst + rate * S` replies from one bucket.
//! Probes over a limit are dropped (XDP_DROP), counted as `rate_limited` /
//! `global_limited`.
//!
//! Known peers (`REFLECTOR_PEERS`, an LPM trie of the allowlist's
//! prefixes, looked up by source before any bucket) draw from budgets of
//! their own instead: a bucket per peer in `REFLECTOR_PEER_SOURCES` (the
//! same per-source limit, in a map no stranger can insert into, so a flood
//! of forged sources never evicts it) and the peers' cap
//! `REFLECTOR_PEER_GLOBAL`. A flood from anywhere else spends only the
//! strangers' buckets and global cap. Counted apart: `peer_reflected` (a
//! part of the reflected ones), `peer_rate_limited`, `peer_global_limited`.
//!
//! Checksums: swapping addresses and ports leaves both sums unchanged (the
//! same words, reordered; the IPv6 pseudo-header too). The IPv4 checksum is
//! updated incrementally for the TTL word (IPv6 has none, and the hop limit
//! is not in the pseudo-header); the UDP checksum incrementally for every
//! payload word the reflector changes (RFC 1624). Over IPv4 a zero UDP
//! checksum (none) stays zero; over IPv6 it is malformed (RFC 8200 §8.1).
//! The incoming UDP checksum is not verified (that needs a loop over the
//! payload): a bad one stays bad. Frames must carry full checksums, so the
//! sending veth needs TX checksum offload off (as the router's setup does).
//!
//! Time: `bpf_ktime_get_tai_ns()` (CLOCK_TAI, Linux >= 6.1) plus the
//! TAI -> REALTIME offset user space measures and keeps in
//! `REFLECTOR_CLOCK` (a leap second changes it).
//!
//! Kernel interfaces: XDP (BPF_PROG_TYPE_XDP, XDP_TX, bpf_redirect), bpf_ktime_get_tai_ns
//! (6.1), bpf_ktime_get_ns, per-CPU arrays, HASH, LRU_HASH and LPM_TRIE maps, BPF_CMPXCHG on map
//! values (5.12), read-only global data set at load time (5.2). Minimum kernel: 6.1.

use aya_ebpf::{
    bindings::{BPF_NOEXIST, xdp_action},
    helpers::{bpf_ktime_get_ns, bpf_ktime_get_tai_ns, bpf_redirect},
    macros::{map, xdp},
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, lpm_trie::Key},
    programs::XdpContext,
};
use xdp_common::{
    AddrKey, AddrKind, Counter, CsumDelta, Gcra, REFLECT_TTL, REFLECTOR_ADDRS_MAX,
    REFLECTOR_OUTCOME_COUNT, REFLECTOR_PEER_SOURCES_MAX, REFLECTOR_PEERS_MAX,
    REFLECTOR_SOURCES_MAX, RTPB_FLAG_ECHO, RTPB_HEADER_LEN, RTPB_KTIMES_MIN_LEN,
    RTPB_KTIMES_OFFSET, RTPB_MAGIC, RTPB_VERSION, ReflectorClock, ReflectorIface, ReflectorOutcome,
    STAMP_UNAUTH_LEN, addr_key_v4, csum_replace2, ipv4_bad_source, ipv6_bad_source, rate_key,
    realtime_ns_to_ntp, rtpb_mark_echo, rtpb_write_times, stamp_reflect,
};

use crate::{
    ETH_HLEN, ETH_P_IP, ETH_P_IPV6, EthHdr, IPV4_HLEN, IPV6_HLEN, Ipv4Hdr, Ipv6Hdr, ptr_at,
};
use aya_log_ebpf::{debug, warn};

/// UDP destination port of rtprobe probes (host order), set at load time.
#[unsafe(no_mangle)]
static REFLECT_PORT: u16 = 0;
/// UDP destination port of STAMP session-sender packets (host order), set
/// at load time; 0 answers no STAMP.
#[unsafe(no_mangle)]
static STAMP_PORT: u16 = 0;
/// Interface to redirect replies to (its own), set at load time; 0: XDP_TX.
#[unsafe(no_mangle)]
static REPLY_IFINDEX: u32 = 0;

/// The per-source limit (see [`Gcra`]), set at load time; interval 0: none.
#[unsafe(no_mangle)]
static SOURCE_INTERVAL_NS: u64 = 0;
#[unsafe(no_mangle)]
static SOURCE_TOLERANCE_NS: u64 = 0;
/// The global cap on replies, set at load time; interval 0: none.
#[unsafe(no_mangle)]
static GLOBAL_INTERVAL_NS: u64 = 0;
#[unsafe(no_mangle)]
static GLOBAL_TOLERANCE_NS: u64 = 0;
/// The cap on replies to all known peers together, set at load time;
/// interval 0: none.
#[unsafe(no_mangle)]
static PEER_GLOBAL_INTERVAL_NS: u64 = 0;
#[unsafe(no_mangle)]
static PEER_GLOBAL_TOLERANCE_NS: u64 = 0;

/// The interface's MAC, filled by user space before attaching (all zero:
/// nothing is answered).
#[map(name = "REFLECTOR_IFACE")]
static REFLECTOR_IFACE: Array<ReflectorIface> = Array::with_max_entries(1, 0);

/// The interface's addresses and its subnets' broadcasts ([`AddrKind`]).
#[map(name = "REFLECTOR_ADDRS")]
static REFLECTOR_ADDRS: HashMap<AddrKey, u8> = HashMap::with_max_entries(REFLECTOR_ADDRS_MAX, 0);

/// Each source's bucket (GCRA theoretical arrival time, monotonic ns),
/// keyed by `rate_key` (IPv6: the /64).
#[map(name = "REFLECTOR_SOURCES")]
static REFLECTOR_SOURCES: LruHashMap<AddrKey, u64> =
    LruHashMap::with_max_entries(REFLECTOR_SOURCES_MAX, 0);

/// The global bucket (every source but the known peers).
#[map(name = "REFLECTOR_GLOBAL")]
static REFLECTOR_GLOBAL: Array<u64> = Array::with_max_entries(1, 0);

/// The known peers' prefixes (value: the prefix's family, 4 or 6).
#[map(name = "REFLECTOR_PEERS")]
static REFLECTOR_PEERS: LpmTrie<AddrKey, u8> = LpmTrie::with_max_entries(REFLECTOR_PEERS_MAX, 0);

/// Each known peer's bucket, keyed by `rate_key` as the others'.
#[map(name = "REFLECTOR_PEER_SOURCES")]
static REFLECTOR_PEER_SOURCES: LruHashMap<AddrKey, u64> =
    LruHashMap::with_max_entries(REFLECTOR_PEER_SOURCES_MAX, 0);

/// The bucket all known peers share.
#[map(name = "REFLECTOR_PEER_GLOBAL")]
static REFLECTOR_PEER_GLOBAL: Array<u64> = Array::with_max_entries(1, 0);

#[map(name = "REFLECTOR_COUNTERS")]
static REFLECTOR_COUNTERS: PerCpuArray<Counter> =
    PerCpuArray::with_max_entries(REFLECTOR_OUTCOME_COUNT, 0);

#[map(name = "REFLECTOR_CLOCK")]
static REFLECTOR_CLOCK: Array<ReflectorClock> = Array::with_max_entries(1, 0);

const UDP_HLEN: usize = 8;
const IPPROTO_UDP: u8 = 17;
/// Offset of the UDP payload in an IPv4 frame without options.
const PAYLOAD_OFF_V4: usize = ETH_HLEN + IPV4_HLEN + UDP_HLEN;
/// Offset of the UDP payload in an IPv6 frame without extension headers.
const PAYLOAD_OFF_V6: usize = ETH_HLEN + IPV6_HLEN + UDP_HLEN;

/// UDP header: ports, length, checksum, network byte order.
type UdpHdr = [u8; UDP_HLEN];

#[xdp]
pub fn xdp_reflector(ctx: XdpContext) -> u32 {
    match try_reflector(&ctx) {
        Ok(action) | Err(action) => action,
    }
}

/// `Ok` carries the action for a frame the reflector handled (answered or
/// passed on purpose); `Err` the XDP_PASS of a malformed one.
#[inline(always)]
fn try_reflector(ctx: &XdpContext) -> Result<u32, u32> {
    // SAFETY: a helper without arguments.
    let rx_tai_ns = unsafe { bpf_ktime_get_tai_ns() } as i64;
    let len = (ctx.data_end() - ctx.data()) as u64;
    let eth: *mut EthHdr = ptr_at(ctx, 0).ok_or_else(|| malformed(ctx, len))?;
    // SAFETY: ptr_at checked that the whole header is inside the frame.
    match u16::from_be_bytes(unsafe { (*eth).proto }) {
        ETH_P_IP => reflect_ipv4(ctx, eth, rx_tai_ns, len),
        ETH_P_IPV6 => reflect_ipv6(ctx, eth, rx_tai_ns, len),
        _ => Ok(count(ReflectorOutcome::NotIp, len, xdp_action::XDP_PASS)),
    }
}

/// Counts a malformed frame and returns XDP_PASS.
#[inline(always)]
fn malformed(ctx: &XdpContext, len: u64) -> u32 {
    if crate::log_rare() {
        warn!(ctx, "reflector: malformed frame of {} bytes refused", len);
    }
    count(ReflectorOutcome::Malformed, len, xdp_action::XDP_PASS)
}

#[inline(always)]
fn reflect_ipv4(ctx: &XdpContext, eth: *mut EthHdr, rx_tai_ns: i64, len: u64) -> Result<u32, u32> {
    let pass = |o| Ok(count(o, len, xdp_action::XDP_PASS));
    let ip: *mut Ipv4Hdr = ptr_at(ctx, ETH_HLEN).ok_or_else(|| malformed(ctx, len))?;
    // SAFETY: the 20 bytes are inside the frame (checked by ptr_at).
    let hdr: &mut Ipv4Hdr = unsafe { &mut *ip };
    let tot_len = u16::from_be_bytes([hdr[2], hdr[3]]) as usize;
    if hdr[0] >> 4 != 4
        || hdr[0] & 0x0f < 5
        || tot_len < IPV4_HLEN
        || (ETH_HLEN + tot_len) as u64 > len
    {
        return Err(malformed(ctx, len));
    }
    if hdr[9] != IPPROTO_UDP {
        return pass(ReflectorOutcome::NotProbe);
    }
    // Options would move the UDP header; fragments carry no or part of a
    // payload. The kernel reassembles, the user-space reflector answers.
    if hdr[0] & 0x0f != 5 || u16::from_be_bytes([hdr[6], hdr[7]]) & 0x3fff != 0 {
        return pass(ReflectorOutcome::NotProbe);
    }
    if !xdp_common::ipv4_checksum_ok(hdr) {
        return Err(malformed(ctx, len));
    }
    let udp: *mut UdpHdr = ptr_at(ctx, ETH_HLEN + IPV4_HLEN).ok_or_else(|| malformed(ctx, len))?;
    // SAFETY: inside the frame (checked by ptr_at).
    let uh: &mut UdpHdr = unsafe { &mut *udp };
    let udp_len = u16::from_be_bytes([uh[4], uh[5]]) as usize;
    if udp_len < UDP_HLEN || udp_len > tot_len - IPV4_HLEN {
        return Err(malformed(ctx, len));
    }
    let payload_len = udp_len - UDP_HLEN;
    let kind = classify::<PAYLOAD_OFF_V4>(ctx, uh, payload_len, len)?;
    let src = [hdr[12], hdr[13], hdr[14], hdr[15]];
    let dst = [hdr[16], hdr[17], hdr[18], hdr[19]];
    let peer = admit(
        eth,
        &addr_key_v4(dst),
        &addr_key_v4(src),
        ipv4_bad_source(src),
        len,
    )?;
    let (delta, outcome) =
        rewrite::<PAYLOAD_OFF_V4>(ctx, kind, payload_len, hdr[8], rx_tai_ns, len)?;
    count_peer(peer, len);
    // Fresh TTL, with the IP checksum updated for its word.
    let ip_check = u16::from_be_bytes([hdr[10], hdr[11]]);
    let new_ip_check = csum_replace2(
        ip_check,
        u16::from_be_bytes([hdr[8], hdr[9]]),
        u16::from_be_bytes([REFLECT_TTL, hdr[9]]),
    )
    .to_be_bytes();
    hdr[8] = REFLECT_TTL;
    hdr[10] = new_ip_check[0];
    hdr[11] = new_ip_check[1];
    // Source and destination address: bytes 12..16 and 16..20.
    let mut i = 12;
    while i < 16 {
        hdr.swap(i, i + 4);
        i += 1;
    }
    // IPv4: a zero UDP checksum means none and stays zero.
    let check = u16::from_be_bytes([uh[6], uh[7]]);
    Ok(reply(eth, uh, delta.apply_udp(check), outcome, len))
}

#[inline(always)]
fn reflect_ipv6(ctx: &XdpContext, eth: *mut EthHdr, rx_tai_ns: i64, len: u64) -> Result<u32, u32> {
    let pass = |o| Ok(count(o, len, xdp_action::XDP_PASS));
    let ip: *mut Ipv6Hdr = ptr_at(ctx, ETH_HLEN).ok_or_else(|| malformed(ctx, len))?;
    // SAFETY: the 40 bytes are inside the frame (checked by ptr_at).
    let hdr: &mut Ipv6Hdr = unsafe { &mut *ip };
    let payload_len = u16::from_be_bytes([hdr[4], hdr[5]]) as usize;
    if hdr[0] >> 4 != 6 || (ETH_HLEN + IPV6_HLEN + payload_len) as u64 > len {
        return Err(malformed(ctx, len));
    }
    // UDP right after the fixed header only: an extension header (hop by
    // hop, routing, fragment...) is the kernel's, the user-space
    // reflector answers what it delivers.
    if hdr[6] != IPPROTO_UDP {
        return pass(ReflectorOutcome::NotProbe);
    }
    let udp: *mut UdpHdr = ptr_at(ctx, ETH_HLEN + IPV6_HLEN).ok_or_else(|| malformed(ctx, len))?;
    // SAFETY: inside the frame (checked by ptr_at).
    let uh: &mut UdpHdr = unsafe { &mut *udp };
    let udp_len = u16::from_be_bytes([uh[4], uh[5]]) as usize;
    // A zero checksum is not allowed over IPv6 (RFC 8200 §8.1): the
    // kernel drops such a datagram, and so the reflector does not answer it.
    if udp_len < UDP_HLEN || udp_len > payload_len || (uh[6] == 0 && uh[7] == 0) {
        return Err(malformed(ctx, len));
    }
    let payload_len = udp_len - UDP_HLEN;
    let kind = classify::<PAYLOAD_OFF_V6>(ctx, uh, payload_len, len)?;
    let mut src: AddrKey = [0; 16];
    let mut dst: AddrKey = [0; 16];
    src.copy_from_slice(&hdr[8..24]);
    dst.copy_from_slice(&hdr[24..40]);
    let peer = admit(eth, &dst, &src, ipv6_bad_source(&src), len)?;
    let (delta, outcome) =
        rewrite::<PAYLOAD_OFF_V6>(ctx, kind, payload_len, hdr[7], rx_tai_ns, len)?;
    count_peer(peer, len);
    // Fresh hop limit (no header checksum, not in the pseudo-header).
    hdr[7] = REFLECT_TTL;
    // Source and destination address: bytes 8..24 and 24..40.
    let mut i = 8;
    while i < 24 {
        hdr.swap(i, i + 16);
        i += 1;
    }
    let check = u16::from_be_bytes([uh[6], uh[7]]);
    let new = match delta.apply(check) {
        0 => 0xffff,
        c => c,
    };
    Ok(reply(eth, uh, new, outcome, len))
}

/// What an answerable payload is.
#[derive(Clone, Copy)]
enum Kind {
    Rtprobe,
    Stamp,
}

/// Whether the payload at `OFF` (after the UDP header `uh`) is one the
/// reflector answers: an rtprobe probe to the probe port, a STAMP
/// session-sender packet to the STAMP port. Reads only; `Err` is the
/// (counted) action for a frame it does not answer.
#[inline(always)]
fn classify<const OFF: usize>(
    ctx: &XdpContext,
    uh: &UdpHdr,
    payload_len: usize,
    len: u64,
) -> Result<Kind, u32> {
    let not_ours = |o| Err(count(o, len, xdp_action::XDP_PASS));
    let dport = u16::from_be_bytes([uh[2], uh[3]]);
    // SAFETY: read-only globals; volatile so the compiler does not fold
    // them to their initial values.
    let (probe_port, stamp_port) = unsafe {
        (
            core::ptr::read_volatile(&REFLECT_PORT),
            core::ptr::read_volatile(&STAMP_PORT),
        )
    };
    if dport == probe_port && probe_port != 0 {
        if payload_len < RTPB_HEADER_LEN {
            return not_ours(ReflectorOutcome::NotProbe);
        }
        let p: *const [u8; RTPB_HEADER_LEN] =
            ptr_at(ctx, OFF).ok_or_else(|| malformed(ctx, len))?;
        // SAFETY: inside the frame (checked by ptr_at).
        let probe = unsafe { &*p };
        if probe[0..4] != RTPB_MAGIC || probe[4] != RTPB_VERSION {
            return not_ours(ReflectorOutcome::NotProbe);
        }
        if probe[5] & RTPB_FLAG_ECHO != 0 {
            return not_ours(ReflectorOutcome::Echo);
        }
        Ok(Kind::Rtprobe)
    } else if dport == stamp_port && stamp_port != 0 {
        if payload_len < STAMP_UNAUTH_LEN {
            return Err(malformed(ctx, len));
        }
        Ok(Kind::Stamp)
    } else {
        not_ours(ReflectorOutcome::NotProbe)
    }
}

/// Whether a probe from `src` to `dst` (map keys; `src_bad`: a source
/// class no unicast reply may go to) in the frame at `eth` may be
/// answered: addressed to this interface's MAC and one of its addresses,
/// from a unicast source that is none of them, within the source's rate
/// and the global cap (a known peer's: its own bucket and the peers' cap).
/// `Ok(true)`: the source is a known peer. `Err` is the (counted) action
/// of a refusal:
/// XDP_PASS of a frame for another host or address (the kernel forwards or
/// drops it as it would without the reflector), XDP_DROP of a probe from a
/// bad source or over a limit.
#[inline(always)]
fn admit(
    eth: *const EthHdr,
    dst: &AddrKey,
    src: &AddrKey,
    src_bad: bool,
    len: u64,
) -> Result<bool, u32> {
    let refuse = |o| Err(count(o, len, xdp_action::XDP_PASS));
    // SAFETY: eth is inside the frame (checked by ptr_at).
    let (dst_mac, src_mac) = unsafe { ((*eth).dst, (*eth).src) };
    let own_mac = REFLECTOR_IFACE.get(0).map(|i| i.mac).unwrap_or([0; 6]);
    // An unset MAC (all zero, as loaded) answers nothing.
    if own_mac == [0; 6] || dst_mac != own_mac {
        return refuse(ReflectorOutcome::NotForUs);
    }
    // SAFETY: the map's values are plain bytes, read once.
    if unsafe { REFLECTOR_ADDRS.get(dst) }.copied() != Some(AddrKind::Own as u8) {
        return refuse(ReflectorOutcome::NotForUs);
    }
    // A group MAC (bit 0 of the first byte: broadcast, multicast) or an
    // address of ours (or a subnet broadcast) as source would turn the
    // reply into a broadcast or send it to ourselves.
    // Dropped, not passed: the kernel would deliver some of them (a subnet
    // broadcast source is no martian) to a user-space reflector.
    if src_mac[0] & 1 != 0 || src_bad || REFLECTOR_ADDRS.get_ptr(src).is_some() {
        return Err(count(
            ReflectorOutcome::BadSource,
            len,
            xdp_action::XDP_DROP,
        ));
    }
    // Before any bucket: a known peer draws from budgets of its own.
    let peer = is_peer(src);
    within_limits(src, peer, len)?;
    Ok(peer)
}

/// Whether a probe from `src` (`peer`: a known peer's) is within its
/// source's limit and its cap: the strangers' global one, or the peers'.
/// `Err` is the counted XDP_DROP of one over a limit.
#[inline(always)]
fn within_limits(src: &AddrKey, peer: bool, len: u64) -> Result<(), u32> {
    // SAFETY: read-only globals, volatile as above.
    let (source, cap) = unsafe {
        (
            Gcra {
                interval_ns: core::ptr::read_volatile(&SOURCE_INTERVAL_NS),
                tolerance_ns: core::ptr::read_volatile(&SOURCE_TOLERANCE_NS),
            },
            if peer {
                Gcra {
                    interval_ns: core::ptr::read_volatile(&PEER_GLOBAL_INTERVAL_NS),
                    tolerance_ns: core::ptr::read_volatile(&PEER_GLOBAL_TOLERANCE_NS),
                }
            } else {
                Gcra {
                    interval_ns: core::ptr::read_volatile(&GLOBAL_INTERVAL_NS),
                    tolerance_ns: core::ptr::read_volatile(&GLOBAL_TOLERANCE_NS),
                }
            },
        )
    };
    if source.interval_ns == 0 && cap.interval_ns == 0 {
        return Ok(());
    }
    // Monotonic, unlike the TAI time in the reply: a clock step must not
    // refill or drain the buckets.
    // SAFETY: a helper without arguments.
    let now_ns = unsafe { bpf_ktime_get_ns() };
    // The source's bucket first: a source over its own limit must not
    // spend the global budget the others share.
    // Dropped, not passed: passed, the probe would reach `rtprobe
    // reflect`'s socket on the same port and be answered there too.
    let drop = |o| Err(count(o, len, xdp_action::XDP_DROP));
    let (sources, limited, capped) = if peer {
        (
            &REFLECTOR_PEER_SOURCES,
            ReflectorOutcome::PeerRateLimited,
            ReflectorOutcome::PeerGlobalLimited,
        )
    } else {
        (
            &REFLECTOR_SOURCES,
            ReflectorOutcome::RateLimited,
            ReflectorOutcome::GlobalLimited,
        )
    };
    // Keyed by the /64 for IPv6 (one host's worth), by address for IPv4.
    if source.interval_ns != 0 && !take_source(sources, &rate_key(src), now_ns, source) {
        return drop(limited);
    }
    if cap.interval_ns != 0 {
        let bucket = if peer {
            REFLECTOR_PEER_GLOBAL.get_ptr_mut(0)
        } else {
            REFLECTOR_GLOBAL.get_ptr_mut(0)
        };
        let taken = match bucket {
            Some(tat) => take(tat, now_ns, cap),
            None => false,
        };
        if !taken {
            return drop(capped);
        }
    }
    Ok(())
}

/// Whether `src` is inside a known peer's prefix of its own family (an
/// IPv6 prefix such as ::/0 also covers the IPv4-mapped keys, which are
/// IPv4 sources: the family stored with the prefix tells them apart).
#[inline(always)]
fn is_peer(src: &AddrKey) -> bool {
    let family = if xdp_common::addr_key_is_v4(src) {
        4
    } else {
        6
    };
    REFLECTOR_PEERS
        .get(&Key::new(128, *src))
        .is_some_and(|f| *f == family)
}

/// Counts a reply to a known peer (besides its kind).
#[inline(always)]
fn count_peer(peer: bool, len: u64) {
    if peer {
        count(ReflectorOutcome::PeerReflected, len, 0);
    }
}

/// Takes a token from the bucket under `key` (a [`rate_key`]) in
/// `sources`, creating it (full) on its first probe.
#[inline(always)]
fn take_source(sources: &LruHashMap<AddrKey, u64>, key: &AddrKey, now_ns: u64, g: Gcra) -> bool {
    if let Some(tat) = sources.get_ptr_mut(key) {
        return take(tat, now_ns, g);
    }
    // A full bucket less this probe's token. NOEXIST: if another CPU
    // created it meanwhile, take from that one instead of resetting it.
    let first = now_ns + g.interval_ns;
    if sources.insert(key, &first, BPF_NOEXIST as u64).is_ok() {
        return true;
    }
    match sources.get_ptr_mut(key) {
        Some(tat) => take(tat, now_ns, g),
        None => false,
    }
}

/// Takes a token from the bucket whose theoretical arrival time is at
/// `tat`, shared by every CPU. The update is one compare-and-swap of the
/// word read (BPF_CMPXCHG, fully ordered): if another CPU changed it in
/// between, the swap fails and the token is not taken, so concurrent
/// probes can only be refused more, never answered beyond the bucket.
/// One retry keeps a legitimate source's rare collision from refusing it.
#[inline(always)]
fn take(tat: *mut u64, now_ns: u64, g: Gcra) -> bool {
    let mut tries = 0;
    while tries < 2 {
        // An aligned 8-byte load is one instruction, never torn (LLVM's
        // BPF backend selects no atomic load below CPU v4).
        // SAFETY: a map value of 8 bytes, 8-byte aligned, alive while the
        // program runs.
        let old = unsafe { core::ptr::read_volatile(tat) };
        let Some(new) = g.admit(old, now_ns) else {
            return false;
        };
        // SAFETY: as above.
        if unsafe { compare_and_swap(tat, old, new) } {
            return true;
        }
        tries += 1;
    }
    false
}

/// Stores `new` at `p` if it still holds `old`; true if it did.
///
/// The eBPF target declares no compare-and-swap to Rust (its spec has
/// `atomic_cas: false`, so `AtomicU64::compare_exchange` does not exist
/// there), although BPF has had BPF_CMPXCHG since Linux 5.12 and LLVM
/// emits it for the default CPU (v3): the intrinsic behind
/// `compare_exchange` gives that instruction.
///
/// # Safety
/// `p` is valid, aligned and only accessed atomically.
#[cfg(target_arch = "bpf")]
#[inline(always)]
unsafe fn compare_and_swap(p: *mut u64, old: u64, new: u64) -> bool {
    use core::intrinsics::{AtomicOrdering, atomic_cxchg};
    // The swap happened iff the word held `old`: compare the value it
    // returns rather than use its success flag, whose `bool` rustc
    // 1.98-nightly lowers to an invalid `br i8` once inlined here (LLVM's
    // reader, in bpf-linker, rejects the bitcode: "Invalid record").
    // SAFETY: the caller's.
    let (seen, _) = unsafe {
        atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(p, old, new)
    };
    seen == old
}

/// The host build (type-checking only) has the stable operation.
#[cfg(not(target_arch = "bpf"))]
#[inline(always)]
unsafe fn compare_and_swap(p: *mut u64, old: u64, new: u64) -> bool {
    use core::sync::atomic::{AtomicU64, Ordering};
    // SAFETY: the caller's.
    unsafe { AtomicU64::from_ptr(p) }
        .compare_exchange(old, new, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
}

/// Turns the payload at `OFF`, classified as `kind`, into the reply
/// (`ttl`: the one the probe arrived with). Returns the payload's checksum
/// change and the outcome to count.
#[inline(always)]
fn rewrite<const OFF: usize>(
    ctx: &XdpContext,
    kind: Kind,
    payload_len: usize,
    ttl: u8,
    rx_tai_ns: i64,
    len: u64,
) -> Result<(CsumDelta, ReflectorOutcome), u32> {
    let clock = REFLECTOR_CLOCK.get(0).copied().unwrap_or_default();
    let rx_ns = rx_tai_ns + clock.tai_to_realtime_ns;
    match kind {
        Kind::Rtprobe => {
            let p: *mut [u8; RTPB_HEADER_LEN] =
                ptr_at(ctx, OFF).ok_or_else(|| malformed(ctx, len))?;
            // SAFETY: inside the frame (checked by ptr_at).
            let probe = unsafe { &mut *p };
            if payload_len >= RTPB_KTIMES_MIN_LEN {
                let t: *mut [u8; 16] =
                    ptr_at(ctx, OFF + RTPB_KTIMES_OFFSET).ok_or_else(|| malformed(ctx, len))?;
                let d = rtpb_mark_echo(probe, true);
                // SAFETY: ktime helper; t is inside the frame (checked by ptr_at).
                let tx_ns = unsafe { bpf_ktime_get_tai_ns() } as i64 + clock.tai_to_realtime_ns;
                // SAFETY: t is inside the frame (checked by ptr_at), nothing else refers to it.
                let w = rtpb_write_times(unsafe { &mut *t }, rx_ns, tx_ns);
                Ok((d.merge(w), ReflectorOutcome::ReflectedRtprobe))
            } else {
                if crate::log_rare() {
                    debug!(
                        ctx,
                        "reflector: {}-byte probe has no room for kernel times", payload_len
                    );
                }
                count(ReflectorOutcome::NoRoomForTimes, len, 0);
                Ok((
                    rtpb_mark_echo(probe, false),
                    ReflectorOutcome::ReflectedRtprobe,
                ))
            }
        }
        Kind::Stamp => {
            let p: *mut [u8; STAMP_UNAUTH_LEN] =
                ptr_at(ctx, OFF).ok_or_else(|| malformed(ctx, len))?;
            // SAFETY: ktime helper; p is inside the frame (checked by ptr_at).
            let tx_ns = unsafe { bpf_ktime_get_tai_ns() } as i64 + clock.tai_to_realtime_ns;
            let d = stamp_reflect(
                // SAFETY: p is inside the frame (checked by ptr_at), nothing else refers to it.
                unsafe { &mut *p },
                ttl,
                clock.stamp_error_estimate,
                realtime_ns_to_ntp(rx_ns),
                realtime_ns_to_ntp(tx_ns),
            );
            Ok((d, ReflectorOutcome::ReflectedStamp))
        }
    }
}

/// The rest of the reply for either family: UDP ports swapped (sums
/// unchanged) with the new checksum, MACs swapped, and the action.
#[inline(always)]
fn reply(
    eth: *mut EthHdr,
    uh: &mut UdpHdr,
    udp_check: u16,
    outcome: ReflectorOutcome,
    len: u64,
) -> u32 {
    let udp_check = udp_check.to_be_bytes();
    let (sport, dport_b) = ([uh[0], uh[1]], [uh[2], uh[3]]);
    uh[0] = dport_b[0];
    uh[1] = dport_b[1];
    uh[2] = sport[0];
    uh[3] = sport[1];
    uh[6] = udp_check[0];
    uh[7] = udp_check[1];
    // SAFETY: eth is inside the frame (checked by ptr_at), and src and dst
    // are two distinct fields of it.
    unsafe { core::mem::swap(&mut (*eth).src, &mut (*eth).dst) };
    // SAFETY: a read-only global, volatile as above.
    let reply_ifindex = unsafe { core::ptr::read_volatile(&REPLY_IFINDEX) };
    let action = if reply_ifindex == 0 {
        xdp_action::XDP_TX
    } else {
        // SAFETY: a helper taking plain integers; it returns XDP_REDIRECT,
        // or XDP_ABORTED (flags 0) when the ifindex is bad.
        unsafe { bpf_redirect(reply_ifindex, 0) as u32 }
    };
    count(outcome, len, action)
}

/// Counts the frame under `outcome` and returns `action`.
#[inline(always)]
fn count(outcome: ReflectorOutcome, len: u64, action: u32) -> u32 {
    if let Some(c) = REFLECTOR_COUNTERS.get_ptr_mut(outcome.index()) {
        // SAFETY: a per-CPU slot, only this CPU writes it while we run.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += len;
        }
    }
    action
}
