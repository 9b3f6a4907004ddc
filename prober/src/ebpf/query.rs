//! Which XDP program is attached to an interface, and in which mode, as the
//! kernel reports it: RTM_GETLINK's nested IFLA_XDP attributes
//! (IFLA_XDP_ATTACHED and the per-mode IFLA_XDP_{SKB,DRV,HW}_PROG_ID,
//! Linux >= 4.13/4.19), read by [`crate::sys::netlink`].
//!
//! [`xdp_state`] asks in the calling thread's network namespace (for code
//! already running inside `Netns::run`); [`xdp_state_in`] goes through the
//! kernel layer's worker of a namespace.

use anyhow::Result;

pub use crate::sys::XdpState;
use crate::sys::{Ns, Sys, netlink::NlSocket};

/// Asks the kernel which XDP programs are attached to `ifindex` (in the
/// calling thread's namespace).
pub fn xdp_state(ifindex: u32) -> Result<XdpState> {
    NlSocket::new()?.xdp_state(ifindex)
}

/// The same, in namespace `ns` through `sys`.
pub fn xdp_state_in(sys: &dyn Sys, ns: Ns, ifindex: u32) -> Result<XdpState> {
    sys.xdp_state(ns, ifindex)
}
