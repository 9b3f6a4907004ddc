//! Hardware timestamping switched on for one NIC with SIOCSHWTSTAMP (TX
//! on, every RX packet), the previous configuration read with
//! SIOCGHWTSTAMP and put back on drop.
//!
//! Kernel interfaces: SIOCSHWTSTAMP / SIOCGHWTSTAMP (Linux >= 2.6.30).

use std::{
    io,
    mem::zeroed,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
};

use super::cvt;

const SIOCGHWTSTAMP: libc::c_ulong = 0x89b1;
const HWTSTAMP_TX_OFF: libc::c_int = 0;
const HWTSTAMP_TX_ON: libc::c_int = 1;
const HWTSTAMP_FILTER_NONE: libc::c_int = 0;
const HWTSTAMP_FILTER_ALL: libc::c_int = 1;

/// `struct hwtstamp_config` (linux/net_tstamp.h).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct HwtstampConfig {
    flags: libc::c_int,
    tx_type: libc::c_int,
    rx_filter: libc::c_int,
}

fn hwtstamp_ioctl(
    sock: RawFd,
    ifname: &str,
    req: libc::c_ulong,
    cfg: &mut HwtstampConfig,
) -> io::Result<()> {
    // SAFETY: ifreq is POD.
    let mut ifr: libc::ifreq = unsafe { zeroed() };
    let name = ifname.as_bytes();
    if name.len() >= ifr.ifr_name.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    for (d, s) in ifr.ifr_name.iter_mut().zip(name) {
        *d = *s as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = (cfg as *mut HwtstampConfig).cast();
    // SAFETY: ifr is valid and points to cfg for the duration of the call.
    cvt(unsafe { libc::ioctl(sock, req as _, &mut ifr) }).map(drop)
}

/// Hardware timestamping switched on for one interface; the previous
/// configuration is put back on drop. The ioctl socket belongs to the
/// namespace it was made in, so restoring works from any thread.
pub(crate) struct HwTimestamping {
    sock: OwnedFd,
    ifname: String,
    previous: HwtstampConfig,
}

impl HwTimestamping {
    /// Asks the NIC for TX and all-RX hardware timestamps. Call inside the
    /// interface's namespace. Err means the NIC/driver cannot (veth: EOPNOTSUPP).
    pub(crate) fn enable(ifname: &str) -> io::Result<Self> {
        // SAFETY: plain socket(2) call.
        let s =
            cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: s is a fresh fd owned here.
        let sock = unsafe { OwnedFd::from_raw_fd(s) };
        let mut previous = HwtstampConfig::default();
        if hwtstamp_ioctl(sock.as_raw_fd(), ifname, SIOCGHWTSTAMP, &mut previous).is_err() {
            previous = HwtstampConfig {
                flags: 0,
                tx_type: HWTSTAMP_TX_OFF,
                rx_filter: HWTSTAMP_FILTER_NONE,
            };
        }
        let mut cfg = HwtstampConfig {
            flags: 0,
            tx_type: HWTSTAMP_TX_ON,
            rx_filter: HWTSTAMP_FILTER_ALL,
        };
        hwtstamp_ioctl(sock.as_raw_fd(), ifname, libc::SIOCSHWTSTAMP, &mut cfg)?;
        if cfg.tx_type != HWTSTAMP_TX_ON || cfg.rx_filter == HWTSTAMP_FILTER_NONE {
            // The driver narrowed the request to something useless for UDP.
            let mut p = previous;
            let _ = hwtstamp_ioctl(sock.as_raw_fd(), ifname, libc::SIOCSHWTSTAMP, &mut p);
            return Err(io::Error::from_raw_os_error(libc::ERANGE));
        }
        Ok(Self {
            sock,
            ifname: ifname.to_string(),
            previous,
        })
    }
}

impl Drop for HwTimestamping {
    fn drop(&mut self) {
        let mut p = self.previous;
        if let Err(e) = hwtstamp_ioctl(
            self.sock.as_raw_fd(),
            &self.ifname,
            libc::SIOCSHWTSTAMP,
            &mut p,
        ) {
            log::warn!(
                "could not restore hardware timestamping on {}: {e}",
                self.ifname
            );
        }
    }
}
