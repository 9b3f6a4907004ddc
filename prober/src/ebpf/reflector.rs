//! Loads rtprobe's in-kernel reflector (`xdp_reflector`, in the same
//! embedded object as the router), sets its ports at load time, keeps its
//! TAI -> REALTIME offset current, attaches it to one interface and reads
//! its per-outcome counters. Dropping it detaches it.
//!
//! Kernel interfaces: bpf(2) (BPF_PROG_LOAD, per-CPU and plain arrays,
//! global data set at load time, BPF_LINK_CREATE for XDP), the program's
//! `bpf_ktime_get_tai_ns` (Linux >= 6.1), `adjtimex(2)` (read only) for
//! the kernel's TAI offset, rtnetlink IFLA_XDP to read back the mode.
//! Minimum kernel: 6.1.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, MapData},
    programs::Xdp,
};
use xdp_common::{
    LOG_RARE_GLOBAL, REFLECT_PORT_GLOBAL, REFLECTOR_CLOCK_MAP, REFLECTOR_COUNTERS_MAP,
    REFLECTOR_PROGRAM_NAME, REPLY_IFINDEX_GLOBAL, ReflectorClock, ReflectorOutcome,
    STAMP_PORT_GLOBAL,
};

use super::{
    AttachedMode, attach_error, attach_flags, detach_checked, explain_load_error,
    explain_program_error, raise_memlock_limit, read_back, read_counters, router_object,
};
use crate::{
    ebpf::XdpMode,
    error::Error,
    probe::stamp::{ClockSync, ErrorEstimate},
    stats::XdpCounters,
    sys::{BpfObject, Ns, SysRef, XdpLink, XdpProg},
};

/// How often the TAI offset is read again (a leap second changes it).
const CLOCK_REFRESH: Duration = Duration::from_secs(1);

/// The reflector's clock parameters as the kernel states them now: the
/// TAI offset from `adjtimex(2)` (CLOCK_TAI = CLOCK_REALTIME + tai, whole
/// seconds, exact) and the STAMP error estimate of this clock.
pub fn current_clock() -> ReflectorClock {
    let sync = ClockSync::read_kernel().ok();
    let tai_s = sync.as_ref().map_or(0, |s| s.tai_offset_s);
    let ee = sync
        .as_ref()
        .map_or(ErrorEstimate::from_error_ns(false, 0, false), |s| {
            ErrorEstimate::from_clock_sync(s, false)
        });
    ReflectorClock {
        tai_to_realtime_ns: -(tai_s as i64) * 1_000_000_000,
        stamp_error_estimate: ee.to_bits(),
        _pad: [0; 6],
    }
}

/// The loaded in-kernel reflector.
pub struct Reflector {
    sys: SysRef,
    prog: XdpProg,
    attached: Option<XdpLink>,
    stop: Arc<AtomicBool>,
    refresher: Option<JoinHandle<()>>,
    /// The program's rare-path log, when `-vv` asked for it.
    _log: Option<super::klog::KernelLog>,
}

impl Reflector {
    /// Loads the reflector answering rtprobe probes to UDP `probe_port`
    /// and STAMP to `stamp_port` (0: none), with the clock offset written
    /// and a thread that keeps it current. Replies leave by XDP_TX, or with
    /// `reply_ifindex` non-zero by a redirect to that interface (the one it
    /// is attached to: what a veth needs, see [`super::XdpSetup`]).
    pub fn load(probe_port: u16, stamp_port: u16, reply_ifindex: u32) -> Result<Self> {
        let object = router_object();
        if object.is_empty() {
            bail!(
                "this rtprobe was built with AYA_BUILD_SKIP set and has no in-kernel reflector: \
                 rebuild it without AYA_BUILD_SKIP (cargo build)"
            );
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(Error::NotRoot.into());
        }
        raise_memlock_limit();
        let mut ebpf = EbpfLoader::new()
            .override_global(REFLECT_PORT_GLOBAL, &probe_port, true)
            .override_global(STAMP_PORT_GLOBAL, &stamp_port, true)
            .override_global(REPLY_IFINDEX_GLOBAL, &reply_ifindex, true)
            .override_global(LOG_RARE_GLOBAL, &super::klog::global(), true)
            .load(object)
            .map_err(explain_load_error)
            .context("cannot load the in-kernel reflector's maps")?;
        let log = super::klog::KernelLog::start(&mut ebpf, "in-kernel reflector")?;
        let prog = program(&mut ebpf)?;
        prog.load()
            .map_err(|e| explain_program_error(e, "loading the in-kernel reflector"))?;
        let prog_id = prog
            .info()
            .context("reading the loaded reflector's id")?
            .id();

        let map = ebpf
            .take_map(REFLECTOR_CLOCK_MAP)
            .with_context(|| format!("the object has no {REFLECTOR_CLOCK_MAP} map"))?;
        let mut clock: Array<MapData, ReflectorClock> =
            Array::try_from(map).context("the reflector clock map has an unexpected type")?;
        clock
            .set(0, current_clock(), 0)
            .context("writing the reflector's clock offset")?;
        let stop = Arc::new(AtomicBool::new(false));
        let refresher = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("kreflect-clock".into())
                .spawn(move || {
                    let mut last = current_clock();
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::park_timeout(CLOCK_REFRESH);
                        let now = current_clock();
                        if now != last && clock.set(0, now, 0).is_ok() {
                            last = now;
                        }
                    }
                })
                .context("starting the reflector's clock thread")?
        };
        Ok(Reflector {
            sys: crate::sys::linux(),
            prog: XdpProg {
                obj: BpfObject::new(ebpf),
                name: REFLECTOR_PROGRAM_NAME,
                id: prog_id,
            },
            attached: None,
            stop,
            refresher: Some(refresher),
            _log: log,
        })
    }

    /// A reflector that was never loaded, for orchestration tests against
    /// the fake kernel.
    #[cfg(test)]
    pub(crate) fn stand_in(sys: SysRef, prog_id: u32) -> Self {
        Reflector {
            sys,
            prog: XdpProg {
                obj: BpfObject::stand_in(),
                name: REFLECTOR_PROGRAM_NAME,
                id: prog_id,
            },
            attached: None,
            stop: Arc::new(AtomicBool::new(false)),
            refresher: None,
            _log: None,
        }
    }

    /// Attaches and detaches through `sys` from now on.
    pub(crate) fn using(mut self, sys: SysRef) -> Self {
        self.sys = sys;
        self
    }

    pub fn prog_id(&self) -> u32 {
        self.prog.id
    }

    /// Attaches to `ifname` in `ns` in `mode` (native, skb or auto) and
    /// returns the mode the kernel reports.
    pub fn attach<'a>(
        &mut self,
        ns: impl Into<Ns<'a>>,
        ifname: &str,
        mode: XdpMode,
    ) -> Result<AttachedMode> {
        let ns = ns.into();
        let flags = attach_flags(mode)?;
        if self.attached.is_some() {
            bail!("the in-kernel reflector is already attached");
        }
        let link = self
            .sys
            .xdp_attach(ns, ifname, &self.prog, flags)
            .map_err(|e| attach_error(e, mode, ifname))?;
        let got = match read_back(self.sys.as_ref(), ns, &link, "the reflector") {
            Ok(m) => m,
            Err(e) => {
                let _ = self.sys.xdp_detach(link);
                return Err(e);
            }
        };
        log::info!(
            "in-kernel reflector (prog id {}) attached to {ifname} in namespace {ns} in {got} mode",
            self.prog.id
        );
        self.attached = Some(link);
        Ok(got)
    }

    /// Packets and bytes per outcome, summed over CPUs, every outcome present.
    pub fn counters(&self) -> Result<XdpCounters> {
        self.prog.obj.with(|ebpf| {
            read_counters(
                ebpf,
                REFLECTOR_COUNTERS_MAP,
                ReflectorOutcome::ALL.iter().map(|o| (o.index(), o.name())),
            )
        })
    }

    /// Detaches from the interface (inside its namespace), if attached.
    pub fn detach(&mut self) -> Result<()> {
        let Some(a) = self.attached.take() else {
            return Ok(());
        };
        let what = format!(
            "detaching the in-kernel reflector from {} in namespace {}",
            a.dev,
            a.ns()
        );
        detach_checked(self.sys.as_ref(), a).context(what)
    }

    /// Runs `f` on the loaded program (BPF_PROG_TEST_RUN in the tests).
    #[cfg(test)]
    pub(super) fn with_xdp<T>(&self, f: impl FnOnce(&Xdp) -> Result<T>) -> Result<T> {
        self.prog.obj.with(|ebpf| {
            f(ebpf
                .program(REFLECTOR_PROGRAM_NAME)
                .context("program")?
                .try_into()?)
        })
    }
}

impl Drop for Reflector {
    fn drop(&mut self) {
        if let Err(e) = self.detach() {
            log::warn!("{e:#}");
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.refresher.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn program(ebpf: &mut Ebpf) -> Result<&mut Xdp> {
    ebpf.program_mut(REFLECTOR_PROGRAM_NAME)
        .with_context(|| format!("the XDP object has no program {REFLECTOR_PROGRAM_NAME}"))?
        .try_into()
        .with_context(|| format!("{REFLECTOR_PROGRAM_NAME} is not an XDP program"))
}
