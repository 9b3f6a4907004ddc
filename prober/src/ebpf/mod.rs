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
//! - rtnetlink RTM_GETLINK / IFLA_XDP (see [`query`]) to read back the
//!   attach mode.
//! - setrlimit(RLIMIT_MEMLOCK): kernels before 5.11 charge BPF memory to it.
//!
//! Namespaces matter: interface names and indexes, aya's netlink fallback
//! and the DEVMAP_HASH update (the kernel resolves the ifindex in the
//! caller's namespace) all act in the calling *thread's* namespace, so
//! attach and detach run on a thread inside the interface's namespace.

pub mod klog;
pub mod mode;
pub mod query;
pub mod reflector;
mod setup;

#[cfg(test)]
mod reflector_tests;
#[cfg(test)]
mod tests;

use std::{fmt, fs::File, os::fd::AsFd, os::unix::fs::MetadataExt};

use anyhow::{Context, Result, anyhow, bail};
use aya::{
    Ebpf, EbpfError, EbpfLoader,
    maps::{DevMapHash, MapData, MapError, PerCpuArray},
    programs::{ProgramError, Xdp, XdpMode as AyaXdpMode, xdp::XdpLinkId},
};
use nix::sched::{CloneFlags, setns};
use serde::Serialize;
use xdp_common::{
    COUNTERS_MAP, COUNTERS6_MAP, Counter, EGRESS_MAP, LOG_RARE_GLOBAL, Outcome, PASS_ONLY_GLOBAL,
    PROGRAM_NAME,
};

use crate::{
    error::Error,
    stats::{XdpCounters, summary::PacketsBytes},
    testbed::Netns,
};

pub use mode::{ReflectorKind, XdpAction, XdpMode};
pub use query::XdpState;
pub use reflector::Reflector;
pub use setup::{XdpSetup, attach_for_testbed};

/// The XDP router object, built by `build.rs` (aya-build) for
/// bpfel-unknown-none and embedded so that rtprobe is a single binary.
pub(crate) fn router_object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/xdp-router"))
}

/// The mode the kernel attached an XDP program in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachedMode {
    /// Generic XDP (XDP_FLAGS_SKB_MODE), after the kernel built an skb.
    Skb,
    /// Driver XDP (XDP_FLAGS_DRV_MODE), in the driver's receive path.
    Native,
}

impl AttachedMode {
    pub fn as_str(self) -> &'static str {
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

/// One interface the router is attached to.
#[derive(Debug)]
struct Attachment {
    /// The interface's namespace, kept open so detaching can enter it even
    /// after the `Netns` was dropped (and for NIC pairs before they are
    /// given back to the host).
    ns: File,
    ns_name: String,
    ifname: String,
    ifindex: u32,
    link: XdpLinkId,
}

/// The loaded XDP router. Dropping it detaches it everywhere.
///
/// It keeps the namespaces it is attached in open (to detach inside them
/// later), so detach or drop it before tearing the testbed down, and in
/// particular before giving NIC-pair interfaces back to the host.
///
/// It changes nothing on the interfaces besides the XDP attachment. Native
/// redirect into a veth needs GRO (or an XDP program) on that veth's peer,
/// and UDP from local sockets needs TX checksum offload off on the sending
/// veth: see [`crate::testbed::ethtool`].
pub struct Router {
    ebpf: Ebpf,
    prog_id: u32,
    pass_only: bool,
    attachments: Vec<Attachment>,
    /// Interfaces in the EGRESS map as (namespace inode, ifindex). All
    /// must be in one namespace: ifindexes are only unique within one.
    egress: Vec<(u64, u32)>,
    /// The program's rare-path log, when `-vv` asked for it.
    _log: Option<klog::KernelLog>,
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Router")
            .field("prog_id", &self.prog_id)
            .field("pass_only", &self.pass_only)
            .field("attachments", &self.attachments)
            .finish_non_exhaustive()
    }
}

impl Router {
    /// Loads the router into the kernel (not attached anywhere yet).
    /// `pass_only` makes it a pure XDP_PASS program that still counts.
    pub fn load(pass_only: bool) -> Result<Self> {
        let on = klog::global() != 0;
        let sink: Option<Box<dyn log::Log>> = on.then(|| Box::new(log::logger()) as _);
        Self::load_logging_to(pass_only, on, sink)
    }

    /// [`Router::load`] with the programs' rare-path log on or off, and its
    /// records (if any) read into `sink`.
    pub(crate) fn load_logging_to(
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
            ebpf,
            prog_id,
            pass_only,
            attachments: Vec::new(),
            egress: Vec::new(),
            _log: log,
        })
    }

    /// The kernel's id of the loaded program (as `bpftool prog` shows it).
    pub fn prog_id(&self) -> u32 {
        self.prog_id
    }

    pub fn pass_only(&self) -> bool {
        self.pass_only
    }

    /// Attaches the router to `ifname` inside `ns` in `mode`, lets it
    /// redirect out of that interface, and returns the mode the kernel
    /// reports. `auto` passes no mode flag (native where the driver can,
    /// else generic); if the driver refuses native, it falls back to skb
    /// and says so in the log. `off` is the caller's business.
    pub fn attach(&mut self, ns: &Netns, ifname: &str, mode: XdpMode) -> Result<AttachedMode> {
        let xdp_mode = match mode {
            XdpMode::Skb => AyaXdpMode::Skb,
            XdpMode::Native => AyaXdpMode::Driver,
            XdpMode::Auto => AyaXdpMode::Default,
            XdpMode::Off => bail!("XDP mode off: there is nothing to attach"),
        };
        if self
            .attachments
            .iter()
            .any(|a| a.ifname == ifname && a.ns_name == ns.name())
        {
            bail!(
                "the XDP router is already attached to {ifname} in namespace {}",
                ns.name()
            );
        }
        let ns_file = ns
            .file()
            .try_clone()
            .with_context(|| format!("duplicate the handle of namespace {}", ns.name()))?;
        let ns_ino = ns_file.metadata().context("stat the namespace")?.ino();
        self.check_one_namespace(ns_ino, ns.name())?;

        let prog_id = self.prog_id;
        let Router { ebpf, egress, .. } = self;
        let (ifindex, link, attached) = ns.run(|| {
            let ifindex = ifindex_of(ifname, ns.name())?;
            // Allowed as egress first, so the first packet the program sees
            // can already be redirected back out of this interface.
            insert_egress(ebpf, ifindex)
                .with_context(|| format!("allowing redirects to {ifname}"))?;
            let forget_egress = |ebpf: &mut Ebpf| {
                if !egress.contains(&(ns_ino, ifindex))
                    && let Ok(mut m) = egress_map(ebpf)
                {
                    let _ = m.remove(ifindex);
                }
            };
            let prog = xdp_program(ebpf)?;
            let attempt = match prog.attach_to_if_index(ifindex, xdp_mode) {
                Err(e) if mode == XdpMode::Auto && may_fall_back(&e) => {
                    log::warn!(
                        "native XDP refused on {ifname} ({}); attaching in skb mode",
                        describe_errno(&e).unwrap_or_else(|| e.to_string())
                    );
                    prog.attach_to_if_index(ifindex, AyaXdpMode::Skb)
                        .map_err(|e| attach_error(e, XdpMode::Skb, ifname))
                }
                other => other.map_err(|e| attach_error(e, mode, ifname)),
            };
            let link = match attempt {
                Ok(link) => link,
                Err(e) => {
                    forget_egress(ebpf);
                    return Err(e);
                }
            };
            // Read back what the kernel did rather than trusting the request.
            let attached = match query::xdp_state(ifindex) {
                Ok(st) if st.drv_prog_id == Some(prog_id) => Ok(AttachedMode::Native),
                Ok(st) if st.skb_prog_id == Some(prog_id) => Ok(AttachedMode::Skb),
                Ok(st) => Err(anyhow!(
                    "attached the XDP router to {ifname} but the kernel reports another \
                     program there ({st:?}, ours is id {prog_id})"
                )),
                Err(e) => Err(e.context(format!("reading back the XDP mode of {ifname}"))),
            };
            match attached {
                Ok(attached) => Ok((ifindex, link, attached)),
                Err(e) => {
                    if let Ok(prog) = xdp_program(ebpf) {
                        let _ = prog.detach(link);
                    }
                    forget_egress(ebpf);
                    Err(e)
                }
            }
        })?;
        if !self.egress.contains(&(ns_ino, ifindex)) {
            self.egress.push((ns_ino, ifindex));
        }
        log::info!(
            "XDP router (prog id {prog_id}) attached to {ifname} (ifindex {ifindex}) in namespace {} in {attached} mode",
            ns.name()
        );
        self.attachments.push(Attachment {
            ns: ns_file,
            ns_name: ns.name().to_string(),
            ifname: ifname.to_string(),
            ifindex,
            link,
        });
        Ok(attached)
    }

    /// Lets the router redirect out of `ifname` (in `ns`) without
    /// attaching to it. `attach` does this for the interfaces it attaches
    /// to. Returns the interface's ifindex.
    pub fn add_egress(&mut self, ns: &Netns, ifname: &str) -> Result<u32> {
        let ns_ino = ns.file().metadata().context("stat the namespace")?.ino();
        self.check_one_namespace(ns_ino, ns.name())?;
        let ebpf = &mut self.ebpf;
        let ifindex = ns.run(|| {
            let ifindex = ifindex_of(ifname, ns.name())?;
            insert_egress(ebpf, ifindex)
                .with_context(|| format!("allowing redirects to {ifname}"))?;
            Ok(ifindex)
        })?;
        if !self.egress.contains(&(ns_ino, ifindex)) {
            self.egress.push((ns_ino, ifindex));
        }
        Ok(ifindex)
    }

    fn check_one_namespace(&self, ns_ino: u64, ns_name: &str) -> Result<()> {
        if self.egress.iter().any(|&(ino, _)| ino != ns_ino) {
            bail!(
                "one XDP router serves one namespace (ifindexes are per namespace); \
                 load another Router for namespace {ns_name}"
            );
        }
        Ok(())
    }

    /// Names of the interfaces the router is attached to, with their namespace.
    pub fn attached_to(&self) -> Vec<(String, String)> {
        self.attachments
            .iter()
            .map(|a| (a.ns_name.clone(), a.ifname.clone()))
            .collect()
    }

    /// Packets and bytes per outcome, summed over CPUs: IPv4 (and not-IP)
    /// outcomes under their names, IPv6 ones prefixed `ipv6_`. Every
    /// outcome is present, zero or not.
    pub fn counters(&self) -> Result<XdpCounters> {
        let mut all = read_counters(
            &self.ebpf,
            COUNTERS_MAP,
            Outcome::ALL.iter().map(|o| (o.index(), o.name())),
        )?;
        all.extend(read_counters(
            &self.ebpf,
            COUNTERS6_MAP,
            Outcome::IPV6.iter().map(|o| (o.index(), o.name6())),
        )?);
        Ok(all)
    }

    /// Detaches the router from every interface, each inside its own
    /// namespace, and empties the egress map. Tries them all and reports
    /// the first failure.
    pub fn detach_all(&mut self) -> Result<()> {
        let Router {
            ebpf,
            prog_id,
            attachments,
            egress,
            ..
        } = self;
        let mut first_err = None;
        for a in attachments.drain(..) {
            let res = run_in_ns(&a.ns, &a.ns_name, || {
                let prog = xdp_program(ebpf)?;
                match prog.detach(a.link) {
                    Ok(()) | Err(ProgramError::NotAttached) => {}
                    Err(e) => return Err(anyhow!(e).context("bpf link detach")),
                }
                // The interface may be gone with its namespace: nothing is left then.
                let Ok(ifindex) = ifindex_of(&a.ifname, &a.ns_name) else {
                    return Ok(());
                };
                if ifindex != a.ifindex {
                    return Ok(());
                }
                let state = query::xdp_state(ifindex)?;
                if state.skb_prog_id == Some(*prog_id) || state.drv_prog_id == Some(*prog_id) {
                    bail!("the kernel still reports the XDP router attached ({state:?})");
                }
                Ok(())
            })
            .with_context(|| {
                format!(
                    "detaching the XDP router from {} in namespace {}",
                    a.ifname, a.ns_name
                )
            });
            match res {
                Ok(()) => log::info!(
                    "XDP router detached from {} in namespace {}",
                    a.ifname,
                    a.ns_name
                ),
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        // Entries of deleted interfaces vanish by themselves; the rest go
        // now so a later attach starts clean.
        if let Ok(mut map) = egress_map(ebpf) {
            for (_, ifindex) in egress.drain(..) {
                match map.remove(ifindex) {
                    Ok(()) => {}
                    Err(MapError::KeyNotFound) => {}
                    Err(MapError::SyscallError(e))
                        if e.io_error.raw_os_error() == Some(libc::ENOENT) => {}
                    Err(e) => {
                        first_err.get_or_insert(anyhow!(e).context("emptying the XDP egress map"));
                    }
                }
            }
        }
        match first_err {
            None => Ok(()),
            Some(e) => Err(e),
        }
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
pub fn attached_mode(ns: &Netns, ifname: &str) -> Result<Option<AttachedMode>> {
    let state = ns.run(|| {
        let ifindex = ifindex_of(ifname, ns.name())?;
        query::xdp_state(ifindex)
    })?;
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

fn egress_map(ebpf: &mut Ebpf) -> Result<DevMapHash<&mut MapData>> {
    let map = ebpf
        .map_mut(EGRESS_MAP)
        .with_context(|| format!("the XDP router object has no {EGRESS_MAP} map"))?;
    DevMapHash::try_from(map).context("the egress map has an unexpected type")
}

/// Must run in the interface's namespace: the kernel resolves the ifindex
/// of a DEVMAP entry in the namespace of the thread that writes it.
fn insert_egress(ebpf: &mut Ebpf, ifindex: u32) -> Result<()> {
    egress_map(ebpf)?
        .insert(ifindex, ifindex, None, 0)
        .context("updating the XDP egress map")
}

fn ifindex_of(ifname: &str, ns_name: &str) -> Result<u32> {
    nix::net::if_::if_nametoindex(ifname)
        .map_err(|_| Error::InterfaceNotFound(format!("{ifname} (in namespace {ns_name})")).into())
}

/// Runs `f` on a thread inside the namespace `ns` (an open namespace file).
fn run_in_ns<T: Send>(ns: &File, name: &str, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("cannot enter network namespace {name}"))?;
            f()
        })
        .join()
        .map_err(|_| anyhow!("thread in namespace {name} panicked"))?
    })
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

/// The errno at the bottom of an aya program error, if any.
fn errno_of(e: &ProgramError) -> Option<i32> {
    match e {
        ProgramError::SyscallError(s) => s.io_error.raw_os_error(),
        ProgramError::LoadError { io_error, .. } => io_error.raw_os_error(),
        ProgramError::XdpError(aya::programs::XdpError::NetlinkError(n)) => n.raw_os_error(),
        _ => None,
    }
}

fn describe_errno(e: &ProgramError) -> Option<String> {
    errno_of(e).map(|n| std::io::Error::from_raw_os_error(n).to_string())
}

/// Errors for which `auto` retries in skb mode: the driver cannot run this
/// program natively (no ndo_bpf, MTU too large, queue layout, ...).
fn may_fall_back(e: &ProgramError) -> bool {
    matches!(
        errno_of(e),
        Some(libc::EOPNOTSUPP | libc::ERANGE | libc::EINVAL | libc::ENOSPC | libc::E2BIG)
    )
}

fn attach_error(e: ProgramError, mode: XdpMode, ifname: &str) -> anyhow::Error {
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
    match errno_of(&e) {
        Some(libc::EOPNOTSUPP) => unsupported(if mode == XdpMode::Skb {
            "the kernel refuses generic XDP on this device"
        } else {
            "the driver has no native XDP support"
        }),
        Some(libc::ERANGE) => unsupported("the MTU is too large for XDP on this device"),
        Some(libc::ENOSPC) => unsupported(
            "the device has fewer RX queues than its peer has TX queues (veth: give it as many)",
        ),
        Some(libc::EINVAL) | Some(libc::E2BIG) => {
            unsupported(&format!("the driver rejected the program ({e})"))
        }
        Some(libc::EBUSY) | Some(libc::EEXIST) => anyhow!(
            "another XDP program is already attached to {ifname}; detach it first \
             (see `ip link show {ifname}`)"
        ),
        Some(libc::EPERM) | Some(libc::EACCES) => Error::NotRoot.into(),
        _ => anyhow!(e).context(format!(
            "attaching the XDP router to {ifname} in {mode_name} mode"
        )),
    }
}

fn explain_program_error(e: ProgramError, what: &str) -> anyhow::Error {
    match errno_of(&e) {
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
