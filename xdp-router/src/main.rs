//! rtprobe's XDP router: an IPv4 and IPv6 forwarder in the style of
//! xdp-tutorial's `xdp_router_func` and xdp-tools' `xdp_forward`.
//!
//! For each frame: bounds-checked Ethernet + IPv4/IPv6 parse; anything
//! else goes to the kernel (XDP_PASS), as does every frame the router
//! cannot or should not handle itself (truncated or inconsistent headers,
//! IPv4 options, IPv6 extension headers, link-local or multicast IPv6,
//! TTL/hop limit <= 1, a FIB result other than success). On a successful
//! `bpf_fib_lookup` towards an interface userspace put in `EGRESS`, the
//! TTL is decremented (incremental checksum; IPv6 has none), the MACs are
//! rewritten and the frame is redirected through the DEVMAP_HASH.
//! Blackhole/unreachable/prohibit routes are dropped. Every frame is counted
//! per family and outcome in per-CPU arrays; nothing is logged per packet.
//!
//! Kernel interfaces: XDP (BPF_PROG_TYPE_XDP), `bpf_fib_lookup` (4.18),
//! `bpf_redirect_map` on BPF_MAP_TYPE_DEVMAP_HASH (5.4), per-CPU arrays,
//! read-only global data set at load time (5.2). Minimum kernel: 5.4.
//!
//! The same object holds the in-kernel reflector, `xdp_reflector` (see
//! `reflector.rs`); rtprobe loads one or the other. `xdp_router_work`
//! (`work.rs`) is the router with extra work per frame, for the bench.
//!
//! The program only builds for `bpfel-unknown-none` (see `cargo xtask
//! build-ebpf`); on the host it type-checks and its `main` says so.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
// BPF_CMPXCHG for the reflector's rate limit (see `reflector::compare_and_swap`);
// the eBPF crate is only built with its pinned nightly.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

mod busy;
mod reflector;
mod work;

use core::mem;

use aya_ebpf::{
    EbpfContext,
    bindings::{
        BPF_FIB_LKUP_RET_BLACKHOLE, BPF_FIB_LKUP_RET_PROHIBIT, BPF_FIB_LKUP_RET_SUCCESS,
        BPF_FIB_LKUP_RET_UNREACHABLE, bpf_fib_lookup as FibParams, xdp_action,
    },
    helpers::bpf_fib_lookup,
    macros::{map, xdp},
    maps::{DevMapHash, PerCpuArray},
    programs::XdpContext,
};
use aya_log_ebpf::{debug, warn};
use xdp_common::{Counter, EGRESS_MAX_ENTRIES, OUTCOME_COUNT, Outcome, ttl_decrement_csum};

/// Set by userspace at load time (aya `EbpfLoader::set_global`): non-zero
/// turns the router into a pure XDP_PASS program that still counts, the
/// study's "XDP_PASS by default" variant. Read-only after load, so the
/// verifier prunes the unused branch.
#[unsafe(no_mangle)]
static PASS_ONLY: u8 = 0;

/// Set by userspace at load time (`rtprobe -vv`): non-zero makes the
/// program log its rare paths (malformed frames, TTL expiry, an egress the
/// router may not use) through aya-log. Zero (the default) lets the
/// verifier prune every log call: nothing is logged, or paid for, per
/// packet.
#[unsafe(no_mangle)]
static LOG_RARE: u8 = 0;

/// True if the rare paths should be logged (see [`LOG_RARE`]).
#[inline(always)]
pub(crate) fn log_rare() -> bool {
    // SAFETY: a read-only global; volatile so it is not folded to 0.
    unsafe { core::ptr::read_volatile(&LOG_RARE) != 0 }
}

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<Counter> = PerCpuArray::with_max_entries(OUTCOME_COUNT, 0);

/// Interfaces the router may redirect to, keyed by ifindex (value: the
/// same ifindex). Userspace fills it; a route out of any other interface
/// is left to the kernel.
/// The same outcomes for IPv6 frames ([`COUNTERS`] holds IPv4's and the
/// frames of neither family).
#[map(name = "COUNTERS6")]
static COUNTERS6: PerCpuArray<Counter> = PerCpuArray::with_max_entries(OUTCOME_COUNT, 0);

#[map(name = "EGRESS")]
static EGRESS: DevMapHash = DevMapHash::with_max_entries(EGRESS_MAX_ENTRIES, 0);

pub(crate) const ETH_HLEN: usize = 14;
const ETH_ALEN: usize = 6;
pub(crate) const ETH_P_IP: u16 = 0x0800;
pub(crate) const ETH_P_IPV6: u16 = 0x86dd;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
pub(crate) const IPV4_HLEN: usize = 20;
pub(crate) const IPV6_HLEN: usize = 40;

#[repr(C)]
pub(crate) struct EthHdr {
    pub(crate) dst: [u8; ETH_ALEN],
    pub(crate) src: [u8; ETH_ALEN],
    /// Network byte order.
    pub(crate) proto: [u8; 2],
}

/// The fixed 20 bytes of an IPv4 header, as raw bytes so that the checksum
/// helpers of `xdp-common` can take it whole.
pub(crate) type Ipv4Hdr = [u8; IPV4_HLEN];

/// The fixed 40 bytes of an IPv6 header.
pub(crate) type Ipv6Hdr = [u8; IPV6_HLEN];

#[xdp]
pub fn xdp_router(ctx: XdpContext) -> u32 {
    match try_router(&ctx) {
        Ok(action) | Err(action) => action,
    }
}

/// `Ok` carries the action for a frame the router handled; `Err` the
/// XDP_PASS of a frame it refused (malformed).
#[inline(always)]
fn try_router(ctx: &XdpContext) -> Result<u32, u32> {
    let len = (ctx.data_end() - ctx.data()) as u64;

    // SAFETY: PASS_ONLY is a read-only global; the volatile read keeps the
    // compiler from folding it to its initial value.
    if unsafe { core::ptr::read_volatile(&PASS_ONLY) } != 0 {
        return Ok(verdict(
            &COUNTERS,
            Outcome::PassOnly,
            len,
            xdp_action::XDP_PASS,
        ));
    }

    let eth: *mut EthHdr = ptr_at(ctx, 0)
        .ok_or_else(|| verdict(&COUNTERS, Outcome::Malformed, len, xdp_action::XDP_PASS))?;
    // SAFETY: ptr_at checked that the whole header is inside the frame.
    match u16::from_be_bytes(unsafe { (*eth).proto }) {
        ETH_P_IP => try_ipv4(ctx, eth, len),
        ETH_P_IPV6 => try_ipv6(ctx, eth, len),
        // ARP, VLAN tags (0x8100/0x88a8), ...: the kernel's business.
        _ => Ok(verdict(
            &COUNTERS,
            Outcome::NotIp,
            len,
            xdp_action::XDP_PASS,
        )),
    }
}

#[inline(always)]
fn try_ipv4(ctx: &XdpContext, eth: *mut EthHdr, len: u64) -> Result<u32, u32> {
    let malformed = || {
        if log_rare() {
            warn!(
                ctx,
                "router: malformed IPv4 frame of {} bytes passed to the kernel", len
            );
        }
        verdict(&COUNTERS, Outcome::Malformed, len, xdp_action::XDP_PASS)
    };
    let ip: *mut Ipv4Hdr = ptr_at(ctx, ETH_HLEN).ok_or_else(malformed)?;
    // SAFETY: the 20 bytes are inside the frame (checked by ptr_at). Read
    // in place: copying them to the stack costs 40 instructions.
    let hdr: &Ipv4Hdr = unsafe { &*ip };
    let version = hdr[0] >> 4;
    let ihl = hdr[0] & 0x0f;
    let tot_len = u16::from_be_bytes([hdr[2], hdr[3]]);
    // A frame may carry Ethernet padding after the datagram, never less
    // than the datagram.
    if version != 4
        || ihl < 5
        || (tot_len as usize) < IPV4_HLEN
        || ETH_HLEN as u64 + tot_len as u64 > len
    {
        return Err(malformed());
    }
    if ihl > 5 {
        // Options (record route, timestamp, source route) must be processed
        // by the kernel's ip_forward(); like hardware routers, leave them to
        // the slow path.
        return Ok(verdict(
            &COUNTERS,
            Outcome::PassIpOptions,
            len,
            xdp_action::XDP_PASS,
        ));
    }
    if !xdp_common::ipv4_checksum_ok(hdr) {
        // The kernel counts it (InHdrErrors) and drops it.
        return Err(malformed());
    }

    let ttl = hdr[8];
    let protocol = hdr[9];
    if ttl <= 1 {
        // The kernel answers with ICMP time exceeded.
        if log_rare() {
            debug!(
                ctx,
                "router: IPv4 TTL {} expires here, the kernel answers", ttl
            );
        }
        return Ok(verdict(
            &COUNTERS,
            Outcome::PassTtl,
            len,
            xdp_action::XDP_PASS,
        ));
    }

    let mut params = FibBuf(mem::MaybeUninit::uninit());
    let fib = params.zeroed();
    fib.family = AF_INET;
    fib.l4_protocol = protocol;
    fib.__bindgen_anon_1.tot_len = tot_len;
    fib.__bindgen_anon_2.tos = hdr[1];
    // Addresses stay in network byte order, as the kernel expects.
    fib.__bindgen_anon_3.ipv4_src = u32::from_ne_bytes([hdr[12], hdr[13], hdr[14], hdr[15]]);
    fib.__bindgen_anon_4.ipv4_dst = u32::from_ne_bytes([hdr[16], hdr[17], hdr[18], hdr[19]]);
    fib.ifindex = ctx.ingress_ifindex() as u32;

    let action = match lookup(ctx, fib) {
        Ok(action) => action,
        Err(outcome) => return Ok(verdict(&COUNTERS, outcome, len, fail_action(outcome))),
    };

    let check = u16::from_be_bytes([hdr[10], hdr[11]]);
    let new_check = ttl_decrement_csum(check, ttl, protocol).to_be_bytes();
    // SAFETY: ip and eth point inside the frame (checked above); XDP frames
    // are writable. The MACs are the union member bpf_fib_lookup fills on
    // success (the other, `mark`, is only an input with BPF_FIB_LOOKUP_MARK).
    unsafe {
        (*ip)[8] = ttl - 1;
        (*ip)[10] = new_check[0];
        (*ip)[11] = new_check[1];
        (*eth).dst = fib.__bindgen_anon_6.__bindgen_anon_2.dmac;
        (*eth).src = fib.__bindgen_anon_6.__bindgen_anon_2.smac;
    }
    Ok(verdict(&COUNTERS, Outcome::Redirected, len, action))
}

/// IPv6: no header checksum (the hop limit is decremented in place), no
/// options in the fixed header; extension headers, link-local and
/// multicast traffic go to the kernel.
#[inline(always)]
fn try_ipv6(ctx: &XdpContext, eth: *mut EthHdr, len: u64) -> Result<u32, u32> {
    let malformed = || {
        if log_rare() {
            warn!(
                ctx,
                "router: malformed IPv6 frame of {} bytes passed to the kernel", len
            );
        }
        verdict(&COUNTERS6, Outcome::Malformed, len, xdp_action::XDP_PASS)
    };
    let ip: *mut Ipv6Hdr = ptr_at(ctx, ETH_HLEN).ok_or_else(malformed)?;
    // SAFETY: the 40 bytes are inside the frame (checked by ptr_at).
    let hdr: &Ipv6Hdr = unsafe { &*ip };
    let payload_len = u16::from_be_bytes([hdr[4], hdr[5]]);
    // payload_len 0 is a jumbogram (hop-by-hop option), caught below as an
    // extension header only if it also says so: a zero length without one
    // is inconsistent.
    if hdr[0] >> 4 != 6 || (ETH_HLEN + IPV6_HLEN) as u64 + payload_len as u64 > len {
        return Err(malformed());
    }
    let next_header = hdr[6];
    let hop_limit = hdr[7];
    if xdp_common::ipv6_is_extension_header(next_header) {
        // Hop-by-hop options must be seen by every router, routing headers
        // may name this one: the kernel's ip6_forward() decides.
        return Ok(verdict(
            &COUNTERS6,
            Outcome::PassIpOptions,
            len,
            xdp_action::XDP_PASS,
        ));
    }
    // Link-local source or destination (fe80::/10) never leaves its link;
    // multicast (ff00::/8) is the kernel's (MLD, neighbour discovery).
    if hdr[24] == 0xff
        || (hdr[24] == 0xfe && hdr[25] & 0xc0 == 0x80)
        || (hdr[8] == 0xfe && hdr[9] & 0xc0 == 0x80)
    {
        return Ok(verdict(
            &COUNTERS6,
            Outcome::Passed,
            len,
            xdp_action::XDP_PASS,
        ));
    }
    if hop_limit <= 1 {
        // The kernel answers with ICMPv6 time exceeded.
        if log_rare() {
            debug!(
                ctx,
                "router: IPv6 hop limit {} expires here, the kernel answers", hop_limit
            );
        }
        return Ok(verdict(
            &COUNTERS6,
            Outcome::PassTtl,
            len,
            xdp_action::XDP_PASS,
        ));
    }

    let mut params = FibBuf(mem::MaybeUninit::uninit());
    let fib = params.zeroed();
    fib.family = AF_INET6;
    fib.l4_protocol = next_header;
    // The whole packet, as the kernel compares it with the route's MTU.
    fib.__bindgen_anon_1.tot_len = payload_len.saturating_add(IPV6_HLEN as u16);
    // Traffic class and flow label, network byte order (the version nibble
    // is masked off as the kernel's IPV6_FLOWINFO_MASK does).
    fib.__bindgen_anon_2.flowinfo = u32::from_ne_bytes([hdr[0] & 0x0f, hdr[1], hdr[2], hdr[3]]);
    let word = |at: usize| u32::from_ne_bytes([hdr[at], hdr[at + 1], hdr[at + 2], hdr[at + 3]]);
    fib.__bindgen_anon_3.ipv6_src = [word(8), word(12), word(16), word(20)];
    fib.__bindgen_anon_4.ipv6_dst = [word(24), word(28), word(32), word(36)];
    fib.ifindex = ctx.ingress_ifindex() as u32;

    let action = match lookup(ctx, fib) {
        Ok(action) => action,
        Err(outcome) => return Ok(verdict(&COUNTERS6, outcome, len, fail_action(outcome))),
    };
    // SAFETY: ip and eth point inside the frame (checked above); XDP frames
    // are writable. The MACs are the union member bpf_fib_lookup fills on
    // success (the other, `mark`, is only an input with BPF_FIB_LOOKUP_MARK).
    unsafe {
        (*ip)[7] = hop_limit - 1;
        (*eth).dst = fib.__bindgen_anon_6.__bindgen_anon_2.dmac;
        (*eth).src = fib.__bindgen_anon_6.__bindgen_anon_2.smac;
    }
    Ok(verdict(&COUNTERS6, Outcome::Redirected, len, action))
}

/// The FIB lookup and the egress check shared by both families: `Ok` with
/// the redirect action (the frame is still untouched), or `Err` with the
/// outcome of a frame the router leaves alone.
#[inline(always)]
fn lookup(ctx: &XdpContext, fib: &mut FibParams) -> Result<u32, Outcome> {
    // SAFETY: ctx is the program's context and fib a valid, sized struct.
    let rc = unsafe { bpf_fib_lookup(ctx.as_ptr(), fib, mem::size_of::<FibParams>() as i32, 0) };
    if rc < 0 {
        return Err(Outcome::Passed);
    }
    match rc as u32 {
        BPF_FIB_LKUP_RET_SUCCESS => {}
        BPF_FIB_LKUP_RET_BLACKHOLE | BPF_FIB_LKUP_RET_UNREACHABLE | BPF_FIB_LKUP_RET_PROHIBIT => {
            return Err(Outcome::DroppedUnreachable);
        }
        // NOT_FWDED (local/broadcast/multicast), FWD_DISABLED, NO_NEIGH
        // (the kernel resolves it), FRAG_NEEDED, UNSUPP_LWT, NO_SRC_ADDR.
        _ => return Err(Outcome::Passed),
    }
    // bpf_redirect_map only records the target; the frame is untouched
    // until we return, so a miss leaves it as it came in.
    EGRESS
        .redirect(fib.ifindex, xdp_action::XDP_PASS as u64)
        .map_err(|_| {
            if log_rare() {
                warn!(
                    ctx,
                    "router: route out of ifindex {} which is not in the egress map, passed",
                    fib.ifindex
                );
            }
            Outcome::PassNotInMap
        })
}

/// XDP_DROP for routes that say so, XDP_PASS for everything else refused.
#[inline(always)]
fn fail_action(outcome: Outcome) -> u32 {
    if outcome == Outcome::DroppedUnreachable {
        xdp_action::XDP_DROP
    } else {
        xdp_action::XDP_PASS
    }
}

/// Room for the bpf_fib_lookup parameters on the stack, 8-aligned so it
/// can be zeroed with 8-byte stores.
#[repr(C, align(8))]
struct FibBuf(mem::MaybeUninit<FibParams>);

impl FibBuf {
    /// Zeroes the parameters with eight volatile 8-byte stores: plain
    /// zero-initialisation (`mem::zeroed()`, `[0u64; 8]`) is lowered to a
    /// call to a byte-wise memset loop, 64 iterations per packet.
    #[inline(always)]
    fn zeroed(&mut self) -> &mut FibParams {
        const WORDS: usize = mem::size_of::<FibParams>() / 8;
        const _: () = assert!(mem::size_of::<FibParams>().is_multiple_of(8));
        let p = self.0.as_mut_ptr().cast::<u64>();
        for i in 0..WORDS {
            // SAFETY: in bounds (WORDS * 8 bytes) and 8-aligned (repr align).
            unsafe { p.add(i).write_volatile(0) };
        }
        // SAFETY: all-zero is a valid bpf_fib_lookup (integers and unions of integers).
        unsafe { self.0.assume_init_mut() }
    }
}

/// Counts the frame under `outcome` in the family's `counters` and returns
/// `action`.
#[inline(always)]
fn verdict(counters: &PerCpuArray<Counter>, outcome: Outcome, len: u64, action: u32) -> u32 {
    if let Some(c) = counters.get_ptr_mut(outcome.index()) {
        // SAFETY: a per-CPU slot, only this CPU writes it while we run.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += len;
        }
    }
    action
}

/// A pointer to a `T` at `offset` in the frame, or None if it would run
/// past the end (the check the verifier wants to see).
#[inline(always)]
pub(crate) fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Option<*mut T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *mut T)
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// bpf_fib_lookup is a GPL-only helper, so the program must declare a
/// GPL-compatible licence.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!(
        "xdp-router is an eBPF program: build it with `cargo xtask build-ebpf` (rtprobe embeds it)"
    );
    std::process::exit(2);
}
