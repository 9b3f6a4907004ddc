//! The path under test: three namespaces (sender -> router -> receiver)
//! joined by two veth pairs, or two existing interfaces (NIC pair) moved
//! into sender/receiver namespaces; and the two-namespace veth pair of
//! `rtprobe testbed --pair` ([`pair`]). Everything is undone on drop.
//!
//! Every kernel change goes through [`crate::sys::Sys`] and is pushed on an
//! undo list ([`Undo`]) as it is made, so a build that fails at step k
//! removes what steps 1..k made, in reverse order, and so does a drop.
//! Each testbed also leaves a record of its owner and of what it borrowed
//! in /run/rtprobe (see [`record`]) for `rtprobe cleanup` after a SIGKILL.
//!
//! Kernel interfaces: network namespaces ([`crate::sys::netns`]), netlink for links,
//! addresses and routes, /proc/sys/net per namespace, ethtool offloads of
//! NIC-pair interfaces (all through `sys`). veth needs CONFIG_VETH
//! (Linux >= 2.6.24).

pub(crate) mod nicpair;
pub(crate) mod pair;
pub(crate) mod record;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod testutil;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use anyhow::{Result, bail};

use crate::sys::{Addr, Netns, Ns, Route, Sys, SysRef, netns};
pub(crate) use nicpair::Borrowed;

/// One interface of the testbed, in the namespace that holds it.
#[derive(Debug, Clone)]
pub(crate) struct Iface {
    pub(crate) name: String,
    pub(crate) ifindex: u32,
    pub(crate) addr: Ipv4Addr,
    /// Its unique-local IPv6 address (/64) on a dual-stack testbed.
    pub(crate) addr6: Option<Ipv6Addr>,
}

impl Iface {
    /// Its address of family `ip`, or why it has none.
    pub(crate) fn ip(&self, ip: IpVersion) -> Result<IpAddr> {
        match ip {
            IpVersion::V4 => Ok(IpAddr::V4(self.addr)),
            IpVersion::V6 => match self.addr6 {
                Some(a) => Ok(IpAddr::V6(a)),
                None => bail!(
                    "{} has no IPv6 address: give it one (e.g. `ip -6 addr add fd00::1/64 dev {}`) or leave out --ip 6",
                    self.name,
                    self.name
                ),
            },
        }
    }
}

/// The address family probes use on a testbed (`--ip 4|6`). The testbed
/// carries both; the choice is the probes'.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum IpVersion {
    #[default]
    V4,
    V6,
}

impl IpVersion {
    pub(crate) fn number(self) -> u8 {
        match self {
            IpVersion::V4 => 4,
            IpVersion::V6 => 6,
        }
    }

    pub(crate) fn from_number(n: i64) -> Option<Self> {
        match n {
            4 => Some(IpVersion::V4),
            6 => Some(IpVersion::V6),
            _ => None,
        }
    }
}

/// `ip = 6` in a scenario file (also `"6"`); written as the number.
impl serde::Serialize for IpVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_u8(self.number())
    }
}

impl<'de> serde::Deserialize<'de> for IpVersion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de;
        struct V;
        impl de::Visitor<'_> for V {
            type Value = IpVersion;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the IP version: 4 or 6")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<IpVersion, E> {
                IpVersion::from_number(v)
                    .ok_or_else(|| E::custom(format!("IP version {v}: use 4 or 6")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<IpVersion, E> {
                self.visit_i64(v.min(i64::MAX as u64) as i64)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<IpVersion, E> {
                match v.trim() {
                    "4" => Ok(IpVersion::V4),
                    "6" => Ok(IpVersion::V6),
                    _ => Err(E::custom(format!("IP version {v:?}: use 4 or 6"))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

impl std::fmt::Display for IpVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IPv{}", self.number())
    }
}

/// The unspecified address (`0.0.0.0` or `::`) of `a`'s family.
pub(crate) fn unspecified(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

/// Which kind of path the testbed is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Kind {
    /// sender -> router -> receiver over two veth pairs.
    Veth,
    /// Two existing interfaces (a cable, or a veth pair made by the user).
    NicPair,
}

/// A built testbed. Dropping it tears everything down.
#[derive(Debug)]
pub(crate) struct Testbed {
    /// Short unique id of this run, part of every name it created.
    pub(crate) id: String,
    pub(crate) kind: Kind,
    pub(crate) sender: Netns,
    pub(crate) receiver: Netns,
    /// None in NIC-pair mode (the cable is the path).
    pub(crate) router: Option<Netns>,
    /// Sender's interface (probes and the TCP load leave here).
    pub(crate) sender_if: Iface,
    pub(crate) receiver_if: Iface,
    /// Router side facing the sender (ingress of probes).
    pub(crate) router_in: Option<Iface>,
    /// Router side facing the receiver (egress of probes: the bottleneck hop).
    pub(crate) router_out: Option<Iface>,
    /// What to undo, newest last; run on teardown or drop.
    undo: Undo,
    sys: SysRef,
}

/// Addresses of the veth testbed. Private to the namespaces, never routed
/// anywhere else.
pub(crate) const SENDER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 71, 1, 2);
pub(crate) const ROUTER_IN_ADDR: Ipv4Addr = Ipv4Addr::new(10, 71, 1, 1);
pub(crate) const ROUTER_OUT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 71, 2, 1);
pub(crate) const RECEIVER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 71, 2, 2);
/// NIC-pair addresses (one /24 across the cable).
pub(crate) const PAIR_TX_ADDR: Ipv4Addr = Ipv4Addr::new(10, 71, 0, 1);
pub(crate) const PAIR_RX_ADDR: Ipv4Addr = Ipv4Addr::new(10, 71, 0, 2);
/// The same links' unique-local IPv6 addresses (RFC 4193, one /64 per
/// link): fd71:1::/64 sender side, fd71:2::/64 receiver side, fd71::/64
/// across a NIC pair.
pub(crate) const SENDER_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd71, 1, 0, 0, 0, 0, 0, 2);
pub(crate) const ROUTER_IN_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd71, 1, 0, 0, 0, 0, 0, 1);
pub(crate) const ROUTER_OUT_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd71, 2, 0, 0, 0, 0, 0, 1);
pub(crate) const RECEIVER_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd71, 2, 0, 0, 0, 0, 0, 2);
pub(crate) const PAIR_TX_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd71, 0, 0, 0, 0, 0, 0, 1);
pub(crate) const PAIR_RX_ADDR6: Ipv6Addr = Ipv6Addr::new(0xfd71, 0, 0, 0, 0, 0, 0, 2);

pub(crate) const SENDER_VETH: &str = "veth-snd";
pub(crate) const ROUTER_IN_VETH: &str = "veth-rin";
pub(crate) const ROUTER_OUT_VETH: &str = "veth-rout";
pub(crate) const RECEIVER_VETH: &str = "veth-rcv";

/// Prefix of every namespace rtprobe creates: `rtprobe-<id>-<role>`.
pub(crate) const NS_PREFIX: &str = "rtprobe-";

pub(crate) fn new_id() -> String {
    use rand::Rng;
    format!("{:06x}", rand::rng().random::<u32>() & 0xff_ffff)
}

/// Checks the privileges a testbed needs, with an error that says what to do.
pub(crate) fn require_root() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(crate::error::Error::NotRoot.into());
    }
    Ok(())
}

/// One step to undo, in the order it was made.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Step {
    /// A namespace we created (the veths in it go with it).
    Netns(String),
    /// A NIC-pair interface moved into one of our namespaces.
    Borrowed(Borrowed),
}

/// The undo list of a testbed. Dropping it undoes everything, newest first.
pub(crate) struct Undo {
    sys: SysRef,
    steps: Vec<Step>,
    /// The record in /run/rtprobe kept in step with `steps`.
    record: Option<record::Record>,
}

impl std::fmt::Debug for Undo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Undo").field("steps", &self.steps).finish()
    }
}

impl Undo {
    pub(crate) fn new(sys: SysRef, record: Option<record::Record>) -> Self {
        Self {
            sys,
            steps: Vec::new(),
            record,
        }
    }

    /// Notes a step in the durable record *before* it is made, so a
    /// SIGKILL in between leaves a record that still covers it (cleanup
    /// tolerates steps that never happened).
    fn record(&mut self, step: &Step) -> Result<()> {
        if let Some(r) = self.record.as_mut() {
            r.steps.push(step.clone());
            r.save()?;
        }
        Ok(())
    }

    /// Creates a namespace; it is undone only once it exists (a name that
    /// was taken is not ours to delete).
    fn create_netns(&mut self, sys: &dyn Sys, name: &str) -> Result<()> {
        let step = Step::Netns(name.to_string());
        self.record(&step)?;
        sys.create_netns(name)?;
        self.steps.push(step);
        Ok(())
    }

    /// Notes a borrowed interface before it is touched: giving it back
    /// copes with one that never left the host.
    fn borrow(&mut self, b: Borrowed) -> Result<()> {
        let step = Step::Borrowed(b);
        self.record(&step)?;
        self.steps.push(step);
        Ok(())
    }

    /// Undoes every step, newest first; keeps going after an error and
    /// returns the first. The record goes only when everything was undone.
    pub(crate) fn run(&mut self) -> Result<()> {
        let mut first_err = None;
        while let Some(step) = self.steps.pop() {
            if let Err(e) = undo_step(self.sys.as_ref(), Ns::Host, &step, false) {
                log::error!("{e:#}");
                first_err.get_or_insert(e);
            }
        }
        if let Some(r) = self.record.take() {
            if first_err.is_none() {
                r.remove();
            } else {
                log::error!(
                    "testbed {} was not fully removed: `rtprobe cleanup` will retry when this run has ended",
                    r.id
                );
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        let _ = self.run();
    }
}

/// Undoes one step. `host` is where borrowed interfaces go back to.
/// `lenient` (cleanup after a crash): a namespace or interface that is
/// already gone is not an error.
pub(crate) fn undo_step(sys: &dyn Sys, host: Ns, step: &Step, lenient: bool) -> Result<()> {
    match step {
        Step::Netns(name) => {
            if lenient && !sys.netns_list().iter().any(|n| n == name) {
                return Ok(());
            }
            sys.delete_netns(name)
        }
        Step::Borrowed(b) => nicpair::give_back(sys, host, b, lenient),
    }
}

/// IPv6 settings of a fresh namespace (its `default` holds for the veths
/// made or moved there later): IPv6 on, addresses usable at once (no DAD),
/// and no router solicitations or advertisements taken, which would cross
/// the router as IPv6 traffic nobody asked for.
const IPV6_SYSCTLS: [(&str, &str); 6] = [
    ("net.ipv6.conf.all.disable_ipv6", "0"),
    ("net.ipv6.conf.default.disable_ipv6", "0"),
    ("net.ipv6.conf.all.accept_dad", "0"),
    ("net.ipv6.conf.default.accept_dad", "0"),
    ("net.ipv6.conf.default.router_solicitations", "0"),
    ("net.ipv6.conf.default.accept_ra", "0"),
];

/// Host-side settings of a fresh namespace: loopback up, IPv6 as
/// [`IPV6_SYSCTLS`]. Returns whether IPv6 is there: best effort, a kernel
/// without IPv6 (no /proc/sys/net/ipv6) gives an IPv4-only testbed.
fn prepare_ns(sys: &dyn Sys, ns: &str) -> Result<bool> {
    let ns = Ns::Named(ns);
    let mut ipv6 = true;
    for (key, value) in IPV6_SYSCTLS {
        // Once one failed the rest would too: no point asking.
        ipv6 = ipv6 && sys.set_sysctl(ns, key, value).is_ok();
    }
    sys.set_up(ns, "lo", true)?;
    Ok(ipv6)
}

fn v4(a: Ipv4Addr) -> Addr {
    Addr {
        addr: IpAddr::V4(a),
        prefix_len: 24,
    }
}

fn v6(a: Ipv6Addr) -> Addr {
    Addr {
        addr: IpAddr::V6(a),
        prefix_len: 64,
    }
}

/// The interfaces of a veth testbed once built (ifindexes included).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct VethLayout {
    pub(crate) sender: String,
    pub(crate) router: String,
    pub(crate) receiver: String,
    pub(crate) sender_if: u32,
    pub(crate) router_in: u32,
    pub(crate) router_out: u32,
    pub(crate) receiver_if: u32,
    /// The IPv6 addresses are on too (the kernel has IPv6).
    pub(crate) ipv6: bool,
}

fn ifindex_of(sys: &dyn Sys, ns: Ns, name: &str) -> Result<u32> {
    sys.link(ns, name)?
        .map(|l| l.index)
        .ok_or_else(|| crate::error::Error::InterfaceNotFound(name.to_string()).into())
}

/// Builds sender -> router -> receiver through `sys`, each step on `undo`.
pub(crate) fn build_veth(sys: &dyn Sys, id: &str, undo: &mut Undo) -> Result<VethLayout> {
    let name = |role: &str| format!("{NS_PREFIX}{id}-{role}");
    let (s, r, d) = (name("sender"), name("router"), name("receiver"));
    let mut ipv6 = true;
    for ns in [&s, &r, &d] {
        undo.create_netns(sys, ns)?;
        ipv6 &= prepare_ns(sys, ns)?;
    }
    let (sn, rn, dn) = (Ns::Named(&s), Ns::Named(&r), Ns::Named(&d));
    sys.add_veth(rn, ROUTER_IN_VETH, SENDER_VETH)?;
    sys.add_veth(rn, ROUTER_OUT_VETH, RECEIVER_VETH)?;
    sys.move_link(rn, SENDER_VETH, sn)?;
    sys.move_link(rn, RECEIVER_VETH, dn)?;
    for (dev, addr, addr6) in [
        (ROUTER_IN_VETH, ROUTER_IN_ADDR, ROUTER_IN_ADDR6),
        (ROUTER_OUT_VETH, ROUTER_OUT_ADDR, ROUTER_OUT_ADDR6),
    ] {
        sys.add_addr(rn, dev, v4(addr))?;
        if ipv6 {
            sys.add_addr(rn, dev, v6(addr6))?;
        }
        sys.set_up(rn, dev, true)?;
    }
    sys.set_sysctl(rn, "net.ipv4.ip_forward", "1")?;
    if ipv6 {
        sys.set_sysctl(rn, "net.ipv6.conf.all.forwarding", "1")?;
    }
    for (ns, dev, addr, gw, addr6, gw6) in [
        (
            sn,
            SENDER_VETH,
            SENDER_ADDR,
            ROUTER_IN_ADDR,
            SENDER_ADDR6,
            ROUTER_IN_ADDR6,
        ),
        (
            dn,
            RECEIVER_VETH,
            RECEIVER_ADDR,
            ROUTER_OUT_ADDR,
            RECEIVER_ADDR6,
            ROUTER_OUT_ADDR6,
        ),
    ] {
        sys.add_addr(ns, dev, v4(addr))?;
        if ipv6 {
            sys.add_addr(ns, dev, v6(addr6))?;
        }
        sys.set_up(ns, dev, true)?;
        sys.add_route(ns, &Route::default_via(IpAddr::V4(gw)))?;
        if ipv6 {
            sys.add_route(ns, &Route::default_via(IpAddr::V6(gw6)))?;
        }
    }
    Ok(VethLayout {
        sender_if: ifindex_of(sys, sn, SENDER_VETH)?,
        router_in: ifindex_of(sys, rn, ROUTER_IN_VETH)?,
        router_out: ifindex_of(sys, rn, ROUTER_OUT_VETH)?,
        receiver_if: ifindex_of(sys, dn, RECEIVER_VETH)?,
        sender: s,
        router: r,
        receiver: d,
        ipv6,
    })
}

/// The NIC-pair layout once built.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PairLayout {
    pub(crate) sender: String,
    pub(crate) receiver: String,
    pub(crate) sender_if: u32,
    pub(crate) receiver_if: u32,
    /// The IPv6 addresses are on too (the kernel has IPv6).
    pub(crate) ipv6: bool,
}

/// Moves `tx_if`/`rx_if` into fresh sender/receiver namespaces through
/// `sys`, recording each interface's state before it moves.
pub(crate) fn build_nic_pair(
    sys: &dyn Sys,
    id: &str,
    tx_if: &str,
    rx_if: &str,
    force: bool,
    undo: &mut Undo,
) -> Result<PairLayout> {
    if tx_if == rx_if {
        bail!("--tx-if and --rx-if must be two different interfaces (both are {tx_if})");
    }
    if tx_if == "lo" || rx_if == "lo" {
        bail!("the loopback interface cannot be part of a NIC pair; pick two Ethernet interfaces");
    }
    let ssh = std::env::var("SSH_CONNECTION").ok();
    let mut before = Vec::new();
    for dev in [tx_if, rx_if] {
        let b = nicpair::snapshot(sys, Ns::Host, dev)?;
        if !force {
            nicpair::check_safe(&b, ssh.as_deref())?;
        }
        before.push(b);
    }
    let name = |role: &str| format!("{NS_PREFIX}{id}-{role}");
    let (s, d) = (name("sender"), name("receiver"));
    let mut ipv6 = true;
    for ns in [&s, &d] {
        undo.create_netns(sys, ns)?;
        ipv6 &= prepare_ns(sys, ns)?;
    }
    for (mut b, (ns, addr, addr6)) in before.into_iter().zip([
        (&s, PAIR_TX_ADDR, PAIR_TX_ADDR6),
        (&d, PAIR_RX_ADDR, PAIR_RX_ADDR6),
    ]) {
        b.netns = ns.clone();
        let dev = b.name.clone();
        undo.borrow(b)?;
        sys.set_up(Ns::Host, &dev, false)?;
        sys.move_link(Ns::Host, &dev, Ns::Named(ns)).map_err(|e| {
            e.context(format!(
                "move {dev} into the testbed (is it a physical NIC that refuses namespaces?)"
            ))
        })?;
        sys.add_addr(Ns::Named(ns), &dev, v4(addr))?;
        if ipv6 {
            sys.add_addr(Ns::Named(ns), &dev, v6(addr6))?;
        }
        sys.set_up(Ns::Named(ns), &dev, true)?;
    }
    Ok(PairLayout {
        sender_if: ifindex_of(sys, Ns::Named(&s), tx_if)?,
        receiver_if: ifindex_of(sys, Ns::Named(&d), rx_if)?,
        sender: s,
        receiver: d,
        ipv6,
    })
}

impl Testbed {
    /// Builds sender -> router -> receiver with two veth pairs through
    /// `sys`, recorded in /run/rtprobe for `rtprobe cleanup`.
    pub(crate) fn veth(sys: SysRef) -> Result<Self> {
        require_root()?;
        record::mention_stale();
        let id = new_id();
        let record = record::Record::new(&id, Kind::Veth)?;
        Self::veth_recorded(sys, id, Some(record))
    }

    /// [`Testbed::veth`] with the id and the durable record (None: none)
    /// chosen by the caller: what the orchestration tests build on the fake.
    pub(crate) fn veth_recorded(
        sys: SysRef,
        id: String,
        record: Option<record::Record>,
    ) -> Result<Self> {
        let mut undo = Undo::new(sys.clone(), record);
        let l = build_veth(sys.as_ref(), &id, &mut undo)?;
        let iface = |name: &str, ifindex, addr, addr6| Iface {
            name: name.to_string(),
            ifindex,
            addr,
            addr6: l.ipv6.then_some(addr6),
        };
        Ok(Self {
            id,
            kind: Kind::Veth,
            sender_if: iface(SENDER_VETH, l.sender_if, SENDER_ADDR, SENDER_ADDR6),
            receiver_if: iface(RECEIVER_VETH, l.receiver_if, RECEIVER_ADDR, RECEIVER_ADDR6),
            router_in: Some(iface(
                ROUTER_IN_VETH,
                l.router_in,
                ROUTER_IN_ADDR,
                ROUTER_IN_ADDR6,
            )),
            router_out: Some(iface(
                ROUTER_OUT_VETH,
                l.router_out,
                ROUTER_OUT_ADDR,
                ROUTER_OUT_ADDR6,
            )),
            sender: sys.open_netns(&l.sender)?,
            receiver: sys.open_netns(&l.receiver)?,
            router: Some(sys.open_netns(&l.router)?),
            undo,
            sys,
        })
    }

    /// Moves two existing interfaces into fresh sender/receiver namespaces
    /// (as the study did with two NICs and a cable). They are given back,
    /// with their addresses (IPv4 and IPv6), routes, MTU, up/down state and
    /// offloads, when the testbed is dropped. An interface that carries a
    /// default route or the current SSH session is refused unless `force`.
    pub(crate) fn nic_pair(sys: SysRef, tx_if: &str, rx_if: &str, force: bool) -> Result<Self> {
        require_root()?;
        record::mention_stale();
        let id = new_id();
        let mut undo = Undo::new(sys.clone(), Some(record::Record::new(&id, Kind::NicPair)?));
        let l = build_nic_pair(sys.as_ref(), &id, tx_if, rx_if, force, &mut undo)?;
        Ok(Self {
            id,
            kind: Kind::NicPair,
            sender_if: Iface {
                name: tx_if.into(),
                ifindex: l.sender_if,
                addr: PAIR_TX_ADDR,
                addr6: l.ipv6.then_some(PAIR_TX_ADDR6),
            },
            receiver_if: Iface {
                name: rx_if.into(),
                ifindex: l.receiver_if,
                addr: PAIR_RX_ADDR,
                addr6: l.ipv6.then_some(PAIR_RX_ADDR6),
            },
            router_in: None,
            router_out: None,
            sender: sys.open_netns(&l.sender)?,
            receiver: sys.open_netns(&l.receiver)?,
            router: None,
            undo,
            sys,
        })
    }

    /// A testbed assembled from parts a test built itself (nothing to undo:
    /// its namespaces delete themselves).
    #[cfg(test)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
        sys: SysRef,
        id: String,
        sender: Netns,
        receiver: Netns,
        router: Option<Netns>,
        sender_if: Iface,
        receiver_if: Iface,
        router_in: Option<Iface>,
        router_out: Option<Iface>,
    ) -> Self {
        let kind = if router.is_some() {
            Kind::Veth
        } else {
            Kind::NicPair
        };
        Self {
            id,
            kind,
            sender,
            receiver,
            router,
            sender_if,
            receiver_if,
            router_in,
            router_out,
            undo: Undo::new(sys.clone(), None),
            sys,
        }
    }

    /// The kernel layer this testbed was built with.
    pub(crate) fn sys(&self) -> &dyn Sys {
        self.sys.as_ref()
    }

    /// The same, shared (for what outlives a borrow of the testbed).
    pub(crate) fn sys_ref(&self) -> SysRef {
        self.sys.clone()
    }

    /// Namespace names, for messages.
    pub(crate) fn namespaces(&self) -> Vec<&str> {
        let mut v = vec![self.sender.name()];
        if let Some(r) = &self.router {
            v.push(r.name());
        }
        v.push(self.receiver.name());
        v
    }

    /// Tears everything down now, reporting the first error (drop does the same silently).
    pub(crate) fn teardown(mut self) -> Result<()> {
        self.undo.run()
    }
}

/// rtprobe namespaces present on the machine (leftovers of killed runs, or runs in progress).
pub fn leftover_namespaces() -> Vec<String> {
    netns::list()
        .into_iter()
        .filter(|n| n.starts_with(NS_PREFIX))
        .collect()
}
