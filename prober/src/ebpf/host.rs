//! `rtprobe reflect --kernel`: the in-kernel (XDP) reflector of
//! [`super::reflector`] loaded and attached to the interface of the one
//! `--listen` address, or why not.
//!
//! On a veth it also looks at the peer, when the peer is in this
//! namespace: the kernel's replies reach it only with GRO requested on it
//! (or an XDP program there), and its probes need full UDP checksums (TX
//! checksum offload off). What is missing is said (not under `-q`); a peer
//! in another namespace cannot be seen from here, and `-v` says so.
//!
//! Kernel interfaces: getifaddrs (the interface of the address), sysfs
//! (its driver, `ifindex` and `iflink`: a veth's peer), SIOCETHTOOL
//! (ETHTOOL_GFEATURES: GRO requested, ETHTOOL_GTXCSUM), rtnetlink (an XDP
//! program on the peer) and the XDP attach of [`super::reflector::put_on`].

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result};

use super::reflector::{self, Reflector};
use crate::{
    probe::reflect::{Peers, RateLimits},
    probe::wire::ProtocolArg,
    sys::{Ns, Offload, Sys, netdev_attr},
};

/// The interface holding `addr` in this namespace (for `--kernel`).
fn interface_of(addr: IpAddr) -> Result<String> {
    let addrs = nix::ifaddrs::getifaddrs().context("getifaddrs")?;
    for a in addrs {
        let Some(s) = a.address.as_ref() else {
            continue;
        };
        let ip = match (s.as_sockaddr_in(), s.as_sockaddr_in6()) {
            (Some(v4), _) => IpAddr::V4(v4.ip()),
            (_, Some(v6)) => IpAddr::V6(v6.ip()),
            _ => continue,
        };
        if ip == addr {
            return Ok(a.interface_name);
        }
    }
    anyhow::bail!("no interface in this namespace has the address {addr}")
}

/// `--kernel`: the in-kernel reflector on the interface of the one
/// `--listen` address, within `limits`, with `peers` as the known peers,
/// or why not. `quiet`: no advice on stderr.
pub(crate) fn attach_kernel(
    sys: crate::sys::SysRef,
    listen: &[SocketAddr],
    protocol: ProtocolArg,
    key: bool,
    limits: RateLimits,
    peers: &Peers,
    quiet: bool,
) -> Result<Reflector> {
    let [a] = listen else {
        anyhow::bail!(
            "give exactly one --listen address: the kernel reflector goes on its interface"
        );
    };
    if a.ip().is_unspecified() {
        anyhow::bail!(
            "--listen {a} names no interface: give the address of the interface to attach to"
        );
    }
    if key {
        anyhow::bail!(
            "the in-kernel reflector answers unauthenticated STAMP only: drop --auth-key or --kernel"
        );
    }
    let ifname = interface_of(a.ip())?;
    let (probe_port, stamp_port) = match protocol {
        ProtocolArg::Rtprobe => (a.port(), 0),
        ProtocolArg::Stamp => (0, a.port()),
    };
    // On a veth, XDP_TX frames reach the peer only when the peer's NAPI
    // runs (an XDP program there, or GRO requested): replies are
    // redirected to the interface itself, as in rtprobe's own testbed.
    let veth = sys.driver(Ns::Host, &ifname).is_ok_and(|d| d == "veth");
    let index = sys
        .link(Ns::Host, &ifname)?
        .with_context(|| format!("{ifname} is gone"))?
        .index;
    let reply_ifindex = if veth { index } else { 0 };
    let r = Reflector::load(
        sys.clone(),
        probe_port,
        stamp_port,
        reply_ifindex,
        limits,
        peers,
    )?;
    let (r, mode) =
        reflector::put_on(r, Ns::Host, &ifname).with_context(|| format!("attach to {ifname}"))?;
    // Said under -q too, as the "answering" line: what runs, not advice.
    eprintln!(
        "rtprobe reflect: in-kernel reflector on {ifname} ({mode} mode): answers only unicast \
         probes to {ifname}'s MAC and addresses from unicast sources; {}; probes over a limit \
         are dropped",
        limits.describe(!peers.is_empty())
    );
    if veth {
        advise_on_veth_peer(sys.as_ref(), &ifname, index, quiet);
    }
    Ok(r)
}

/// What the veth `ifname`'s peer lacks for the kernel's replies, said when
/// it can be seen from this namespace and is really missing (never with
/// `quiet`); a peer elsewhere only gets a `-v` line.
fn advise_on_veth_peer(sys: &dyn Sys, ifname: &str, index: u32, quiet: bool) {
    match veth_peer(sys, Ns::Host, ifname, index) {
        Ok(Some(peer)) => {
            let missing = peer_missing(sys, Ns::Host, &peer);
            if !missing.is_empty() && !quiet {
                eprintln!(
                    "rtprobe reflect: {ifname} is a veth whose peer {peer} {}: the kernel's \
                     replies will not reach it; run `{}`",
                    missing
                        .iter()
                        .map(|(why, _)| *why)
                        .collect::<Vec<_>>()
                        .join(" and "),
                    missing
                        .iter()
                        .map(|(_, fix)| fix.as_str())
                        .collect::<Vec<_>>()
                        .join("; ")
                );
            }
        }
        Ok(None) => log::info!(
            "{ifname} is a veth whose peer is in another namespace, which cannot be checked \
             from here: it receives the kernel's replies only with GRO requested (ethtool -K \
             PEER gro off; ethtool -K PEER gro on) and must send full UDP checksums \
             (ethtool -K PEER tx off)"
        ),
        Err(e) => log::debug!("the peer of {ifname}: {e:#}"),
    }
}

/// The name of the veth `ifname`'s (ifindex `index`) peer if it is in this
/// namespace (sysfs: the device whose `ifindex` is our `iflink` and whose
/// `iflink` is our index); None if it is elsewhere.
fn veth_peer(sys: &dyn Sys, ns: Ns, ifname: &str, index: u32) -> Result<Option<String>> {
    let read = |dev: &str, attr: &str| -> Result<u32> {
        let t = sys.sysfs_read(ns, &netdev_attr(dev, attr))?;
        t.trim()
            .parse()
            .with_context(|| format!("{dev}'s {attr} is {t:?}"))
    };
    let peer_index = read(ifname, "iflink")?;
    for dev in sys.sysfs_list(ns, "class/net")? {
        if dev != ifname
            && read(&dev, "ifindex").is_ok_and(|i| i == peer_index)
            && read(&dev, "iflink").is_ok_and(|i| i == index)
        {
            return Ok(Some(dev));
        }
    }
    Ok(None)
}

/// What the veth `peer` lacks for the in-kernel reflector (what, and the
/// command that sets it), read from the device itself.
fn peer_missing(sys: &dyn Sys, ns: Ns, peer: &str) -> Vec<(&'static str, String)> {
    let mut missing = Vec::new();
    let has_xdp = sys
        .link(ns, peer)
        .ok()
        .flatten()
        .and_then(|l| sys.xdp_state(ns, l.index).ok())
        .is_some_and(|x| !x.is_empty());
    // GRO on but never asked for does not start the veth's NAPI: only a
    // requested GRO (or an XDP program) does.
    if !has_xdp && !sys.gro_requested(ns, peer).unwrap_or(true) {
        missing.push((
            "has no GRO requested",
            format!("ethtool -K {peer} gro off; ethtool -K {peer} gro on"),
        ));
    }
    if sys.offload(ns, peer, Offload::TxCsum).unwrap_or(false) {
        missing.push((
            "leaves UDP checksums to an offload",
            format!("ethtool -K {peer} tx off"),
        ));
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testbed::testutil::{ip, netns, require_root};

    /// A veth whose peer is in the same namespace: found through sysfs, and
    /// what it lacks read from the device (GRO asked for, TX checksum
    /// offload off), so that nothing is said once `ethtool` has set it up.
    /// A peer in another namespace is not found (None).
    #[test]
    #[ignore = "needs root: run by cargo xtask test"]
    fn a_veth_peer_is_checked_where_it_can_be_seen() {
        require_root();
        let sys = crate::sys::linux();
        let ns = netns("vpeer");
        ip(&ns, "link add rfa type veth peer name rfb");
        let name = ns.name().to_string();
        let at = Ns::Named(&name);
        let index = sys.link(at, "rfa").unwrap().unwrap().index;
        assert_eq!(
            veth_peer(sys.as_ref(), at, "rfa", index)
                .unwrap()
                .as_deref(),
            Some("rfb")
        );
        let missing = peer_missing(sys.as_ref(), at, "rfb");
        let fixes: Vec<&str> = missing.iter().map(|(_, f)| f.as_str()).collect();
        assert_eq!(
            fixes,
            [
                "ethtool -K rfb gro off; ethtool -K rfb gro on",
                "ethtool -K rfb tx off"
            ]
        );
        sys.set_offload(at, "rfb", Offload::Gro, true).unwrap();
        sys.set_offload(at, "rfb", Offload::TxCsum, false).unwrap();
        assert!(peer_missing(sys.as_ref(), at, "rfb").is_empty());
        // The peer moved to another namespace: not visible from here.
        let other = netns("vpeer2");
        ip(&ns, &format!("link set rfb netns {}", other.name()));
        assert_eq!(veth_peer(sys.as_ref(), at, "rfa", index).unwrap(), None);
        crate::sys::release_worker(&name);
    }
}
