//! The path under test: three namespaces (sender -> router -> receiver)
//! joined by two veth pairs, or two existing interfaces (NIC pair) moved
//! into sender/receiver namespaces. Everything is undone on drop.
//!
//! Kernel interfaces: network namespaces (`netns`), rtnetlink for links,
//! addresses and routes (`netlink`), /proc/sys/net per namespace. veth needs
//! CONFIG_VETH (Linux >= 2.6.24).

pub mod ethtool;
pub mod netlink;
pub mod netns;
#[cfg(test)]
pub(crate) mod testutil;

pub use netns::Netns;

use std::{fs::File, net::Ipv4Addr, os::fd::AsRawFd};

use anyhow::{Context, Result, bail};

use netlink::{
    add_addr, add_default_route, add_veth, move_to_netns, require_link, set_up, with_netlink,
    write_sysctl,
};

/// One interface of the testbed, in the namespace that holds it.
#[derive(Debug, Clone)]
pub struct Iface {
    pub name: String,
    pub ifindex: u32,
    pub addr: Ipv4Addr,
    pub prefix_len: u8,
}

/// Which kind of path the testbed is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// sender -> router -> receiver over two veth pairs.
    Veth,
    /// Two existing interfaces (a cable, or a veth pair made by the user).
    NicPair,
}

/// A NIC-pair interface as it was before the run, to give it back.
#[derive(Debug)]
struct Borrowed {
    name: String,
    up: bool,
    mtu: Option<u32>,
    addrs: Vec<(Ipv4Addr, u8)>,
}

/// A built testbed. Dropping it tears everything down.
#[derive(Debug)]
pub struct Testbed {
    /// Short unique id of this run, part of every name it created.
    pub id: String,
    pub kind: Kind,
    pub sender: Netns,
    pub receiver: Netns,
    /// None in NIC-pair mode (the cable is the path).
    pub router: Option<Netns>,
    /// Sender's interface (probes and the TCP load leave here).
    pub sender_if: Iface,
    pub receiver_if: Iface,
    /// Router side facing the sender (ingress of probes).
    pub router_in: Option<Iface>,
    /// Router side facing the receiver (egress of probes: the bottleneck hop).
    pub router_out: Option<Iface>,
    borrowed: Vec<(Borrowed, bool)>,
    host_ns: Option<File>,
}

/// Addresses of the veth testbed. Private to the namespaces, never routed
/// anywhere else.
pub const SENDER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 71, 1, 2);
pub const ROUTER_IN_ADDR: Ipv4Addr = Ipv4Addr::new(10, 71, 1, 1);
pub const ROUTER_OUT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 71, 2, 1);
pub const RECEIVER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 71, 2, 2);
/// NIC-pair addresses (one /24 across the cable).
pub const PAIR_TX_ADDR: Ipv4Addr = Ipv4Addr::new(10, 71, 0, 1);
pub const PAIR_RX_ADDR: Ipv4Addr = Ipv4Addr::new(10, 71, 0, 2);

pub const SENDER_VETH: &str = "veth-snd";
pub const ROUTER_IN_VETH: &str = "veth-rin";
pub const ROUTER_OUT_VETH: &str = "veth-rout";
pub const RECEIVER_VETH: &str = "veth-rcv";

/// Prefix of every namespace rtprobe creates: `rtprobe-<id>-<role>`.
pub const NS_PREFIX: &str = "rtprobe-";

fn new_id() -> String {
    use rand::Rng;
    format!("{:06x}", rand::rng().random::<u32>() & 0xff_ffff)
}

/// Checks the privileges a testbed needs, with an error that says what to do.
pub fn require_root() -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Err(crate::error::Error::NotRoot.into());
    }
    Ok(())
}

/// Host-side settings of a fresh namespace: loopback up, no IPv6 chatter
/// (router solicitations would show up as non-IPv4 XDP traffic).
fn prepare_ns(ns: &Netns) -> Result<()> {
    ns.run(|| {
        let _ = write_sysctl("net.ipv6.conf.all.disable_ipv6", "1");
        let _ = write_sysctl("net.ipv6.conf.default.disable_ipv6", "1");
        Ok(())
    })?;
    with_netlink(Some(ns), |h| async move {
        let lo = require_link(&h, "lo").await?;
        set_up(&h, lo.index, true).await
    })
}

impl Testbed {
    /// Builds sender -> router -> receiver with two veth pairs.
    pub fn veth() -> Result<Self> {
        require_root()?;
        let id = new_id();
        let mk = |role: &str| Netns::create(&format!("{NS_PREFIX}{id}-{role}"));
        let sender = mk("sender")?;
        let router = mk("router")?;
        let receiver = mk("receiver")?;
        for ns in [&sender, &router, &receiver] {
            prepare_ns(ns)?;
        }
        let (sfd, rfd) = (sender.file().as_raw_fd(), receiver.file().as_raw_fd());
        let (rin, rout) = with_netlink(Some(&router), |h| async move {
            add_veth(&h, ROUTER_IN_VETH, SENDER_VETH).await?;
            add_veth(&h, ROUTER_OUT_VETH, RECEIVER_VETH).await?;
            move_to_netns(&h, require_link(&h, SENDER_VETH).await?.index, sfd).await?;
            move_to_netns(&h, require_link(&h, RECEIVER_VETH).await?.index, rfd).await?;
            let rin = require_link(&h, ROUTER_IN_VETH).await?;
            let rout = require_link(&h, ROUTER_OUT_VETH).await?;
            add_addr(&h, rin.index, ROUTER_IN_ADDR, 24).await?;
            add_addr(&h, rout.index, ROUTER_OUT_ADDR, 24).await?;
            set_up(&h, rin.index, true).await?;
            set_up(&h, rout.index, true).await?;
            Ok((rin.index, rout.index))
        })?;
        router.run(|| write_sysctl("net.ipv4.ip_forward", "1"))?;
        let end = |ns: &Netns, name: &'static str, addr: Ipv4Addr, gw: Ipv4Addr| -> Result<u32> {
            with_netlink(Some(ns), |h| async move {
                let l = require_link(&h, name).await?;
                add_addr(&h, l.index, addr, 24).await?;
                set_up(&h, l.index, true).await?;
                add_default_route(&h, gw).await?;
                Ok(l.index)
            })
        };
        let s_idx = end(&sender, SENDER_VETH, SENDER_ADDR, ROUTER_IN_ADDR)?;
        let r_idx = end(&receiver, RECEIVER_VETH, RECEIVER_ADDR, ROUTER_OUT_ADDR)?;
        let iface = |name: &str, ifindex, addr| Iface {
            name: name.to_string(),
            ifindex,
            addr,
            prefix_len: 24,
        };
        Ok(Self {
            id,
            kind: Kind::Veth,
            sender_if: iface(SENDER_VETH, s_idx, SENDER_ADDR),
            receiver_if: iface(RECEIVER_VETH, r_idx, RECEIVER_ADDR),
            router_in: Some(iface(ROUTER_IN_VETH, rin, ROUTER_IN_ADDR)),
            router_out: Some(iface(ROUTER_OUT_VETH, rout, ROUTER_OUT_ADDR)),
            sender,
            receiver,
            router: Some(router),
            borrowed: Vec::new(),
            host_ns: None,
        })
    }

    /// Moves two existing interfaces into fresh sender/receiver namespaces
    /// (as the study did with two NICs and a cable). They are given back,
    /// with their addresses and up/down state, when the testbed is dropped.
    pub fn nic_pair(tx_if: &str, rx_if: &str) -> Result<Self> {
        require_root()?;
        if tx_if == rx_if {
            bail!("--tx-if and --rx-if must be two different interfaces (both are {tx_if})");
        }
        let host_ns = File::open("/proc/thread-self/ns/net")
            .context("open this process's network namespace")?;
        let (tx_info, rx_info) = with_netlink(None, |h| async move {
            let t = netlink::link_by_name(&h, tx_if).await?;
            let r = netlink::link_by_name(&h, rx_if).await?;
            Ok((t, r))
        })?;
        let tx_info =
            tx_info.ok_or_else(|| crate::error::Error::InterfaceNotFound(tx_if.to_string()))?;
        let rx_info =
            rx_info.ok_or_else(|| crate::error::Error::InterfaceNotFound(rx_if.to_string()))?;
        if tx_if == "lo" || rx_if == "lo" {
            bail!(
                "the loopback interface cannot be part of a NIC pair; pick two Ethernet interfaces"
            );
        }
        let id = new_id();
        let sender = Netns::create(&format!("{NS_PREFIX}{id}-sender"))?;
        let receiver = Netns::create(&format!("{NS_PREFIX}{id}-receiver"))?;
        prepare_ns(&sender)?;
        prepare_ns(&receiver)?;
        let mut tb = Self {
            id,
            kind: Kind::NicPair,
            sender_if: Iface {
                name: tx_if.into(),
                ifindex: 0,
                addr: PAIR_TX_ADDR,
                prefix_len: 24,
            },
            receiver_if: Iface {
                name: rx_if.into(),
                ifindex: 0,
                addr: PAIR_RX_ADDR,
                prefix_len: 24,
            },
            router_in: None,
            router_out: None,
            sender,
            receiver,
            router: None,
            borrowed: Vec::new(),
            host_ns: Some(host_ns),
        };
        for (info, to_sender) in [(&tx_info, true), (&rx_info, false)] {
            let ns_fd = if to_sender {
                tb.sender.file().as_raw_fd()
            } else {
                tb.receiver.file().as_raw_fd()
            };
            let index = info.index;
            with_netlink(
                None,
                |h| async move { move_to_netns(&h, index, ns_fd).await },
            )
            .with_context(|| {
                format!(
                    "move {} into the testbed (is it a physical NIC that refuses namespaces?)",
                    info.name
                )
            })?;
            tb.borrowed.push((
                Borrowed {
                    name: info.name.clone(),
                    up: info.up,
                    mtu: info.mtu,
                    addrs: info.addrs.clone(),
                },
                to_sender,
            ));
        }
        for to_sender in [true, false] {
            let (ns, iface) = if to_sender {
                (&tb.sender, &tb.sender_if)
            } else {
                (&tb.receiver, &tb.receiver_if)
            };
            let (name, addr) = (iface.name.clone(), iface.addr);
            let idx = with_netlink(Some(ns), |h| async move {
                let l = require_link(&h, &name).await?;
                add_addr(&h, l.index, addr, 24).await?;
                set_up(&h, l.index, true).await?;
                Ok(l.index)
            })?;
            if to_sender {
                tb.sender_if.ifindex = idx;
            } else {
                tb.receiver_if.ifindex = idx;
            }
        }
        Ok(tb)
    }

    /// A testbed assembled from parts a test built itself (no NIC pair to give back).
    #[cfg(test)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_parts(
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
            borrowed: Vec::new(),
            host_ns: None,
        }
    }

    /// Namespace names, for messages.
    pub fn namespaces(&self) -> Vec<&str> {
        let mut v = vec![self.sender.name()];
        if let Some(r) = &self.router {
            v.push(r.name());
        }
        v.push(self.receiver.name());
        v
    }

    /// Gives NIC-pair interfaces back to the host namespace with their
    /// previous addresses and state.
    fn give_back(&mut self) -> Result<()> {
        let Some(host) = self.host_ns.as_ref() else {
            return Ok(());
        };
        let host_fd = host.as_raw_fd();
        let mut first_err = None;
        for (b, in_sender) in std::mem::take(&mut self.borrowed) {
            let ns = if in_sender {
                &self.sender
            } else {
                &self.receiver
            };
            let name = b.name.clone();
            let moved = with_netlink(Some(ns), |h| async move {
                let l = require_link(&h, &name).await?;
                set_up(&h, l.index, false).await?;
                move_to_netns(&h, l.index, host_fd).await
            });
            let restored = moved.and_then(|()| {
                let b = &b;
                with_netlink(None, |h| async move {
                    let l = require_link(&h, &b.name).await?;
                    if let Some(mtu) = b.mtu {
                        let _ = h
                            .link()
                            .set(
                                rtnetlink::LinkUnspec::new_with_index(l.index)
                                    .mtu(mtu)
                                    .build(),
                            )
                            .execute()
                            .await;
                    }
                    for (a, p) in &b.addrs {
                        add_addr(&h, l.index, *a, *p).await?;
                    }
                    set_up(&h, l.index, b.up).await
                })
            });
            if let Err(e) = restored {
                log::error!(
                    "could not give {} back to the host namespace: {e:#}",
                    b.name
                );
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Tears everything down now, reporting the first error (drop does the same silently).
    pub fn teardown(mut self) -> Result<()> {
        self.give_back()
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = self.give_back();
        // The namespaces (and the veths inside them) go when the fields drop.
    }
}

/// rtprobe namespaces present on the machine (leftovers of killed runs, or runs in progress).
pub fn leftover_namespaces() -> Vec<String> {
    netns::list()
        .into_iter()
        .filter(|n| n.starts_with(NS_PREFIX))
        .collect()
}
