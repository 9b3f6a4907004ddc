//! Types shared by the XDP router (eBPF side) and rtprobe (user side).
//!
//! Everything here is `#[repr(C)]` without implicit padding so both sides
//! read the same bytes, and the pure helpers (checksums) are unit-tested on
//! the host with `cargo test -p xdp-common`.
#![no_std]

/// The nightly that builds the eBPF program (`-Z build-std=core`). Its LLVM
/// (22) must not be newer than bpf-linker's (built against llvm-22-dev),
/// and its rustc not older than aya-ebpf's rust-version (1.98): a 1.98
/// nightly, the 1.99 ones being on LLVM 23. Used by `prober/build.rs` and
/// `cargo xtask`, so it lives here, the one crate both already depend on.
pub const EBPF_TOOLCHAIN: &str = "nightly-2026-07-01";
/// The bpf-linker release that links it (built against LLVM 22).
pub const BPF_LINKER_VERSION: &str = "0.13";
/// The target the eBPF program is built for.
pub const EBPF_TARGET: &str = "bpfel-unknown-none";

/// Name of the XDP program in the object file.
pub const PROGRAM_NAME: &str = "xdp_router";
/// Per-CPU array of [`Counter`], indexed by [`Outcome`]: IPv4 frames and
/// frames of no IP family.
pub const COUNTERS_MAP: &str = "COUNTERS";
/// The same for IPv6 frames.
pub const COUNTERS6_MAP: &str = "COUNTERS6";
/// Prefix of the IPv6 outcomes' names in summaries ("ipv6_redirected").
pub const IPV6_PREFIX: &str = "ipv6_";
/// DEVMAP_HASH keyed by ifindex: the interfaces the router may redirect to.
pub const EGRESS_MAP: &str = "EGRESS";
/// `u8` global: non-zero makes the program a pure XDP_PASS program.
pub const PASS_ONLY_GLOBAL: &str = "PASS_ONLY";
/// Load-time global of the router and reflector: non-zero logs their rare
/// paths through aya-log (`rtprobe -vv`).
pub const LOG_RARE_GLOBAL: &str = "LOG_RARE";
/// Capacity of [`EGRESS_MAP`]; a router has few ports.
pub const EGRESS_MAX_ENTRIES: u32 = 64;

/// What the router did with one frame; the index into [`COUNTERS_MAP`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Forwarded in XDP: TTL decremented, MACs rewritten, XDP_REDIRECT.
    Redirected = 0,
    /// XDP_PASS because the FIB lookup did not give a usable next hop (no
    /// neighbour yet, local delivery, MTU exceeded, forwarding off...): the
    /// kernel handles it.
    Passed = 1,
    /// XDP_PASS because TTL (IPv6: hop limit) <= 1: the kernel sends ICMP
    /// time exceeded.
    PassTtl = 2,
    /// XDP_PASS because the IPv4 header has options the kernel must process
    /// (record route, timestamps, source routing), or the IPv6 header is
    /// followed by an extension header (hop-by-hop, routing, fragment...).
    PassIpOptions = 3,
    /// XDP_PASS because the egress interface is not in [`EGRESS_MAP`].
    PassNotInMap = 4,
    /// XDP_PASS because the program runs in pass-only mode.
    PassOnly = 5,
    /// XDP_DROP: the route is blackhole, unreachable or prohibit.
    DroppedUnreachable = 6,
    /// XDP_PASS of a truncated or inconsistent Ethernet/IPv4 frame (the kernel
    /// counts and drops it).
    Malformed = 7,
    /// XDP_PASS of anything that is neither IPv4 nor IPv6 (ARP, VLAN-tagged...).
    NotIp = 8,
}

/// Number of [`Outcome`]s (the size of [`COUNTERS_MAP`]).
pub const OUTCOME_COUNT: u32 = 9;

impl Outcome {
    /// Every outcome in index order.
    pub const ALL: [Outcome; OUTCOME_COUNT as usize] = [
        Outcome::Redirected,
        Outcome::Passed,
        Outcome::PassTtl,
        Outcome::PassIpOptions,
        Outcome::PassNotInMap,
        Outcome::PassOnly,
        Outcome::DroppedUnreachable,
        Outcome::Malformed,
        Outcome::NotIp,
    ];

    pub const fn index(self) -> u32 {
        self as u32
    }

    /// Stable name used in summaries, JSON and CSV metadata.
    pub const fn name(self) -> &'static str {
        match self {
            Outcome::Redirected => "redirected",
            Outcome::Passed => "passed",
            Outcome::PassTtl => "pass_ttl",
            Outcome::PassIpOptions => "pass_ip_options",
            Outcome::PassNotInMap => "pass_not_in_map",
            Outcome::PassOnly => "pass_only",
            Outcome::DroppedUnreachable => "dropped_unreachable",
            Outcome::Malformed => "malformed",
            Outcome::NotIp => "not_ip",
        }
    }

    /// The outcomes an IPv6 frame can have (pass-only mode and "not IP"
    /// are counted before the family is known, in [`COUNTERS_MAP`]).
    pub const IPV6: [Outcome; 7] = [
        Outcome::Redirected,
        Outcome::Passed,
        Outcome::PassTtl,
        Outcome::PassIpOptions,
        Outcome::PassNotInMap,
        Outcome::DroppedUnreachable,
        Outcome::Malformed,
    ];

    /// Name of the outcome in [`COUNTERS6_MAP`]: [`IPV6_PREFIX`] + [`Self::name`].
    pub const fn name6(self) -> &'static str {
        match self {
            Outcome::Redirected => "ipv6_redirected",
            Outcome::Passed => "ipv6_passed",
            Outcome::PassTtl => "ipv6_pass_ttl",
            Outcome::PassIpOptions => "ipv6_pass_ip_options",
            Outcome::PassNotInMap => "ipv6_pass_not_in_map",
            Outcome::PassOnly => "ipv6_pass_only",
            Outcome::DroppedUnreachable => "ipv6_dropped_unreachable",
            Outcome::Malformed => "ipv6_malformed",
            Outcome::NotIp => "ipv6_not_ip",
        }
    }
}

/// Packets and bytes (whole frame, Ethernet header included) of one outcome
/// on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}

// SAFETY: two u64, no padding, every bit pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for Counter {}

/// Folds a 32-bit one's complement sum to 16 bits (end-around carry).
#[inline(always)]
pub const fn csum_fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// Incremental update of an Internet checksum when one 16-bit word of the
/// covered data changes from `old` to `new` (RFC 1624, eqn. 3:
/// `HC' = ~(~HC + ~m + m')`). All three values are the words as read in
/// network byte order (`u16::from_be_bytes`).
#[inline(always)]
pub const fn csum_replace2(check: u16, old: u16, new: u16) -> u16 {
    let sum = (!check as u32) + (!old as u32) + (new as u32);
    !csum_fold(sum)
}

/// The IPv4 header checksum after decrementing TTL by one. `check` is the
/// current checksum; `ttl` (>= 1) and `protocol` share the header's 16-bit
/// word at offset 8, the only word that changes.
#[inline(always)]
pub const fn ttl_decrement_csum(check: u16, ttl: u8, protocol: u8) -> u16 {
    let old = u16::from_be_bytes([ttl, protocol]);
    let new = u16::from_be_bytes([ttl.wrapping_sub(1), protocol]);
    csum_replace2(check, old, new)
}

/// One's complement sum of a 20-byte IPv4 header (no options), checksum
/// field included. A correct header sums to 0xffff.
#[inline(always)]
pub fn ipv4_header_sum(hdr: &[u8; 20]) -> u16 {
    let mut sum: u32 = 0;
    let mut i = 0;
    while i < 20 {
        sum += u16::from_be_bytes([hdr[i], hdr[i + 1]]) as u32;
        i += 2;
    }
    csum_fold(sum)
}

/// True if an IPv6 next-header value names an extension header (RFC 8200
/// §4, and the IANA list of IPv6 extension header types: hop-by-hop,
/// routing, fragment, ESP, AH, destination options, mobility, HIP, shim6
/// and the two experimental values) rather than an upper-layer protocol.
#[inline(always)]
pub const fn ipv6_is_extension_header(next_header: u8) -> bool {
    matches!(
        next_header,
        0 | 43 | 44 | 50 | 51 | 60 | 135 | 139 | 140 | 253 | 254
    )
}

/// True if the 20-byte IPv4 header's checksum verifies.
#[inline(always)]
pub fn ipv4_checksum_ok(hdr: &[u8; 20]) -> bool {
    ipv4_header_sum(hdr) == 0xffff
}

/// The checksum to store in a 20-byte IPv4 header (its checksum field is
/// treated as zero).
pub fn ipv4_checksum(hdr: &[u8; 20]) -> u16 {
    let mut h = *hdr;
    h[10] = 0;
    h[11] = 0;
    !ipv4_header_sum(&h)
}

// ------------------------------------------------------------ the reflector

/// Name of the in-kernel reflector's XDP program (same object as the router).
pub const REFLECTOR_PROGRAM_NAME: &str = "xdp_reflector";
/// Per-CPU array of [`Counter`], indexed by [`ReflectorOutcome`].
pub const REFLECTOR_COUNTERS_MAP: &str = "REFLECTOR_COUNTERS";
/// ARRAY of one [`ReflectorClock`], written by user space at attach time
/// and refreshed while it runs.
pub const REFLECTOR_CLOCK_MAP: &str = "REFLECTOR_CLOCK";
/// `u16` global (host order): UDP destination port of rtprobe probes to answer.
pub const REFLECT_PORT_GLOBAL: &str = "REFLECT_PORT";
/// `u16` global (host order): UDP destination port of STAMP session-sender
/// packets to answer; 0 answers none.
pub const STAMP_PORT_GLOBAL: &str = "STAMP_PORT";
/// `u32` global: ifindex the reflector sends its replies out of by
/// `bpf_redirect` (its own interface); 0 sends them with XDP_TX.
pub const REPLY_IFINDEX_GLOBAL: &str = "REPLY_IFINDEX";
/// ARRAY of one [`ReflectorIface`]: the MAC frames must be addressed to.
/// All zero (as loaded) answers nothing.
pub const REFLECTOR_IFACE_MAP: &str = "REFLECTOR_IFACE";
/// HASH of [`AddrKey`] -> [`AddrKind`] as `u8`: the interface's own
/// addresses (the only destinations answered, never a source) and its
/// IPv4 subnets' broadcast and network addresses (never a source).
pub const REFLECTOR_ADDRS_MAP: &str = "REFLECTOR_ADDRS";
/// Capacity of [`REFLECTOR_ADDRS_MAP`].
pub const REFLECTOR_ADDRS_MAX: u32 = 256;
/// LRU_HASH of [`rate_key`] -> `u64`: each source's (IPv6: each /64's)
/// token bucket, kept as the GCRA's theoretical arrival time in
/// `bpf_ktime_get_ns` ns (see [`Gcra::admit`]).
pub const REFLECTOR_SOURCES_MAP: &str = "REFLECTOR_SOURCES";
/// Capacity of [`REFLECTOR_SOURCES_MAP`]: sources tracked at once. A flood
/// from more sources evicts the least recently seen, whose next probe
/// starts with a full burst again; the global cap bounds that case.
pub const REFLECTOR_SOURCES_MAX: u32 = 65_536;
/// ARRAY of one `u64`: the global bucket's theoretical arrival time.
pub const REFLECTOR_GLOBAL_MAP: &str = "REFLECTOR_GLOBAL";
/// LPM_TRIE of (prefix length, [`AddrKey`]) -> `u8` (4 or 6: the
/// prefix's family, which must be the source's): the
/// known peers, whose probes draw from budgets no other source can spend
/// ([`REFLECTOR_PEER_SOURCES_MAP`], [`REFLECTOR_PEER_GLOBAL_MAP`]) instead
/// of [`REFLECTOR_SOURCES_MAP`] and [`REFLECTOR_GLOBAL_MAP`]. IPv4
/// prefixes are keyed IPv4-mapped, 96 bits longer.
pub const REFLECTOR_PEERS_MAP: &str = "REFLECTOR_PEERS";
/// Capacity of [`REFLECTOR_PEERS_MAP`]: prefixes in the allowlist.
pub const REFLECTOR_PEERS_MAX: u32 = 16_384;
/// LRU_HASH of [`rate_key`] -> `u64`: each known peer's bucket, apart from
/// every other source's so that no flood evicts it.
pub const REFLECTOR_PEER_SOURCES_MAP: &str = "REFLECTOR_PEER_SOURCES";
/// Capacity of [`REFLECTOR_PEER_SOURCES_MAP`].
pub const REFLECTOR_PEER_SOURCES_MAX: u32 = 16_384;
/// ARRAY of one `u64`: the bucket all known peers share.
pub const REFLECTOR_PEER_GLOBAL_MAP: &str = "REFLECTOR_PEER_GLOBAL";
/// `u64` globals: the per-source limit as a [`Gcra`] (0 interval: none).
pub const SOURCE_INTERVAL_GLOBAL: &str = "SOURCE_INTERVAL_NS";
pub const SOURCE_TOLERANCE_GLOBAL: &str = "SOURCE_TOLERANCE_NS";
/// `u64` globals: the global cap as a [`Gcra`] (0 interval: none).
pub const GLOBAL_INTERVAL_GLOBAL: &str = "GLOBAL_INTERVAL_NS";
pub const GLOBAL_TOLERANCE_GLOBAL: &str = "GLOBAL_TOLERANCE_NS";
/// `u64` globals: the cap over all known peers as a [`Gcra`] (0 interval: none).
pub const PEER_GLOBAL_INTERVAL_GLOBAL: &str = "PEER_GLOBAL_INTERVAL_NS";
pub const PEER_GLOBAL_TOLERANCE_GLOBAL: &str = "PEER_GLOBAL_TOLERANCE_NS";

/// The interface the reflector answers for, the one entry of
/// [`REFLECTOR_IFACE_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReflectorIface {
    pub mac: [u8; 6],
    /// Explicit padding to 8 bytes, zero.
    pub _pad: [u8; 2],
}

// SAFETY: 8 bytes, no implicit padding, every bit pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for ReflectorIface {}

/// An address as a map key: IPv6 as is, IPv4 as IPv4-mapped IPv6
/// (`::ffff:a.b.c.d`), so one map holds both families.
pub type AddrKey = [u8; 16];

/// The key of an IPv4 address (network byte order).
#[inline(always)]
pub const fn addr_key_v4(a: [u8; 4]) -> AddrKey {
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3],
    ]
}

/// The key of an address of either family: IPv4 as [`addr_key_v4`], IPv6
/// as is.
#[inline(always)]
pub const fn addr_key(a: core::net::IpAddr) -> AddrKey {
    match a {
        core::net::IpAddr::V4(v4) => addr_key_v4(v4.octets()),
        core::net::IpAddr::V6(v6) => v6.octets(),
    }
}

/// Bytes of an IPv6 source that name its rate-limit bucket: the /64.
pub const RATE_PREFIX6_BYTES: usize = 8;

/// The key of the rate-limit bucket a source (an [`AddrKey`]) draws from,
/// in both reflectors: an IPv4 source by its address, an IPv6 source by
/// its /64 prefix (the rest zero). One IPv6 host owns a whole /64 (SLAAC,
/// privacy addresses, RFC 8981), so a bucket per address would give a
/// host rotating through its /64 a fresh burst per address. IPv4-mapped
/// keys (`::ffff:a.b.c.d`, also what a dual-stack socket reports for an
/// IPv4 peer) stay whole: their /64 is `::`, every IPv4 source at once.
/// A masked IPv6 key never equals an IPv4 one (bytes 10..12 stay 0 in
/// it, 0xffff in those).
#[inline(always)]
pub const fn rate_key(src: &AddrKey) -> AddrKey {
    let mut k = *src;
    if addr_key_is_v4(src) {
        return k;
    }
    let mut i = RATE_PREFIX6_BYTES;
    while i < 16 {
        k[i] = 0;
        i += 1;
    }
    k
}

/// True for an IPv4-mapped key (`::ffff:0:0/96`).
#[inline(always)]
pub const fn addr_key_is_v4(k: &AddrKey) -> bool {
    let mut i = 0;
    while i < 10 {
        if k[i] != 0 {
            return false;
        }
        i += 1;
    }
    k[10] == 0xff && k[11] == 0xff
}

/// What an entry of [`REFLECTOR_ADDRS_MAP`] is.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AddrKind {
    /// One of the interface's addresses: answered as destination.
    Own = 1,
    /// A subnet's broadcast or network address: never answered.
    Broadcast = 2,
}

/// An IPv4 source no unicast reply may go to: "this network" 0/8
/// (unspecified), loopback 127/8, multicast 224/4, reserved 240/4 and the
/// limited broadcast 255.255.255.255 in it.
#[inline(always)]
pub const fn ipv4_bad_source(a: [u8; 4]) -> bool {
    a[0] == 0 || a[0] == 127 || a[0] >= 224
}

/// An IPv6 source no unicast reply may go to: unspecified `::`, loopback
/// `::1`, multicast ff00::/8, and IPv4-mapped ::ffff:0:0/96 (never on the
/// wire, RFC 4291 §2.5.5.2).
#[inline(always)]
pub fn ipv6_bad_source(a: &[u8; 16]) -> bool {
    if a[0] == 0xff {
        return true;
    }
    let mut i = 0;
    while i < 10 {
        if a[i] != 0 {
            return false;
        }
        i += 1;
    }
    let (w5, w6, w7) = (
        u16::from_be_bytes([a[10], a[11]]),
        u16::from_be_bytes([a[12], a[13]]),
        u16::from_be_bytes([a[14], a[15]]),
    );
    w5 == 0xffff || (w5 == 0 && w6 == 0 && w7 <= 1)
}

/// A token bucket as the GCRA (ITU-T I.371 virtual scheduling) keeps it:
/// one word, the theoretical arrival time (TAT) of the next conforming
/// packet, instead of a token count and a time. One word is what lets many
/// CPUs share a bucket with one compare-and-swap. Integers only.
///
/// A packet at `now` conforms when `TAT - now <= tolerance`; it then moves
/// TAT to `max(TAT, now) + interval`. With `interval = ceil(1 s / rate)`
/// and `tolerance = (burst - 1) * interval`, any window of `S` seconds
/// admits at most `burst + S / interval <= burst + rate * S` packets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gcra {
    /// ns per token (0: no limit).
    pub interval_ns: u64,
    /// How far TAT may run ahead of now: `(burst - 1)` intervals.
    pub tolerance_ns: u64,
}

impl Gcra {
    /// `rate_pps` packets a second with bursts of `burst` (at least 1);
    /// `rate_pps` 0 is no limit. The interval is rounded up, so the rate
    /// never comes out higher than asked.
    pub const fn per_second(rate_pps: u32, burst: u32) -> Self {
        if rate_pps == 0 {
            return Gcra {
                interval_ns: 0,
                tolerance_ns: 0,
            };
        }
        let interval_ns = 1_000_000_000u64.div_ceil(rate_pps as u64);
        let burst = if burst == 0 { 1 } else { burst };
        Gcra {
            interval_ns,
            tolerance_ns: (burst as u64 - 1) * interval_ns,
        }
    }

    /// The new TAT if a packet at `now_ns` conforms to a bucket whose TAT
    /// is `tat_ns` (0: a fresh bucket, full), else None. No limit admits
    /// everything and leaves TAT as it is.
    #[inline(always)]
    pub const fn admit(self, tat_ns: u64, now_ns: u64) -> Option<u64> {
        if self.interval_ns == 0 {
            return Some(tat_ns);
        }
        if tat_ns > now_ns && tat_ns - now_ns > self.tolerance_ns {
            return None;
        }
        let base = if tat_ns > now_ns { tat_ns } else { now_ns };
        Some(base + self.interval_ns)
    }
}

/// rtprobe payload (see rtprobe's `probe/packet.rs`): magic, version, flags.
pub const RTPB_MAGIC: [u8; 4] = *b"RTPB";
pub const RTPB_VERSION: u8 = 1;
/// Flag bit: the datagram is an echo (never reflected again).
pub const RTPB_FLAG_ECHO: u8 = 1;
/// Flag bit: bytes [`RTPB_KTIMES_OFFSET`].. hold the receive and transmit
/// times of an in-kernel reflector (CLOCK_REALTIME ns, big-endian i64 each).
/// (Bit 1, value 2, marks rtprobe's warm-up probes.)
pub const RTPB_FLAG_KERNEL_TIMES: u8 = 4;
/// The probe header every rtprobe payload has.
pub const RTPB_HEADER_LEN: usize = 32;
/// Where the in-kernel reflector writes its receive time (then its transmit time).
pub const RTPB_KTIMES_OFFSET: usize = 32;
/// Shortest payload the in-kernel reflector writes its times into.
pub const RTPB_KTIMES_MIN_LEN: usize = 48;
/// Unauthenticated STAMP test packet (RFC 8762 §4.2.1 / §4.3.1).
pub const STAMP_UNAUTH_LEN: usize = 44;
/// Seconds from the NTP epoch (1900) to the Unix epoch (1970).
pub const NTP_UNIX_OFFSET_S: u64 = 2_208_988_800;
/// TTL of every reflected datagram, as a host's own UDP would leave.
pub const REFLECT_TTL: u8 = 64;

/// What the reflector did with one frame; the index into [`REFLECTOR_COUNTERS_MAP`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReflectorOutcome {
    /// An rtprobe probe answered with XDP_TX.
    ReflectedRtprobe = 0,
    /// A STAMP session-sender packet answered with XDP_TX.
    ReflectedStamp = 1,
    /// XDP_PASS: IPv4 or IPv6 but not for the reflector (other protocol
    /// or port, not an rtprobe payload, a fragment, IP options, IPv6
    /// extension headers).
    NotProbe = 2,
    /// XDP_PASS of an rtprobe echo (never reflected again).
    Echo = 3,
    /// XDP_PASS of a truncated or inconsistent frame.
    Malformed = 4,
    /// An rtprobe probe answered without times: shorter than
    /// [`RTPB_KTIMES_MIN_LEN`] (also counted as reflected).
    NoRoomForTimes = 5,
    /// XDP_PASS of anything that is neither IPv4 nor IPv6 (ARP, VLAN...).
    NotIp = 6,
    /// XDP_PASS of a probe not addressed to this interface: a destination
    /// MAC other than its own (broadcast, multicast, another host's) or a
    /// destination IP that is not one of its addresses.
    NotForUs = 7,
    /// XDP_DROP of a probe whose source could not take a unicast reply:
    /// a group (broadcast/multicast) source MAC, or a source IP that is
    /// broadcast (255.255.255.255, a subnet broadcast of the interface),
    /// multicast, loopback, unspecified, reserved, or one of the
    /// interface's own addresses.
    BadSource = 8,
    /// XDP_DROP of a probe over its source's `--rate-limit` (dropped, so
    /// that no user-space reflector on the port answers it either).
    RateLimited = 9,
    /// XDP_DROP of a probe over the reflector's global cap on replies
    /// (every source but the known peers).
    GlobalLimited = 10,
    /// A probe from a known peer answered (also counted as reflected).
    PeerReflected = 11,
    /// XDP_DROP of a known peer's probe over its own `--rate-limit`.
    PeerRateLimited = 12,
    /// XDP_DROP of a known peer's probe over the cap of all known peers.
    PeerGlobalLimited = 13,
}

/// Number of [`ReflectorOutcome`]s (the size of [`REFLECTOR_COUNTERS_MAP`]).
pub const REFLECTOR_OUTCOME_COUNT: u32 = 14;

impl ReflectorOutcome {
    pub const ALL: [ReflectorOutcome; REFLECTOR_OUTCOME_COUNT as usize] = [
        ReflectorOutcome::ReflectedRtprobe,
        ReflectorOutcome::ReflectedStamp,
        ReflectorOutcome::NotProbe,
        ReflectorOutcome::Echo,
        ReflectorOutcome::Malformed,
        ReflectorOutcome::NoRoomForTimes,
        ReflectorOutcome::NotIp,
        ReflectorOutcome::NotForUs,
        ReflectorOutcome::BadSource,
        ReflectorOutcome::RateLimited,
        ReflectorOutcome::GlobalLimited,
        ReflectorOutcome::PeerReflected,
        ReflectorOutcome::PeerRateLimited,
        ReflectorOutcome::PeerGlobalLimited,
    ];

    pub const fn index(self) -> u32 {
        self as u32
    }

    /// Stable name used in summaries.
    pub const fn name(self) -> &'static str {
        match self {
            ReflectorOutcome::ReflectedRtprobe => "reflected_rtprobe",
            ReflectorOutcome::ReflectedStamp => "reflected_stamp",
            ReflectorOutcome::NotProbe => "not_probe",
            ReflectorOutcome::Echo => "echo_passed",
            ReflectorOutcome::Malformed => "malformed",
            ReflectorOutcome::NoRoomForTimes => "no_room_for_times",
            ReflectorOutcome::NotIp => "not_ip",
            ReflectorOutcome::NotForUs => "not_for_us",
            ReflectorOutcome::BadSource => "bad_source",
            ReflectorOutcome::RateLimited => "rate_limited",
            ReflectorOutcome::GlobalLimited => "global_limited",
            ReflectorOutcome::PeerReflected => "peer_reflected",
            ReflectorOutcome::PeerRateLimited => "peer_rate_limited",
            ReflectorOutcome::PeerGlobalLimited => "peer_global_limited",
        }
    }
}

/// The reflector's clock parameters, the one entry of [`REFLECTOR_CLOCK_MAP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReflectorClock {
    /// CLOCK_REALTIME - CLOCK_TAI in ns (about -37 s today), measured by
    /// user space; the reflector adds it to `bpf_ktime_get_tai_ns()`.
    pub tai_to_realtime_ns: i64,
    /// STAMP Error Estimate (RFC 8762 §4.2.1, Z = 0: NTP format) put into
    /// reflected STAMP packets, as a big-endian word's value.
    pub stamp_error_estimate: u16,
    /// Explicit padding to 16 bytes, zero.
    pub _pad: [u8; 6],
}

// SAFETY: i64, u16 and 6 bytes, no implicit padding, every bit pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for ReflectorClock {}

/// Accumulates the change of 16-bit words in checksummed data for an
/// incremental Internet checksum update (RFC 1624 eqn. 3 over many words:
/// `HC' = ~(~HC + sum ~m + sum m')`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CsumDelta(u64);

impl CsumDelta {
    pub const fn new() -> Self {
        CsumDelta(0)
    }

    /// One 16-bit word changed from `old` to `new` (as read big-endian).
    #[inline(always)]
    pub const fn replace16(self, old: u16, new: u16) -> Self {
        CsumDelta(self.0 + (!old) as u64 + new as u64)
    }

    /// Four consecutive words (an aligned 8-byte field, read big-endian) changed.
    #[inline(always)]
    pub const fn replace64(self, old: u64, new: u64) -> Self {
        let mut d = self;
        let mut i = 0;
        while i < 4 {
            let shift = 48 - 16 * i;
            d = d.replace16((old >> shift) as u16, (new >> shift) as u16);
            i += 1;
        }
        d
    }

    /// Both sets of changes.
    #[inline(always)]
    pub const fn merge(self, other: CsumDelta) -> Self {
        CsumDelta(self.0 + other.0)
    }

    /// The checksum after the changes, given the one before.
    #[inline(always)]
    pub const fn apply(self, check: u16) -> u16 {
        !fold64((!check) as u64 + self.0)
    }

    /// As [`apply`](Self::apply) for a UDP checksum over IPv4: 0 means "no
    /// checksum" and stays 0, and a computed 0 is sent as 0xffff (RFC 768).
    #[inline(always)]
    pub const fn apply_udp(self, check: u16) -> u16 {
        if check == 0 {
            return 0;
        }
        match self.apply(check) {
            0 => 0xffff,
            c => c,
        }
    }
}

/// Folds a 64-bit one's complement sum to 16 bits.
#[inline(always)]
pub const fn fold64(mut sum: u64) -> u16 {
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    csum_fold(((sum & 0xffff) + (sum >> 16)) as u32)
}

/// A CLOCK_REALTIME time (ns since 1970) as an NTP 64-bit timestamp
/// (RFC 5905 §6: seconds since 1900 modulo 2^32, fraction in 2^-32 s),
/// truncated. Times before 1970 give 0.
#[inline(always)]
pub const fn realtime_ns_to_ntp(ns: i64) -> u64 {
    if ns < 0 {
        return 0;
    }
    let ns = ns as u64;
    let secs = (ns / 1_000_000_000 + NTP_UNIX_OFFSET_S) & 0xffff_ffff;
    // < 10^9 << 32 < 2^62: no overflow.
    let frac = ((ns % 1_000_000_000) << 32) / 1_000_000_000;
    (secs << 32) | frac
}

/// Marks an rtprobe probe header as an echo (and, with `times`, as carrying
/// in-kernel reflector times), returning the checksum change.
#[inline(always)]
pub fn rtpb_mark_echo(hdr: &mut [u8; RTPB_HEADER_LEN], times: bool) -> CsumDelta {
    let old = u16::from_be_bytes([hdr[4], hdr[5]]);
    let mut flags = hdr[5] | RTPB_FLAG_ECHO;
    if times {
        flags |= RTPB_FLAG_KERNEL_TIMES;
    }
    hdr[5] = flags;
    CsumDelta::new().replace16(old, u16::from_be_bytes([hdr[4], flags]))
}

/// Writes the reflector's receive and transmit times (CLOCK_REALTIME ns)
/// into the 16 bytes after the probe header, returning the checksum change.
#[inline(always)]
pub fn rtpb_write_times(times: &mut [u8; 16], rx_ns: i64, tx_ns: i64) -> CsumDelta {
    let old_rx = u64::from_be_bytes(read8(times, 0));
    let old_tx = u64::from_be_bytes(read8(times, 8));
    times[0..8].copy_from_slice(&rx_ns.to_be_bytes());
    times[8..16].copy_from_slice(&tx_ns.to_be_bytes());
    CsumDelta::new()
        .replace64(old_rx, rx_ns as u64)
        .replace64(old_tx, tx_ns as u64)
}

/// Turns an unauthenticated STAMP session-sender packet into the
/// session-reflector packet (RFC 8762 §4.3.1 stateless, RFC 8972 §3 SSID)
/// in place: sequence number copied, T3 (`tx_ntp`), the reflector's error
/// estimate, SSID kept, T2 (`rx_ntp`), the sender's sequence number,
/// timestamp and error estimate, and the TTL the packet arrived with.
/// Returns the checksum change.
#[inline(always)]
pub fn stamp_reflect(
    pkt: &mut [u8; STAMP_UNAUTH_LEN],
    sender_ttl: u8,
    error_estimate: u16,
    rx_ntp: u64,
    tx_ntp: u64,
) -> CsumDelta {
    let old = *pkt;
    let mut new = [0u8; STAMP_UNAUTH_LEN];
    new[0..4].copy_from_slice(&old[0..4]);
    new[4..12].copy_from_slice(&tx_ntp.to_be_bytes());
    new[12..14].copy_from_slice(&error_estimate.to_be_bytes());
    new[14..16].copy_from_slice(&old[14..16]);
    new[16..24].copy_from_slice(&rx_ntp.to_be_bytes());
    new[24..28].copy_from_slice(&old[0..4]);
    new[28..36].copy_from_slice(&old[4..12]);
    new[36..38].copy_from_slice(&old[12..14]);
    new[40] = sender_ttl;
    *pkt = new;
    let mut d = CsumDelta::new();
    let mut i = 0;
    while i < STAMP_UNAUTH_LEN {
        d = d.replace16(
            u16::from_be_bytes([old[i], old[i + 1]]),
            u16::from_be_bytes([new[i], new[i + 1]]),
        );
        i += 2;
    }
    d
}

#[inline(always)]
fn read8(b: &[u8; 16], at: usize) -> [u8; 8] {
    [
        b[at],
        b[at + 1],
        b[at + 2],
        b[at + 3],
        b[at + 4],
        b[at + 5],
        b[at + 6],
        b[at + 7],
    ]
}

/// Names and sizes of the bench's XDP programs (the `xdp-bench` object and
/// the router's work variant), shared with `rtprobe bench-forward`.
pub mod flows;

pub mod bench {
    /// Load generator run by BPF_PROG_TEST_RUN with live frames.
    pub const LOADGEN_PROGRAM: &str = "bench_loadgen";
    /// Receiver-side drop of the load.
    pub const SINK_PROGRAM: &str = "bench_sink";
    /// The XDP thesis's baseline: MACs swapped, XDP_TX.
    pub const BOUNCE_PROGRAM: &str = "bench_bounce";
    /// Redirect to the AF_XDP socket of the receive queue.
    pub const XSK_PROGRAM: &str = "bench_xsk";
    /// The router with extra work per frame (in the router's object).
    pub const ROUTER_WORK_PROGRAM: &str = "xdp_router_work";
    /// Per-CPU array of one [`crate::Counter`]: what a bench program handled.
    pub const COUNTERS_MAP: &str = "BENCH_COUNTERS";
    /// XSKMAP of `bench_xsk`, indexed by receive queue.
    pub const XSKS_MAP: &str = "BENCH_XSKS";
    /// Capacity of [`XSKS_MAP`].
    pub const XSKS_MAX_ENTRIES: u32 = 64;
    pub const LOAD_IFINDEX_GLOBAL: &str = "LOAD_IFINDEX";
    pub const LOAD_KEEP_GLOBAL: &str = "LOAD_KEEP";
    pub const LOAD_HEADER_GLOBAL: &str = "LOAD_HEADER";
    pub const SINK_PORT_GLOBAL: &str = "SINK_PORT";
    pub const BOUNCE_WORK_GLOBAL: &str = "BOUNCE_WORK";
    /// `u32` global of `xdp_router_work`.
    pub const ROUTER_WORK_GLOBAL: &str = "WORK_ACCESSES";
    /// Most memory accesses per packet the programs do (the thesis's range
    /// is 1..12800).
    pub const MAX_WORK_ACCESSES: u32 = 12_800;

    /// Frame bytes the generator restores on every run: Ethernet, IPv4 and
    /// UDP headers.
    pub const HEADER_LEN: usize = 42;
    /// `LOAD_HEADER` as u64 words (the last holds bytes 40..42).
    pub const HEADER_WORDS: usize = 6;

    /// Packs the first [`HEADER_LEN`] bytes of a frame into the words the
    /// generator writes back: bytes 0..40 as five little-endian words (the
    /// eBPF target is little-endian), bytes 40..42 in the low half of the
    /// sixth. Pure.
    pub fn pack_header(frame: &[u8; HEADER_LEN]) -> [u64; HEADER_WORDS] {
        let mut w = [0u64; HEADER_WORDS];
        let mut i = 0;
        while i < HEADER_WORDS - 1 {
            let mut b = [0u8; 8];
            b.copy_from_slice(&frame[i * 8..i * 8 + 8]);
            w[i] = u64::from_le_bytes(b);
            i += 1;
        }
        w[HEADER_WORDS - 1] = u64::from(u16::from_le_bytes([frame[40], frame[41]]));
        w
    }
}
pub use bench::{HEADER_LEN as BENCH_HEADER_LEN, HEADER_WORDS as BENCH_HEADER_WORDS};

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use proptest::prelude::*;
    use std::format;

    #[test]
    fn bench_header_packs_as_the_generator_writes_it() {
        let mut f = [0u8; bench::HEADER_LEN];
        for (i, b) in f.iter_mut().enumerate() {
            *b = i as u8;
        }
        let w = bench::pack_header(&f);
        // Written back as little-endian stores, the words give the bytes again.
        let mut back = [0u8; 48];
        for (i, v) in w.iter().enumerate() {
            back[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        assert_eq!(&back[..40], &f[..40]);
        assert_eq!(&back[40..42], &[40, 41]);
        assert_eq!(&back[42..], &[0; 6], "only two bytes in the last word");
    }

    /// A real header: 45 00 00 73 00 00 40 00 40 11 b8 61 c0 a8 00 01 c0 a8 00 c7
    /// (the classic Wikipedia example, checksum 0xb861).
    const EXAMPLE: [u8; 20] = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];

    #[test]
    fn ipv6_names_are_the_prefix_and_the_ipv4_name() {
        for o in Outcome::ALL {
            assert_eq!(o.name6(), format!("{IPV6_PREFIX}{}", o.name()));
        }
    }

    #[test]
    fn extension_headers_are_not_upper_layers() {
        for eh in [0u8, 43, 44, 50, 51, 60, 135, 139, 140, 253, 254] {
            assert!(ipv6_is_extension_header(eh), "{eh}");
        }
        // TCP, UDP, ICMPv6, no next header, SCTP, UDP-Lite.
        for ul in [6u8, 17, 58, 59, 132, 136] {
            assert!(!ipv6_is_extension_header(ul), "{ul}");
        }
    }

    #[test]
    fn full_checksum_matches_known_header() {
        assert_eq!(ipv4_checksum(&EXAMPLE), 0xb861);
        assert!(ipv4_checksum_ok(&EXAMPLE));
        let mut bad = EXAMPLE;
        bad[11] ^= 1;
        assert!(!ipv4_checksum_ok(&bad));
    }

    #[test]
    fn ttl_decrement_on_known_header() {
        let mut h = EXAMPLE;
        let new = ttl_decrement_csum(0xb861, h[8], h[9]);
        h[8] -= 1;
        h[10..12].copy_from_slice(&new.to_be_bytes());
        assert!(ipv4_checksum_ok(&h));
        assert_eq!(new, ipv4_checksum(&h));
        // TTL is the high byte of the word: one less TTL adds 0x0100 to the checksum.
        assert_eq!(new, 0xb961);
    }

    /// RFC 1624 section 4: recomputation gives 0x0000 where eqn. 2 would
    /// give 0xffff (-0); eqn. 3 agrees with recomputation.
    #[test]
    fn rfc1624_example() {
        // HC = 0xdd2f, m = 0x5555 -> m' = 0x3285; HC' = 0x0000.
        assert_eq!(csum_replace2(0xdd2f, 0x5555, 0x3285), 0x0000);
    }

    #[test]
    fn outcome_names_unique_and_indexed() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(o.index() as usize, i);
            for p in &Outcome::ALL[i + 1..] {
                assert_ne!(o.name(), p.name());
            }
        }
        assert_eq!(core::mem::size_of::<Counter>(), 16);
    }

    fn with_checksum(mut h: [u8; 20]) -> [u8; 20] {
        h[0] = 0x45;
        let c = ipv4_checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h
    }

    proptest! {
        /// Incremental update = recomputing from scratch, for any header and TTL >= 1.
        #[test]
        fn incremental_equals_full(raw in proptest::array::uniform20(any::<u8>()), ttl in 1u8..=255) {
            let mut h = raw;
            h[8] = ttl;
            let h = with_checksum(h);
            let check = u16::from_be_bytes([h[10], h[11]]);
            let new = ttl_decrement_csum(check, h[8], h[9]);
            let mut d = h;
            d[8] -= 1;
            d[10..12].copy_from_slice(&new.to_be_bytes());
            prop_assert!(ipv4_checksum_ok(&d));
            prop_assert_eq!(new, ipv4_checksum(&d));
        }

        /// Any single-word change keeps a valid header valid.
        #[test]
        fn replace2_keeps_header_valid(raw in proptest::array::uniform20(any::<u8>()), word in 0usize..10, new in any::<u16>()) {
            prop_assume!(word != 5); // the checksum word itself
            let h = with_checksum(raw);
            let off = word * 2;
            let old = u16::from_be_bytes([h[off], h[off + 1]]);
            let check = u16::from_be_bytes([h[10], h[11]]);
            let mut d = h;
            d[off..off + 2].copy_from_slice(&new.to_be_bytes());
            d[10..12].copy_from_slice(&csum_replace2(check, old, new).to_be_bytes());
            prop_assert!(ipv4_checksum_ok(&d));
        }
    }

    /// One's complement checksum over `data` (odd length padded), the
    /// plain definition, for checking the incremental helpers.
    fn full_sum(data: &[u8]) -> u16 {
        let mut sum: u64 = 0;
        for w in data.chunks(2) {
            sum += u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]) as u64;
        }
        fold64(sum)
    }

    #[test]
    fn reflector_outcomes_and_clock_layout() {
        for (i, o) in ReflectorOutcome::ALL.iter().enumerate() {
            assert_eq!(o.index() as usize, i);
            for p in &ReflectorOutcome::ALL[i + 1..] {
                assert_ne!(o.name(), p.name());
            }
        }
        assert_eq!(core::mem::size_of::<ReflectorClock>(), 16);
    }

    #[test]
    fn bad_sources() {
        for a in [
            [0, 0, 0, 0],
            [0, 1, 2, 3],
            [127, 0, 0, 1],
            [224, 0, 0, 1],
            [239, 255, 255, 250],
            [240, 0, 0, 1],
            [255, 255, 255, 255],
        ] {
            assert!(ipv4_bad_source(a), "{a:?}");
        }
        for a in [
            [10, 77, 0, 1],
            [192, 0, 2, 255],
            [1, 1, 1, 1],
            [223, 255, 255, 254],
        ] {
            assert!(!ipv4_bad_source(a), "{a:?}");
        }
        let v6 = |s: &str| s.parse::<std::net::Ipv6Addr>().unwrap().octets();
        for a in ["::", "::1", "ff02::1", "ff05::2", "::ffff:10.0.0.1"] {
            assert!(ipv6_bad_source(&v6(a)), "{a}");
        }
        for a in [
            "fd77::1",
            "fe80::1",
            "2001:db8::2",
            "::2",
            "::1:0:0:1",
            "64:ff9b::a00:1",
        ] {
            assert!(!ipv6_bad_source(&v6(a)), "{a}");
        }
        assert_eq!(addr_key_v4([10, 0, 0, 1]), v6("::ffff:10.0.0.1"));
    }

    fn v6(s: &str) -> AddrKey {
        s.parse::<std::net::Ipv6Addr>().unwrap().octets()
    }

    /// `n` addresses inside `prefix`'s /64 (the interface identifiers a
    /// host rotating privacy addresses would pick).
    fn addrs_in_64(prefix: &str, n: u64) -> std::vec::Vec<AddrKey> {
        let base = v6(prefix);
        (0..n)
            .map(|i| {
                let mut a = base;
                let iid = 0x5eed_0000_0000_0000u64 ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                a[8..].copy_from_slice(&iid.to_be_bytes());
                a
            })
            .collect()
    }

    #[test]
    fn rate_key_is_the_64_for_ipv6_and_the_address_for_ipv4() {
        let one = addrs_in_64("2001:db8:1:2::", 1000);
        assert_eq!(
            one.iter()
                .map(rate_key)
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            1,
            "1000 addresses of one /64 share one key"
        );
        assert_eq!(rate_key(&one[0]), v6("2001:db8:1:2::"));
        assert_ne!(
            rate_key(&v6("2001:db8:1:2::1")),
            rate_key(&v6("2001:db8:1:3::1")),
            "the next /64 is another host"
        );
        assert_eq!(rate_key(&v6("fe80::1")), rate_key(&v6("fe80::2")));
        // IPv4, as a map key or as a dual-stack socket reports it: unchanged.
        let a = addr_key_v4([10, 0, 0, 1]);
        assert_eq!(rate_key(&a), a);
        assert_eq!(rate_key(&v6("::ffff:10.0.0.1")), a);
        assert_ne!(rate_key(&a), rate_key(&addr_key_v4([10, 0, 0, 2])));
        assert!(addr_key_is_v4(&a) && !addr_key_is_v4(&v6("::1:0:0:1")));
        // The IPv6 /64 that holds the IPv4-mapped range is not an IPv4 key.
        assert_ne!(rate_key(&v6("::1")), rate_key(&a));
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(addr_key(ip("10.0.0.1")), a);
        assert_eq!(addr_key(ip("2001:db8::7")), v6("2001:db8::7"));
    }

    /// The reflectors' per-source limit as both run it, one bucket per
    /// `key(source)`: a flood of `count` probes spread evenly over
    /// `sources` and `secs` seconds; returns the probes answered.
    fn flood(
        g: Gcra,
        key: fn(&AddrKey) -> AddrKey,
        sources: &[AddrKey],
        count: u64,
        secs: u64,
    ) -> u64 {
        let mut tats = std::collections::HashMap::new();
        let gap_ns = secs * 1_000_000_000 / count;
        let start_ns = 1_000_000_000u64;
        let mut answered = 0;
        for i in 0..count {
            let src = &sources[(i % sources.len() as u64) as usize];
            let tat = tats.entry(key(src)).or_insert(0u64);
            if let Some(t) = g.admit(*tat, start_ns + i * gap_ns) {
                *tat = t;
                answered += 1;
            }
        }
        answered
    }

    #[test]
    fn a_64_rotating_addresses_draws_from_one_bucket() {
        let (rate, burst, secs) = (100u32, 10u32, 2u64);
        let g = Gcra::per_second(rate, burst);
        let bound = u64::from(burst) + u64::from(rate) * secs;
        let one = addrs_in_64("2001:db8:1:2::", 1000);
        let count = 20_000;
        let by_64 = flood(g, rate_key, &one, count, secs);
        let by_address = flood(g, |k| *k, &one, count, secs);
        std::eprintln!(
            "1000 addresses of one /64, {count} probes in {secs} s at {rate}/s burst {burst}: \
             {by_64} answered by /64 (bound {bound}), {by_address} by address"
        );
        assert!(by_64 <= bound, "{by_64} > {bound}");
        assert!(by_64 >= bound - 1, "the /64 still gets its rate: {by_64}");
        assert!(by_address > 5 * bound, "keyed by address: {by_address}");

        // Two /64s: a bucket each.
        let mut two = addrs_in_64("2001:db8:1:2::", 500);
        two.extend(addrs_in_64("2001:db8:1:3::", 500));
        let answered = flood(g, rate_key, &two, count, secs);
        std::eprintln!("two /64s: {answered} answered (bound {})", 2 * bound);
        assert!(answered > bound && answered <= 2 * bound, "{answered}");

        // IPv4 unchanged: 1000 addresses, a bucket each.
        let v4: std::vec::Vec<AddrKey> = (0..1000u32)
            .map(|i| addr_key_v4([10, 1, (i >> 8) as u8, i as u8]))
            .collect();
        assert_eq!(
            flood(g, rate_key, &v4, count, secs),
            flood(g, |k| *k, &v4, count, secs)
        );
    }

    #[test]
    fn gcra_burst_then_rate() {
        let g = Gcra::per_second(10, 3);
        assert_eq!(g.interval_ns, 100_000_000);
        let t0 = 5_000_000_000u64;
        let mut tat = 0;
        let mut ok = 0;
        for _ in 0..10 {
            if let Some(t) = g.admit(tat, t0) {
                tat = t;
                ok += 1;
            }
        }
        assert_eq!(ok, 3, "a full bucket gives the burst at once");
        assert_eq!(g.admit(tat, t0 + 99_999_999), None);
        assert!(
            g.admit(tat, t0 + 100_000_000).is_some(),
            "one token a tenth"
        );
        assert_eq!(
            Gcra::per_second(0, 5).admit(u64::MAX - 1, 0),
            Some(u64::MAX - 1)
        );
        // A rate that does not divide a second: rounded to fewer, not more.
        assert_eq!(Gcra::per_second(3, 1).interval_ns, 333_333_334);
    }

    proptest! {
        /// Whatever the arrivals, a window of S ns admits at most
        /// burst + rate * S / 1e9 packets.
        #[test]
        fn gcra_never_admits_more_than_rate_and_burst(
            rate in 1u32..2_000_000, burst in 1u32..100,
            gaps in proptest::collection::vec(0u64..3_000_000, 1..400),
        ) {
            let g = Gcra::per_second(rate, burst);
            let mut tat = 0u64;
            let mut now = 1_000_000_000u64;
            let start = now;
            let mut admitted = 0u64;
            for gap in gaps {
                now += gap;
                if let Some(t) = g.admit(tat, now) {
                    tat = t;
                    admitted += 1;
                }
            }
            let span = now - start;
            let bound = burst as u128 + (rate as u128 * span as u128) / 1_000_000_000;
            prop_assert!(admitted as u128 <= bound, "{admitted} > {bound}");
        }
    }

    #[test]
    fn ntp_conversion() {
        // 1970-01-01 is NTP second 2208988800, fraction 0.
        assert_eq!(realtime_ns_to_ntp(0), NTP_UNIX_OFFSET_S << 32);
        // Half a second is fraction 2^31.
        assert_eq!(realtime_ns_to_ntp(500_000_000) & 0xffff_ffff, 1 << 31);
        // 2036-02-07 06:28:16 UTC wraps to era 1, second 0.
        let wrap_s = (1u64 << 32) - NTP_UNIX_OFFSET_S;
        assert_eq!(realtime_ns_to_ntp((wrap_s * 1_000_000_000) as i64), 0);
        assert_eq!(realtime_ns_to_ntp(-1), 0);
    }

    #[test]
    fn udp_zero_checksum_rules() {
        assert_eq!(CsumDelta::new().replace16(0, 5).apply_udp(0), 0);
        // A change that makes the sum come out as 0 is sent as 0xffff.
        let d = CsumDelta::new().replace16(0x0000, 0x0001);
        assert_eq!(d.apply(0x0001), 0x0000);
        assert_eq!(d.apply_udp(0x0001), 0xffff);
    }

    /// Data with a checksum word at 0..2 that makes the whole sum 0xffff.
    fn with_sum(mut d: std::vec::Vec<u8>) -> std::vec::Vec<u8> {
        d[0] = 0;
        d[1] = 0;
        let c = !full_sum(&d);
        d[0..2].copy_from_slice(&c.to_be_bytes());
        d
    }

    proptest! {
        /// Marking an echo and writing times keeps a valid checksum valid.
        #[test]
        fn rtpb_updates_keep_checksum(
            raw in proptest::collection::vec(any::<u8>(), 50),
            rx in any::<i64>(), tx in any::<i64>(), times in any::<bool>(),
        ) {
            // [0..2] checksum, [2..34] probe header, [34..50] times.
            let d0 = with_sum(raw);
            let check = u16::from_be_bytes([d0[0], d0[1]]);
            let mut d = d0.clone();
            let mut hdr: [u8; 32] = d[2..34].try_into().unwrap();
            let mut t: [u8; 16] = d[34..50].try_into().unwrap();
            let mut delta = rtpb_mark_echo(&mut hdr, times);
            if times {
                let w = rtpb_write_times(&mut t, rx, tx);
                delta = CsumDelta(delta.0 + w.0);
            }
            d[2..34].copy_from_slice(&hdr);
            d[34..50].copy_from_slice(&t);
            d[0..2].copy_from_slice(&delta.apply(check).to_be_bytes());
            prop_assert_eq!(full_sum(&d), 0xffff);
            prop_assert!(hdr[5] & RTPB_FLAG_ECHO != 0);
            prop_assert_eq!(hdr[5] & RTPB_FLAG_KERNEL_TIMES != 0, times || d0[7] & RTPB_FLAG_KERNEL_TIMES != 0);
            if times {
                prop_assert_eq!(&t[0..8], &rx.to_be_bytes());
                prop_assert_eq!(&t[8..16], &tx.to_be_bytes());
            }
        }

        /// The STAMP rewrite keeps a valid checksum valid and moves the fields.
        #[test]
        fn stamp_reflect_fields_and_checksum(
            raw in proptest::collection::vec(any::<u8>(), 46),
            ttl in any::<u8>(), ee in any::<u16>(), t2 in any::<u64>(), t3 in any::<u64>(),
        ) {
            let d0 = with_sum(raw);
            let check = u16::from_be_bytes([d0[0], d0[1]]);
            let mut pkt: [u8; 44] = d0[2..46].try_into().unwrap();
            let sender = pkt;
            let delta = stamp_reflect(&mut pkt, ttl, ee, t2, t3);
            prop_assert_eq!(&pkt[0..4], &sender[0..4]);
            prop_assert_eq!(&pkt[4..12], &t3.to_be_bytes());
            prop_assert_eq!(&pkt[12..14], &ee.to_be_bytes());
            prop_assert_eq!(&pkt[14..16], &sender[14..16]);
            prop_assert_eq!(&pkt[16..24], &t2.to_be_bytes());
            prop_assert_eq!(&pkt[24..28], &sender[0..4]);
            prop_assert_eq!(&pkt[28..36], &sender[4..12]);
            prop_assert_eq!(&pkt[36..38], &sender[12..14]);
            prop_assert_eq!(&pkt[38..40], &[0u8, 0]);
            prop_assert_eq!(pkt[40], ttl);
            prop_assert_eq!(&pkt[41..44], &[0u8; 3]);
            let mut d = d0.clone();
            d[2..46].copy_from_slice(&pkt);
            d[0..2].copy_from_slice(&delta.apply(check).to_be_bytes());
            prop_assert_eq!(full_sum(&d), 0xffff);
        }
    }
}
