//! Interface offloads and ring sizes through the kernel's ethtool ioctl
//! (SIOCETHTOOL): GRO (ETHTOOL_GGRO/SGRO; whether it was asked for,
//! ETHTOOL_GFEATURES with the names of ETHTOOL_GSTRINGS), TX checksumming
//! (ETHTOOL_GTXCSUM/STXCSUM) and ring sizes (ETHTOOL_GRINGPARAM/
//! SRINGPARAM). Linux >= 2.6.39 for all of them.
//!
//! Every function acts on the interface of that name in the calling
//! *thread's* network namespace (the ioctl goes through a socket created
//! by the call); [`super::Sys`] runs them on the namespace's worker. A driver without the
//! operation yields an [`Unsupported`] error (downcast it to branch on it).
//!
//! Why rtprobe cares: native XDP redirect into a veth needs GRO (or an XDP
//! program) on the peer; UDP from a local socket through native XDP needs
//! TX checksum offload off on the sending veth; TX ring size is one of
//! the study's knobs.

use std::os::fd::{AsRawFd, OwnedFd};

use anyhow::{Context, Result, bail};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
use serde::Serialize;

use crate::error::Error;

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GDRVINFO: u32 = 0x03;
const ETHTOOL_GRINGPARAM: u32 = 0x10;
const ETHTOOL_SRINGPARAM: u32 = 0x11;
const ETHTOOL_GTXCSUM: u32 = 0x16;
const ETHTOOL_GTSO: u32 = 0x1e;
const ETHTOOL_STSO: u32 = 0x1f;
const ETHTOOL_GGSO: u32 = 0x23;
const ETHTOOL_SGSO: u32 = 0x24;
const ETHTOOL_STXCSUM: u32 = 0x17;
const ETHTOOL_GGRO: u32 = 0x2b;
const ETHTOOL_SGRO: u32 = 0x2c;
const ETHTOOL_GSTRINGS: u32 = 0x1b;
const ETHTOOL_GSSET_INFO: u32 = 0x37;
const ETHTOOL_GFEATURES: u32 = 0x3a;
const ETH_SS_FEATURES: u32 = 4;
const ETH_GSTRING_LEN: usize = 32;

/// The driver does not implement an ethtool operation on this interface.
#[derive(Debug, thiserror::Error)]
#[error("{ifname} does not support {what} (the driver has no such ethtool operation)")]
pub(crate) struct Unsupported {
    pub(crate) ifname: String,
    pub(crate) what: &'static str,
}

/// RX/TX ring sizes (descriptors) and their driver maxima.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Ring {
    pub(crate) rx: u32,
    pub(crate) rx_max: u32,
    pub(crate) tx: u32,
    pub(crate) tx_max: u32,
}

/// `struct ethtool_value`.
#[repr(C)]
#[derive(Default)]
struct EthtoolValue {
    cmd: u32,
    data: u32,
}

/// `struct ethtool_ringparam`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct EthtoolRingparam {
    cmd: u32,
    rx_max_pending: u32,
    rx_mini_max_pending: u32,
    rx_jumbo_max_pending: u32,
    tx_max_pending: u32,
    rx_pending: u32,
    rx_mini_pending: u32,
    rx_jumbo_pending: u32,
    tx_pending: u32,
}

/// `struct ifreq` with the `ifr_data` member of its union (40 bytes on
/// 64-bit Linux).
#[repr(C)]
struct IfreqData {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 24 - std::mem::size_of::<*mut libc::c_void>()],
}

/// Is GRO (generic receive offload) on?
pub(crate) fn gro(ifname: &str) -> Result<bool> {
    get_value(ifname, ETHTOOL_GGRO, "GRO").map(|v| v != 0)
}

/// Turns GRO on or off and checks that the kernel applied it.
pub(crate) fn set_gro(ifname: &str, on: bool) -> Result<()> {
    set_value(ifname, ETHTOOL_SGRO, on.into(), "changing GRO")?;
    let now = gro(ifname)?;
    if now != on {
        bail!(
            "GRO stayed {} on {ifname}: the driver or a dependent feature overrides it",
            on_off(now)
        );
    }
    Ok(())
}

/// Was GRO asked for (`ethtool -K DEV gro on`), not merely on by default?
/// The feature's "requested" bit (the kernel's `wanted_features`): a veth
/// starts the NAPI that takes XDP frames from its peer only then.
pub(crate) fn gro_requested(ifname: &str) -> Result<bool> {
    let index = feature_names(ifname)?
        .iter()
        .position(|n| n == "rx-gro")
        .with_context(|| format!("{ifname} lists no rx-gro feature"))?;
    let blocks = index / 32 + 1;
    // struct ethtool_gfeatures: cmd, size, then blocks of {available,
    // requested, active, never_changed}.
    let mut buf = vec![0u32; 2 + 4 * blocks];
    buf[0] = ETHTOOL_GFEATURES;
    buf[1] = blocks as u32;
    ioctl_raw(ifname, buf.as_mut_ptr().cast(), "feature flags")?;
    let requested = buf[2 + 4 * (index / 32) + 1];
    Ok(requested & (1 << (index % 32)) != 0)
}

/// The names of the interface's feature bits, by bit (ETH_SS_FEATURES).
fn feature_names(ifname: &str) -> Result<Vec<String>> {
    // struct ethtool_sset_info: cmd, reserved, u64 sset_mask, data[1].
    let mut info = [0u32; 5];
    info[0] = ETHTOOL_GSSET_INFO;
    let mask = (1u64 << ETH_SS_FEATURES).to_ne_bytes();
    info[2] = u32::from_ne_bytes([mask[0], mask[1], mask[2], mask[3]]);
    info[3] = u32::from_ne_bytes([mask[4], mask[5], mask[6], mask[7]]);
    ioctl_raw(ifname, info.as_mut_ptr().cast(), "feature names")?;
    let count = info[4] as usize;
    // struct ethtool_gstrings: cmd, string_set, len, then the strings.
    let mut buf = vec![0u32; 3 + count * ETH_GSTRING_LEN / 4];
    buf[0] = ETHTOOL_GSTRINGS;
    buf[1] = ETH_SS_FEATURES;
    buf[2] = count as u32;
    ioctl_raw(ifname, buf.as_mut_ptr().cast(), "feature names")?;
    let bytes: Vec<u8> = buf[3..].iter().flat_map(|w| w.to_ne_bytes()).collect();
    Ok(bytes
        .chunks(ETH_GSTRING_LEN)
        .map(|c| {
            let end = c.iter().position(|&b| b == 0).unwrap_or(c.len());
            String::from_utf8_lossy(&c[..end]).into_owned()
        })
        .collect())
}

/// Is TX checksum offload on (any of the NETIF_F_CSUM_MASK features)?
pub(crate) fn tx_csum(ifname: &str) -> Result<bool> {
    get_value(ifname, ETHTOOL_GTXCSUM, "TX checksumming").map(|v| v != 0)
}

/// Turns TX checksum offload on or off (the kernel also drops features
/// that need it, such as TSO) and checks that it was applied.
pub(crate) fn set_tx_csum(ifname: &str, on: bool) -> Result<()> {
    set_value(
        ifname,
        ETHTOOL_STXCSUM,
        on.into(),
        "changing TX checksumming",
    )?;
    let now = tx_csum(ifname)?;
    if now != on {
        bail!(
            "TX checksumming stayed {} on {ifname}: the driver overrides it",
            on_off(now)
        );
    }
    Ok(())
}

/// TCP segmentation offload and generic segmentation offload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Segmentation {
    pub(crate) tso: bool,
    pub(crate) gso: bool,
}

/// TSO/GSO state (ETHTOOL_GTSO/GGSO).
pub(crate) fn segmentation(ifname: &str) -> Result<Segmentation> {
    Ok(Segmentation {
        tso: get_value(ifname, ETHTOOL_GTSO, "TSO")? != 0,
        gso: get_value(ifname, ETHTOOL_GGSO, "GSO")? != 0,
    })
}

/// Sets TSO and GSO, touching only what differs: a feature the kernel
/// holds fixed (veth with a native XDP program forces GSO off) is fine as
/// long as it is already as asked.
pub(crate) fn set_segmentation(ifname: &str, want: Segmentation) -> Result<()> {
    let now = segmentation(ifname)?;
    if now.tso != want.tso {
        set_value(ifname, ETHTOOL_STSO, want.tso.into(), "switching TSO")?;
    }
    if now.gso != want.gso {
        set_value(ifname, ETHTOOL_SGSO, want.gso.into(), "switching GSO")?;
    }
    let after = segmentation(ifname)?;
    if after != want {
        bail!(
            "segmentation offload of {ifname} is {after:?} after asking for {want:?}: the driver overrides it"
        );
    }
    Ok(())
}

/// `struct ethtool_drvinfo`.
#[repr(C)]
struct EthtoolDrvinfo {
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

/// The driver's name ("veth", "ixgbe", ...), ETHTOOL_GDRVINFO.
pub(crate) fn driver(ifname: &str) -> Result<String> {
    let mut d = EthtoolDrvinfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        version: [0; 32],
        fw_version: [0; 32],
        bus_info: [0; 32],
        erom_version: [0; 32],
        reserved2: [0; 12],
        n_priv_flags: 0,
        n_stats: 0,
        testinfo_len: 0,
        eedump_len: 0,
        regdump_len: 0,
    };
    ioctl(ifname, &mut d, "driver info")?;
    let end = d
        .driver
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(d.driver.len());
    Ok(String::from_utf8_lossy(&d.driver[..end]).into_owned())
}

/// Current and maximum RX/TX ring sizes.
pub(crate) fn ring(ifname: &str) -> Result<Ring> {
    let rp = get_ringparam(ifname)?;
    Ok(Ring {
        rx: rp.rx_pending,
        rx_max: rp.rx_max_pending,
        tx: rp.tx_pending,
        tx_max: rp.tx_max_pending,
    })
}

/// Sets the TX ring size to `descriptors` (1..=tx_max), leaving RX alone.
pub(crate) fn set_tx_ring(ifname: &str, descriptors: u32) -> Result<()> {
    let mut rp = get_ringparam(ifname)?;
    if descriptors == 0 || descriptors > rp.tx_max_pending {
        bail!(
            "TX ring size {descriptors} is out of range for {ifname}: 1..={}",
            rp.tx_max_pending
        );
    }
    rp.cmd = ETHTOOL_SRINGPARAM;
    rp.tx_pending = descriptors;
    ioctl(ifname, &mut rp, "changing the ring size")?;
    let now = get_ringparam(ifname)?.tx_pending;
    if now != descriptors {
        bail!("the TX ring of {ifname} is {now} descriptors after asking for {descriptors}");
    }
    Ok(())
}

/// Is `what` on?
pub(crate) fn offload(ifname: &str, what: super::Offload) -> Result<bool> {
    use super::Offload::*;
    let cmd = match what {
        Gro => ETHTOOL_GGRO,
        TxCsum => ETHTOOL_GTXCSUM,
        Tso => ETHTOOL_GTSO,
        Gso => ETHTOOL_GGSO,
    };
    get_value(ifname, cmd, what.name()).map(|v| v != 0)
}

/// Switches `what` and checks that the kernel applied it.
pub(crate) fn set_offload(ifname: &str, what: super::Offload, on: bool) -> Result<()> {
    use super::Offload::*;
    match what {
        Gro => set_gro(ifname, on),
        TxCsum => set_tx_csum(ifname, on),
        Tso | Gso => {
            let mut want = segmentation(ifname)?;
            if what == Tso {
                want.tso = on;
            } else {
                want.gso = on;
            }
            set_segmentation(ifname, want)
        }
    }
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

fn get_ringparam(ifname: &str) -> Result<EthtoolRingparam> {
    let mut rp = EthtoolRingparam {
        cmd: ETHTOOL_GRINGPARAM,
        ..Default::default()
    };
    ioctl(ifname, &mut rp, "ring sizes")?;
    Ok(rp)
}

fn get_value(ifname: &str, cmd: u32, what: &'static str) -> Result<u32> {
    let mut v = EthtoolValue { cmd, data: 0 };
    ioctl(ifname, &mut v, what)?;
    Ok(v.data)
}

fn set_value(ifname: &str, cmd: u32, data: u32, what: &'static str) -> Result<()> {
    let mut v = EthtoolValue { cmd, data };
    ioctl(ifname, &mut v, what)
}

const ETHTOOL_GET_TS_INFO: u32 = 0x41;

/// `struct ethtool_ts_info` (linux/ethtool.h), 44 bytes.
#[repr(C)]
#[derive(Default)]
struct EthtoolTsInfo {
    cmd: u32,
    so_timestamping: u32,
    /// -1 when the interface has no PHC.
    phc_index: i32,
    tx_types: u32,
    tx_reserved: [u32; 3],
    rx_filters: u32,
    rx_reserved: [u32; 3],
}

/// The index N of the interface's PHC (`/dev/ptpN`), or None when it has
/// none (veth, loopback, NICs without hardware timestamping).
pub(crate) fn phc_index(ifname: &str) -> Result<Option<u32>> {
    let mut info = EthtoolTsInfo {
        cmd: ETHTOOL_GET_TS_INFO,
        ..Default::default()
    };
    match ioctl(ifname, &mut info, "timestamping info") {
        Ok(()) => Ok(u32::try_from(info.phc_index).ok()),
        // Kernels fill in a software-only answer for drivers without the
        // operation; a driver refusing it outright has no PHC either.
        Err(e) if e.downcast_ref::<Unsupported>().is_some() => Ok(None),
        Err(e) => Err(e),
    }
}

/// SIOCETHTOOL with `arg` (an ethtool command struct starting with `cmd`).
pub(crate) fn ioctl<T>(ifname: &str, arg: &mut T, what: &'static str) -> Result<()> {
    ioctl_raw(ifname, (arg as *mut T).cast(), what)
}

/// [`ioctl`] with a command struct of variable length at `arg` (a buffer
/// as long as its `cmd` and sizes say, alive through the call).
fn ioctl_raw(ifname: &str, arg: *mut libc::c_void, what: &'static str) -> Result<()> {
    let name = ifname.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        bail!("invalid interface name {ifname:?}");
    }
    let mut ifr = IfreqData {
        name: [0; libc::IFNAMSIZ],
        data: arg,
        _pad: [0; 24 - std::mem::size_of::<*mut libc::c_void>()],
    };
    ifr.name[..name.len()].copy_from_slice(name);
    // Any socket will do; it fixes the namespace the name is looked up in.
    let sock: OwnedFd = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .context("open a socket for the ethtool ioctl")?;
    // SAFETY: ifr is a valid ifreq whose data points at a live ethtool
    // struct of the layout `cmd` implies; both outlive the call.
    let rc = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCETHTOOL as _, &mut ifr) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EOPNOTSUPP) => Err(Unsupported {
            ifname: ifname.to_string(),
            what,
        }
        .into()),
        Some(libc::ENODEV) => Err(Error::InterfaceNotFound(ifname.to_string()).into()),
        Some(libc::EPERM) => Err(Error::NotRoot.into()),
        _ => Err(err).with_context(|| format!("ethtool ioctl ({what}) on {ifname}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testbed::testutil::{ip, netns, require_root};

    #[test]
    fn struct_layouts_match_the_kernel() {
        assert_eq!(std::mem::size_of::<IfreqData>(), 40);
        assert_eq!(std::mem::size_of::<EthtoolValue>(), 8);
        assert_eq!(std::mem::size_of::<EthtoolRingparam>(), 36);
        assert_eq!(std::mem::size_of::<EthtoolDrvinfo>(), 196);
        assert_eq!(std::mem::size_of::<EthtoolTsInfo>(), 44);
    }

    #[test]
    #[ignore = "needs root: run by cargo xtask test"]
    fn gro_and_tx_csum_on_veth() {
        require_root();
        let ns = netns("eth");
        ip(&ns, "link add veth-a type veth peer name veth-b");
        ns.run(|| {
            for on in [true, false, true] {
                set_gro("veth-a", on)?;
                assert_eq!(gro("veth-a")?, on);
                // Asked for, so the feature's requested bit follows.
                assert_eq!(gro_requested("veth-a")?, on);
            }
            // The peer is untouched.
            assert!(!gro("veth-b")?, "veth starts with GRO off");
            assert!(!gro_requested("veth-b")?, "and not asked for");
            for on in [false, true] {
                set_tx_csum("veth-a", on)?;
                assert_eq!(tx_csum("veth-a")?, on);
            }
            Ok(())
        })
        .unwrap();
    }

    #[test]
    #[ignore = "needs root: run by cargo xtask test"]
    fn ring_unsupported_and_missing_interface_are_clear() {
        require_root();
        let ns = netns("eth");
        ip(&ns, "link add veth-a type veth peer name veth-b");
        ns.run(|| {
            // veth has no rings: the error says so and can be branched on.
            let e = ring("veth-a").unwrap_err();
            let u = e.downcast_ref::<Unsupported>().expect("Unsupported");
            assert_eq!(u.ifname, "veth-a");
            assert!(e.to_string().contains("does not support ring sizes"), "{e}");
            assert!(
                set_tx_ring("veth-a", 128)
                    .unwrap_err()
                    .downcast_ref::<Unsupported>()
                    .is_some()
            );

            let e = gro("nosuch0").unwrap_err();
            assert!(matches!(
                e.downcast_ref::<Error>(),
                Some(Error::InterfaceNotFound(n)) if n == "nosuch0"
            ));
            assert!(gro("this-name-is-far-too-long").is_err());
            Ok(())
        })
        .unwrap();
    }
}
