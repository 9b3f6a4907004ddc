//! What `bench-forward` reads and sets on the testbed's interfaces, all
//! through the kernel layer ([`crate::sys`], the namespace's own sysfs
//! view and ethtool): packet counters (/sys/class/net/DEV/statistics, the
//! same `dev_get_stats` figures as IFLA_STATS64) and MAC address, GRO
//! (a veth needs GRO or an XDP program to accept frames redirected into
//! it; Linux >= 2.6.39) and threaded NAPI (/sys/class/net/DEV/threaded,
//! 5.12 or later), which runs a device's NAPI polling in its own kernel
//! thread so the router's work can run on another core than the generator's.

use anyhow::{Context, Result, bail};

use crate::sys::{self, Netns, Ns, Offload, Sys};

/// Counters of one interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LinkCounters {
    pub(crate) rx_packets: u64,
    pub(crate) tx_packets: u64,
    pub(crate) rx_dropped: u64,
    pub(crate) tx_dropped: u64,
}

impl LinkCounters {
    pub(crate) fn since(&self, b: &LinkCounters) -> LinkCounters {
        LinkCounters {
            rx_packets: self.rx_packets.saturating_sub(b.rx_packets),
            tx_packets: self.tx_packets.saturating_sub(b.tx_packets),
            rx_dropped: self.rx_dropped.saturating_sub(b.rx_dropped),
            tx_dropped: self.tx_dropped.saturating_sub(b.tx_dropped),
        }
    }
}

/// Parses "aa:bb:cc:dd:ee:ff" (sysfs `address`).
fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = s.trim().split(':');
    for b in &mut mac {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// Counters and MAC address of `ifname` in `ns`.
pub(crate) fn link_state(
    sys: &dyn Sys,
    ns: &Netns,
    ifname: &str,
) -> Result<(LinkCounters, [u8; 6])> {
    let ns = Ns::Named(ns.name());
    let stat = |name: &str| -> Result<u64> {
        let v = sys.sysfs_read(ns, &sys::netdev_attr(ifname, &format!("statistics/{name}")))?;
        v.parse()
            .with_context(|| format!("{ifname} {name} is not a number: {v:?}"))
    };
    let c = LinkCounters {
        rx_packets: stat("rx_packets")?,
        tx_packets: stat("tx_packets")?,
        rx_dropped: stat("rx_dropped")?,
        tx_dropped: stat("tx_dropped")?,
    };
    let a = sys.sysfs_read(ns, &sys::netdev_attr(ifname, "address"))?;
    let mac = parse_mac(&a).with_context(|| format!("{ifname} has no MAC address ({a:?})"))?;
    Ok((c, mac))
}

/// Switches GRO on or off on `ifname` in `ns`.
pub(crate) fn set_gro(sys: &dyn Sys, ns: &Netns, ifname: &str, on: bool) -> Result<()> {
    sys.set_offload(Ns::Named(ns.name()), ifname, Offload::Gro, on)
        .with_context(|| format!("GRO {} on {ifname}", if on { "on" } else { "off" }))
}

/// Pids of the kernel threads polling `ifname` (threaded NAPI names them
/// `napi/IFNAME-ID`). Interface names repeat across namespaces, so callers
/// compare the list before and after switching threaded NAPI on.
pub(crate) fn napi_threads(ifname: &str) -> Vec<i32> {
    let prefix = format!("napi/{ifname}-");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim_end().starts_with(&prefix))
        })
        .collect()
}

/// Makes thread `tid` (0 = the caller) SCHED_FIFO at `prio`.
pub(crate) fn set_fifo(tid: i32, prio: u8) -> Result<()> {
    crate::sys::rt::set_fifo(tid, prio)
        .with_context(|| format!("SCHED_FIFO {prio} for thread {tid}"))
}

/// Turns threaded NAPI on or off for `ifname` in `ns` (written in the
/// namespace's own sysfs view, which lists its devices).
pub(crate) fn set_threaded_napi(sys: &dyn Sys, ns: &Netns, ifname: &str, on: bool) -> Result<()> {
    if ifname.contains('/') {
        bail!("bad interface name {ifname}");
    }
    sys.sysfs_write(
        Ns::Named(ns.name()),
        &sys::netdev_attr(ifname, "threaded"),
        if on { "1" } else { "0" },
    )
    .context("threaded NAPI needs Linux >= 5.12")
}

#[cfg(test)]
mod tests {
    use super::parse_mac;

    #[test]
    fn mac_from_sysfs() {
        assert_eq!(
            parse_mac("02:1a:ff:00:9B:0c\n"),
            Some([0x02, 0x1a, 0xff, 0x00, 0x9b, 0x0c])
        );
        assert_eq!(parse_mac("02:1a:ff:00:9b"), None);
        assert_eq!(parse_mac("02:1a:ff:00:9b:0c:01"), None);
        assert_eq!(parse_mac("zz:1a:ff:00:9b:0c"), None);
    }
}
