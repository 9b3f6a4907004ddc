//! Reading qdiscs back over netlink, for the knobs and the queue sampler
//! (which must not fork `tc` every few milliseconds next to a latency
//! measurement). The socket and the dump live in [`crate::sys::netlink`];
//! this module keeps the sampler's names.
//!
//! Kernel interface: NETLINK_ROUTE RTM_GETQDISC dump (Linux >= 2.6). A
//! netlink socket talks to the network namespace it was created in: the
//! sampler creates its own on the thread it runs in the namespace.

use anyhow::Result;

pub use crate::sys::QdiscInfo;
use crate::sys::netlink::NlSocket;

/// A netlink route socket bound in the namespace it was created in.
pub struct RouteSocket(NlSocket);

impl RouteSocket {
    pub fn new() -> Result<Self> {
        Ok(Self(NlSocket::new()?))
    }

    /// All qdiscs of interface `ifindex` in this socket's namespace.
    pub fn qdiscs(&mut self, ifindex: u32) -> Result<Vec<QdiscInfo>> {
        self.0.qdiscs(ifindex)
    }
}

/// The root qdisc of `ifindex` in the calling thread's namespace (None if
/// the device has none, e.g. down).
pub fn root_qdisc(ifindex: u32) -> Result<Option<QdiscInfo>> {
    Ok(RouteSocket::new()?
        .qdiscs(ifindex)?
        .into_iter()
        .find(|q| q.is_root()))
}

/// ifindex of `ifname` in the calling thread's namespace.
pub fn ifindex(ifname: &str) -> Result<u32> {
    nix::net::if_::if_nametoindex(ifname)
        .map_err(|_| crate::error::Error::InterfaceNotFound(ifname.to_string()).into())
}
