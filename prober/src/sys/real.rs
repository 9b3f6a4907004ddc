//! [`LinuxSys`]: the real kernel. One worker thread per network namespace:
//! it enters the namespace once (setns(2)), leaves the shared mount table
//! (unshare(CLONE_NEWNS), every mount made private so nothing propagates
//! back) and mounts a fresh sysfs on /sys, because /sys/class/net lists the
//! devices of the namespace that *mounted* sysfs, not of the reader. All
//! three need CAP_SYS_ADMIN (setns even into the namespace the thread is
//! already in), so a worker whose thread already is in its namespace, with
//! that namespace's sysfs on /sys (the usual case for the process's own
//! namespace), does none of them: `rtprobe reflect --kernel` then needs no
//! CAP_SYS_ADMIN. It
//! then opens one NETLINK_ROUTE socket and runs the calls sent to it, so a
//! namespace costs one thread and one socket for the whole run. /proc/sys/net
//! already follows the reading thread's network namespace.
//!
//! Kernel interfaces: setns(2) and unshare(2) (Linux >= 3.8), mount(2) of
//! sysfs, NETLINK_ROUTE ([`super::netlink`]), SIOCETHTOOL
//! ([`super::ethtool`]), `tc` ([`super::tc`]), files under /proc/sys and
//! /proc/thread-self/net,
//! bpf(2) through aya for XDP attach (BPF_LINK_CREATE, Linux >= 5.9; aya
//! falls back to netlink IFLA_XDP) and DEVMAP_HASH updates (5.4).

use std::{
    collections::HashMap,
    fs::File,
    os::fd::{AsFd, AsRawFd},
    path::Path,
    sync::{Arc, Mutex, OnceLock, mpsc},
    thread::JoinHandle,
};

use anyhow::{Context, Result, anyhow};
use nix::{
    mount::{MsFlags, mount},
    sched::{CloneFlags, setns, unshare},
};

use aya::{
    maps::{DevMapHash, MapData, MapError},
    programs::{CgroupAttachMode, Link as _, ProgramError, SockOps, Xdp, XdpMode},
};

use super::{
    Addr, BpfObject, CgroupLink, Link, Ns, Offload, QdiscInfo, Ring, Route, Sys, TcCmd,
    XdpAttachError, XdpFlags, XdpLink, XdpProg, XdpState, ethtool, netlink::NlSocket, netns, tc,
};

/// What a worker holds while it runs a call.
pub(crate) struct NsCtx {
    pub(crate) nl: NlSocket,
}

type Job = Box<dyn FnOnce(&mut NsCtx) + Send>;

struct Worker {
    tx: mpsc::Sender<Job>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Closing the channel ends the loop; join so the thread (and its
        // hold on the namespace) is gone before the namespace is deleted.
        let (dead, _) = mpsc::channel();
        self.tx = dead;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The kernel, one worker per namespace.
#[derive(Default)]
pub(crate) struct LinuxSys {
    workers: Mutex<HashMap<String, Arc<Worker>>>,
    /// Qdisc kind -> does the kernel have it (probing takes a namespace).
    qdisc_kinds: Mutex<HashMap<String, bool>>,
}

/// The process-wide [`LinuxSys`].
pub(crate) fn linux() -> Arc<LinuxSys> {
    SYS.get_or_init(|| Arc::new(LinuxSys::new())).clone()
}

/// The same, borrowed for the life of the process.
#[cfg(test)]
pub(crate) fn linux_static() -> &'static LinuxSys {
    SYS.get_or_init(|| Arc::new(LinuxSys::new()))
}

static SYS: OnceLock<Arc<LinuxSys>> = OnceLock::new();

/// Stops the worker of `name` if the process-wide [`LinuxSys`] has one.
pub(crate) fn release_worker(name: &str) {
    if let Some(s) = SYS.get() {
        s.release(name);
    }
}

const HOST_KEY: &str = "";

impl LinuxSys {
    /// The host namespace is the one of the process's main thread
    /// (/proc/self/ns/net), opened when first needed.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The file of a namespace (to move links into it).
    fn ns_file(&self, ns: Ns) -> Result<File> {
        match ns {
            Ns::Host => {
                File::open("/proc/self/ns/net").context("open this process's network namespace")
            }
            Ns::Named(n) => File::open(Path::new(netns::NETNS_RUN_DIR).join(n))
                .with_context(|| format!("network namespace {n} not found")),
        }
    }

    fn worker(&self, ns: Ns) -> Result<Arc<Worker>> {
        let key = match ns {
            Ns::Host => HOST_KEY.to_string(),
            Ns::Named(n) => n.to_string(),
        };
        let mut ws = self.workers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = ws.get(&key) {
            return Ok(w.clone());
        }
        let file = self.ns_file(ns)?;
        let label = ns.label();
        let (tx, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<()>>();
        let thread = std::thread::Builder::new()
            .name(format!("sys-{label}"))
            .spawn(move || {
                let setup = (|| -> Result<NsCtx> {
                    if already_in(&file) {
                        drop(file);
                        let mut nl = NlSocket::new()?;
                        if !sysfs_is_this_namespaces(&mut nl) {
                            private_sysfs()?;
                        }
                        return Ok(NsCtx { nl });
                    }
                    setns(file.as_fd(), CloneFlags::CLONE_NEWNET)
                        .with_context(|| format!("cannot enter network namespace {label}"))?;
                    drop(file);
                    private_sysfs()?;
                    Ok(NsCtx {
                        nl: NlSocket::new()?,
                    })
                })();
                let mut ctx = match setup {
                    Ok(c) => {
                        let _ = ready_tx.send(Ok(()));
                        c
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Ok(job) = rx.recv() {
                    job(&mut ctx);
                }
            })
            .context("spawn a namespace worker thread")?;
        ready_rx
            .recv()
            .map_err(|_| anyhow!("the worker of namespace {ns} died while starting"))??;
        let w = Arc::new(Worker {
            tx,
            thread: Some(thread),
        });
        ws.insert(key, w.clone());
        Ok(w)
    }

    /// Runs `f` on the worker of `ns` (inside the namespace, with its sysfs
    /// on /sys and its netlink socket) and returns its result. Also the way
    /// for code with needs the trait does not cover (bench's link
    /// counters) to reach the same view.
    pub(crate) fn on<T, F>(&self, ns: Ns, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut NsCtx) -> Result<T> + Send + 'static,
    {
        let w = self.worker(ns)?;
        let (tx, rx) = mpsc::channel();
        w.tx.send(Box::new(move |ctx: &mut NsCtx| {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(ctx)))
                .unwrap_or_else(|_| Err(anyhow!("a call in the namespace worker panicked")));
            let _ = tx.send(r);
        }))
        .map_err(|_| anyhow!("the worker of namespace {ns} has stopped"))?;
        rx.recv()
            .map_err(|_| anyhow!("the worker of namespace {ns} has stopped"))?
    }

    /// Stops the worker of a named namespace (before it is deleted, or when
    /// a namespace made elsewhere goes away) so it does not keep it alive.
    pub(crate) fn release(&self, name: &str) {
        let w = self
            .workers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        drop(w);
    }
}

/// Whether the calling thread is in the network namespace of `file`
/// already (same inode on the same nsfs).
fn already_in(file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (
        file.metadata(),
        std::fs::metadata("/proc/thread-self/ns/net"),
    ) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Whether /sys/class/net lists this thread's namespace's interfaces:
/// every device there is a link netlink knows by that name and index.
/// Then the sysfs on /sys already is this namespace's (the process's own,
/// or `ip netns exec`'s) and no private one is needed.
fn sysfs_is_this_namespaces(nl: &mut NlSocket) -> bool {
    let Ok(dir) = std::fs::read_dir("/sys/class/net") else {
        return false;
    };
    let mut any = false;
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let index = std::fs::read_to_string(e.path().join("ifindex"))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok());
        match (index, nl.link(&name)) {
            (Some(i), Ok(Some(l))) if l.index == i => any = true,
            _ => return false,
        }
    }
    any
}

/// Gives the calling thread its own mount table with the sysfs of its
/// network namespace on /sys. The thread's mount table dies with it.
pub(crate) fn private_sysfs() -> Result<()> {
    unshare(CloneFlags::CLONE_NEWNS)
        .context("unshare(CLONE_NEWNS) to mount the namespace's sysfs")?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .context("make the private mount table private")?;
    match mount(
        Some("sysfs"),
        "/sys",
        Some("sysfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    ) {
        // This namespace's sysfs is already the one on /sys (under
        // `ip netns exec`): the kernel refuses to stack it on itself.
        Err(nix::errno::Errno::EBUSY) => Ok(()),
        r => r.context("mount the namespace's sysfs"),
    }
}

fn sysctl_path(key: &str) -> String {
    format!("/proc/sys/{}", key.replace('.', "/"))
}

/// class/net/DEV/... with DEV missing is a missing interface, not a missing file.
fn sysfs_error(path: &str, e: std::io::Error, doing: &str) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::NotFound
        && let Some(rest) = path.strip_prefix("class/net/")
    {
        let dev = rest.split('/').next().unwrap_or(rest);
        if !Path::new("/sys/class/net").join(dev).exists() {
            return crate::error::Error::InterfaceNotFound(dev.to_string()).into();
        }
    }
    anyhow::Error::new(e).context(format!("{doing} /sys/{path}"))
}

impl Sys for LinuxSys {
    fn create_netns(&self, name: &str) -> Result<()> {
        netns::Netns::create(name)?.disown();
        Ok(())
    }

    fn delete_netns(&self, name: &str) -> Result<()> {
        self.release(name);
        netns::remove(name)
    }

    fn netns_list(&self) -> Vec<String> {
        netns::list()
    }

    fn open_netns(&self, name: &str) -> Result<netns::Netns> {
        netns::Netns::open(name)
    }

    fn link(&self, ns: Ns, name: &str) -> Result<Option<Link>> {
        let name = name.to_string();
        self.on(ns, move |c| c.nl.link(&name))
    }

    fn add_veth(&self, ns: Ns, name: &str, peer: &str) -> Result<()> {
        let (name, peer) = (name.to_string(), peer.to_string());
        self.on(ns, move |c| c.nl.add_veth(&name, &peer))
    }

    fn add_veth_queues(&self, ns: Ns, name: &str, peer: &str, queues: u32) -> Result<()> {
        let (name, peer) = (name.to_string(), peer.to_string());
        self.on(ns, move |c| c.nl.add_veth_queues(&name, &peer, queues))
    }

    #[cfg(test)]
    fn delete_link(&self, ns: Ns, name: &str) -> Result<()> {
        let name = name.to_string();
        self.on(ns, move |c| c.nl.delete_link(&name))
    }

    fn set_up(&self, ns: Ns, name: &str, up: bool) -> Result<()> {
        let name = name.to_string();
        self.on(ns, move |c| c.nl.set_up(&name, up))
    }

    fn set_mtu(&self, ns: Ns, name: &str, mtu: u32) -> Result<()> {
        let name = name.to_string();
        self.on(ns, move |c| c.nl.set_mtu(&name, mtu))
    }

    fn move_link(&self, ns: Ns, name: &str, to: Ns) -> Result<()> {
        let target = self.ns_file(to)?;
        let name = name.to_string();
        self.on(ns, move |c| c.nl.move_link(&name, target.as_raw_fd()))
    }

    fn addrs(&self, ns: Ns, name: &str) -> Result<Vec<Addr>> {
        let name = name.to_string();
        self.on(ns, move |c| c.nl.addrs(&name))
    }

    fn add_addr(&self, ns: Ns, name: &str, addr: Addr) -> Result<()> {
        let name = name.to_string();
        self.on(ns, move |c| c.nl.add_addr(&name, addr))
    }

    fn routes(&self, ns: Ns) -> Result<Vec<Route>> {
        self.on(ns, |c| c.nl.routes())
    }

    fn add_route(&self, ns: Ns, route: &Route) -> Result<()> {
        let route = route.clone();
        self.on(ns, move |c| c.nl.add_route(&route))
    }

    fn sysctl(&self, ns: Ns, key: &str) -> Result<String> {
        let key = key.to_string();
        self.on(ns, move |_| {
            Ok(std::fs::read_to_string(sysctl_path(&key))
                .with_context(|| format!("read sysctl {key}"))?
                .trim()
                .to_string())
        })
    }

    fn set_sysctl(&self, ns: Ns, key: &str, value: &str) -> Result<()> {
        let (key, value) = (key.to_string(), value.to_string());
        self.on(ns, move |_| {
            std::fs::write(sysctl_path(&key), &value)
                .with_context(|| format!("set sysctl {key}={value}"))
        })
    }

    fn sysfs_read(&self, ns: Ns, path: &str) -> Result<String> {
        let path = path.to_string();
        self.on(ns, move |_| {
            std::fs::read_to_string(Path::new("/sys").join(&path))
                .map(|s| s.trim().to_string())
                .map_err(|e| sysfs_error(&path, e, "read"))
        })
    }

    fn sysfs_write(&self, ns: Ns, path: &str, value: &str) -> Result<()> {
        let (path, value) = (path.to_string(), value.to_string());
        self.on(ns, move |_| {
            std::fs::write(Path::new("/sys").join(&path), &value)
                .map_err(|e| sysfs_error(&path, e, &format!("write {value} to")))
        })
    }

    fn sysfs_list(&self, ns: Ns, dir: &str) -> Result<Vec<String>> {
        let dir = dir.to_string();
        self.on(ns, move |_| {
            let mut v: Vec<String> = std::fs::read_dir(Path::new("/sys").join(&dir))
                .map_err(|e| sysfs_error(&dir, e, "list"))?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            Ok(v)
        })
    }

    fn proc_net(&self, ns: Ns, file: &str) -> Result<String> {
        let file = file.to_string();
        self.on(ns, move |_| {
            // thread-self: /proc/net is the main thread's namespace's view.
            let p = format!("/proc/thread-self/net/{file}");
            std::fs::read_to_string(&p).with_context(|| format!("read {p}"))
        })
    }

    fn offload(&self, ns: Ns, dev: &str, what: Offload) -> Result<bool> {
        let dev = dev.to_string();
        self.on(ns, move |_| ethtool::offload(&dev, what))
    }

    fn set_offload(&self, ns: Ns, dev: &str, what: Offload, on: bool) -> Result<()> {
        let dev = dev.to_string();
        self.on(ns, move |_| ethtool::set_offload(&dev, what, on))
    }

    fn gro_requested(&self, ns: Ns, dev: &str) -> Result<bool> {
        let dev = dev.to_string();
        self.on(ns, move |_| ethtool::gro_requested(&dev))
    }

    fn ring(&self, ns: Ns, dev: &str) -> Result<Ring> {
        let dev = dev.to_string();
        self.on(ns, move |_| ethtool::ring(&dev))
    }

    fn set_tx_ring(&self, ns: Ns, dev: &str, descriptors: u32) -> Result<()> {
        let dev = dev.to_string();
        self.on(ns, move |_| ethtool::set_tx_ring(&dev, descriptors))
    }

    fn driver(&self, ns: Ns, dev: &str) -> Result<String> {
        let dev = dev.to_string();
        self.on(ns, move |_| ethtool::driver(&dev))
    }

    fn tc(&self, ns: Ns, cmd: &TcCmd) -> Result<String> {
        let cmd = cmd.clone();
        self.on(ns, move |_| tc::run(&cmd).map_err(anyhow::Error::new))
    }

    fn qdiscs(&self, ns: Ns, dev: &str) -> Result<Vec<QdiscInfo>> {
        let dev = dev.to_string();
        self.on(ns, move |c| {
            let index = c.nl.require_link(&dev)?.index;
            c.nl.qdiscs(index)
        })
    }

    fn xdp_state(&self, ns: Ns, ifindex: u32) -> Result<XdpState> {
        self.on(ns, move |c| c.nl.xdp_state(ifindex))
    }

    fn missing_qdisc_kinds(&self, kinds: &[&str]) -> Result<Vec<String>> {
        let known = |k: &str| {
            self.qdisc_kinds
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(k)
                .copied()
        };
        let unknown: Vec<&str> = kinds
            .iter()
            .copied()
            .filter(|k| known(k).is_none())
            .collect();
        if !unknown.is_empty() {
            if !nix::unistd::geteuid().is_root() {
                return Err(crate::error::Error::NotRoot.into());
            }
            let found = tc::probe_kinds(self, &unknown)?;
            self.qdisc_kinds
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend(found);
        }
        let mut missing: Vec<String> = kinds
            .iter()
            .filter(|k| known(k) == Some(false))
            .map(|k| k.to_string())
            .collect();
        missing.dedup();
        Ok(missing)
    }

    fn xdp_attach(&self, ns: Ns, dev: &str, prog: &XdpProg, flags: XdpFlags) -> Result<XdpLink> {
        let (obj, name, d) = (prog.obj.clone(), prog.name, dev.to_string());
        let (ifindex, link) = self.on(ns, move |c| {
            let ifindex = c.nl.require_link(&d)?.index;
            let link = obj.with(|ebpf| {
                let xdp: &mut Xdp = ebpf
                    .program_mut(name)
                    .with_context(|| format!("the eBPF object has no program {name}"))?
                    .try_into()
                    .with_context(|| format!("{name} is not an XDP program"))?;
                let mode = match flags {
                    XdpFlags::Skb => XdpMode::Skb,
                    XdpFlags::Drv => XdpMode::Driver,
                    XdpFlags::Any => XdpMode::Default,
                };
                let id = xdp.attach(ifindex, mode).map_err(|e| XdpAttachError {
                    dev: d.clone(),
                    errno: bpf_errno(&e),
                    message: format!("{:#}", anyhow::Error::new(e)),
                })?;
                // Owned by the caller from here: its undo list detaches it.
                xdp.take_link(id).context("take the XDP link from aya")
            })?;
            Ok((ifindex, link))
        })?;
        Ok(XdpLink {
            netns: match ns {
                Ns::Host => None,
                Ns::Named(n) => Some(n.to_string()),
            },
            dev: dev.to_string(),
            ifindex,
            prog_id: prog.id,
            link: Some(link),
        })
    }

    fn xdp_detach(&self, link: XdpLink) -> Result<()> {
        let netns = link.netns.clone();
        let ns = netns.as_deref().map_or(Ns::Host, Ns::Named);
        let Some(l) = link.link else {
            return Ok(());
        };
        let detach = move |l: aya::programs::xdp::XdpLink| match l.detach() {
            Ok(()) | Err(ProgramError::NotAttached) => Ok(()),
            Err(e) => Err(anyhow!(e).context("bpf link detach")),
        };
        match self.worker(ns) {
            Ok(_) => self.on(ns, move |_| detach(l)),
            // The namespace is gone (and with it a veth); a bpf_link
            // detaches wherever its fd is closed, e.g. on a NIC that went
            // back to the host.
            Err(_) => detach(l),
        }
    }

    fn devmap_insert(&self, ns: Ns, obj: &BpfObject, map: &str, dev: &str) -> Result<u32> {
        let (obj, map, dev) = (obj.clone(), map.to_string(), dev.to_string());
        self.on(ns, move |c| {
            let ifindex = c.nl.require_link(&dev)?.index;
            obj.with(|ebpf| {
                devmap(ebpf, &map)?
                    .insert(ifindex, ifindex, None, 0)
                    .with_context(|| format!("updating the XDP map {map} with {dev}"))
            })?;
            Ok(ifindex)
        })
    }

    fn devmap_remove(&self, obj: &BpfObject, map: &str, ifindex: u32) -> Result<()> {
        obj.with(|ebpf| match devmap(ebpf, map)?.remove(ifindex) {
            Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(())
            }
            Err(e) => Err(anyhow!(e).context(format!("removing {ifindex} from the XDP map {map}"))),
        })
    }

    fn sock_ops_attach(
        &self,
        cgroup: &std::path::Path,
        obj: &BpfObject,
        prog: &'static str,
    ) -> Result<CgroupLink> {
        let dir = std::fs::File::open(cgroup)
            .with_context(|| format!("open the cgroup {}", cgroup.display()))?;
        let link = obj.with(|ebpf| {
            let p: &mut SockOps = ebpf
                .program_mut(prog)
                .with_context(|| format!("the eBPF object has no program {prog}"))?
                .try_into()
                .with_context(|| format!("{prog} is not a sock_ops program"))?;
            // A bpf_link (Linux >= 5.7; the program needs 6.15) always
            // runs beside the cgroup's other programs, and the kernel
            // refuses attach flags on it: "single" is aya's no flags.
            let id = p
                .attach(&dir, CgroupAttachMode::Single)
                .with_context(|| format!("attach {prog} to the cgroup {}", cgroup.display()))?;
            p.take_link(id).context("take the sock_ops link from aya")
        })?;
        Ok(CgroupLink {
            cgroup: cgroup.to_path_buf(),
            link: Some(link),
        })
    }

    fn sock_ops_detach(&self, link: CgroupLink) -> Result<()> {
        let cgroup = link.cgroup;
        match link.link.map(|l| l.detach()) {
            None | Some(Ok(()) | Err(ProgramError::NotAttached)) => Ok(()),
            Some(Err(e)) => Err(anyhow!(e).context(format!(
                "detach the sock_ops program from the cgroup {}",
                cgroup.display()
            ))),
        }
    }
}

fn devmap<'a>(ebpf: &'a mut aya::Ebpf, map: &str) -> Result<DevMapHash<&'a mut MapData>> {
    let m = ebpf
        .map_mut(map)
        .with_context(|| format!("the eBPF object has no {map} map"))?;
    DevMapHash::try_from(m).with_context(|| format!("the {map} map is not a DEVMAP_HASH"))
}

/// The errno at the bottom of an aya program error, if any.
pub(crate) fn bpf_errno(e: &ProgramError) -> Option<i32> {
    match e {
        ProgramError::SyscallError(s) => s.io_error.raw_os_error(),
        ProgramError::LoadError { io_error, .. } => io_error.raw_os_error(),
        ProgramError::XdpError(aya::programs::XdpError::NetlinkError(n)) => n.raw_os_error(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::{
        sys::netdev_attr,
        testbed::testutil::{require_root, unique_name},
    };

    /// Every typed call on the real kernel, in two namespaces of our own.
    #[test]
    #[ignore = "needs root: run by cargo xtask test"]
    fn typed_calls_on_the_real_kernel() {
        require_root();
        let sys = LinuxSys::new();
        let (a, b) = (unique_name("sysa"), unique_name("sysb"));
        sys.create_netns(&a).unwrap();
        sys.create_netns(&b).unwrap();
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let (na, nb) = (Ns::Named(&a), Ns::Named(&b));
            let l = links_and_addrs(&sys, &a, na, nb);
            default_routes(&sys, na);
            sysfs_and_sysctl(&sys, na, nb);
            ethtool_and_tc(&sys, na);
            assert!(sys.xdp_state(na, l.index).unwrap().is_empty());
            // One worker per namespace, however many calls.
            assert_eq!(sys.workers.lock().unwrap().len(), 2);
            sys.delete_link(na, "sx0").unwrap();
            assert!(sys.link(nb, "sx1").unwrap().is_none(), "the peer goes too");
        }));
        sys.delete_netns(&a).unwrap();
        sys.delete_netns(&b).unwrap();
        assert!(sys.workers.lock().unwrap().is_empty());
        assert!(!sys.netns_list().contains(&a));
        if let Err(p) = res {
            std::panic::resume_unwind(p);
        }
    }

    /// A veth pair across the two namespaces, its MTU, state and addresses;
    /// the link `sx0` as it ends up.
    fn links_and_addrs(sys: &LinuxSys, a: &str, na: Ns, nb: Ns) -> Link {
        assert!(sys.netns_list().contains(&a.to_string()));
        sys.add_veth(na, "sx0", "sx1").unwrap();
        assert!(sys.add_veth(na, "sx0", "sx2").is_err(), "sx0 exists");
        sys.move_link(na, "sx1", nb).unwrap();
        assert!(sys.link(na, "sx1").unwrap().is_none());
        let l = sys.link(nb, "sx1").unwrap().unwrap();
        assert!(!l.up);
        sys.set_mtu(na, "sx0", 1400).unwrap();
        sys.set_up(na, "sx0", true).unwrap();
        sys.set_up(nb, "sx1", true).unwrap();
        let l = sys.link(na, "sx0").unwrap().unwrap();
        assert_eq!((l.up, l.mtu), (true, Some(1400)));
        let v4 = Addr {
            addr: IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)),
            prefix_len: 24,
        };
        let v6 = Addr {
            addr: IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 1)),
            prefix_len: 64,
        };
        sys.add_addr(na, "sx0", v4).unwrap();
        sys.add_addr(na, "sx0", v4).unwrap();
        sys.add_addr(na, "sx0", v6).unwrap();
        let addrs = sys.addrs(na, "sx0").unwrap();
        assert!(addrs.contains(&v4) && addrs.contains(&v6), "{addrs:?}");
        l
    }

    /// A default route via each family's gateway, added twice.
    fn default_routes(sys: &LinuxSys, na: Ns) {
        for gw in [
            IpAddr::V4(Ipv4Addr::new(192, 0, 2, 254)),
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 0xfe)),
        ] {
            let mut r = Route::default_via(gw);
            r.dev = Some("sx0".into());
            sys.add_route(na, &r).unwrap();
            sys.add_route(na, &r).unwrap();
            let routes = sys.routes(na).unwrap();
            assert!(
                routes.iter().any(|x| x.is_default()
                    && x.gateway == Some(gw)
                    && x.dev.as_deref() == Some("sx0")),
                "{routes:?}"
            );
        }
    }

    fn sysfs_and_sysctl(sys: &LinuxSys, na: Ns, nb: Ns) {
        // sysfs and sysctl are the namespace's own.
        sys.sysfs_write(na, &netdev_attr("sx0", "tx_queue_len"), "77")
            .unwrap();
        assert_eq!(
            sys.sysfs_read(na, &netdev_attr("sx0", "tx_queue_len"))
                .unwrap(),
            "77"
        );
        assert!(
            sys.sysfs_list(na, "class/net")
                .unwrap()
                .contains(&"sx0".to_string())
        );
        assert!(
            !sys.sysfs_list(nb, "class/net")
                .unwrap()
                .contains(&"sx0".to_string())
        );
        let e = sys.sysfs_read(nb, &netdev_attr("sx0", "mtu")).unwrap_err();
        assert!(
            matches!(e.downcast_ref::<crate::error::Error>(), Some(crate::error::Error::InterfaceNotFound(n)) if n == "sx0"),
            "{e:#}"
        );
        sys.set_sysctl(na, "net.ipv4.ip_forward", "1").unwrap();
        assert_eq!(sys.sysctl(na, "net.ipv4.ip_forward").unwrap(), "1");
        assert_eq!(sys.sysctl(nb, "net.ipv4.ip_forward").unwrap(), "0");
    }

    fn ethtool_and_tc(sys: &LinuxSys, na: Ns) {
        // ethtool and tc.
        assert_eq!(sys.driver(na, "sx0").unwrap(), "veth");
        for on in [true, false] {
            sys.set_offload(na, "sx0", Offload::Gro, on).unwrap();
            assert_eq!(sys.offload(na, "sx0", Offload::Gro).unwrap(), on);
        }
        sys.tc(
            na,
            &TcCmd::parse("qdisc add dev sx0 root handle 1: pfifo limit 10"),
        )
        .unwrap();
        let q = crate::sys::root_qdisc(sys, na, "sx0").unwrap().unwrap();
        assert_eq!((q.kind.as_str(), q.handle.as_str()), ("pfifo", "1:"));
        let e = sys
            .tc(
                na,
                &TcCmd::parse("qdisc add dev sx0 root handle 1: nosuchqdisc"),
            )
            .unwrap_err();
        let t = e
            .downcast_ref::<crate::sys::tc::TcError>()
            .expect("a TcError");
        assert!(
            t.to_string()
                .contains("tc qdisc add dev sx0 root handle 1: nosuchqdisc"),
            "{t}"
        );
    }
}
