//! The kernel, behind one trait.
//!
//! Every kernel state change of testbed, tune, run and bench_forward goes through
//! [`Sys`]: links, addresses and routes (netlink), qdiscs (netlink to read,
//! the `tc` command to build trees and to find the kinds the kernel lacks,
//! see [`tc`]), offloads, rings and the PHC index (ethtool ioctl,
//! [`ethtool`]), sysctls (/proc/sys), /proc/net counters and sysfs
//! attributes, and XDP: attach, detach, the attached state and the device
//! maps the kernel resolves in the caller's namespace (aya loads the
//! programs and fills their own maps in `ebpf`; the probe and the
//! reflectors use their own sockets). Two implementations:
//!
//! - [`LinuxSys`] (`real.rs`): one worker thread per network namespace
//!   that entered it once, owns one NETLINK_ROUTE socket and a private
//!   mount table with that namespace's own sysfs on /sys, and runs the
//!   calls sent to it (the shape of msg-rs `linkem`'s namespace worker).
//! - `fake::FakeSys` (tests only): a small in-memory model that records every call and
//!   can be told to fail chosen ones, so the orchestration above is tested
//!   without root (the shape of youki's `TestHelperSyscall`).
//!
//! XDP programs are loaded by `ebpf` (aya) and handed over as a
//! [`BpfObject`]; the worker attaches them (BPF_LINK_CREATE) and returns
//! an [`XdpLink`] the caller's undo list gives back to [`Sys::xdp_detach`].
//!
//! Not behind the trait: the probe's own sockets and their timestamping
//! ioctls (SIOCSHWTSTAMP, `probe::socket`) and the PHC reads
//! (`probe::phc`, /dev/ptpN), which act on sockets and devices the probe
//! owns rather than on network configuration; the queue sampler's own
//! netlink socket on its thread (`tune::sampler`, code in [`netlink`]: a
//! sample through the worker costs ten times as much); `bench_forward`'s AF_XDP
//! sockets, its load generator's BPF_PROG_TEST_RUN and the scheduling of
//! its threads (affinity, SCHED_FIFO), which act on the calling thread;
//! the same for the probe's sender thread, whose real-time settings
//! (SCHED_FIFO, mlockall, pinning, the CPU idle-latency limit) are [`rt`].
//!
//! The host's own facts (cores, cpuidle, preemption, hypervisor, clock
//! source), which follow no namespace and need no root, are plain reads of
//! /proc and /sys in [`host`].
//!
//! Child processes (`perf`, `stress-ng`; `tc` in [`tc`]) are started and
//! stopped in [`process`].
//!
//! Named namespaces themselves (/run/netns/NAME: unshare, bind mount,
//! setns) are made in [`netns`], which [`LinuxSys`] uses for
//! [`Sys::create_netns`] and whose [`Netns`] handles let a thread enter one.
//!
//! Kernel versions: see the module of each mechanism; all of it works on
//! Linux >= 4.19.

pub(crate) mod caps;
pub(crate) mod ethtool;
#[cfg(test)]
pub(crate) mod fake;
pub(crate) mod host;
pub(crate) mod netlink;
pub mod netns;
pub(crate) mod process;
mod real;
pub(crate) mod rt;
pub(crate) mod tc;

use std::{
    fmt,
    net::IpAddr,
    sync::{Arc, RwLock},
};

use anyhow::Result;
use serde::{Deserialize, Serialize};

pub(crate) use ethtool::Ring;
pub(crate) use netns::Netns;
#[cfg(test)]
pub(crate) use real::private_sysfs;
pub(crate) use real::{bpf_errno, linux, release_worker};
// Root tests borrow the process-wide handle; the program passes its `Sys` down.
#[cfg(test)]
pub(crate) use real::linux_static;
pub(crate) use tc::TcCmd;

/// Which network namespace a call acts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Ns<'a> {
    /// The namespace this process started in.
    Host,
    /// A named namespace (/run/netns/NAME).
    Named(&'a str),
}

impl Ns<'_> {
    pub(crate) fn label(&self) -> String {
        match self {
            Ns::Host => "host".into(),
            Ns::Named(n) => (*n).to_string(),
        }
    }
}

impl fmt::Display for Ns<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// A link as netlink reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Link {
    pub(crate) index: u32,
    pub(crate) name: String,
    pub(crate) up: bool,
    pub(crate) mtu: Option<u32>,
}

/// An interface address (IPv4 or IPv6) with its prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct Addr {
    pub(crate) addr: IpAddr,
    pub(crate) prefix_len: u8,
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// A unicast route of the main table.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct Route {
    pub(crate) dst: IpAddr,
    pub(crate) prefix_len: u8,
    pub(crate) gateway: Option<IpAddr>,
    /// Output interface.
    pub(crate) dev: Option<String>,
    pub(crate) metric: Option<u32>,
    /// RTPROT_* (2 = kernel, 3 = boot, 4 = static, 16 = dhcp, ...).
    pub(crate) protocol: u8,
    /// RT_SCOPE_* (0 = universe, 253 = link).
    pub(crate) scope: u8,
    pub(crate) pref_src: Option<IpAddr>,
}

impl Route {
    pub(crate) fn is_default(&self) -> bool {
        self.prefix_len == 0
    }

    /// A default route via `gw` (the testbed's sender and receiver).
    pub(crate) fn default_via(gw: IpAddr) -> Self {
        let dst = match gw {
            IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        };
        Route {
            dst,
            prefix_len: 0,
            gateway: Some(gw),
            dev: None,
            metric: None,
            protocol: 4,
            scope: 0,
            pref_src: None,
        }
    }
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_default() {
            f.write_str("default")?;
        } else {
            write!(f, "{}/{}", self.dst, self.prefix_len)?;
        }
        if let Some(g) = self.gateway {
            write!(f, " via {g}")?;
        }
        if let Some(d) = &self.dev {
            write!(f, " dev {d}")?;
        }
        if let Some(m) = self.metric {
            write!(f, " metric {m}")?;
        }
        Ok(())
    }
}

/// One qdisc as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct QdiscInfo {
    pub(crate) ifindex: u32,
    pub(crate) kind: String,
    /// "1:" style, "0:" for the kernel's default qdiscs.
    pub(crate) handle: String,
    /// "root" or "1:1" style.
    pub(crate) parent: String,
    pub(crate) qlen: u32,
    pub(crate) backlog_bytes: u32,
    pub(crate) drops: u32,
    pub(crate) overlimits: u32,
    pub(crate) requeues: u32,
    pub(crate) sent_bytes: u64,
    pub(crate) sent_packets: u64,
}

impl QdiscInfo {
    pub(crate) fn is_root(&self) -> bool {
        self.parent == "root"
    }

    /// Default qdiscs the kernel attaches by itself have handle 0:
    /// (noqueue, pfifo_fast, mq and its children, fq_codel as default_qdisc).
    pub(crate) fn is_kernel_default(&self) -> bool {
        self.handle == "0:"
    }
}

/// XDP programs attached to one interface, by mode (kernel program ids).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct XdpState {
    pub(crate) skb_prog_id: Option<u32>,
    pub(crate) drv_prog_id: Option<u32>,
    pub(crate) hw_prog_id: Option<u32>,
}

impl XdpState {
    pub(crate) fn is_empty(&self) -> bool {
        self.skb_prog_id.is_none() && self.drv_prog_id.is_none() && self.hw_prog_id.is_none()
    }
}

/// The mode flag an XDP attach asks the kernel for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum XdpFlags {
    /// XDP_FLAGS_SKB_MODE: generic XDP, any driver.
    Skb,
    /// XDP_FLAGS_DRV_MODE: in the driver; refused by drivers without it.
    Drv,
    /// No mode flag: the kernel picks native where the driver has it.
    Any,
}

/// A loaded eBPF object (aya's `Ebpf`), shared with the kernel layer so
/// that its worker of a namespace can attach the object's XDP programs and
/// write its device maps there. Tests use a stand-in holding no object.
#[derive(Clone)]
pub(crate) struct BpfObject(Arc<RwLock<Option<aya::Ebpf>>>);

impl BpfObject {
    pub(crate) fn new(ebpf: aya::Ebpf) -> Self {
        Self(Arc::new(RwLock::new(Some(ebpf))))
    }

    /// An object that was never loaded, for orchestration tests against
    /// the fake (which never looks inside).
    #[cfg(test)]
    pub(crate) fn stand_in() -> Self {
        Self(Arc::new(RwLock::new(None)))
    }

    /// Runs `f` on the loaded object (attach, map updates: one at a time).
    pub(crate) fn with<T>(&self, f: impl FnOnce(&mut aya::Ebpf) -> Result<T>) -> Result<T> {
        let mut g = self.0.write().unwrap_or_else(|p| p.into_inner());
        match g.as_mut() {
            Some(e) => f(e),
            None => anyhow::bail!("this eBPF object is a test stand-in, never loaded"),
        }
    }

    /// Runs `f` on the loaded object without excluding other readers: the
    /// bench's generator threads run one program side by side.
    pub(crate) fn with_shared<T>(&self, f: impl FnOnce(&aya::Ebpf) -> Result<T>) -> Result<T> {
        let g = self.0.read().unwrap_or_else(|p| p.into_inner());
        match g.as_ref() {
            Some(e) => f(e),
            None => anyhow::bail!("this eBPF object is a test stand-in, never loaded"),
        }
    }
}

impl fmt::Debug for BpfObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BpfObject")
    }
}

/// One XDP program of a loaded object.
#[derive(Debug, Clone)]
pub(crate) struct XdpProg {
    pub(crate) obj: BpfObject,
    /// Its name in the object.
    pub(crate) name: &'static str,
    /// The kernel's program id (what IFLA_XDP reports once attached).
    pub(crate) id: u32,
}

/// An XDP attachment made by [`Sys::xdp_attach`]; [`Sys::xdp_detach`]
/// takes it back. Dropped without that, a bpf_link attachment (Linux >=
/// 5.9) detaches as its fd closes; a netlink one stays.
#[derive(Debug)]
pub(crate) struct XdpLink {
    /// The namespace's name, None for the host.
    pub(crate) netns: Option<String>,
    pub(crate) dev: String,
    pub(crate) ifindex: u32,
    pub(crate) prog_id: u32,
    /// aya's link (None from the fake).
    pub(crate) link: Option<aya::programs::xdp::XdpLink>,
}

impl XdpLink {
    pub(crate) fn ns(&self) -> Ns<'_> {
        self.netns.as_deref().map_or(Ns::Host, Ns::Named)
    }
}

/// A cgroup's attachment of a sock_ops program, made by
/// [`Sys::sock_ops_attach`]; [`Sys::sock_ops_detach`] takes it back.
/// Dropped without that, it detaches as its link's fd closes.
#[derive(Debug)]
pub(crate) struct CgroupLink {
    pub(crate) cgroup: std::path::PathBuf,
    /// aya's link (None from the fake).
    pub(crate) link: Option<aya::programs::sock_ops::SockOpsLink>,
}

/// Why the kernel refused an XDP attach, with its errno where there is one
/// (callers choose a fallback or an explanation by it).
#[derive(Debug, thiserror::Error)]
#[error("attaching XDP to {dev}: {message}")]
pub(crate) struct XdpAttachError {
    pub(crate) dev: String,
    pub(crate) errno: Option<i32>,
    pub(crate) message: String,
}

/// An offload feature switched through ethtool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) enum Offload {
    /// Generic receive offload.
    Gro,
    /// TX checksumming (dropping it also drops TSO).
    TxCsum,
    /// TCP segmentation offload.
    Tso,
    /// Generic segmentation offload.
    Gso,
}

impl Offload {
    pub(crate) const ALL: [Offload; 4] =
        [Offload::Gro, Offload::TxCsum, Offload::Tso, Offload::Gso];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Offload::Gro => "GRO",
            Offload::TxCsum => "TX checksumming",
            Offload::Tso => "TSO",
            Offload::Gso => "GSO",
        }
    }
}

/// Everything rtprobe asks of the kernel for its network set-up. Every
/// call names the namespace it acts in. Paths under sysfs are relative to
/// that namespace's /sys ("class/net/veth0/tx_queue_len"); sysctl keys use
/// dots ("net.ipv4.ip_forward").
pub(crate) trait Sys: Send + Sync {
    /// Creates /run/netns/NAME holding a fresh network namespace.
    fn create_netns(&self, name: &str) -> Result<()>;
    /// Deletes a named namespace (the veths inside go with it).
    fn delete_netns(&self, name: &str) -> Result<()>;
    /// Named namespaces present (what `ip netns list` shows).
    fn netns_list(&self) -> Vec<String>;
    /// A handle on an existing named namespace (not owned: dropping it
    /// deletes nothing), for threads that enter it (sockets, loads).
    fn open_netns(&self, name: &str) -> Result<Netns>;

    fn link(&self, ns: Ns, name: &str) -> Result<Option<Link>>;
    fn add_veth(&self, ns: Ns, name: &str, peer: &str) -> Result<()>;
    /// A veth pair with `queues` TX and RX queues on each end.
    fn add_veth_queues(&self, ns: Ns, name: &str, peer: &str, queues: u32) -> Result<()>;
    /// (Only the real layer's own tests delete a single link.)
    #[cfg(test)]
    fn delete_link(&self, ns: Ns, name: &str) -> Result<()>;
    fn set_up(&self, ns: Ns, name: &str, up: bool) -> Result<()>;
    fn set_mtu(&self, ns: Ns, name: &str, mtu: u32) -> Result<()>;
    /// Moves a link to another namespace (its addresses and routes are lost).
    fn move_link(&self, ns: Ns, name: &str, to: Ns) -> Result<()>;

    fn addrs(&self, ns: Ns, name: &str) -> Result<Vec<Addr>>;
    /// Adds an address; one already present is not an error.
    fn add_addr(&self, ns: Ns, name: &str, addr: Addr) -> Result<()>;
    /// Unicast routes of the main table, IPv4 and IPv6.
    fn routes(&self, ns: Ns) -> Result<Vec<Route>>;
    /// Adds a route; one already present is not an error.
    fn add_route(&self, ns: Ns, route: &Route) -> Result<()>;

    fn sysctl(&self, ns: Ns, key: &str) -> Result<String>;
    fn set_sysctl(&self, ns: Ns, key: &str, value: &str) -> Result<()>;
    /// Reads a sysfs attribute (trimmed). A missing class/net/DEV is
    /// `Error::InterfaceNotFound`.
    fn sysfs_read(&self, ns: Ns, path: &str) -> Result<String>;
    fn sysfs_write(&self, ns: Ns, path: &str, value: &str) -> Result<()>;
    /// Entries of a sysfs directory, sorted.
    fn sysfs_list(&self, ns: Ns, dir: &str) -> Result<Vec<String>>;
    /// A file of the namespace's /proc/net ("snmp", "softnet_stat").
    fn proc_net(&self, ns: Ns, file: &str) -> Result<String>;

    /// Is this offload on? A driver without it: `ethtool::Unsupported`.
    fn offload(&self, ns: Ns, dev: &str, what: Offload) -> Result<bool>;
    /// Switches an offload and checks the kernel applied it.
    fn set_offload(&self, ns: Ns, dev: &str, what: Offload, on: bool) -> Result<()>;
    /// Was GRO asked for (not merely on)? A veth takes XDP frames from
    /// its peer only then (or with an XDP program of its own).
    fn gro_requested(&self, ns: Ns, dev: &str) -> Result<bool>;
    fn ring(&self, ns: Ns, dev: &str) -> Result<Ring>;
    fn set_tx_ring(&self, ns: Ns, dev: &str, descriptors: u32) -> Result<()>;
    fn driver(&self, ns: Ns, dev: &str) -> Result<String>;

    /// Runs one `tc` command in the namespace; the error is a [`TcError`]
    /// (downcast it to branch on an unknown qdisc kind).
    fn tc(&self, ns: Ns, cmd: &TcCmd) -> Result<String>;
    fn qdiscs(&self, ns: Ns, dev: &str) -> Result<Vec<QdiscInfo>>;
    /// Which of `kinds` (qdisc kinds, "u32" for the classifier) this
    /// kernel lacks, found by trying each in a scratch namespace; the
    /// answer is kept for the life of the handle.
    fn missing_qdisc_kinds(&self, kinds: &[&str]) -> Result<Vec<String>>;
    fn xdp_state(&self, ns: Ns, ifindex: u32) -> Result<XdpState>;

    /// Attaches `prog` to `dev` in `ns` (BPF_LINK_CREATE, netlink IFLA_XDP
    /// before Linux 5.9). A refusal by the kernel is an [`XdpAttachError`];
    /// a missing `dev` is `Error::InterfaceNotFound`.
    fn xdp_attach(&self, ns: Ns, dev: &str, prog: &XdpProg, flags: XdpFlags) -> Result<XdpLink>;
    /// Detaches what [`Sys::xdp_attach`] attached (inside its namespace;
    /// if the namespace is gone, where the link still lives).
    fn xdp_detach(&self, link: XdpLink) -> Result<()>;
    /// Puts `dev`'s ifindex into the DEVMAP_HASH `map` of `obj` (key and
    /// value) and returns it: the kernel resolves the device in the
    /// namespace of the writing thread, so this runs in `ns`.
    fn devmap_insert(&self, ns: Ns, obj: &BpfObject, map: &str, dev: &str) -> Result<u32>;
    /// Removes `ifindex` from `map`; an absent key is not an error.
    fn devmap_remove(&self, obj: &BpfObject, map: &str, ifindex: u32) -> Result<()>;
    /// Attaches the sock_ops program `prog` of `obj` to the cgroup (v2)
    /// directory `cgroup` through a bpf_link, which runs beside any
    /// programs already there (nothing of theirs is replaced).
    fn sock_ops_attach(
        &self,
        cgroup: &std::path::Path,
        obj: &BpfObject,
        prog: &'static str,
    ) -> Result<CgroupLink>;
    /// Detaches what [`Sys::sock_ops_attach`] attached.
    fn sock_ops_detach(&self, link: CgroupLink) -> Result<()>;
}

/// The shared handle the orchestration passes around.
pub(crate) type SysRef = Arc<dyn Sys>;

/// /sys path of a network device attribute.
pub(crate) fn netdev_attr(dev: &str, attr: &str) -> String {
    format!("class/net/{dev}/{attr}")
}

/// The root qdisc of `dev` (None if the device has none, e.g. down).
pub(crate) fn root_qdisc(sys: &dyn Sys, ns: Ns, dev: &str) -> Result<Option<QdiscInfo>> {
    Ok(sys.qdiscs(ns, dev)?.into_iter().find(QdiscInfo::is_root))
}

impl fmt::Debug for dyn Sys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("dyn Sys")
    }
}
