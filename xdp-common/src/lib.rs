//! Types shared by the XDP router (eBPF side) and rtprobe (user side).
//!
//! Everything here is `#[repr(C)]` without implicit padding so both sides
//! read the same bytes, and the pure helpers (checksums) are unit-tested on
//! the host with `cargo test -p xdp-common`.
#![no_std]

/// The nightly that builds the eBPF program (`-Z build-std=core`). Its LLVM
/// (22) must not be newer than bpf-linker's. Used by `prober/build.rs` and
/// `cargo xtask`, so it lives here, the one crate both already depend on.
pub const EBPF_TOOLCHAIN: &str = "nightly-2026-05-20";
/// The bpf-linker release that links it (built against LLVM 22).
pub const BPF_LINKER_VERSION: &str = "0.13";
/// The target the eBPF program is built for.
pub const EBPF_TARGET: &str = "bpfel-unknown-none";

/// Name of the XDP program in the object file.
pub const PROGRAM_NAME: &str = "xdp_router";
/// Per-CPU array of [`Counter`], indexed by [`Outcome`].
pub const COUNTERS_MAP: &str = "COUNTERS";
/// DEVMAP_HASH keyed by ifindex: the interfaces the router may redirect to.
pub const EGRESS_MAP: &str = "EGRESS";
/// `u8` global: non-zero makes the program a pure XDP_PASS program.
pub const PASS_ONLY_GLOBAL: &str = "PASS_ONLY";
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
    /// XDP_PASS because TTL <= 1: the kernel sends ICMP time exceeded.
    PassTtl = 2,
    /// XDP_PASS because the IPv4 header has options the kernel must process
    /// (record route, timestamps, source routing).
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
    /// XDP_PASS of anything that is not IPv4 (ARP, IPv6, VLAN-tagged...).
    NonIpv4 = 8,
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
        Outcome::NonIpv4,
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
            Outcome::NonIpv4 => "non_ipv4",
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

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use proptest::prelude::*;

    /// A real header: 45 00 00 73 00 00 40 00 40 11 b8 61 c0 a8 00 01 c0 a8 00 c7
    /// (the classic Wikipedia example, checksum 0xb861).
    const EXAMPLE: [u8; 20] = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];

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
}
