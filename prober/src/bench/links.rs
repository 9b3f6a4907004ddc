//! What `bench-forward` reads and sets on the testbed's interfaces:
//! packet counters and MAC addresses (rtnetlink RTM_GETLINK with
//! IFLA_STATS64, Linux 2.6.35 or later), GRO (`testbed::ethtool`,
//! 2.6.39 or later; a veth needs GRO or an XDP program to accept frames
//! redirected into it) and threaded NAPI (/sys/class/net/DEV/threaded,
//! 5.12 or later), which runs a device's NAPI polling in its own kernel
//! thread so the router's work can run on another core than the generator's.

use anyhow::{Context, Result, bail};
use futures::TryStreamExt;
use netlink_packet_route::link::LinkAttribute;

use crate::testbed::{Netns, netlink::with_netlink};

/// Counters of one interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkCounters {
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_dropped: u64,
    pub tx_dropped: u64,
}

impl LinkCounters {
    pub fn since(&self, b: &LinkCounters) -> LinkCounters {
        LinkCounters {
            rx_packets: self.rx_packets.saturating_sub(b.rx_packets),
            tx_packets: self.tx_packets.saturating_sub(b.tx_packets),
            rx_dropped: self.rx_dropped.saturating_sub(b.rx_dropped),
            tx_dropped: self.tx_dropped.saturating_sub(b.tx_dropped),
        }
    }
}

/// Counters and MAC address of `ifname` in `ns`.
pub fn link_state(ns: &Netns, ifname: &str) -> Result<(LinkCounters, [u8; 6])> {
    let name = ifname.to_string();
    with_netlink(Some(ns), |h| async move {
        let mut links = h.link().get().match_name(name.clone()).execute();
        let msg = links
            .try_next()
            .await
            .with_context(|| format!("read the counters of {name}"))?
            .with_context(|| format!("interface {name} not found"))?;
        let mut c = LinkCounters::default();
        let mut mac = [0u8; 6];
        for a in &msg.attributes {
            match a {
                LinkAttribute::Stats64(s) => {
                    c = LinkCounters {
                        rx_packets: s.rx_packets,
                        tx_packets: s.tx_packets,
                        rx_dropped: s.rx_dropped,
                        tx_dropped: s.tx_dropped,
                    }
                }
                LinkAttribute::Address(a) if a.len() == 6 => mac.copy_from_slice(a),
                _ => {}
            }
        }
        Ok((c, mac))
    })
}

/// Switches GRO on or off on `ifname` in `ns` (through `testbed::ethtool`).
pub fn set_gro(ns: &Netns, ifname: &str, on: bool) -> Result<()> {
    ns.run(|| crate::testbed::ethtool::set_gro(ifname, on))
        .with_context(|| format!("GRO {} on {ifname}", if on { "on" } else { "off" }))
}

/// Pids of the kernel threads polling `ifname` (threaded NAPI names them
/// `napi/IFNAME-ID`). Interface names repeat across namespaces, so callers
/// compare the list before and after switching threaded NAPI on.
pub fn napi_threads(ifname: &str) -> Vec<i32> {
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
pub fn set_fifo(tid: i32, prio: u8) -> Result<()> {
    let param = libc::sched_param {
        sched_priority: prio.into(),
    };
    // SAFETY: plain syscall with a valid pointer.
    if unsafe { libc::sched_setscheduler(tid, libc::SCHED_FIFO, &param) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("SCHED_FIFO {prio} for thread {tid}"));
    }
    Ok(())
}

/// Turns threaded NAPI on or off for `ifname` in `ns`. sysfs shows the
/// devices of the namespace it was mounted in, so this mounts a fresh
/// sysfs in a private mount namespace of a short-lived thread (as
/// `ip netns exec` does) and writes `threaded` there.
pub fn set_threaded_napi(ns: &Netns, ifname: &str, on: bool) -> Result<()> {
    use nix::{
        mount::{MsFlags, mount},
        sched::{CloneFlags, unshare},
    };
    if ifname.contains('/') {
        bail!("bad interface name {ifname}");
    }
    ns.run(|| {
        unshare(CloneFlags::CLONE_NEWNS).context("unshare(CLONE_NEWNS)")?;
        // Nothing mounted here may leak back to the host.
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_REC | MsFlags::MS_SLAVE,
            None::<&str>,
        )
        .context("make the private mount namespace a slave")?;
        mount(
            Some("sysfs"),
            "/sys",
            Some("sysfs"),
            MsFlags::empty(),
            None::<&str>,
        )
        .context("mount sysfs for the namespace")?;
        let path = format!("/sys/class/net/{ifname}/threaded");
        std::fs::write(&path, if on { "1" } else { "0" })
            .with_context(|| format!("write {path} (threaded NAPI needs Linux >= 5.12)"))
    })
}
