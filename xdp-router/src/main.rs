//! rtprobe's XDP router: an IPv4 forwarder in the style of xdp-tutorial's
//! `xdp_router_func` and xdp-tools' `xdp_forward`.
//!
//! For each frame: bounds-checked Ethernet + IPv4 parse; anything that is
//! not plain IPv4 goes to the kernel (XDP_PASS), as does every frame the
//! router cannot or should not handle itself (truncated or inconsistent
//! headers, IP options, TTL <= 1, a FIB result other than success). On a
//! successful `bpf_fib_lookup` towards an interface userspace put in
//! `EGRESS`, the TTL is decremented (incremental checksum), the MACs are
//! rewritten and the frame is redirected through the DEVMAP_HASH.
//! Blackhole/unreachable/prohibit routes are dropped. Every frame is counted
//! per outcome in a per-CPU array; nothing is logged per packet.
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
use xdp_common::{Counter, EGRESS_MAX_ENTRIES, OUTCOME_COUNT, Outcome, ttl_decrement_csum};

/// Set by userspace at load time (aya `EbpfLoader::set_global`): non-zero
/// turns the router into a pure XDP_PASS program that still counts, the
/// study's "XDP_PASS by default" variant. Read-only after load, so the
/// verifier prunes the unused branch.
#[unsafe(no_mangle)]
static PASS_ONLY: u8 = 0;

#[map(name = "COUNTERS")]
static COUNTERS: PerCpuArray<Counter> = PerCpuArray::with_max_entries(OUTCOME_COUNT, 0);

/// Interfaces the router may redirect to, keyed by ifindex (value: the
/// same ifindex). Userspace fills it; a route out of any other interface
/// is left to the kernel.
#[map(name = "EGRESS")]
static EGRESS: DevMapHash = DevMapHash::with_max_entries(EGRESS_MAX_ENTRIES, 0);

pub(crate) const ETH_HLEN: usize = 14;
const ETH_ALEN: usize = 6;
pub(crate) const ETH_P_IP: u16 = 0x0800;
const AF_INET: u8 = 2;
pub(crate) const IPV4_HLEN: usize = 20;

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
        return Ok(verdict(Outcome::PassOnly, len, xdp_action::XDP_PASS));
    }

    let malformed = || verdict(Outcome::Malformed, len, xdp_action::XDP_PASS);

    let eth: *mut EthHdr = ptr_at(ctx, 0).ok_or_else(malformed)?;
    // SAFETY: ptr_at checked that the whole header is inside the frame.
    if u16::from_be_bytes(unsafe { (*eth).proto }) != ETH_P_IP {
        // ARP, IPv6, VLAN tags (0x8100/0x88a8), ...: the kernel's business.
        return Ok(verdict(Outcome::NonIpv4, len, xdp_action::XDP_PASS));
    }

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
        return Ok(verdict(Outcome::PassIpOptions, len, xdp_action::XDP_PASS));
    }
    if !xdp_common::ipv4_checksum_ok(hdr) {
        // The kernel counts it (InHdrErrors) and drops it.
        return Err(malformed());
    }

    let ttl = hdr[8];
    let protocol = hdr[9];
    if ttl <= 1 {
        // The kernel answers with ICMP time exceeded.
        return Ok(verdict(Outcome::PassTtl, len, xdp_action::XDP_PASS));
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

    // SAFETY: ctx is the program's context and fib a valid, sized struct.
    let rc = unsafe { bpf_fib_lookup(ctx.as_ptr(), fib, mem::size_of::<FibParams>() as i32, 0) };
    if rc < 0 {
        return Ok(verdict(Outcome::Passed, len, xdp_action::XDP_PASS));
    }
    match rc as u32 {
        BPF_FIB_LKUP_RET_SUCCESS => {}
        BPF_FIB_LKUP_RET_BLACKHOLE | BPF_FIB_LKUP_RET_UNREACHABLE | BPF_FIB_LKUP_RET_PROHIBIT => {
            return Ok(verdict(
                Outcome::DroppedUnreachable,
                len,
                xdp_action::XDP_DROP,
            ));
        }
        // NOT_FWDED (local/broadcast/multicast), FWD_DISABLED, NO_NEIGH
        // (the kernel resolves it), FRAG_NEEDED, UNSUPP_LWT, NO_SRC_ADDR.
        _ => return Ok(verdict(Outcome::Passed, len, xdp_action::XDP_PASS)),
    }

    // bpf_redirect_map only records the target; the frame is untouched
    // until we return, so a miss leaves it as it came in.
    let action = match EGRESS.redirect(fib.ifindex, xdp_action::XDP_PASS as u64) {
        Ok(action) => action,
        Err(_) => return Ok(verdict(Outcome::PassNotInMap, len, xdp_action::XDP_PASS)),
    };

    let check = u16::from_be_bytes([hdr[10], hdr[11]]);
    let new_check = ttl_decrement_csum(check, ttl, protocol).to_be_bytes();
    // SAFETY: ip and eth point inside the frame (checked above); XDP frames
    // are writable.
    unsafe {
        (*ip)[8] = ttl - 1;
        (*ip)[10] = new_check[0];
        (*ip)[11] = new_check[1];
        (*eth).dst = fib.dmac;
        (*eth).src = fib.smac;
    }
    Ok(verdict(Outcome::Redirected, len, action))
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

/// Counts the frame under `outcome` and returns `action`.
#[inline(always)]
fn verdict(outcome: Outcome, len: u64, action: u32) -> u32 {
    if let Some(c) = COUNTERS.get_ptr_mut(outcome.index()) {
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
