//! NIC-pair interfaces: what is recorded before one moves into a test
//! namespace, the safety check that keeps rtprobe from taking the
//! interface this machine depends on, and the give-back.
//!
//! Moving a link to another namespace makes the kernel drop its addresses
//! and routes, so they are read first (IPv4 and IPv6, the routes of the
//! main table through it, the default route included), with its MTU,
//! up/down state, offloads and whether its root qdisc was the kernel's
//! default; the give-back puts all of that back. Kernel interfaces: all
//! through [`crate::sys::Sys`] (netlink, ethtool ioctl, `tc`).

use std::net::IpAddr;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use crate::sys::{Addr, Ns, Offload, Route, Sys, TcCmd, root_qdisc};

/// A NIC-pair interface as it was before the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Borrowed {
    pub(crate) name: String,
    /// The testbed namespace it was moved into.
    pub(crate) netns: String,
    pub(crate) up: bool,
    pub(crate) mtu: Option<u32>,
    pub(crate) addrs: Vec<Addr>,
    /// Main-table routes through it, the default route included.
    pub(crate) routes: Vec<Route>,
    /// The offloads the driver reports, and their state.
    pub(crate) offloads: Vec<(Offload, bool)>,
    /// The root qdisc was the kernel's own (a knob's qdisc left behind by
    /// a killed run is removed on give-back).
    pub(crate) default_root_qdisc: bool,
}

/// Reads everything the give-back restores.
pub(crate) fn snapshot(sys: &dyn Sys, ns: Ns, dev: &str) -> Result<Borrowed> {
    let link = sys
        .link(ns, dev)?
        .ok_or_else(|| crate::error::Error::InterfaceNotFound(dev.to_string()))?;
    let addrs = sys.addrs(ns, dev)?;
    let routes = sys
        .routes(ns)?
        .into_iter()
        .filter(|r| r.dev.as_deref() == Some(dev))
        .collect();
    let mut offloads = Vec::new();
    for o in Offload::ALL {
        match sys.offload(ns, dev, o) {
            Ok(on) => offloads.push((o, on)),
            Err(e)
                if e.downcast_ref::<crate::sys::ethtool::Unsupported>()
                    .is_some() => {}
            Err(e) => return Err(e),
        }
    }
    let default_root_qdisc = matches!(root_qdisc(sys, ns, dev), Ok(None))
        || matches!(root_qdisc(sys, ns, dev), Ok(Some(q)) if q.is_kernel_default());
    Ok(Borrowed {
        name: dev.to_string(),
        netns: String::new(),
        up: link.up,
        mtu: link.mtu,
        addrs,
        routes,
        offloads,
        default_root_qdisc,
    })
}

/// The local address of the SSH session in `SSH_CONNECTION`
/// ("client_ip client_port server_ip server_port").
pub(crate) fn ssh_local_addr(ssh_connection: &str) -> Option<IpAddr> {
    let server = ssh_connection.split_whitespace().nth(2)?;
    // A scoped IPv6 address ("fe80::1%eth0").
    server.split('%').next()?.parse().ok()
}

/// Refuses an interface this machine depends on.
pub(crate) fn check_safe(b: &Borrowed, ssh_connection: Option<&str>) -> Result<()> {
    if let Some(r) = b.routes.iter().find(|r| r.is_default()) {
        bail!(
            "refusing to move {} into a test namespace: it carries this machine's default route ({r}); \
             pick two interfaces nothing else depends on, or pass --force to move it anyway",
            b.name
        );
    }
    if let Some(ip) = ssh_connection.and_then(ssh_local_addr)
        && b.addrs.iter().any(|a| a.addr == ip)
    {
        bail!(
            "refusing to move {} into a test namespace: it holds {ip}, the address of this SSH session \
             (SSH_CONNECTION); pick two interfaces nothing else depends on, or pass --force to move it anyway",
            b.name
        );
    }
    Ok(())
}

/// Is `b` still in its testbed namespace? (False when that namespace is
/// gone or cannot be entered: its mount died with a run's private mount
/// namespace.)
pub(crate) fn still_borrowed(sys: &dyn Sys, b: &Borrowed) -> bool {
    !b.netns.is_empty()
        && sys.netns_list().contains(&b.netns)
        && matches!(sys.link(Ns::Named(&b.netns), &b.name), Ok(Some(_)))
}

/// Moves `b` back to `host` and restores what [`snapshot`] read. Keeps
/// going after an error and returns the first. `lenient`: an interface
/// that is gone (its namespace deleted with a virtual device in it) is
/// not an error.
pub(crate) fn give_back(sys: &dyn Sys, host: Ns, b: &Borrowed, lenient: bool) -> Result<()> {
    let dev = b.name.as_str();
    if still_borrowed(sys, b) {
        let ns = Ns::Named(&b.netns);
        sys.set_up(ns, dev, false)?;
        sys.move_link(ns, dev, host)
            .map_err(|e| e.context(format!("give {dev} back to the host namespace")))?;
    } else if sys.link(host, dev)?.is_none() {
        if lenient {
            log::warn!(
                "{dev} is gone (neither in {} nor in the host namespace)",
                b.netns
            );
            return Ok(());
        }
        bail!(
            "{dev} is neither in {} nor in the host namespace: cannot give it back",
            b.netns
        );
    }
    let mut first_err: Option<anyhow::Error> = None;
    let mut keep = |r: Result<()>| {
        if let Err(e) = r {
            log::error!("giving {dev} back: {e:#}");
            first_err.get_or_insert(e);
        }
    };
    if let Some(mtu) = b.mtu {
        keep(sys.set_mtu(host, dev, mtu));
    }
    for (o, on) in &b.offloads {
        keep(match sys.offload(host, dev, *o) {
            Ok(now) if now == *on => Ok(()),
            Ok(_) => sys.set_offload(host, dev, *o, *on),
            Err(e) => Err(e),
        });
    }
    if b.default_root_qdisc
        && let Ok(Some(q)) = root_qdisc(sys, host, dev)
        && !q.is_kernel_default()
    {
        keep(
            sys.tc(host, &TcCmd::new(["qdisc", "del", "dev", dev, "root"]))
                .map(drop),
        );
    }
    for a in &b.addrs {
        keep(sys.add_addr(host, dev, *a));
    }
    keep(sys.set_up(host, dev, b.up));
    // Routes to the link first, then those through a gateway on it.
    let mut routes = b.routes.clone();
    routes.sort_by_key(|r| r.gateway.is_some());
    for r in &routes {
        keep(sys.add_route(host, r));
    }
    first_err.map_or(Ok(()), Err)
}
