//! `rtprobe reflect --kernel`: the in-kernel (XDP) reflector of
//! `ebpf::reflector` loaded and attached to the interface of the one
//! `--listen` address, or why not.
//!
//! Kernel interfaces: getifaddrs (the interface of the address), sysfs
//! (its driver) and the XDP attach of `ebpf/`.

use std::net::{IpAddr, SocketAddr};

use anyhow::{Context, Result};

use crate::spec::remote::ProtocolArg;

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
/// `--listen` address, or why not.
pub(crate) fn attach_kernel(
    sys: crate::sys::SysRef,
    listen: &[SocketAddr],
    protocol: ProtocolArg,
    key: bool,
    limits: crate::ebpf::reflector::RateLimits,
) -> Result<crate::ebpf::reflector::Reflector> {
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
        anyhow::bail!("the in-kernel reflector answers unauthenticated STAMP only");
    }
    let ifname = interface_of(a.ip())?;
    let (probe_port, stamp_port) = match protocol {
        ProtocolArg::Rtprobe => (a.port(), 0),
        ProtocolArg::Stamp => (0, a.port()),
    };
    // On a veth, XDP_TX frames reach the peer only when the peer's NAPI
    // runs (an XDP program there, or GRO requested): replies are
    // redirected to the interface itself, as in rtprobe's own testbed.
    use crate::sys::Ns;
    let veth = sys.driver(Ns::Host, &ifname).is_ok_and(|d| d == "veth");
    let reply_ifindex = if veth {
        sys.link(Ns::Host, &ifname)?
            .with_context(|| format!("{ifname} is gone"))?
            .index
    } else {
        0
    };
    let mut r = crate::ebpf::reflector::Reflector::load(
        sys,
        probe_port,
        stamp_port,
        reply_ifindex,
        limits,
    )?;
    let mode = r
        .attach(Ns::Host, &ifname, crate::ebpf::XdpMode::Auto)
        .with_context(|| format!("attach to {ifname}"))?;
    eprintln!(
        "rtprobe reflect: in-kernel reflector on {ifname} ({mode} mode): answers only unicast \
         probes to {ifname}'s MAC and addresses from unicast sources; {}",
        kernel_limits_text(limits)
    );
    if veth {
        eprintln!(
            "rtprobe reflect: {ifname} is a veth: its peer receives the kernel's replies only with GRO \
             requested and sends probes with full UDP checksums, which rtprobe cannot set from here: \
             on the peer run `ethtool -K PEER gro off; ethtool -K PEER gro on; ethtool -K PEER tx off`"
        );
    }
    Ok(r)
}

/// What the in-kernel reflector's limits are, for its banner.
fn kernel_limits_text(l: crate::ebpf::reflector::RateLimits) -> String {
    use crate::ebpf::reflector::RateLimits;
    let one = |what: &str, pps: Option<u32>| match pps {
        Some(r) => format!("at most {r}/s {what} (bursts of {})", RateLimits::burst(r)),
        None => format!("no limit {what}"),
    };
    format!(
        "{}, {}; probes over a limit are dropped",
        one("per IPv4 address or IPv6 /64", l.per_source_pps),
        one("in total", l.global_pps)
    )
}
