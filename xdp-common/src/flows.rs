//! Types shared by the sock_ops program (`xdp-flows`) and `rtprobe flows`:
//! the passive per-stage view of the host's own TCP sends.
//!
//! The program asks the kernel (Linux >= 6.15) to timestamp a sample of
//! each TCP socket's sends for it, with no change to the application: a
//! sampled send is seen at `sendmsg` (`BPF_SOCK_OPS_TSTAMP_SENDMSG_CB`),
//! at the qdisc (`..._SCHED_CB`), at the driver (`..._SND_SW_CB`), where
//! the NIC stamps (`..._SND_HW_CB`) and when its last byte is
//! acknowledged (`..._ACK_CB`). A socket has at most one sampled send in
//! flight, so the socket's cookie is the key.

/// Name of the sock_ops program in the object file.
pub const FLOWS_PROGRAM: &str = "rtprobe_flows";
/// Name of its TCP socket iterator (`iter/tcp`), which watches the
/// sockets already open when rtprobe starts.
pub const EXISTING_PROGRAM: &str = "rtprobe_flows_existing";
/// Ring buffer of [`TxSample`]s, one per sampled send once it is
/// acknowledged (or given up).
pub const SAMPLES_MAP: &str = "FLOW_SAMPLES";
/// Its size in bytes (a power of two, a multiple of the page size).
pub const SAMPLES_RING_BYTES: u32 = 1 << 20;
/// LRU hash: socket cookie -> [`Pending`]. Bounded: the least recently
/// used socket's entry goes first, so closed sockets age out.
pub const PENDING_MAP: &str = "FLOW_PENDING";
/// Capacity of [`PENDING_MAP`]: sockets tracked at once.
pub const PENDING_MAX_ENTRIES: u32 = 16_384;
/// Per-CPU array of u64, indexed by [`FlowCounter`].
pub const FLOW_COUNTERS_MAP: &str = "FLOW_COUNTERS";
/// LRU hash: the cookies of the sockets the program turned the callbacks
/// on for (and no one else had), so that rtprobe turns them off again on
/// exit, and only those.
pub const WATCHED_MAP: &str = "FLOW_WATCHED";
/// Its capacity: sockets beyond it keep the (then idle) flag.
pub const WATCHED_MAX_ENTRIES: u32 = 65_536;
/// Array of one u32: 0 while watching; 1 makes the socket iterator turn
/// the callbacks off on the sockets in [`WATCHED_MAP`] (on exit).
pub const MODE_MAP: &str = "FLOW_MODE";
/// [`MODE_MAP`]'s value on exit.
pub const MODE_UNWATCH: u32 = 1;
/// Per-CPU array of one [`Budget`]: the global sampling cap's window.
pub const BUDGET_MAP: &str = "FLOW_BUDGET";
/// Load-time global (u64): the least time between two sampled sends of
/// one socket, in ns (1 s / the per-flow sampling rate).
pub const SAMPLE_GAP_GLOBAL: &str = "SAMPLE_GAP_NS";
/// Load-time global (u64): sampled sends per second per CPU at most (the
/// global cap divided among the CPUs).
pub const CAP_PER_CPU_GLOBAL: &str = "CAP_PER_CPU";
/// Load-time global (u64): a sampled send not acknowledged within this
/// many ns is given up (reported without its ACK) at the socket's next
/// send.
pub const GIVE_UP_GLOBAL: &str = "GIVE_UP_NS";

/// The kernel functions (kfuncs) the program calls. The eBPF side calls
/// each through a placeholder address, which compiles to a helper call
/// (`call imm`) of that number; rtprobe turns each into a kfunc call
/// (`BPF_PSEUDO_KFUNC_CALL`, the function's id in the running kernel's
/// BTF) before loading: the loader resolves no kfuncs itself.
pub const KFUNC_CAST_TO_KERN_CTX: u32 = 0x7ead_0001;
/// See [`KFUNC_CAST_TO_KERN_CTX`].
pub const KFUNC_ENABLE_TX_TSTAMP: u32 = 0x7ead_0002;
/// Each placeholder and the kfunc it stands for.
pub const KFUNCS: [(u32, &str); 2] = [
    (KFUNC_CAST_TO_KERN_CTX, "bpf_cast_to_kern_ctx"),
    (KFUNC_ENABLE_TX_TSTAMP, "bpf_sock_ops_enable_tx_tstamp"),
];

/// `TxSample::flags`: the send was given up before its ACK came.
pub const SAMPLE_GIVEN_UP: u32 = 1;
/// `TxSample::flags`: a stage callback came again (a retransmission of the
/// sampled bytes); the first time of each stage is kept.
pub const SAMPLE_RETRANSMITTED: u32 = 2;

/// What the program counted; the index into [`FLOW_COUNTERS_MAP`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FlowCounter {
    /// Sends (`sendmsg` calls) of the sockets it watches.
    Sends = 0,
    /// Sends it sampled.
    Sampled = 1,
    /// Sends not sampled: the socket's sampling rate.
    SkippedFlowRate = 2,
    /// Sends not sampled: the global cap.
    SkippedGlobalCap = 3,
    /// Sends not sampled: the socket had a sampled send in flight.
    SkippedInFlight = 4,
    /// Samples written to the ring buffer.
    Reported = 5,
    /// Samples lost: the ring buffer was full (user space behind).
    RingFull = 6,
    /// Sampled sends given up without an ACK.
    GivenUp = 7,
    /// Sockets the program turned TX timestamping on for.
    SocketsWatched = 8,
    /// Sockets it could not (`bpf_setsockopt` refused).
    WatchFailed = 9,
    /// Sockets it turned the callbacks off for again, on exit.
    SocketsUnwatched = 10,
}

/// Number of [`FlowCounter`]s.
pub const FLOW_COUNTER_COUNT: u32 = 11;

impl FlowCounter {
    /// Every counter, in index order.
    pub const ALL: [FlowCounter; FLOW_COUNTER_COUNT as usize] = [
        FlowCounter::Sends,
        FlowCounter::Sampled,
        FlowCounter::SkippedFlowRate,
        FlowCounter::SkippedGlobalCap,
        FlowCounter::SkippedInFlight,
        FlowCounter::Reported,
        FlowCounter::RingFull,
        FlowCounter::GivenUp,
        FlowCounter::SocketsWatched,
        FlowCounter::WatchFailed,
        FlowCounter::SocketsUnwatched,
    ];

    /// Its name in summaries.
    pub const fn name(self) -> &'static str {
        match self {
            FlowCounter::Sends => "sends",
            FlowCounter::Sampled => "sampled",
            FlowCounter::SkippedFlowRate => "skipped_flow_rate",
            FlowCounter::SkippedGlobalCap => "skipped_global_cap",
            FlowCounter::SkippedInFlight => "skipped_in_flight",
            FlowCounter::Reported => "reported",
            FlowCounter::RingFull => "ring_full",
            FlowCounter::GivenUp => "given_up",
            FlowCounter::SocketsWatched => "sockets_watched",
            FlowCounter::WatchFailed => "watch_failed",
            FlowCounter::SocketsUnwatched => "sockets_unwatched",
        }
    }
}

/// One sampled send, from its `sendmsg` to the ACK of its last byte. Times
/// are CLOCK_MONOTONIC ns (`bpf_ktime_get_ns`) when each callback ran; 0:
/// that stage was not seen.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxSample {
    /// The socket's cookie (`SO_COOKIE`): one per socket for its life.
    pub cookie: u64,
    /// The sending task's cgroup (v2) id, the inode number of its
    /// directory under /sys/fs/cgroup; 0: unknown.
    pub cgroup_id: u64,
    /// `sendmsg` marked the send (`TSTAMP_SENDMSG_CB`).
    pub sendmsg_ns: u64,
    /// It entered the qdisc (`TSTAMP_SCHED_CB`).
    pub sched_ns: u64,
    /// It went to the driver (`TSTAMP_SND_SW_CB`).
    pub sw_ns: u64,
    /// The NIC's stamp came back (`TSTAMP_SND_HW_CB`).
    pub hw_cb_ns: u64,
    /// The NIC's stamp itself, on the NIC's clock; 0: none.
    pub hw_stamp_ns: u64,
    /// Its last byte was acknowledged (`TSTAMP_ACK_CB`).
    pub ack_ns: u64,
    /// The sending process (tgid) and thread at `sendmsg`; 0: unknown.
    pub pid: u32,
    pub tid: u32,
    /// Bytes of the sampled skb at `sendmsg`.
    pub bytes: u32,
    /// The CPU `sendmsg` ran on. (The socket's smoothed RTT cannot be
    /// read here: the kernel hides the TCP fields from these callbacks,
    /// which may run without the socket's lock.)
    pub cpu: u32,
    /// `SAMPLE_*` flags.
    pub flags: u32,
    /// AF_INET or AF_INET6.
    pub family: u32,
    /// Ports in host order.
    pub local_port: u32,
    pub remote_port: u32,
    /// Addresses in network order (IPv4 in the first word).
    pub local_addr: [u32; 4],
    pub remote_addr: [u32; 4],
    /// The sending task's name at `sendmsg`, NUL-padded.
    pub comm: [u8; 16],
}

// SAFETY: plain integers, no implicit padding (8 x u64, 8 x u32, two
// addresses of 16 B, 16 B of name), every bit pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for TxSample {}

/// The in-flight state of one socket: its sampled send (`sample.sendmsg_ns
/// != 0` while in flight) and when it last sampled one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub sample: TxSample,
    pub last_sampled_ns: u64,
}

// SAFETY: as TxSample, plus one u64.
#[cfg(feature = "user")]
unsafe impl aya::Pod for Pending {}

/// One CPU's window of the global sampling cap.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget {
    /// CLOCK_MONOTONIC start of the current one-second window.
    pub window_ns: u64,
    /// Sends sampled on this CPU in it.
    pub used: u64,
}

// SAFETY: two u64.
#[cfg(feature = "user")]
unsafe impl aya::Pod for Budget {}

/// Whether a send may be sampled by the global cap: takes one from the
/// window of `now_ns` (a new window every second). Pure, so both sides
/// test it.
#[inline(always)]
pub fn take_budget(b: &mut Budget, now_ns: u64, cap: u64) -> bool {
    if now_ns.wrapping_sub(b.window_ns) >= 1_000_000_000 {
        b.window_ns = now_ns;
        b.used = 0;
    }
    if b.used >= cap {
        return false;
    }
    b.used += 1;
    true
}

/// Whether a socket that last sampled at `last_ns` may sample again.
#[inline(always)]
pub fn gap_passed(last_ns: u64, now_ns: u64, gap_ns: u64) -> bool {
    last_ns == 0 || now_ns.wrapping_sub(last_ns) >= gap_ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_has_no_implicit_padding() {
        assert_eq!(
            core::mem::size_of::<TxSample>(),
            8 * 8 + 8 * 4 + 2 * 16 + 16
        );
        assert_eq!(core::mem::size_of::<TxSample>() % 8, 0);
    }

    #[test]
    fn the_budget_refills_each_second_and_caps_within_one() {
        let mut b = Budget::default();
        let t0 = 5_000_000_000;
        assert!(take_budget(&mut b, t0, 2));
        assert!(take_budget(&mut b, t0 + 1, 2));
        assert!(!take_budget(&mut b, t0 + 2, 2), "the third in one window");
        assert!(take_budget(&mut b, t0 + 1_000_000_000, 2), "a new window");
        assert!(
            !take_budget(&mut Budget::default(), t0, 0),
            "a cap of 0 samples nothing"
        );
    }

    #[test]
    fn a_socket_samples_again_after_its_gap() {
        assert!(gap_passed(0, 10, 1_000), "never sampled");
        assert!(!gap_passed(100, 1_099, 1_000));
        assert!(gap_passed(100, 1_100, 1_000));
    }

    #[test]
    fn counters_are_in_index_order() {
        for (i, c) in FlowCounter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i, "{}", c.name());
        }
    }
}
