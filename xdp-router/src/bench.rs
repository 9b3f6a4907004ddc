//! The XDP programs of `rtprobe bench-forward` (the `xdp-bench` object,
//! built and embedded like the router). Every parameter is a read-only
//! global userspace sets at load time (aya `EbpfLoader::override_global`).
//!
//! - `bench_loadgen`: the load generator, run by BPF_PROG_TEST_RUN in XDP
//!   live-frames mode (the mechanism xdp-trafficgen uses): it keeps a
//!   `LOAD_KEEP / 2^32` share of the runs (else XDP_DROP, which recycles
//!   the frame at once), restores the frame's first 42 bytes (live frames
//!   come from a recycled page pool, and a frame the router forwarded comes
//!   back with its rewrites) and returns `bpf_redirect(LOAD_IFINDEX)`, so
//!   the kernel transmits it without socket or skb.
//! - `bench_sink`: on the receiving interface, XDP_DROP for IPv4 UDP to
//!   `SINK_PORT` (the load), XDP_PASS for everything else (the probes).
//! - `bench_bounce`: the XDP thesis's baseline: swap the MACs and XDP_TX
//!   every frame back out of the interface it came in on, after
//!   `BOUNCE_WORK` memory accesses.
//! - `bench_xsk`: hands every frame to the AF_XDP socket bound to its
//!   receive queue (XSKMAP), XDP_PASS where none is.
//!
//! Each counts what it handled in `BENCH_COUNTERS` (per CPU, no atomics).
//!
//! Kernel interfaces: XDP (BPF_PROG_TYPE_XDP, XDP_TX, bpf_redirect,
//! bpf_redirect_map on an XSKMAP: 4.18), bpf_get_prandom_u32, per-CPU
//! arrays, read-only global data set at load time (5.2); the generator
//! needs BPF_F_TEST_XDP_LIVE_FRAMES (5.18). Minimum kernel: 5.18.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod busy;

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_get_prandom_u32, bpf_redirect},
    macros::{map, xdp},
    maps::{PerCpuArray, XskMap},
    programs::XdpContext,
};
use busy::Scratch;
use xdp_common::{BENCH_HEADER_LEN, BENCH_HEADER_WORDS, Counter};

/// Egress interface of the generated frames (in the generator's namespace).
#[unsafe(no_mangle)]
static LOAD_IFINDEX: u32 = 0;
/// Share of runs that send a frame, in 1/2^32; u32::MAX sends every one.
#[unsafe(no_mangle)]
static LOAD_KEEP: u32 = u32::MAX;
/// The first 42 bytes of the frame (Ethernet, IPv4, UDP headers), as
/// little-endian words: bytes 0..40 in words 0..5, bytes 40..42 in the low
/// half of word 5.
#[unsafe(no_mangle)]
static LOAD_HEADER: [u64; BENCH_HEADER_WORDS] = [0; BENCH_HEADER_WORDS];
/// UDP destination port (host order) the sink drops.
#[unsafe(no_mangle)]
static SINK_PORT: u16 = 9;
/// Memory accesses per frame in `bench_bounce`; 0 = none.
#[unsafe(no_mangle)]
static BOUNCE_WORK: u32 = 0;

#[map(name = "BENCH_COUNTERS")]
static BENCH_COUNTERS: PerCpuArray<Counter> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "BENCH_SCRATCH")]
static BENCH_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

#[map(name = "BENCH_XSKS")]
static BENCH_XSKS: XskMap = XskMap::with_max_entries(64, 0);

const ETH_HLEN: usize = 14;

/// Reads a read-only global without letting the compiler fold it to its
/// initial value.
macro_rules! global {
    ($g:expr) => {
        // SAFETY: a plain read of a 'static global the loader fixed.
        unsafe { core::ptr::read_volatile(&$g) }
    };
}

#[inline(always)]
fn count(len: usize) {
    if let Some(c) = BENCH_COUNTERS.get_ptr_mut(0) {
        // SAFETY: a per-CPU slot, only this CPU writes it while we run.
        unsafe {
            (*c).packets += 1;
            (*c).bytes += len as u64;
        }
    }
}

#[inline(always)]
fn frame_len(ctx: &XdpContext) -> usize {
    ctx.data_end() - ctx.data()
}

#[xdp]
pub fn bench_loadgen(ctx: XdpContext) -> u32 {
    match try_loadgen(&ctx) {
        Ok(action) | Err(action) => action,
    }
}

#[inline(always)]
fn try_loadgen(ctx: &XdpContext) -> Result<u32, u32> {
    let keep = global!(LOAD_KEEP);
    // SAFETY: helper without arguments.
    if keep != u32::MAX && unsafe { bpf_get_prandom_u32() } > keep {
        return Err(xdp_action::XDP_DROP);
    }
    let start = ctx.data();
    if start + BENCH_HEADER_LEN > ctx.data_end() {
        return Err(xdp_action::XDP_DROP);
    }
    let words = start as *mut u64;
    // `i` indexes the global and the frame alike; each word is one
    // volatile read of its own global slot.
    #[allow(clippy::needless_range_loop)]
    for i in 0..BENCH_HEADER_WORDS - 1 {
        let word = global!(LOAD_HEADER[i]);
        // SAFETY: 40 bytes inside the frame (checked above); live frames
        // start XDP_PACKET_HEADROOM (256) bytes into a page, so the data
        // pointer is 8-aligned.
        unsafe { words.add(i).write_volatile(word) };
    }
    let tail = global!(LOAD_HEADER[BENCH_HEADER_WORDS - 1]) as u16;
    // SAFETY: bytes 40..42 are inside the frame (checked above), 2-aligned.
    unsafe { (start as *mut u16).add(20).write_volatile(tail) };
    count(frame_len(ctx));
    let ifindex = global!(LOAD_IFINDEX);
    // SAFETY: plain helper call.
    Ok(unsafe { bpf_redirect(ifindex, 0) } as u32)
}

#[xdp]
pub fn bench_sink(ctx: XdpContext) -> u32 {
    match try_sink(&ctx) {
        Ok(action) | Err(action) => action,
    }
}

#[inline(always)]
fn try_sink(ctx: &XdpContext) -> Result<u32, u32> {
    let pass = xdp_action::XDP_PASS;
    let start = ctx.data();
    // Up to the UDP destination port.
    if start + ETH_HLEN + 20 + 4 > ctx.data_end() {
        return Err(pass);
    }
    let p = start as *const u8;
    // SAFETY: 38 bytes inside the frame (checked above).
    let (ethertype, ver_ihl, proto, dport) = unsafe {
        (
            u16::from_be_bytes([*p.add(12), *p.add(13)]),
            *p.add(14),
            *p.add(23),
            u16::from_be_bytes([*p.add(36), *p.add(37)]),
        )
    };
    if ethertype != 0x0800 || ver_ihl != 0x45 || proto != 17 || dport != global!(SINK_PORT) {
        return Err(pass);
    }
    count(frame_len(ctx));
    Ok(xdp_action::XDP_DROP)
}

#[xdp]
pub fn bench_bounce(ctx: XdpContext) -> u32 {
    match try_bounce(&ctx) {
        Ok(action) | Err(action) => action,
    }
}

#[inline(always)]
fn try_bounce(ctx: &XdpContext) -> Result<u32, u32> {
    let start = ctx.data();
    if start + ETH_HLEN > ctx.data_end() {
        return Err(xdp_action::XDP_PASS);
    }
    if let Some(s) = BENCH_SCRATCH.get_ptr_mut(0) {
        busy::touch(s, global!(BOUNCE_WORK));
    }
    let p = start as *mut [u8; 6];
    // SAFETY: the 12 MAC bytes are inside the frame (checked above).
    unsafe {
        let dst = *p;
        *p = *p.add(1);
        *p.add(1) = dst;
    }
    count(frame_len(ctx));
    Ok(xdp_action::XDP_TX)
}

#[xdp]
pub fn bench_xsk(ctx: XdpContext) -> u32 {
    let len = frame_len(&ctx);
    match BENCH_XSKS.redirect(ctx.rx_queue_index(), xdp_action::XDP_PASS as u64) {
        Ok(action) => {
            count(len);
            action
        }
        Err(action) => action,
    }
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!(
        "xdp-bench holds eBPF programs: build them with `cargo xtask build-ebpf` (rtprobe embeds them)"
    );
    std::process::exit(2);
}
