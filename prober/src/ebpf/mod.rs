//! Loads rtprobe's XDP router (the `xdp-router` object embedded at build
//! time), attaches it in skb / native / auto mode inside a testbed
//! namespace, reports the mode the kernel actually attached, reads its
//! per-outcome counters and detaches it again (explicitly and on drop).
//!
//! Kernel interfaces:
//! - bpf(2): BPF_PROG_LOAD, BPF_MAP_CREATE/UPDATE/LOOKUP (per-CPU array,
//!   DEVMAP_HASH: Linux >= 5.4), global data set at load time (5.2),
//!   BPF_LINK_CREATE for XDP (5.9; aya falls back to netlink
//!   IFLA_XDP on older kernels), BPF_PROG_TEST_RUN with an `xdp_md`
//!   context (5.15) in the tests. Minimum kernel: 5.4.
//! - rtnetlink RTM_GETLINK / IFLA_XDP ([`crate::sys::Sys::xdp_state`]) to
//!   read back the attach mode.
//!
//! Attach, detach, the read-back and the egress map's DEVMAP updates go
//! through [`crate::sys::Sys`]: interface names and indexes, aya's netlink
//! fallback and the DEVMAP_HASH update (the kernel resolves the ifindex in
//! the caller's namespace) all act in the calling *thread's* namespace, and
//! the kernel layer runs them on its worker inside the interface's
//! namespace. So the orchestration here and in [`setup`] is tested against
//! the recording fake without root. [`host`] puts the in-kernel reflector
//! on a host's interface (`rtprobe reflect --kernel`).
//! - setrlimit(RLIMIT_MEMLOCK): kernels before 5.11 charge BPF memory to it.

pub(crate) mod flows;
pub(crate) mod host;
pub(crate) mod kfunc;
pub(crate) mod klog;
pub(crate) mod mode;
pub(crate) mod reflector;
mod setup;

#[cfg(test)]
mod reflector_tests;
#[cfg(test)]
mod tests;

use std::fmt;

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfError, EbpfLoader,
    maps::{MapData, MapError, PerCpuArray},
    programs::{ProgramError, Xdp},
};
use serde::Serialize;
use xdp_common::{
    COUNTERS_MAP, COUNTERS6_MAP, Counter, EGRESS_MAP, LOG_RARE_GLOBAL, Outcome, PASS_ONLY_GLOBAL,
    PROGRAM_NAME,
};

use crate::{
    error::Error,
    stats::{XdpCounters, summary::PacketsBytes},
    sys::{BpfObject, Ns, Sys, SysRef, XdpAttachError, XdpFlags, XdpLink, XdpProg},
};

pub(crate) use mode::{ReflectorKind, XdpAction, XdpMode};
pub(crate) use reflector::Reflector;
pub(crate) use setup::{KernelLoader, Loader, attach_for_testbed_with};
pub(crate) use setup::{XdpSetup, attach_for_testbed};

/// The XDP router object, built by `build.rs` (aya-build) for
/// bpfel-unknown-none and embedded so that rtprobe is a single binary.
pub(crate) fn router_object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-router"))
}

/// The mode the kernel attached an XDP program in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum AttachedMode {
    /// Generic XDP (XDP_FLAGS_SKB_MODE), after the kernel built an skb.
    Skb,
    /// Driver XDP (XDP_FLAGS_DRV_MODE), in the driver's receive path.
    Native,
}

impl AttachedMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AttachedMode::Skb => "skb",
            AttachedMode::Native => "native",
        }
    }
}

impl fmt::Display for AttachedMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The loaded XDP router. Dropping it detaches it everywhere.
///
/// Attach, detach and the egress map go through the kernel layer
/// ([`crate::sys::Sys`]), which runs them on the worker of the interface's
/// namespace; detach or drop it before tearing the testbed down, and in
/// particular before giving NIC-pair interfaces back to the host.
///
/// It changes nothing on the interfaces besides the XDP attachment. Native
/// redirect into a veth needs GRO (or an XDP program) on that veth's peer,
/// and UDP from local sockets needs TX checksum offload off on the sending
/// veth: see [`XdpSetup`].
pub(crate) struct Router {
    sys: SysRef,
    prog: XdpProg,
    pass_only: bool,
    attachments: Vec<XdpLink>,
    /// Interfaces in the EGRESS map as (namespace, ifindex). All must be
    /// in one namespace: ifindexes are only unique within one.
    egress: Vec<(String, u32)>,
    /// The program's rare-path log, when `-vv` asked for it.
    _log: Option<klog::KernelLog>,
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Router")
            .field("prog_id", &self.prog.id)
            .field("pass_only", &self.pass_only)
            .field("attachments", &self.attachments)
            .finish_non_exhaustive()
    }
}

impl Router {
    /// Loads the router into the kernel (not attached anywhere yet), to
    /// be attached through `sys`. `pass_only` makes it a pure XDP_PASS
    /// program that still counts.
    pub(crate) fn load(sys: SysRef, pass_only: bool) -> Result<Self> {
        let on = klog::global() != 0;
        let sink: Option<Box<dyn log::Log>> = on.then(|| Box::new(log::logger()) as _);
        Self::load_logging_to(sys, pass_only, on, sink)
    }

    /// [`Router::load`] with the programs' rare-path log on or off, and its
    /// records (if any) read into `sink`.
    pub(crate) fn load_logging_to(
        sys: SysRef,
        pass_only: bool,
        log_rare: bool,
        sink: Option<Box<dyn log::Log>>,
    ) -> Result<Self> {
        let object = router_object();
        if object.is_empty() {
            bail!(
                "this rtprobe was built with AYA_BUILD_SKIP set and has no XDP router: \
                 rebuild it without AYA_BUILD_SKIP (cargo build)"
            );
        }
        if !nix::unistd::geteuid().is_root() {
            return Err(Error::NotRoot.into());
        }
        raise_memlock_limit();

        let pass: u8 = pass_only.into();
        let mut ebpf = EbpfLoader::new()
            .override_global(PASS_ONLY_GLOBAL, &pass, true)
            .override_global(LOG_RARE_GLOBAL, &u8::from(log_rare), true)
            .load(object)
            .map_err(explain_load_error)
            .context("cannot load the XDP router's maps")?;
        let log = sink
            .map(|sink| klog::KernelLog::start_with(&mut ebpf, "XDP router", sink))
            .transpose()?;
        let prog = xdp_program(&mut ebpf)?;
        prog.load()
            .map_err(|e| explain_program_error(e, "loading the XDP router"))?;
        let prog_id = prog
            .info()
            .context("reading the loaded XDP router's id")?
            .id();
        Ok(Router {
            sys,
            prog: XdpProg {
                obj: BpfObject::new(ebpf),
                name: PROGRAM_NAME,
                id: prog_id,
            },
            pass_only,
            attachments: Vec::new(),
            egress: Vec::new(),
            _log: log,
        })
    }

    /// A router that was never loaded, with program id `prog_id`, for
    /// orchestration tests against the fake kernel.
    #[cfg(test)]
    pub(crate) fn stand_in(sys: SysRef, pass_only: bool, prog_id: u32) -> Self {
        Router {
            sys,
            prog: XdpProg {
                obj: BpfObject::stand_in(),
                name: PROGRAM_NAME,
                id: prog_id,
            },
            pass_only,
            attachments: Vec::new(),
            egress: Vec::new(),
            _log: None,
        }
    }

    #[cfg(test)]
    pub(crate) fn pass_only(&self) -> bool {
        self.pass_only
    }

    /// Attaches the router to `ifname` inside `ns` in `mode`, lets it
    /// redirect out of that interface, and returns the mode the kernel
    /// reports. `auto` passes no mode flag (native where the driver can,
    /// else generic); if the driver refuses native, it falls back to skb
    /// and says so in the log. `off` is the caller's business.
    pub(crate) fn attach<'a>(
        &mut self,
        ns: impl Into<Ns<'a>>,
        ifname: &str,
        mode: XdpMode,
    ) -> Result<AttachedMode> {
        let ns = ns.into();
        let flags = attach_flags(mode)?;
        if self
            .attachments
            .iter()
            .any(|a| a.dev == ifname && a.ns() == ns)
        {
            bail!("the XDP router is already attached to {ifname} in namespace {ns}");
        }
        let ns_key = ns.label();
        self.check_one_namespace(&ns_key)?;
        let sys = self.sys.clone();
        // Allowed as egress first, so the first packet the program sees
        // can already be redirected back out of this interface.
        let ifindex = sys
            .devmap_insert(ns, &self.prog.obj, EGRESS_MAP, ifname)
            .map_err(|e| in_namespace(e, ns))
            .with_context(|| format!("allowing redirects to {ifname}"))?;
        let known = self.egress.contains(&(ns_key.clone(), ifindex));
        let forget_egress = || {
            if !known {
                let _ = sys.devmap_remove(&self.prog.obj, EGRESS_MAP, ifindex);
            }
        };
        let attempt = match sys.xdp_attach(ns, ifname, &self.prog, flags) {
            Err(e) if mode == XdpMode::Auto && may_fall_back(&e) => {
                log::warn!("native XDP refused on {ifname} ({e:#}); attaching in skb mode");
                sys.xdp_attach(ns, ifname, &self.prog, XdpFlags::Skb)
                    .map_err(|e| attach_error(e, XdpMode::Skb, ifname))
            }
            other => other.map_err(|e| attach_error(e, mode, ifname)),
        };
        let link = match attempt {
            Ok(link) => link,
            Err(e) => {
                forget_egress();
                return Err(e);
            }
        };
        // Read back what the kernel did rather than trusting the request.
        let attached = match read_back(sys.as_ref(), ns, &link, "the XDP router") {
            Ok(m) => m,
            Err(e) => {
                let _ = sys.xdp_detach(link);
                forget_egress();
                return Err(e);
            }
        };
        if !known {
            self.egress.push((ns_key, ifindex));
        }
        log::info!(
            "XDP router (prog id {}) attached to {ifname} (ifindex {ifindex}) in namespace {ns} in {attached} mode",
            self.prog.id
        );
        self.attachments.push(link);
        Ok(attached)
    }

    /// Lets the router redirect out of `ifname` (in `ns`) without
    /// attaching to it. `attach` does this for the interfaces it attaches
    /// to. Returns the interface's ifindex.
    #[cfg(test)]
    pub(crate) fn add_egress<'a>(&mut self, ns: impl Into<Ns<'a>>, ifname: &str) -> Result<u32> {
        let ns = ns.into();
        let ns_key = ns.label();
        self.check_one_namespace(&ns_key)?;
        let ifindex = self
            .sys
            .devmap_insert(ns, &self.prog.obj, EGRESS_MAP, ifname)
            .map_err(|e| in_namespace(e, ns))
            .with_context(|| format!("allowing redirects to {ifname}"))?;
        if !self.egress.contains(&(ns_key.clone(), ifindex)) {
            self.egress.push((ns_key, ifindex));
        }
        Ok(ifindex)
    }

    fn check_one_namespace(&self, ns_key: &str) -> Result<()> {
        if self.egress.iter().any(|(k, _)| k != ns_key) {
            bail!(
                "one XDP router serves one namespace (ifindexes are per namespace); \
                 load another Router for namespace {ns_key}"
            );
        }
        Ok(())
    }

    /// Names of the interfaces the router is attached to, with their namespace.
    #[cfg(test)]
    pub(crate) fn attached_to(&self) -> Vec<(String, String)> {
        self.attachments
            .iter()
            .map(|a| (a.ns().label(), a.dev.clone()))
            .collect()
    }

    /// Packets and bytes per outcome, summed over CPUs: IPv4 (and not-IP)
    /// outcomes under their names, IPv6 ones prefixed `ipv6_`. Every
    /// outcome is present, zero or not.
    pub(crate) fn counters(&self) -> Result<XdpCounters> {
        self.prog.obj.with(|ebpf| {
            let mut all = read_counters(
                ebpf,
                COUNTERS_MAP,
                Outcome::ALL.iter().map(|o| (o.index(), o.name())),
            )?;
            all.extend(read_counters(
                ebpf,
                COUNTERS6_MAP,
                Outcome::IPV6.iter().map(|o| (o.index(), o.name6())),
            )?);
            Ok(all)
        })
    }

    /// Detaches the router from every interface, each inside its own
    /// namespace, and empties the egress map. Tries them all and reports
    /// the first failure.
    pub(crate) fn detach_all(&mut self) -> Result<()> {
        let sys = self.sys.clone();
        let mut first_err = None;
        for a in self.attachments.drain(..) {
            let (netns, dev) = (a.netns.clone(), a.dev.clone());
            let ns = netns.as_deref().map_or(Ns::Host, Ns::Named);
            let res = detach_checked(sys.as_ref(), a)
                .with_context(|| format!("detaching the XDP router from {dev} in namespace {ns}"));
            match res {
                Ok(()) => log::info!("XDP router detached from {dev} in namespace {ns}"),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        // Entries of deleted interfaces vanish by themselves; the rest go
        // now so a later attach starts clean.
        for (_, ifindex) in self.egress.drain(..) {
            if let Err(e) = sys.devmap_remove(&self.prog.obj, EGRESS_MAP, ifindex) {
                first_err.get_or_insert(e.context("emptying the XDP egress map"));
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        if self.attachments.is_empty() {
            return;
        }
        if let Err(e) = self.detach_all() {
            log::warn!("{e:#}");
        }
    }
}

/// The XDP mode the kernel reports for `ifname` in `ns` (any program, not
/// only rtprobe's), or None if no XDP program is attached. If programs are
/// attached in both modes, native is reported.
#[cfg(test)]
pub(crate) fn attached_mode<'a>(
    sys: &dyn Sys,
    ns: impl Into<Ns<'a>>,
    ifname: &str,
) -> Result<Option<AttachedMode>> {
    let ns = ns.into();
    let ifindex = sys
        .link(ns, ifname)?
        .ok_or_else(|| Error::InterfaceNotFound(format!("{ifname} (in namespace {ns})")))?
        .index;
    let state = sys.xdp_state(ns, ifindex)?;
    if state.hw_prog_id.is_some() {
        bail!("{ifname} has an XDP program offloaded to hardware, a mode rtprobe does not use");
    }
    Ok(if state.drv_prog_id.is_some() {
        Some(AttachedMode::Native)
    } else if state.skb_prog_id.is_some() {
        Some(AttachedMode::Skb)
    } else {
        None
    })
}

/// The attach flag for a mode; `off` attaches nothing.
fn attach_flags(mode: XdpMode) -> Result<XdpFlags> {
    Ok(match mode {
        XdpMode::Skb => XdpFlags::Skb,
        XdpMode::Native => XdpFlags::Drv,
        XdpMode::Auto => XdpFlags::Any,
        XdpMode::Off => bail!("XDP mode off: there is nothing to attach"),
    })
}

/// The mode the kernel reports for the program of `link`, or an error if
/// another program is there.
fn read_back(sys: &dyn Sys, ns: Ns, link: &XdpLink, what: &str) -> Result<AttachedMode> {
    let (ifname, prog_id) = (&link.dev, link.prog_id);
    match sys.xdp_state(ns, link.ifindex) {
        Ok(st) if st.drv_prog_id == Some(prog_id) => Ok(AttachedMode::Native),
        Ok(st) if st.skb_prog_id == Some(prog_id) => Ok(AttachedMode::Skb),
        Ok(st) => Err(anyhow!(
            "attached {what} to {ifname} but the kernel reports another \
             program there ({st:?}, ours is id {prog_id})"
        )),
        Err(e) => Err(e.context(format!("reading back the XDP mode of {ifname}"))),
    }
}

/// Detaches `link` and checks the kernel no longer reports its program on
/// the interface (if the interface is still there, in its namespace).
fn detach_checked(sys: &dyn Sys, link: XdpLink) -> Result<()> {
    let (netns, dev, ifindex, prog_id) = (
        link.netns.clone(),
        link.dev.clone(),
        link.ifindex,
        link.prog_id,
    );
    let ns = netns.as_deref().map_or(Ns::Host, Ns::Named);
    sys.xdp_detach(link)?;
    // The interface may be gone with its namespace: nothing is left then.
    let Ok(Some(l)) = sys.link(ns, &dev) else {
        return Ok(());
    };
    if l.index != ifindex {
        return Ok(());
    }
    let state = sys.xdp_state(ns, ifindex)?;
    if state.skb_prog_id == Some(prog_id) || state.drv_prog_id == Some(prog_id) {
        bail!("the kernel still reports the program attached ({state:?})");
    }
    Ok(())
}

/// An interface missing from `ns` says which namespace it was looked for in.
fn in_namespace(e: anyhow::Error, ns: Ns) -> anyhow::Error {
    match e.downcast_ref::<Error>() {
        Some(Error::InterfaceNotFound(n)) if !n.contains("namespace") => {
            Error::InterfaceNotFound(format!("{n} (in namespace {ns})")).into()
        }
        _ => e,
    }
}

/// Packets and bytes per outcome of a per-CPU counter map of `ebpf`,
/// summed over CPUs; every outcome listed is present, zero or not.
pub(crate) fn read_counters(
    ebpf: &Ebpf,
    map_name: &str,
    outcomes: impl IntoIterator<Item = (u32, &'static str)>,
) -> Result<XdpCounters> {
    let map = ebpf
        .map(map_name)
        .with_context(|| format!("the XDP object has no {map_name} map"))?;
    let counters: PerCpuArray<&MapData, Counter> = PerCpuArray::try_from(map)
        .with_context(|| format!("the {map_name} map has an unexpected type"))?;
    let mut out = XdpCounters::new();
    for (index, name) in outcomes {
        let per_cpu = counters
            .get(&index, 0)
            .with_context(|| format!("reading XDP counter {name}"))?;
        let mut sum = PacketsBytes::default();
        for c in per_cpu.iter() {
            sum.packets += c.packets;
            sum.bytes += c.bytes;
        }
        out.insert(name.to_string(), sum);
    }
    Ok(out)
}

fn xdp_program(ebpf: &mut Ebpf) -> Result<&mut Xdp> {
    ebpf.program_mut(PROGRAM_NAME)
        .with_context(|| format!("the XDP router object has no program {PROGRAM_NAME}"))?
        .try_into()
        .with_context(|| format!("{PROGRAM_NAME} is not an XDP program"))
}

/// Kernels before 5.11 account BPF maps and programs against
/// RLIMIT_MEMLOCK, whose default (64 KiB or 8 MiB) is too small.
fn raise_memlock_limit() {
    use nix::sys::resource::{Resource, setrlimit};
    let inf = libc::RLIM_INFINITY;
    if let Err(e) = setrlimit(Resource::RLIMIT_MEMLOCK, inf, inf) {
        log::debug!("could not raise RLIMIT_MEMLOCK ({e}); fine on Linux >= 5.11");
    }
}

/// Errors for which `auto` retries in skb mode: the driver cannot run this
/// program natively (no ndo_bpf, MTU too large, queue layout, ...).
fn may_fall_back(e: &anyhow::Error) -> bool {
    matches!(
        attach_errno(e),
        Some(libc::EOPNOTSUPP | libc::ERANGE | libc::EINVAL | libc::ENOSPC | libc::E2BIG)
    )
}

/// The kernel's errno of a refused attach (None for other failures).
fn attach_errno(e: &anyhow::Error) -> Option<i32> {
    e.downcast_ref::<XdpAttachError>().and_then(|a| a.errno)
}

/// Explains a failed attach; failures that are not a kernel refusal
/// (a missing interface, a worker that could not start) pass unchanged.
fn attach_error(e: anyhow::Error, mode: XdpMode, ifname: &str) -> anyhow::Error {
    let mode_name = match mode {
        XdpMode::Skb => "skb",
        XdpMode::Native => "native",
        XdpMode::Auto => "auto",
        XdpMode::Off => "off",
    };
    let unsupported = |reason: &str| -> anyhow::Error {
        Error::XdpModeUnsupported {
            mode: mode_name.to_string(),
            ifname: ifname.to_string(),
            reason: reason.to_string(),
        }
        .into()
    };
    let Some(refused) = e.downcast_ref::<XdpAttachError>() else {
        return e;
    };
    match refused.errno {
        Some(libc::EOPNOTSUPP) => unsupported(if mode == XdpMode::Skb {
            "the kernel refuses generic XDP on this device"
        } else {
            "the driver has no native XDP support"
        }),
        Some(libc::ERANGE) => unsupported("the MTU is too large for XDP on this device"),
        Some(libc::ENOSPC) => unsupported(
            "the device has fewer RX queues than its peer has TX queues (veth: give it as many)",
        ),
        Some(libc::EINVAL) | Some(libc::E2BIG) => unsupported(&format!(
            "the driver rejected the program ({})",
            refused.message
        )),
        Some(libc::EBUSY) | Some(libc::EEXIST) => anyhow!(
            "another XDP program is already attached to {ifname}; detach it first \
             (see `ip link show {ifname}`)"
        ),
        Some(libc::EPERM) | Some(libc::EACCES) => Error::NotRoot.into(),
        _ => e.context(format!("attaching to {ifname} in {mode_name} mode")),
    }
}

fn explain_program_error(e: ProgramError, what: &str) -> anyhow::Error {
    match crate::sys::bpf_errno(&e) {
        Some(libc::ENOSYS) => anyhow!(
            "{what}: this kernel has no bpf() system call (needs CONFIG_BPF_SYSCALL and Linux >= 5.4)"
        ),
        Some(libc::EPERM) | Some(libc::EACCES) if nix::unistd::geteuid().is_root() => anyhow!(
            "{what}: the kernel refused BPF although running as root (kernel lockdown, a seccomp \
             filter, or a container without CAP_BPF/CAP_SYS_ADMIN: run it privileged): {e}"
        ),
        Some(libc::EPERM) | Some(libc::EACCES) => Error::NotRoot.into(),
        _ => anyhow!(e).context(what.to_string()),
    }
}

fn explain_load_error(e: EbpfError) -> anyhow::Error {
    match e {
        EbpfError::ProgramError(p) => explain_program_error(p, "loading the XDP router"),
        EbpfError::MapError(MapError::CreateError { io_error, .. })
            if matches!(io_error.raw_os_error(), Some(libc::EPERM)) =>
        {
            if nix::unistd::geteuid().is_root() {
                anyhow!(
                    "creating BPF maps failed with EPERM although running as root \
                     (RLIMIT_MEMLOCK on kernels < 5.11, lockdown or a container without \
                     CAP_BPF): {io_error}"
                )
            } else {
                Error::NotRoot.into()
            }
        }
        EbpfError::MapError(MapError::CreateError { io_error, .. })
            if matches!(io_error.raw_os_error(), Some(libc::ENOSYS)) =>
        {
            anyhow!(
                "this kernel has no bpf() system call (needs CONFIG_BPF_SYSCALL and Linux >= 5.4)"
            )
        }
        e => anyhow!(e),
    }
}
