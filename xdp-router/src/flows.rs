//! `rtprobe flows`' sock_ops program: the stages of a sample of the host's
//! own TCP sends, with no probe sent and no change to the application.
//!
//! Attached to a cgroup (by default the root: every socket of the host),
//! it turns the kernel's BPF TX timestamping on for each TCP socket as it
//! is established (`SK_BPF_CB_TX_TIMESTAMPING`, Linux >= 6.15). The kernel
//! then calls it at every `sendmsg` of those sockets
//! (`TSTAMP_SENDMSG_CB`), where it samples at most one send per socket
//! every `SAMPLE_GAP_NS` (and at most `CAP_PER_CPU` per second per CPU),
//! marking it with the kfunc `bpf_sock_ops_enable_tx_tstamp`. The marked
//! send comes back at the qdisc (`TSTAMP_SCHED_CB`), the driver
//! (`TSTAMP_SND_SW_CB`), the NIC's stamp (`TSTAMP_SND_HW_CB`) and the ACK
//! of its last byte (`TSTAMP_ACK_CB`); each time is kept in the socket's
//! entry of an LRU hash (bounded; closed sockets age out), and the whole
//! sample goes to a ring buffer at the ACK. A socket has at most one
//! sampled send in flight, so its cookie is the key (no `tskey` read).
//! Nothing is logged per packet; every decision is counted per CPU.
//!
//! Kernel interfaces: BPF_PROG_TYPE_SOCK_OPS on a cgroup (4.13), the TX
//! timestamping callbacks and `bpf_sock_ops_enable_tx_tstamp` (6.15),
//! `bpf_cast_to_kern_ctx` (6.2), LRU hash, per-CPU arrays, ring buffer
//! (5.8), read-only globals set at load time (5.2).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB},
    helpers::generated::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_smp_processor_id, bpf_get_socket_cookie, bpf_getsockopt, bpf_ktime_get_ns,
        bpf_setsockopt, bpf_skc_to_tcp_sock,
    },
    macros::{map, sock_ops},
    maps::{Array, LruHashMap, PerCpuArray, RingBuf},
    programs::SockOpsContext,
};
use xdp_common::flows::{
    Budget, FLOW_COUNTER_COUNT, FlowCounter, KFUNC_CAST_TO_KERN_CTX, KFUNC_ENABLE_TX_TSTAMP,
    MODE_UNWATCH, PENDING_MAX_ENTRIES, Pending, SAMPLE_GIVEN_UP, SAMPLE_RETRANSMITTED,
    SAMPLES_RING_BYTES, TxSample, WATCHED_MAX_ENTRIES, gap_passed, take_budget,
};

/// The least time between two sampled sends of one socket (set at load).
#[unsafe(no_mangle)]
static SAMPLE_GAP_NS: u64 = 100_000_000;
/// Sampled sends per second per CPU at most (set at load).
#[unsafe(no_mangle)]
static CAP_PER_CPU: u64 = 1_000;
/// A sampled send with no ACK after this long is given up (set at load).
#[unsafe(no_mangle)]
static GIVE_UP_NS: u64 = 2_000_000_000;

#[map(name = "FLOW_SAMPLES")]
static FLOW_SAMPLES: RingBuf = RingBuf::with_byte_size(SAMPLES_RING_BYTES, 0);

#[map(name = "FLOW_PENDING")]
static FLOW_PENDING: LruHashMap<u64, Pending> =
    LruHashMap::with_max_entries(PENDING_MAX_ENTRIES, 0);

#[map(name = "FLOW_COUNTERS")]
static FLOW_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(FLOW_COUNTER_COUNT, 0);

#[map(name = "FLOW_WATCHED")]
static FLOW_WATCHED: LruHashMap<u64, u8> = LruHashMap::with_max_entries(WATCHED_MAX_ENTRIES, 0);

#[map(name = "FLOW_MODE")]
static FLOW_MODE: Array<u32> = Array::with_max_entries(1, 0);

#[map(name = "FLOW_BUDGET")]
static FLOW_BUDGET: PerCpuArray<Budget> = PerCpuArray::with_max_entries(1, 0);

/// `SOL_SOCKET`, and the socket option of the BPF callbacks it turns on
/// (uapi/linux/bpf.h: `SK_BPF_CB_FLAGS`, `SK_BPF_CB_TX_TIMESTAMPING`).
const SOL_SOCKET: i32 = 1;
const SK_BPF_CB_FLAGS: i32 = 1009;
const SK_BPF_CB_TX_TIMESTAMPING: i32 = 1;
const AF_INET: u32 = 2;

/// The TX timestamping callbacks (uapi/linux/bpf.h, Linux 6.15).
const BPF_SOCK_OPS_TSTAMP_SCHED_CB: u32 = 16;
const BPF_SOCK_OPS_TSTAMP_SND_SW_CB: u32 = 17;
const BPF_SOCK_OPS_TSTAMP_SND_HW_CB: u32 = 18;
const BPF_SOCK_OPS_TSTAMP_ACK_CB: u32 = 19;
const BPF_SOCK_OPS_TSTAMP_SENDMSG_CB: u32 = 20;

/// A read-only global set at load time; volatile so it is not folded.
macro_rules! global {
    ($g:ident) => {
        // SAFETY: a read-only global of plain data.
        unsafe { core::ptr::read_volatile(&$g) }
    };
}

#[sock_ops]
pub fn rtprobe_flows(ctx: SockOpsContext) -> u32 {
    match ctx.op() {
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB | BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => watch(&ctx),
        BPF_SOCK_OPS_TSTAMP_SENDMSG_CB => on_sendmsg(&ctx),
        op @ (BPF_SOCK_OPS_TSTAMP_SCHED_CB
        | BPF_SOCK_OPS_TSTAMP_SND_SW_CB
        | BPF_SOCK_OPS_TSTAMP_SND_HW_CB
        | BPF_SOCK_OPS_TSTAMP_ACK_CB) => on_stamp(&ctx, op),
        _ => {}
    }
    1
}

#[inline(always)]
fn count(c: FlowCounter) {
    if let Some(v) = FLOW_COUNTERS.get_ptr_mut(c as u32) {
        // SAFETY: a per-CPU slot of this CPU's own.
        unsafe { *v += 1 };
    }
}

/// Turns the kernel's TX timestamping callbacks on for an established socket.
#[inline(always)]
fn watch(ctx: &SockOpsContext) {
    // SAFETY: the program's own context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    watch_socket(ctx.as_ptr(), cookie);
}

/// The socket's SK_BPF_CB_FLAGS (0 if they cannot be read).
#[inline(always)]
fn cb_flags(sk: *mut c_void) -> i32 {
    let mut flags: i32 = 0;
    // SAFETY: `sk` is what the program was given; 4 bytes on the stack.
    let r = unsafe {
        bpf_getsockopt(
            sk,
            SOL_SOCKET,
            SK_BPF_CB_FLAGS,
            (&raw mut flags).cast::<c_void>(),
            4,
        )
    };
    if r == 0 { flags } else { 0 }
}

/// Sets the socket's SK_BPF_CB_FLAGS; whether the kernel took them.
#[inline(always)]
fn set_cb_flags(sk: *mut c_void, flags: i32) -> bool {
    let mut v = flags;
    // SAFETY: as in `cb_flags`.
    unsafe {
        bpf_setsockopt(
            sk,
            SOL_SOCKET,
            SK_BPF_CB_FLAGS,
            (&raw mut v).cast::<c_void>(),
            4,
        ) == 0
    }
}

/// Turns the TX timestamping callbacks on for a socket that has them off,
/// and notes it in FLOW_WATCHED (one that has them on is someone else's
/// or already ours: left as it is).
#[inline(always)]
fn watch_socket(sk: *mut c_void, cookie: u64) {
    let flags = cb_flags(sk);
    if flags & SK_BPF_CB_TX_TIMESTAMPING != 0 {
        return;
    }
    if set_cb_flags(sk, flags | SK_BPF_CB_TX_TIMESTAMPING) {
        let _ = FLOW_WATCHED.insert(&cookie, &1, 0);
        count(FlowCounter::SocketsWatched);
    } else {
        count(FlowCounter::WatchFailed);
    }
}

/// Turns the callbacks off again on a socket in FLOW_WATCHED (on exit).
#[inline(always)]
fn unwatch_socket(sk: *mut c_void, cookie: u64) {
    // SAFETY: a lookup of a plain key.
    if unsafe { FLOW_WATCHED.get(&cookie) }.is_none() {
        return;
    }
    let flags = cb_flags(sk);
    if set_cb_flags(sk, flags & !SK_BPF_CB_TX_TIMESTAMPING) {
        count(FlowCounter::SocketsUnwatched);
    }
    let _ = FLOW_WATCHED.remove(&cookie);
}

/// The context of a TCP socket iterator (`struct bpf_iter__tcp`).
#[repr(C)]
pub struct IterTcp {
    meta: *mut c_void,
    sk_common: *mut c_void,
    uid: u32,
}

/// Watches the TCP sockets already open (in the network namespace of
/// whoever reads the iterator): rtprobe runs it once after attaching the
/// sock_ops program, which then only sees new sockets established. With
/// FLOW_MODE set to unwatch (on exit) it turns the callbacks off again on
/// the sockets it turned them on for.
///
/// # Safety
///
/// The kernel calls it with its iterator context; nothing else may.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/tcp")]
pub unsafe extern "C" fn rtprobe_flows_existing(ctx: *mut IterTcp) -> i32 {
    // SAFETY: the iterator's context; the kernel gives a socket or null.
    let skc = unsafe { (*ctx).sk_common };
    if skc.is_null() {
        return 0;
    }
    // SAFETY: a socket from the iterator; null unless it is a full TCP one.
    let tp = unsafe { bpf_skc_to_tcp_sock(skc) };
    if tp.is_null() {
        return 0;
    }
    let sk = tp.cast::<c_void>();
    // SAFETY: a full TCP socket.
    let cookie = unsafe { bpf_get_socket_cookie(sk) };
    if FLOW_MODE.get(0).copied() == Some(MODE_UNWATCH) {
        unwatch_socket(sk, cookie);
    } else {
        watch_socket(sk, cookie);
    }
    0
}

/// `bpf_cast_to_kern_ctx`: the placeholder rtprobe turns into the kfunc.
#[inline(always)]
unsafe fn cast_to_kern_ctx(ctx: *mut c_void) -> *mut c_void {
    // SAFETY: rtprobe replaces this call before loading (see KFUNCS).
    unsafe {
        let f: unsafe extern "C" fn(*mut c_void) -> *mut c_void =
            core::mem::transmute(KFUNC_CAST_TO_KERN_CTX as usize);
        f(ctx)
    }
}

/// `bpf_sock_ops_enable_tx_tstamp`: the placeholder for the kfunc.
#[inline(always)]
unsafe fn enable_tx_tstamp(kern_ctx: *mut c_void, flags: u64) -> i32 {
    // SAFETY: as above.
    unsafe {
        let f: unsafe extern "C" fn(*mut c_void, u64) -> i32 =
            core::mem::transmute(KFUNC_ENABLE_TX_TSTAMP as usize);
        f(kern_ctx, flags)
    }
}

/// Writes a finished (or given-up) sample to the ring buffer.
#[inline(always)]
fn report(s: &TxSample) {
    count(match FLOW_SAMPLES.output::<TxSample>(s, 0) {
        Ok(()) => FlowCounter::Reported,
        Err(_) => FlowCounter::RingFull,
    });
}

/// A `sendmsg` of a watched socket: samples it if the socket has none in
/// flight, its gap has passed and the CPU's budget allows.
#[inline(always)]
fn on_sendmsg(ctx: &SockOpsContext) {
    count(FlowCounter::Sends);
    // SAFETY: plain helpers on the program's own context.
    let (now, cookie) = unsafe { (bpf_ktime_get_ns(), bpf_get_socket_cookie(ctx.as_ptr())) };
    if let Some(p) = FLOW_PENDING.get_ptr_mut(&cookie) {
        // SAFETY: the map's value, this socket's (its callbacks run in turn).
        let p = unsafe { &mut *p };
        if p.sample.sendmsg_ns != 0 {
            if now.wrapping_sub(p.sample.sendmsg_ns) < global!(GIVE_UP_NS) {
                count(FlowCounter::SkippedInFlight);
                return;
            }
            p.sample.flags |= SAMPLE_GIVEN_UP;
            report(&p.sample);
            count(FlowCounter::GivenUp);
            p.sample.sendmsg_ns = 0;
        }
        if !gap_passed(p.last_sampled_ns, now, global!(SAMPLE_GAP_NS)) {
            count(FlowCounter::SkippedFlowRate);
            return;
        }
    }
    let Some(b) = FLOW_BUDGET.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot.
    if !take_budget(unsafe { &mut *b }, now, global!(CAP_PER_CPU)) {
        count(FlowCounter::SkippedGlobalCap);
        return;
    }
    // SAFETY: the kfuncs take the program's context (see KFUNCS).
    if unsafe { enable_tx_tstamp(cast_to_kern_ctx(ctx.as_ptr()), 0) } != 0 {
        return;
    }
    let pending = Pending {
        sample: new_sample(ctx, cookie, now),
        last_sampled_ns: now,
    };
    if FLOW_PENDING.insert(&cookie, &pending, 0).is_ok() {
        count(FlowCounter::Sampled);
    }
}

/// What is known of a sampled send at its `sendmsg`: the socket, the
/// sending task, the bytes.
#[inline(always)]
fn new_sample(ctx: &SockOpsContext, cookie: u64, now: u64) -> TxSample {
    let mut s = TxSample {
        cookie,
        sendmsg_ns: now,
        family: ctx.family(),
        // The local port in host order; the remote one in network order,
        // in the upper 16 bits (the kernel shifts it there on little
        // endian hosts) or the lower.
        local_port: ctx.local_port(),
        remote_port: remote_port(ctx.remote_port()),
        ..TxSample::default()
    };
    if s.family == AF_INET {
        s.local_addr[0] = ctx.local_ip4();
        s.remote_addr[0] = ctx.remote_ip4();
    } else {
        // Word by word at fixed offsets: the verifier refuses a wider load
        // from the context, or one through a moved pointer.
        // SAFETY: the program's context.
        unsafe {
            let o = ctx.ops;
            for i in 0..4 {
                s.local_addr[i] = core::ptr::read_volatile(&raw const (*o).local_ip6[i]);
                s.remote_addr[i] = core::ptr::read_volatile(&raw const (*o).remote_ip6[i]);
            }
        }
    }
    // SAFETY: plain helpers; `comm` is 16 writable bytes; `ops` is the
    // program's context.
    unsafe {
        let id = bpf_get_current_pid_tgid();
        s.pid = (id >> 32) as u32;
        s.tid = id as u32;
        s.cgroup_id = bpf_get_current_cgroup_id();
        bpf_get_current_comm(s.comm.as_mut_ptr().cast::<c_void>(), 16);
        s.bytes = (*ctx.ops).skb_len;
        s.cpu = bpf_get_smp_processor_id();
    }
    s
}

/// The remote port in host order from `bpf_sock_ops.remote_port`.
#[inline(always)]
fn remote_port(raw: u32) -> u32 {
    let be = if raw > 0xffff { raw >> 16 } else { raw };
    u16::from_be(be as u16) as u32
}

/// Keeps the first time of a stage; a second one is a retransmission's.
#[inline(always)]
fn first(at: &mut u64, now: u64, flags: &mut u32) {
    if *at == 0 {
        *at = now;
    } else {
        *flags |= SAMPLE_RETRANSMITTED;
    }
}

/// A stage of the socket's sampled send: its time kept; at the ACK the
/// sample is reported and the socket may sample again.
#[inline(always)]
fn on_stamp(ctx: &SockOpsContext, op: u32) {
    // SAFETY: plain helpers on the program's own context.
    let (now, cookie) = unsafe { (bpf_ktime_get_ns(), bpf_get_socket_cookie(ctx.as_ptr())) };
    let Some(p) = FLOW_PENDING.get_ptr_mut(&cookie) else {
        return;
    };
    // SAFETY: the map's value, this socket's.
    let s = unsafe { &mut (*p).sample };
    if s.sendmsg_ns == 0 {
        return;
    }
    match op {
        BPF_SOCK_OPS_TSTAMP_SCHED_CB => first(&mut s.sched_ns, now, &mut s.flags),
        BPF_SOCK_OPS_TSTAMP_SND_SW_CB => first(&mut s.sw_ns, now, &mut s.flags),
        BPF_SOCK_OPS_TSTAMP_SND_HW_CB => {
            first(&mut s.hw_cb_ns, now, &mut s.flags);
            // SAFETY: the program's context.
            s.hw_stamp_ns = unsafe { (*ctx.ops).skb_hwtstamp };
        }
        _ => {
            s.ack_ns = now;
            report(s);
            s.sendmsg_ns = 0;
        }
    }
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// The TX timestamping kfunc is GPL-only.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!(
        "xdp-flows is an eBPF program: build it with `cargo xtask build-ebpf` (rtprobe embeds it)"
    );
    std::process::exit(2);
}
