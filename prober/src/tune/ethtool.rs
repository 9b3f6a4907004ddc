//! The few ethtool calls the knobs need: driver name and TX ring size.
//!
//! INTEGRATION NOTE: `testbed/ethtool.rs` (another branch) offers
//! `ring/set_tx_ring(ifname, ..)` acting in the calling thread's namespace.
//! This module has the same shape (free functions, calling thread's
//! namespace) so `tune::ring` can switch to it at merge time; until then it
//! speaks the ioctl itself.
//!
//! Kernel interface: SIOCETHTOOL ioctl on an AF_INET datagram socket,
//! ETHTOOL_GDRVINFO / ETHTOOL_GRINGPARAM / ETHTOOL_SRINGPARAM (Linux >=
//! 2.6). The socket is created by the calling thread, so the device name
//! is looked up in that thread's network namespace.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{Context, Result, bail};

const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;
const ETHTOOL_GRINGPARAM: u32 = 0x0000_0010;
const ETHTOOL_SRINGPARAM: u32 = 0x0000_0011;
const ETHTOOL_GTSO: u32 = 0x0000_001e;
const ETHTOOL_STSO: u32 = 0x0000_001f;
const ETHTOOL_GGSO: u32 = 0x0000_0023;
const ETHTOOL_SGSO: u32 = 0x0000_0024;

/// struct ethtool_value (the legacy per-feature get/set).
#[repr(C)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// TCP segmentation offload and generic segmentation offload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segmentation {
    pub tso: bool,
    pub gso: bool,
}

fn get_value(ifname: &str, cmd: u32, what: &str) -> Result<bool> {
    let mut v = EthtoolValue { cmd, data: 0 };
    match ioctl(ifname, &mut v as *mut _ as *mut libc::c_void) {
        Ok(()) => Ok(v.data != 0),
        Err(EthtoolError::Unsupported) => Ok(false),
        Err(EthtoolError::Other(e)) => {
            Err(e).with_context(|| format!("ethtool -k {ifname} ({what})"))
        }
    }
}

fn set_value(ifname: &str, cmd: u32, on: bool, what: &str) -> Result<()> {
    let mut v = EthtoolValue {
        cmd,
        data: on as u32,
    };
    match ioctl(ifname, &mut v as *mut _ as *mut libc::c_void) {
        Ok(()) => Ok(()),
        Err(EthtoolError::Unsupported) => {
            bail!("{ifname}: the driver cannot switch {what} (ethtool -K unsupported)")
        }
        Err(EthtoolError::Other(e)) => Err(e).with_context(|| {
            format!(
                "ethtool -K {ifname} {what} {}",
                if on { "on" } else { "off" }
            )
        }),
    }
}

/// TSO/GSO state (the legacy ETHTOOL_GTSO/GGSO views of the features).
pub fn segmentation(ifname: &str) -> Result<Segmentation> {
    Ok(Segmentation {
        tso: get_value(ifname, ETHTOOL_GTSO, "tso")?,
        gso: get_value(ifname, ETHTOOL_GGSO, "gso")?,
    })
}

/// Sets TSO and GSO.
pub fn set_segmentation(ifname: &str, s: Segmentation) -> Result<()> {
    set_value(ifname, ETHTOOL_STSO, s.tso, "tso")?;
    set_value(ifname, ETHTOOL_SGSO, s.gso, "gso")
}

#[repr(C)]
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingParam {
    cmd: u32,
    pub rx_max_pending: u32,
    pub rx_mini_max_pending: u32,
    pub rx_jumbo_max_pending: u32,
    pub tx_max_pending: u32,
    pub rx_pending: u32,
    pub rx_mini_pending: u32,
    pub rx_jumbo_pending: u32,
    pub tx_pending: u32,
}

#[repr(C)]
struct DrvInfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// struct ifreq with ifr_data (40 bytes on 64-bit Linux).
#[repr(C)]
struct IfreqData {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

/// Why an ethtool call failed: the driver cannot (EOPNOTSUPP) or another reason.
#[derive(Debug)]
pub enum EthtoolError {
    Unsupported,
    Other(std::io::Error),
}

fn ioctl(ifname: &str, data: *mut libc::c_void) -> Result<(), EthtoolError> {
    if ifname.len() >= libc::IFNAMSIZ {
        return Err(EthtoolError::Other(std::io::Error::from_raw_os_error(
            libc::EINVAL,
        )));
    }
    // SAFETY: plain socket(2); the fd is owned right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(EthtoolError::Other(std::io::Error::last_os_error()));
    }
    // SAFETY: fd is a fresh, valid descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data,
        _pad: [0; 16],
    };
    req.name[..ifname.len()].copy_from_slice(ifname.as_bytes());
    // SAFETY: req is a valid ifreq whose data points to a live ethtool
    // struct of the size the command implies.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCETHTOOL, &mut req) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EOPNOTSUPP) => EthtoolError::Unsupported,
            _ => EthtoolError::Other(e),
        });
    }
    Ok(())
}

/// Driver name (e.g. "veth", "igb"), from ETHTOOL_GDRVINFO.
pub fn driver(ifname: &str) -> Result<String> {
    // SAFETY: DrvInfo is plain old data; all-zero is valid.
    let mut d: DrvInfo = unsafe { std::mem::zeroed() };
    d.cmd = ETHTOOL_GDRVINFO;
    match ioctl(ifname, &mut d as *mut _ as *mut libc::c_void) {
        Ok(()) => {
            let end = d.driver.iter().position(|&b| b == 0).unwrap_or(32);
            Ok(String::from_utf8_lossy(&d.driver[..end]).into_owned())
        }
        Err(EthtoolError::Unsupported) => Ok("unknown".into()),
        Err(EthtoolError::Other(e)) => {
            Err(e).with_context(|| format!("ethtool driver info of {ifname}"))
        }
    }
}

/// Ring sizes; Ok(None) when the driver has no adjustable rings (veth).
pub fn ring(ifname: &str) -> Result<Option<RingParam>> {
    let mut r = RingParam {
        cmd: ETHTOOL_GRINGPARAM,
        ..Default::default()
    };
    match ioctl(ifname, &mut r as *mut _ as *mut libc::c_void) {
        Ok(()) => Ok(Some(r)),
        Err(EthtoolError::Unsupported) => Ok(None),
        Err(EthtoolError::Other(e)) => Err(e).with_context(|| format!("ethtool -g {ifname}")),
    }
}

/// Sets the TX ring size, keeping the other rings as they are.
pub fn set_tx_ring(ifname: &str, tx: u32) -> Result<()> {
    let Some(mut r) = ring(ifname)? else {
        bail!("{ifname}: the driver has no adjustable TX ring (ethtool -G unsupported)");
    };
    if tx > r.tx_max_pending {
        bail!(
            "{ifname}: TX ring {tx} is above the driver's maximum {}",
            r.tx_max_pending
        );
    }
    r.cmd = ETHTOOL_SRINGPARAM;
    r.tx_pending = tx;
    match ioctl(ifname, &mut r as *mut _ as *mut libc::c_void) {
        Ok(()) => Ok(()),
        Err(EthtoolError::Unsupported) => {
            bail!("{ifname}: the driver cannot change its TX ring size (ethtool -G unsupported)")
        }
        Err(EthtoolError::Other(e)) => {
            Err(e).with_context(|| format!("ethtool -G {ifname} tx {tx}"))
        }
    }
}
