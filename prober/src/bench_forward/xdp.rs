//! The bench's own XDP programs, written in Rust (`xdp-router/src/bench.rs`,
//! embedded as the `xdp-bench` object) and the router's work variant
//! (`xdp_router_work` in the router's object), loaded with aya: parameters
//! are read-only globals fixed at load time, the load generator runs
//! through BPF_PROG_TEST_RUN in XDP live-frames mode.
//!
//! Kernel interfaces: bpf(2) through aya: BPF_PROG_LOAD of XDP programs with
//! global data (5.2), BPF_LINK_CREATE for XDP (5.9), BPF_PROG_TEST_RUN with
//! BPF_F_TEST_XDP_LIVE_FRAMES (5.18), per-CPU arrays, DEVMAP_HASH (5.4),
//! XSKMAP (4.18). Minimum kernel: 5.18.
//!
//! Attach and the egress map's DEVMAP update go through [`crate::sys::Sys`]
//! (run inside the interface's namespace by its worker). A program attached
//! here stays attached until its [`BenchProgram`] is dropped, which detaches
//! it through the same kernel layer, so drop it before the testbed it is
//! attached in.

use anyhow::{Context, Result, bail};
use aya::{
    EbpfLoader,
    maps::XskMap,
    programs::{ProgramError, TestRun, TestRunAttrs, TestRunOptions, Xdp},
};
use xdp_common::{
    BENCH_HEADER_LEN, EGRESS_MAP, Outcome,
    bench::{self as names, MAX_WORK_ACCESSES},
};

use crate::{
    stats::XdpCounters,
    sys::{BpfObject, Netns, Sys, SysRef, XdpFlags, XdpLink, XdpProg},
};

/// The `xdp-bench` object, built by `build.rs` (aya-build).
fn bench_object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-bench"))
}

/// Frames per BPF_PROG_TEST_RUN batch (the kernel's maximum is 256).
const LIVE_BATCH: u32 = 64;

/// How a program is attached (the bench's own modes; `auto` is not used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hook {
    /// Generic XDP, after the kernel built an skb.
    Skb,
    /// Driver XDP.
    Native,
}

impl Hook {
    fn flags(self) -> XdpFlags {
        match self {
            Hook::Skb => XdpFlags::Skb,
            Hook::Native => XdpFlags::Drv,
        }
    }
}

/// One loaded program of a bench object (with the object's maps).
pub(crate) struct BenchProgram {
    prog: XdpProg,
    /// Where it is attached, and the kernel layer that detaches it.
    links: Vec<(SysRef, XdpLink)>,
}

impl Drop for BenchProgram {
    fn drop(&mut self) {
        for (sys, link) in self.links.drain(..).rev() {
            let dev = link.dev.clone();
            if let Err(e) = sys.xdp_detach(link) {
                log::warn!("detaching {} from {dev}: {e:#}", self.prog.name);
            }
        }
    }
}

impl std::fmt::Debug for BenchProgram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BenchProgram")
            .field("name", &self.prog.name)
            .finish_non_exhaustive()
    }
}

/// What a global is set to at load time.
enum Global<'a> {
    U16(&'a str, u16),
    U32(&'a str, u32),
    Header(&'a str, [u64; names::HEADER_WORDS]),
}

fn load(object: &[u8], name: &'static str, globals: &[Global<'_>]) -> Result<BenchProgram> {
    if object.is_empty() {
        bail!(
            "this rtprobe was built with AYA_BUILD_SKIP set and has no XDP programs: \
             rebuild it without AYA_BUILD_SKIP (cargo build)"
        );
    }
    crate::testbed::require_root()?;
    let mut loader = EbpfLoader::new();
    for g in globals {
        match g {
            Global::U16(n, v) => loader.override_global(n, v, true),
            Global::U32(n, v) => loader.override_global(n, v, true),
            Global::Header(n, v) => loader.override_global(n, v, true),
        };
    }
    let mut ebpf = loader
        .load(object)
        .with_context(|| format!("loading the maps of the bench program {name}"))?;
    let prog: &mut Xdp = ebpf
        .program_mut(name)
        .with_context(|| format!("the object has no program {name}"))?
        .try_into()
        .with_context(|| format!("{name} is not an XDP program"))?;
    prog.load()
        .map_err(|e| verifier_error(e, name))
        .with_context(|| {
            format!("loading the bench program {name} (is this root with BPF enabled?)")
        })?;
    let id = prog
        .info()
        .with_context(|| format!("reading the loaded {name}'s id"))?
        .id();
    Ok(BenchProgram {
        prog: XdpProg {
            obj: BpfObject::new(ebpf),
            name,
            id,
        },
        links: Vec::new(),
    })
}

/// aya puts the verifier's log into the error's Debug form only.
fn verifier_error(e: ProgramError, name: &str) -> anyhow::Error {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            anyhow::anyhow!("the verifier refused {name} ({io_error}): {verifier_log}")
        }
        e => anyhow::Error::new(e),
    }
}

impl BenchProgram {
    /// The load generator: redirects to `ifindex` (in the namespace of the
    /// thread that runs it) a `keep` share (0..=1) of the runs, restoring
    /// the first [`BENCH_HEADER_LEN`] bytes of `frame` each time.
    pub(crate) fn loadgen(ifindex: u32, frame: &[u8], keep: f64) -> Result<Self> {
        let header: &[u8; BENCH_HEADER_LEN] = frame
            .get(..BENCH_HEADER_LEN)
            .and_then(|h| h.try_into().ok())
            .with_context(|| format!("a load frame needs at least {BENCH_HEADER_LEN} bytes"))?;
        load(
            bench_object(),
            names::LOADGEN_PROGRAM,
            &[
                Global::U32(names::LOAD_IFINDEX_GLOBAL, ifindex),
                Global::U32(names::LOAD_KEEP_GLOBAL, keep_share(keep)),
                Global::Header(names::LOAD_HEADER_GLOBAL, names::pack_header(header)),
            ],
        )
    }

    /// The receiver's sink: drops IPv4 UDP to `port`, passes the rest.
    pub(crate) fn sink(port: u16) -> Result<Self> {
        load(
            bench_object(),
            names::SINK_PROGRAM,
            &[Global::U16(names::SINK_PORT_GLOBAL, port)],
        )
    }

    /// The XDP thesis's baseline: swap MACs, XDP_TX, after `work` memory
    /// accesses per frame.
    pub(crate) fn bounce(work: u32) -> Result<Self> {
        check_work(work)?;
        load(
            bench_object(),
            names::BOUNCE_PROGRAM,
            &[Global::U32(names::BOUNCE_WORK_GLOBAL, work)],
        )
    }

    /// Redirects every frame to the AF_XDP socket of its receive queue.
    pub(crate) fn xsk() -> Result<Self> {
        load(bench_object(), names::XSK_PROGRAM, &[])
    }

    /// The router with `work` memory accesses per frame before its usual
    /// work (`xdp_router_work`, in the router's object).
    pub(crate) fn router_work(work: u32) -> Result<Self> {
        check_work(work)?;
        load(
            crate::ebpf::router_object(),
            names::ROUTER_WORK_PROGRAM,
            &[Global::U32(names::ROUTER_WORK_GLOBAL, work)],
        )
    }

    /// Attaches the program to `ifname` in `ns` through `sys`, which
    /// detaches it when the program drops.
    pub(crate) fn attach(
        &mut self,
        sys: SysRef,
        ns: &Netns,
        ifname: &str,
        hook: Hook,
    ) -> Result<()> {
        let name = self.prog.name;
        let link = sys
            .xdp_attach(ns.into(), ifname, &self.prog, hook.flags())
            .with_context(|| format!("attaching {name} to {ifname} ({hook:?} XDP)"))?;
        self.links.push((sys, link));
        Ok(())
    }

    /// Lets the router's work variant redirect out of `ifname` (in `ns`,
    /// where the kernel resolves the ifindex of a DEVMAP entry).
    pub(crate) fn add_egress(&mut self, sys: &dyn Sys, ns: &Netns, ifname: &str) -> Result<()> {
        sys.devmap_insert(ns.into(), &self.prog.obj, EGRESS_MAP, ifname)
            .map(drop)
            .context("updating the egress map")
    }

    /// Runs the program on `repeat` live copies of `frame`: what it
    /// redirects is transmitted. Returns false if a signal interrupted it.
    pub(crate) fn run_live(&self, frame: &[u8], repeat: u32) -> Result<bool> {
        let name = self.prog.name;
        let r = self.prog.obj.with_shared(|ebpf| {
            let prog: &Xdp = ebpf
                .program(name)
                .context("program vanished")?
                .try_into()
                .context("not XDP")?;
            Ok(prog.test_run(TestRunOptions {
                data_in: Some(frame),
                repeat,
                attrs: TestRunAttrs::new().xdp_live_frames(LIVE_BATCH),
                ..TestRunOptions::new()
            }))
        })?;
        match r {
            Ok(_) => Ok(true),
            Err(ProgramError::SyscallError(e)) => match e.io_error.raw_os_error() {
                Some(libc::EINTR) => Ok(false),
                Some(libc::EINVAL) => bail!(
                    "BPF_PROG_TEST_RUN refused live frames ({}): the xdp generator needs Linux >= 5.18; use --generator socket",
                    e.io_error
                ),
                _ => Err(e).context("BPF_PROG_TEST_RUN (XDP live frames)"),
            },
            Err(e) => Err(e).context("BPF_PROG_TEST_RUN (XDP live frames)"),
        }
    }

    /// Frames the program handled (summed over CPUs): sent by the
    /// generator, dropped by the sink, bounced, handed to a socket.
    pub(crate) fn handled(&self) -> Result<u64> {
        let c = self.prog.obj.with_shared(|ebpf| {
            crate::ebpf::read_counters(ebpf, names::COUNTERS_MAP, [(0, "handled")])
        })?;
        Ok(c.get("handled").map_or(0, |c| c.packets))
    }

    /// The router's per-outcome counters (work variant only).
    pub(crate) fn router_counters(&self) -> Result<XdpCounters> {
        self.prog.obj.with_shared(|ebpf| {
            crate::ebpf::read_counters(
                ebpf,
                xdp_common::COUNTERS_MAP,
                Outcome::ALL.iter().map(|o| (o.index(), o.name())),
            )
        })
    }

    /// Puts the AF_XDP socket `fd` (bound to receive queue `queue`) in
    /// `bench_xsk`'s XSKMAP, so that queue's frames go to it.
    pub(crate) fn set_xsk(&mut self, queue: u32, fd: std::os::fd::BorrowedFd<'_>) -> Result<()> {
        if queue >= names::XSKS_MAX_ENTRIES {
            bail!(
                "queue {queue} is above the XSKMAP's {} entries",
                names::XSKS_MAX_ENTRIES
            );
        }
        self.prog.obj.with(|ebpf| {
            let map = ebpf.map_mut(names::XSKS_MAP).context("no XSKMAP")?;
            let mut xsks = XskMap::try_from(map).context("XSKMAP type")?;
            xsks.set(queue, fd, 0).with_context(|| {
                format!("putting the AF_XDP socket of queue {queue} in the XSKMAP")
            })
        })
    }
}

fn check_work(work: u32) -> Result<()> {
    if work > MAX_WORK_ACCESSES {
        bail!("{work} memory accesses per packet is above the programs' {MAX_WORK_ACCESSES}");
    }
    Ok(())
}

/// The share of runs the generator keeps, in 1/2^32 (u32::MAX: all). Pure.
pub(crate) fn keep_share(keep: f64) -> u32 {
    if keep >= 1.0 {
        u32::MAX
    } else {
        (keep.max(0.0) * f64::from(u32::MAX)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_share_covers_the_range() {
        assert_eq!(keep_share(1.0), u32::MAX);
        assert_eq!(keep_share(2.0), u32::MAX);
        assert_eq!(keep_share(0.0), 0);
        assert_eq!(keep_share(-1.0), 0);
        assert_eq!(keep_share(0.5), u32::MAX / 2);
    }
}
