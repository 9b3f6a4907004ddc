//! Test-only testbeds for the knob tests, built with `ip` so they do not
//! depend on the real testbed builder: namespaces via `Netns::create`
//! (unique names, deleted on drop, which also destroys their veths), and
//! veth pairs created directly inside them, never in the host namespace.

use std::{net::Ipv4Addr, process::Command};

use anyhow::{Context, Result, bail};

use crate::{
    sys::Netns,
    testbed::{Iface, Testbed},
};

/// True as root; under CI a failure, elsewhere a visible SKIPPED line (see
/// [`crate::testbed::testutil::root_or_skip`]).
pub(crate) fn root_or_skip(test: &str) -> bool {
    crate::testbed::testutil::root_or_skip(test)
}

pub(crate) fn unique(tag: &str) -> String {
    format!(
        "rtpt-{}-{:04x}-{tag}",
        std::process::id(),
        rand::random::<u16>()
    )
}

pub(crate) fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip").args(args).output().context("run ip")?;
    if !out.status.success() {
        bail!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command inside `ns` (`ip netns exec`), returns stdout.
pub(crate) fn exec(ns: &Netns, args: &[&str]) -> Result<String> {
    let mut a = vec!["netns", "exec", ns.name()];
    a.extend_from_slice(args);
    let out = Command::new("ip")
        .args(&a)
        .output()
        .context("ip netns exec")?;
    if !out.status.success() {
        bail!(
            "{} in {} failed: {}",
            args.join(" "),
            ns.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn iface(ns: &Netns, name: &str, addr: Ipv4Addr) -> Result<Iface> {
    use crate::sys::Sys as _;
    let ifindex = crate::sys::linux_static()
        .link(ns.into(), name)?
        .with_context(|| format!("{name} not found in {}", ns.name()))?
        .index;
    Ok(Iface {
        name: name.to_string(),
        ifindex,
        addr,
        addr6: None,
    })
}

fn up(ns: &Netns, dev: &str) -> Result<()> {
    ip(&["-n", ns.name(), "link", "set", "dev", dev, "up"])?;
    Ok(())
}

fn addr(ns: &Netns, dev: &str, cidr: &str) -> Result<()> {
    ip(&["-n", ns.name(), "addr", "add", cidr, "dev", dev])?;
    Ok(())
}

/// sender --veth-- receiver (like NIC-pair mode: no router).
pub(crate) fn direct() -> Result<Testbed> {
    let id = unique("d");
    let sender = Netns::create(&format!("{id}-s"))?;
    let receiver = Netns::create(&format!("{id}-r"))?;
    ip(&[
        "-n",
        sender.name(),
        "link",
        "add",
        "name",
        "rtp-s",
        "type",
        "veth",
        "peer",
        "name",
        "rtp-r",
        "netns",
        receiver.name(),
    ])?;
    addr(&sender, "rtp-s", "10.77.0.1/24")?;
    addr(&receiver, "rtp-r", "10.77.0.2/24")?;
    for (ns, d) in [
        (&sender, "lo"),
        (&sender, "rtp-s"),
        (&receiver, "lo"),
        (&receiver, "rtp-r"),
    ] {
        up(ns, d)?;
    }
    let sender_if = iface(&sender, "rtp-s", Ipv4Addr::new(10, 77, 0, 1))?;
    let receiver_if = iface(&receiver, "rtp-r", Ipv4Addr::new(10, 77, 0, 2))?;
    Ok(Testbed::from_parts(
        crate::sys::linux(),
        id,
        sender,
        receiver,
        None,
        sender_if,
        receiver_if,
        None,
        None,
    ))
}

/// sender --veth-- router --veth-- receiver, kernel forwarding.
pub(crate) fn routed() -> Result<Testbed> {
    let id = unique("r");
    let sender = Netns::create(&format!("{id}-s"))?;
    let router = Netns::create(&format!("{id}-m"))?;
    let receiver = Netns::create(&format!("{id}-r"))?;
    for (a, an, b, bn) in [
        (&sender, "rtp-s", &router, "rtp-ri"),
        (&router, "rtp-ro", &receiver, "rtp-r"),
    ] {
        ip(&[
            "-n",
            a.name(),
            "link",
            "add",
            "name",
            an,
            "type",
            "veth",
            "peer",
            "name",
            bn,
            "netns",
            b.name(),
        ])?;
    }
    addr(&sender, "rtp-s", "10.77.1.1/24")?;
    addr(&router, "rtp-ri", "10.77.1.2/24")?;
    addr(&router, "rtp-ro", "10.77.2.1/24")?;
    addr(&receiver, "rtp-r", "10.77.2.2/24")?;
    for (ns, d) in [
        (&sender, "lo"),
        (&sender, "rtp-s"),
        (&router, "lo"),
        (&router, "rtp-ri"),
        (&router, "rtp-ro"),
        (&receiver, "lo"),
        (&receiver, "rtp-r"),
    ] {
        up(ns, d)?;
    }
    ip(&[
        "-n",
        sender.name(),
        "route",
        "add",
        "default",
        "via",
        "10.77.1.2",
    ])?;
    ip(&[
        "-n",
        receiver.name(),
        "route",
        "add",
        "default",
        "via",
        "10.77.2.1",
    ])?;
    router.run(|| {
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1").context("enable forwarding")
    })?;
    let sender_if = iface(&sender, "rtp-s", Ipv4Addr::new(10, 77, 1, 1))?;
    let receiver_if = iface(&receiver, "rtp-r", Ipv4Addr::new(10, 77, 2, 2))?;
    let router_in = Some(iface(&router, "rtp-ri", Ipv4Addr::new(10, 77, 1, 2))?);
    let router_out = Some(iface(&router, "rtp-ro", Ipv4Addr::new(10, 77, 2, 1))?);
    Ok(Testbed::from_parts(
        crate::sys::linux(),
        id,
        sender,
        receiver,
        Some(router),
        sender_if,
        receiver_if,
        router_in,
        router_out,
    ))
}

/// Everything about a namespace the knobs could change, to compare
/// before/after: qdiscs (`tc qdisc show`), sysctls, offloads, txqueuelen,
/// the interfaces present.
pub(crate) fn snapshot(ns: &Netns, dev: &str) -> Result<String> {
    let mut s = String::new();
    s += &exec(ns, &["tc", "qdisc", "show"])?;
    s += &exec(ns, &["tc", "class", "show", "dev", dev])?;
    for parent in ["1:", "10:"] {
        // Errors when the parent does not exist, which is the expected state.
        if let Ok(f) = exec(ns, &["tc", "filter", "show", "dev", dev, "parent", parent]) {
            s += &f;
        }
    }
    s += &exec(
        ns,
        &[
            "sysctl",
            "net.ipv4.tcp_limit_output_bytes",
            "net.ipv4.tcp_congestion_control",
        ],
    )?;
    s += &exec(ns, &["ethtool", "-k", dev])?;
    s += &exec(ns, &["cat", &format!("/sys/class/net/{dev}/tx_queue_len")])?;
    s += &exec(ns, &["ls", "/sys/class/net"])?;
    Ok(s)
}
