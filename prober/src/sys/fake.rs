//! A recording fake of [`Sys`] for tests without root: a small model of
//! namespaces, links (state, MTU, addresses, offloads), routes, sysctls
//! and sysfs files. Every call is recorded in order; [`FakeSys::fail_when`]
//! makes chosen calls fail (still recorded), [`FakeSys::fail_nth_when`] and
//! [`FakeSys::fail_nth_change`] one chosen step, to test the undo paths.
//! Moving a link drops its addresses and routes, as the kernel does.
//! XDP: attaching sets the link's program id in the mode the kernel would
//! choose (native unless the link is told to refuse it), one program per
//! link; device maps are sets of ifindexes per map name.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use anyhow::{Result, anyhow, bail};

use super::{
    Addr, BpfObject, CgroupLink, Link, Netns, Ns, Offload, QdiscInfo, Ring, Route, Sys, TcCmd,
    XdpAttachError, XdpFlags, XdpLink, XdpProg, XdpState,
};

/// One recorded call; the namespace is "host" or its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    CreateNetns(String),
    DeleteNetns(String),
    OpenNetns(String),
    Link(String, String),
    AddVeth(String, String, String),
    AddVethQueues(String, String, String, u32),
    DeleteLink(String, String),
    SetUp(String, String, bool),
    SetMtu(String, String, u32),
    MoveLink(String, String, String),
    Addrs(String, String),
    AddAddr(String, String, Addr),
    Routes(String),
    AddRoute(String, Route),
    Sysctl(String, String),
    SetSysctl(String, String, String),
    SysfsRead(String, String),
    SysfsWrite(String, String, String),
    SysfsList(String, String),
    ProcNet(String, String),
    Offload(String, String, Offload),
    SetOffload(String, String, Offload, bool),
    Ring(String, String),
    SetTxRing(String, String, u32),
    Driver(String, String),
    Tc(String, String),
    Qdiscs(String, String),
    XdpState(String, u32),
    /// Namespace, device, program id, flags.
    XdpAttach(String, String, u32, XdpFlags),
    /// Namespace, device, program id.
    XdpDetach(String, String, u32),
    /// Namespace, map, device.
    DevmapInsert(String, String, String),
    /// Map, ifindex.
    DevmapRemove(String, u32),
    /// Cgroup directory, program.
    SockOpsAttach(String, String),
    /// Cgroup directory.
    SockOpsDetach(String),
    MissingQdiscKinds(Vec<String>),
}

impl Call {
    /// Does this call change kernel state (as opposed to reading it)?
    pub(crate) fn is_change(&self) -> bool {
        !matches!(
            self,
            Call::Link(..)
                | Call::OpenNetns(..)
                | Call::Addrs(..)
                | Call::Routes(..)
                | Call::Sysctl(..)
                | Call::SysfsRead(..)
                | Call::SysfsList(..)
                | Call::ProcNet(..)
                | Call::Offload(..)
                | Call::Ring(..)
                | Call::Driver(..)
                | Call::Qdiscs(..)
                | Call::XdpState(..)
                | Call::MissingQdiscKinds(..)
        )
    }
}

#[derive(Debug, Clone)]
pub(crate) struct FakeLink {
    pub(crate) index: u32,
    pub(crate) up: bool,
    pub(crate) mtu: u32,
    pub(crate) addrs: Vec<Addr>,
    pub(crate) offloads: BTreeMap<Offload, bool>,
    pub(crate) driver: String,
    pub(crate) xdp: XdpState,
    /// The errno a native (or unflagged) XDP attach gets; None: the driver
    /// has native XDP. EOPNOTSUPP makes an unflagged attach generic.
    pub(crate) refuse_native: Option<i32>,
}

#[derive(Default)]
pub(crate) struct Model {
    pub(crate) namespaces: BTreeSet<String>,
    /// (namespace, link name) -> link.
    pub(crate) links: BTreeMap<(String, String), FakeLink>,
    pub(crate) routes: BTreeMap<String, Vec<Route>>,
    /// (namespace, "sysctl:KEY", "sysfs:PATH" or "procnet:FILE") -> value.
    pub(crate) files: BTreeMap<(String, String), String>,
    /// Qdisc kinds (and "u32") the fake kernel lacks.
    pub(crate) missing_qdisc_kinds: BTreeSet<String>,
    /// Device map name -> ifindexes in it.
    pub(crate) devmaps: BTreeMap<String, BTreeSet<u32>>,
    next_index: u32,
}

type Pred = Box<dyn Fn(&Call) -> bool + Send>;

#[derive(Default)]
pub(crate) struct FakeSys {
    calls: Mutex<Vec<Call>>,
    fail: Mutex<Vec<Pred>>,
    pub(crate) model: Mutex<Model>,
}

fn key(ns: Ns) -> String {
    ns.label()
}

impl FakeSys {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Every call matching `pred` fails from now on.
    pub(crate) fn fail_when(&self, pred: impl Fn(&Call) -> bool + Send + 'static) {
        self.fail.lock().unwrap().push(Box::new(pred));
    }

    /// Only the `n`-th call (1-based) from now on that matches `pred`
    /// fails: one step of a sequence whose calls look alike (the second
    /// attach, a restore that writes what an apply wrote).
    pub(crate) fn fail_nth_when(&self, n: usize, pred: impl Fn(&Call) -> bool + Send + 'static) {
        let seen = AtomicUsize::new(0);
        self.fail_when(move |c| pred(c) && seen.fetch_add(1, Ordering::SeqCst) + 1 == n);
    }

    /// Only the `n`-th state-changing call (1-based) from now on fails:
    /// a failure injected at step `n` of a set-up.
    pub(crate) fn fail_nth_change(&self, n: usize) {
        self.fail_nth_when(n, Call::is_change);
    }

    /// All calls so far, in order.
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Forgets the calls so far (those that built a test's starting state).
    pub(crate) fn clear_calls(&self) {
        self.calls.lock().unwrap().clear();
    }

    /// The calls that change state, in order.
    pub(crate) fn changes(&self) -> Vec<Call> {
        self.calls().into_iter().filter(Call::is_change).collect()
    }

    /// Adds a link to the model (a NIC the user owns, say).
    pub(crate) fn with_link(&self, ns: Ns, name: &str, up: bool, mtu: u32) -> &Self {
        let mut m = self.model.lock().unwrap();
        m.next_index += 1;
        let index = m.next_index;
        let offloads = Offload::ALL.iter().map(|o| (*o, true)).collect();
        m.links.insert(
            (key(ns), name.to_string()),
            FakeLink {
                index,
                up,
                mtu,
                addrs: Vec::new(),
                offloads,
                driver: "fake".into(),
                xdp: XdpState::default(),
                refuse_native: None,
            },
        );
        self
    }

    /// Changes a link of the model (driver, native XDP refusal, ...).
    pub(crate) fn edit_link(&self, ns: Ns, name: &str, f: impl FnOnce(&mut FakeLink)) -> &Self {
        self.with_link_mut(ns, name, f).expect("with_link first");
        self
    }

    pub(crate) fn with_addr(&self, ns: Ns, name: &str, a: Addr) -> &Self {
        let mut m = self.model.lock().unwrap();
        m.links
            .get_mut(&(key(ns), name.to_string()))
            .expect("with_link first")
            .addrs
            .push(a);
        self
    }

    pub(crate) fn with_route(&self, ns: Ns, r: Route) -> &Self {
        self.model
            .lock()
            .unwrap()
            .routes
            .entry(key(ns))
            .or_default()
            .push(r);
        self
    }

    pub(crate) fn with_file(&self, ns: Ns, path: &str, value: &str) -> &Self {
        self.model
            .lock()
            .unwrap()
            .files
            .insert((key(ns), path.to_string()), value.to_string());
        self
    }

    pub(crate) fn file(&self, ns: Ns, path: &str) -> Option<String> {
        self.model
            .lock()
            .unwrap()
            .files
            .get(&(key(ns), path.to_string()))
            .cloned()
    }

    pub(crate) fn link_state(&self, ns: Ns, name: &str) -> Option<FakeLink> {
        self.model
            .lock()
            .unwrap()
            .links
            .get(&(key(ns), name.to_string()))
            .cloned()
    }

    pub(crate) fn routes_of(&self, ns: Ns) -> Vec<Route> {
        self.model
            .lock()
            .unwrap()
            .routes
            .get(&key(ns))
            .cloned()
            .unwrap_or_default()
    }

    fn record(&self, c: Call) -> Result<()> {
        // Every predicate sees every call (no short cut): those that count
        // calls count them all.
        let fails = self
            .fail
            .lock()
            .unwrap()
            .iter()
            .fold(false, |any, p| p(&c) | any);
        let text = format!("{c:?}");
        self.calls.lock().unwrap().push(c);
        if fails {
            bail!("injected failure: {text}");
        }
        Ok(())
    }

    fn with_link_mut<T>(
        &self,
        ns: Ns,
        name: &str,
        f: impl FnOnce(&mut FakeLink) -> T,
    ) -> Result<T> {
        let mut m = self.model.lock().unwrap();
        let l = m
            .links
            .get_mut(&(key(ns), name.to_string()))
            .ok_or_else(|| crate::error::Error::InterfaceNotFound(name.to_string()))?;
        Ok(f(l))
    }

    fn ns_exists(&self, ns: Ns) -> Result<()> {
        match ns {
            Ns::Host => Ok(()),
            Ns::Named(n) if self.model.lock().unwrap().namespaces.contains(n) => Ok(()),
            Ns::Named(n) => Err(anyhow!("network namespace {n} not found")),
        }
    }
}

impl Sys for FakeSys {
    fn create_netns(&self, name: &str) -> Result<()> {
        self.record(Call::CreateNetns(name.into()))?;
        if !self.model.lock().unwrap().namespaces.insert(name.into()) {
            bail!("network namespace {name} already exists");
        }
        // A new namespace holds a loopback device, down.
        self.with_link(Ns::Named(name), "lo", false, 65536);
        Ok(())
    }

    fn delete_netns(&self, name: &str) -> Result<()> {
        self.record(Call::DeleteNetns(name.into()))?;
        let mut m = self.model.lock().unwrap();
        if !m.namespaces.remove(name) {
            bail!("network namespace {name} not found");
        }
        m.links.retain(|(n, _), _| n != name);
        m.routes.remove(name);
        Ok(())
    }

    fn netns_list(&self) -> Vec<String> {
        self.model
            .lock()
            .unwrap()
            .namespaces
            .iter()
            .cloned()
            .collect()
    }

    /// A stand-in handle: entering it enters this process's own namespace.
    fn open_netns(&self, name: &str) -> Result<Netns> {
        self.record(Call::OpenNetns(name.into()))?;
        self.ns_exists(Ns::Named(name))?;
        Netns::stand_in(name)
    }

    fn link(&self, ns: Ns, name: &str) -> Result<Option<Link>> {
        self.record(Call::Link(key(ns), name.into()))?;
        self.ns_exists(ns)?;
        let m = self.model.lock().unwrap();
        Ok(m.links.get(&(key(ns), name.to_string())).map(|l| Link {
            index: l.index,
            name: name.to_string(),
            up: l.up,
            mtu: Some(l.mtu),
        }))
    }

    fn add_veth(&self, ns: Ns, name: &str, peer: &str) -> Result<()> {
        self.record(Call::AddVeth(key(ns), name.into(), peer.into()))?;
        self.ns_exists(ns)?;
        self.with_link(ns, name, false, 1500);
        self.with_link(ns, peer, false, 1500);
        Ok(())
    }

    fn add_veth_queues(&self, ns: Ns, name: &str, peer: &str, queues: u32) -> Result<()> {
        self.record(Call::AddVethQueues(
            key(ns),
            name.into(),
            peer.into(),
            queues,
        ))?;
        self.ns_exists(ns)?;
        self.with_link(ns, name, false, 1500);
        self.with_link(ns, peer, false, 1500);
        Ok(())
    }

    fn delete_link(&self, ns: Ns, name: &str) -> Result<()> {
        self.record(Call::DeleteLink(key(ns), name.into()))?;
        self.model
            .lock()
            .unwrap()
            .links
            .remove(&(key(ns), name.to_string()))
            .map(drop)
            .ok_or_else(|| crate::error::Error::InterfaceNotFound(name.into()).into())
    }

    fn set_up(&self, ns: Ns, name: &str, up: bool) -> Result<()> {
        self.record(Call::SetUp(key(ns), name.into(), up))?;
        self.with_link_mut(ns, name, |l| l.up = up)
    }

    fn set_mtu(&self, ns: Ns, name: &str, mtu: u32) -> Result<()> {
        self.record(Call::SetMtu(key(ns), name.into(), mtu))?;
        self.with_link_mut(ns, name, |l| l.mtu = mtu)
    }

    fn move_link(&self, ns: Ns, name: &str, to: Ns) -> Result<()> {
        self.record(Call::MoveLink(key(ns), name.into(), key(to)))?;
        self.ns_exists(to)?;
        let mut m = self.model.lock().unwrap();
        let mut l = m
            .links
            .remove(&(key(ns), name.to_string()))
            .ok_or_else(|| crate::error::Error::InterfaceNotFound(name.into()))?;
        l.addrs.clear();
        l.up = false;
        if let Some(rs) = m.routes.get_mut(&key(ns)) {
            rs.retain(|r| r.dev.as_deref() != Some(name));
        }
        m.links.insert((key(to), name.to_string()), l);
        Ok(())
    }

    fn addrs(&self, ns: Ns, name: &str) -> Result<Vec<Addr>> {
        self.record(Call::Addrs(key(ns), name.into()))?;
        self.with_link_mut(ns, name, |l| l.addrs.clone())
    }

    fn add_addr(&self, ns: Ns, name: &str, addr: Addr) -> Result<()> {
        self.record(Call::AddAddr(key(ns), name.into(), addr))?;
        self.with_link_mut(ns, name, |l| {
            if !l.addrs.contains(&addr) {
                l.addrs.push(addr)
            }
        })
    }

    fn routes(&self, ns: Ns) -> Result<Vec<Route>> {
        self.record(Call::Routes(key(ns)))?;
        Ok(self.routes_of(ns))
    }

    fn add_route(&self, ns: Ns, route: &Route) -> Result<()> {
        self.record(Call::AddRoute(key(ns), route.clone()))?;
        let mut m = self.model.lock().unwrap();
        let rs = m.routes.entry(key(ns)).or_default();
        if !rs.contains(route) {
            rs.push(route.clone());
        }
        Ok(())
    }

    fn sysctl(&self, ns: Ns, k: &str) -> Result<String> {
        self.record(Call::Sysctl(key(ns), k.into()))?;
        self.file(ns, &format!("sysctl:{k}"))
            .ok_or_else(|| anyhow!("read sysctl {k}: no such key"))
    }

    fn set_sysctl(&self, ns: Ns, k: &str, value: &str) -> Result<()> {
        self.record(Call::SetSysctl(key(ns), k.into(), value.into()))?;
        self.with_file(ns, &format!("sysctl:{k}"), value);
        Ok(())
    }

    fn sysfs_read(&self, ns: Ns, path: &str) -> Result<String> {
        self.record(Call::SysfsRead(key(ns), path.into()))?;
        self.file(ns, &format!("sysfs:{path}"))
            .ok_or_else(|| anyhow!("read /sys/{path}: no such file"))
    }

    fn sysfs_write(&self, ns: Ns, path: &str, value: &str) -> Result<()> {
        self.record(Call::SysfsWrite(key(ns), path.into(), value.into()))?;
        if self.file(ns, &format!("sysfs:{path}")).is_none() {
            bail!("write /sys/{path}: no such file");
        }
        self.with_file(ns, &format!("sysfs:{path}"), value);
        Ok(())
    }

    fn sysfs_list(&self, ns: Ns, dir: &str) -> Result<Vec<String>> {
        self.record(Call::SysfsList(key(ns), dir.into()))?;
        let prefix = format!("sysfs:{}/", dir.trim_end_matches('/'));
        let m = self.model.lock().unwrap();
        let mut v: Vec<String> = m
            .files
            .keys()
            .filter(|(n, _)| *n == key(ns))
            .filter_map(|(_, p)| p.strip_prefix(&prefix))
            .map(|rest| rest.split('/').next().unwrap_or(rest).to_string())
            .collect();
        v.dedup();
        Ok(v)
    }

    fn proc_net(&self, ns: Ns, file: &str) -> Result<String> {
        self.record(Call::ProcNet(key(ns), file.into()))?;
        self.file(ns, &format!("procnet:{file}"))
            .ok_or_else(|| anyhow!("read /proc/thread-self/net/{file}: no such file"))
    }

    fn offload(&self, ns: Ns, dev: &str, what: Offload) -> Result<bool> {
        self.record(Call::Offload(key(ns), dev.into(), what))?;
        self.with_link_mut(ns, dev, |l| l.offloads.get(&what).copied().unwrap_or(false))
    }

    fn set_offload(&self, ns: Ns, dev: &str, what: Offload, on: bool) -> Result<()> {
        self.record(Call::SetOffload(key(ns), dev.into(), what, on))?;
        self.with_link_mut(ns, dev, |l| {
            l.offloads.insert(what, on);
        })
    }

    /// Asked for: switched on through [`Sys::set_offload`].
    fn gro_requested(&self, ns: Ns, dev: &str) -> Result<bool> {
        self.with_link_mut(ns, dev, |l| l.offloads.get(&Offload::Gro) == Some(&true))
    }

    fn ring(&self, ns: Ns, dev: &str) -> Result<Ring> {
        self.record(Call::Ring(key(ns), dev.into()))?;
        Err(super::ethtool::Unsupported {
            ifname: dev.into(),
            what: "ring sizes",
        }
        .into())
    }

    fn set_tx_ring(&self, ns: Ns, dev: &str, descriptors: u32) -> Result<()> {
        self.record(Call::SetTxRing(key(ns), dev.into(), descriptors))
    }

    fn driver(&self, ns: Ns, dev: &str) -> Result<String> {
        self.record(Call::Driver(key(ns), dev.into()))?;
        self.with_link_mut(ns, dev, |l| l.driver.clone())
    }

    fn tc(&self, ns: Ns, cmd: &TcCmd) -> Result<String> {
        self.record(Call::Tc(key(ns), cmd.0.join(" ")))?;
        Ok(String::new())
    }

    fn qdiscs(&self, ns: Ns, dev: &str) -> Result<Vec<QdiscInfo>> {
        self.record(Call::Qdiscs(key(ns), dev.into()))?;
        Ok(Vec::new())
    }

    fn xdp_state(&self, ns: Ns, ifindex: u32) -> Result<XdpState> {
        self.record(Call::XdpState(key(ns), ifindex))?;
        let m = self.model.lock().unwrap();
        Ok(m.links
            .iter()
            .find(|((n, _), l)| *n == key(ns) && l.index == ifindex)
            .map(|(_, l)| l.xdp)
            .unwrap_or_default())
    }

    fn missing_qdisc_kinds(&self, kinds: &[&str]) -> Result<Vec<String>> {
        self.record(Call::MissingQdiscKinds(
            kinds.iter().map(|k| k.to_string()).collect(),
        ))?;
        let m = self.model.lock().unwrap();
        let mut v: Vec<String> = kinds
            .iter()
            .filter(|k| m.missing_qdisc_kinds.contains(**k))
            .map(|k| k.to_string())
            .collect();
        v.dedup();
        Ok(v)
    }

    fn xdp_attach(&self, ns: Ns, dev: &str, prog: &XdpProg, flags: XdpFlags) -> Result<XdpLink> {
        self.record(Call::XdpAttach(key(ns), dev.into(), prog.id, flags))?;
        self.ns_exists(ns)?;
        let refuse = |errno: i32, what: &str| -> anyhow::Error {
            XdpAttachError {
                dev: dev.into(),
                errno: Some(errno),
                message: what.into(),
            }
            .into()
        };
        let ifindex = self.with_link_mut(ns, dev, |l| {
            if !l.xdp.is_empty() {
                return Err(refuse(libc::EBUSY, "another XDP program is attached"));
            }
            match (flags, l.refuse_native) {
                (XdpFlags::Skb, _) => l.xdp.skb_prog_id = Some(prog.id),
                (XdpFlags::Any, Some(libc::EOPNOTSUPP)) => l.xdp.skb_prog_id = Some(prog.id),
                (_, Some(errno)) => return Err(refuse(errno, "the driver refuses native XDP")),
                (_, None) => l.xdp.drv_prog_id = Some(prog.id),
            }
            Ok(l.index)
        })??;
        Ok(XdpLink {
            netns: match ns {
                Ns::Host => None,
                Ns::Named(n) => Some(n.to_string()),
            },
            dev: dev.into(),
            ifindex,
            prog_id: prog.id,
            link: None,
        })
    }

    fn sock_ops_attach(
        &self,
        cgroup: &std::path::Path,
        _obj: &BpfObject,
        prog: &'static str,
    ) -> Result<CgroupLink> {
        self.record(Call::SockOpsAttach(
            cgroup.display().to_string(),
            prog.into(),
        ))?;
        Ok(CgroupLink {
            cgroup: cgroup.to_path_buf(),
            link: None,
        })
    }

    fn sock_ops_detach(&self, link: CgroupLink) -> Result<()> {
        self.record(Call::SockOpsDetach(link.cgroup.display().to_string()))
    }

    fn xdp_detach(&self, link: XdpLink) -> Result<()> {
        let ns = link.ns();
        self.record(Call::XdpDetach(key(ns), link.dev.clone(), link.prog_id))?;
        // Gone with its namespace: nothing left to detach.
        let _ = self.with_link_mut(ns, &link.dev, |l| {
            for slot in [&mut l.xdp.skb_prog_id, &mut l.xdp.drv_prog_id] {
                if *slot == Some(link.prog_id) {
                    *slot = None;
                }
            }
        });
        Ok(())
    }

    fn devmap_insert(&self, ns: Ns, _obj: &BpfObject, map: &str, dev: &str) -> Result<u32> {
        self.record(Call::DevmapInsert(key(ns), map.into(), dev.into()))?;
        let ifindex = self.with_link_mut(ns, dev, |l| l.index)?;
        self.model
            .lock()
            .unwrap()
            .devmaps
            .entry(map.into())
            .or_default()
            .insert(ifindex);
        Ok(ifindex)
    }

    fn devmap_remove(&self, _obj: &BpfObject, map: &str, ifindex: u32) -> Result<()> {
        self.record(Call::DevmapRemove(map.into(), ifindex))?;
        if let Some(s) = self.model.lock().unwrap().devmaps.get_mut(map) {
            s.remove(&ifindex);
        }
        Ok(())
    }
}
