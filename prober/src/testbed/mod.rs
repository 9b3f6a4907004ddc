//! The path under test: three namespaces (sender -> router -> receiver)
//! joined by two veth pairs, or two existing interfaces (NIC pair) moved
//! into sender/receiver namespaces. Everything is undone on drop.

pub mod ethtool;
pub mod netns;
#[cfg(test)]
pub(crate) mod testutil;

pub use netns::Netns;

use std::net::Ipv4Addr;

/// One interface of the testbed, in the namespace that holds it.
#[derive(Debug, Clone)]
pub struct Iface {
    pub name: String,
    pub ifindex: u32,
    pub addr: Ipv4Addr,
    pub prefix_len: u8,
}

/// A built testbed. Dropping it tears everything down.
#[derive(Debug)]
pub struct Testbed {
    /// Short unique id of this run, part of every name it created.
    pub id: String,
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
}
