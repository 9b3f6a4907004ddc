//! Opening a probe socket: socket(2) in the address's family, its traffic
//! class (IP_TOS / IPV6_TCLASS, IPV6_V6ONLY), forced buffer sizes
//! (SO_RCVBUFFORCE / SO_SNDBUFFORCE, which need CAP_NET_ADMIN and are
//! skipped without it), the SO_TIMESTAMPING flags, bind(2), and connect(2)
//! to the one destination of its batches.
//!
//! Kernel interfaces: SO_TIMESTAMPING (Linux >= 2.6.30),
//! SOF_TIMESTAMPING_TX_SCHED (>= 3.17), SOF_TIMESTAMPING_OPT_ID and
//! OPT_TSONLY (>= 4.0).

use std::{
    io,
    net::SocketAddr,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed},
};

use anyhow::{Context, Result};

use super::{ProbeSocket, addr::sockaddr, cvt, setsockopt};

/// Which kernel timestamps a socket asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TsFlags {
    pub(crate) tx: bool,
    pub(crate) rx: bool,
    pub(crate) hardware: bool,
}

impl TsFlags {
    /// Flags for a socket that reports software stamps with OPT_ID but
    /// generates a TX stamp only for a send that asks for one
    /// ([`TX_ON_REQUEST`](super::echo::TX_ON_REQUEST) in its control
    /// message): RX stamps if `rx`.
    fn on_request_bits(rx: bool) -> u32 {
        let mut f = libc::SOF_TIMESTAMPING_SOFTWARE
            | libc::SOF_TIMESTAMPING_OPT_ID
            | libc::SOF_TIMESTAMPING_OPT_TSONLY;
        if rx {
            f |= libc::SOF_TIMESTAMPING_RX_SOFTWARE;
        }
        f
    }

    fn bits(self) -> u32 {
        let mut f = libc::SOF_TIMESTAMPING_SOFTWARE;
        if self.rx {
            f |= libc::SOF_TIMESTAMPING_RX_SOFTWARE;
        }
        if self.tx {
            // TX_SCHED stamps the packet as it enters the device layer
            // (before the qdisc), TX_SOFTWARE as the driver takes it: the
            // two bracket the sender's queue.
            f |= libc::SOF_TIMESTAMPING_TX_SOFTWARE
                | libc::SOF_TIMESTAMPING_TX_SCHED
                | libc::SOF_TIMESTAMPING_OPT_ID
                | libc::SOF_TIMESTAMPING_OPT_TSONLY;
        }
        if self.hardware {
            f |= libc::SOF_TIMESTAMPING_RAW_HARDWARE;
            if self.rx {
                f |= libc::SOF_TIMESTAMPING_RX_HARDWARE;
            }
            if self.tx {
                // Both a software and a hardware TX stamp per send: the
                // matcher keeps the hardware one when it arrives.
                f |= libc::SOF_TIMESTAMPING_TX_HARDWARE | libc::SOF_TIMESTAMPING_OPT_TX_SWHW;
            }
        }
        f
    }
}

/// Receive buffer assumed per probe in flight: the echo plus its SCHED
/// and driver TX stamps on the error queue (in skb mode the router's
/// second pair), each an skb of about 1 KiB truesize. An estimate, not
/// measured per message.
const RCVBUF_PER_PROBE_BYTES: u64 = 4 << 10;
/// Never below the 32 MiB rtprobe always had; never above 512 MiB (the
/// kernel doubles it, and caps the request at INT_MAX / 2).
const RCVBUF_MIN_BYTES: u64 = 32 << 20;
const RCVBUF_MAX_BYTES: u64 = 512 << 20;

/// The receive buffer to force on a probe socket: room for every probe of
/// one `timeout` at one per `interval` (what can still count as arrived),
/// so that a receive thread stalled for up to a timeout loses nothing to a
/// full buffer. At 100 k probes/s and 1 s: 400 MiB; at 1 ms: the minimum.
pub(crate) fn rcvbuf_bytes(interval: std::time::Duration, timeout: std::time::Duration) -> i32 {
    let interval_ns = interval.as_nanos().max(1);
    let in_flight = (timeout.as_nanos() / interval_ns).min(u64::MAX as u128) as u64;
    let bytes = in_flight
        .saturating_mul(RCVBUF_PER_PROBE_BYTES)
        .clamp(RCVBUF_MIN_BYTES, RCVBUF_MAX_BYTES);
    bytes as i32
}

/// What to do about a failed socket(2), by its errno.
fn socket_hint(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EMFILE) => {
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: getrlimit writes into the struct it is given.
            let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
                lim.rlim_cur.to_string()
            } else {
                "unknown".into()
            };
            format!(
                "too many open files in this process (EMFILE, RLIMIT_NOFILE {soft}): raise the limit (LimitNOFILE= in a systemd unit, `ulimit -n` in a shell) or probe fewer targets"
            )
        }
        Some(libc::ENFILE) => {
            "too many open files on this host (ENFILE, fs.file-max): close some or raise fs.file-max"
                .into()
        }
        Some(libc::ENOBUFS) | Some(libc::ENOMEM) => {
            "the kernel is out of memory for sockets: free some".into()
        }
        _ => "is this protocol family enabled?".into(),
    }
}

impl ProbeSocket {
    /// `rcvbuf_bytes`: the receive buffer to force (see [`rcvbuf_bytes`]).
    /// The family follows `addr`: an IPv6 socket takes IPv6 only
    /// (IPV6_V6ONLY), so `[::]` and `0.0.0.0` on one port can coexist;
    /// `tos` is its traffic class. The port must be free: no SO_REUSEADDR,
    /// which for UDP would let two sockets share it and split the datagrams.
    pub(crate) fn bind(addr: SocketAddr, tos: u8, ts: TsFlags, rcvbuf_bytes: i32) -> Result<Self> {
        Self::bind_flags(addr, tos, ts.bits(), (ts.tx, false), rcvbuf_bytes, false)
    }

    /// Like [`Self::bind`], but no send is TX-timestamped unless it asks:
    /// only the echoes [`Self::send_back_stamping`] is given an OPT_ID for
    /// get one software stamp each. The socket still reports software
    /// stamps with their OPT_ID (and RX stamps if `rx`). Each TX stamp is
    /// an error-queue message charged to the receive buffer the datagrams
    /// arrive in: a reflector that stamped every reply lost datagrams to
    /// its own stamps under a flood, so it stamps a bounded sample.
    pub(crate) fn bind_tx_on_request(
        addr: SocketAddr,
        tos: u8,
        rx: bool,
        rcvbuf_bytes: i32,
    ) -> Result<Self> {
        Self::bind_flags(
            addr,
            tos,
            TsFlags::on_request_bits(rx),
            (true, true),
            rcvbuf_bytes,
            false,
        )
    }

    /// [`Self::bind_tx_on_request`] with SO_REUSEPORT set before the bind:
    /// one of a group of sockets on the same address and port, which a
    /// program attached to the group chooses between (the reflector's
    /// known peers get a socket of their own).
    pub(crate) fn bind_tx_on_request_shared(
        addr: SocketAddr,
        rx: bool,
        rcvbuf_bytes: i32,
    ) -> Result<Self> {
        Self::bind_flags(
            addr,
            0,
            TsFlags::on_request_bits(rx),
            (true, true),
            rcvbuf_bytes,
            true,
        )
    }

    /// `(opt_id, tx_on_request)`: see [`Self::bind_tx_on_request`];
    /// `reuseport`: SO_REUSEPORT before the bind.
    fn bind_flags(
        addr: SocketAddr,
        tos: u8,
        flags: u32,
        (opt_id, tx_on_request): (bool, bool),
        rcvbuf_bytes: i32,
        reuseport: bool,
    ) -> Result<Self> {
        let (family, family_name) = match addr {
            SocketAddr::V4(_) => (libc::AF_INET, "AF_INET"),
            SocketAddr::V6(_) => (libc::AF_INET6, "AF_INET6"),
        };
        // SAFETY: plain socket(2) call.
        let fd = cvt(unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })
            .map_err(|e| {
                let hint = socket_hint(&e);
                anyhow::Error::from(e).context(format!("socket({family_name}, SOCK_DGRAM): {hint}"))
            })?;
        // SAFETY: fd was just returned by socket(2) and is owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        match addr {
            SocketAddr::V4(_) => setsockopt(raw, libc::IPPROTO_IP, libc::IP_TOS, &(tos as i32))
                .context("setsockopt(IP_TOS)")?,
            SocketAddr::V6(_) => {
                setsockopt(raw, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, &1i32)
                    .context("setsockopt(IPV6_V6ONLY)")?;
                setsockopt(raw, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, &(tos as i32))
                    .context("setsockopt(IPV6_TCLASS)")?;
            }
        }
        // Room for a stalled receive thread at high probe rates, sized by
        // the caller from the rate (see rcvbuf_bytes). Charged only when used.
        let _ = setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &rcvbuf_bytes);
        let _ = setsockopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &(8 << 20i32));
        setsockopt(raw, libc::SOL_SOCKET, libc::SO_TIMESTAMPING, &flags)
            .context("setsockopt(SO_TIMESTAMPING): this kernel lacks socket timestamping")?;
        if reuseport {
            setsockopt(raw, libc::SOL_SOCKET, libc::SO_REUSEPORT, &1i32)
                .context("setsockopt(SO_REUSEPORT)")?;
        }
        let sa = sockaddr(addr);
        // SAFETY: sa holds a valid sockaddr of sa.len bytes.
        cvt(unsafe { libc::bind(raw, sa.ptr(), sa.len) }).map_err(|e| {
            let what = if e.raw_os_error() == Some(libc::EADDRINUSE) {
                "another program already uses this port: stop it or pick another port"
            } else if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) {
                "no interface here has this address: give one of this host's addresses"
            } else {
                "pick another port"
            };
            anyhow::Error::from(e).context(format!("bind UDP {addr}: {what}"))
        })?;
        Ok(Self {
            fd,
            per_send_opt_id: AtomicBool::new(opt_id),
            next_opt_id: AtomicU32::new(0),
            connected: AtomicBool::new(false),
            tx_on_request,
        })
    }

    /// Connects the socket to `dst`, the destination of every
    /// [`SendBatch`](super::SendBatch) it sends: those then go without an
    /// address, and the kernel reuses the socket's cached route instead of
    /// looking one up per datagram (measured: the route lookup was about
    /// 3 % of the sender's CPU at 100 k probes/s). Datagrams from anywhere
    /// but `dst` are no longer delivered to it.
    pub(crate) fn connect(&self, dst: SocketAddr) -> io::Result<()> {
        let sa = sockaddr(dst);
        // SAFETY: sa holds a valid sockaddr of its family, sa.len bytes long.
        cvt(unsafe { libc::connect(self.fd(), sa.ptr(), sa.len) })?;
        self.connected.store(true, Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{rcvbuf_bytes, socket_hint};

    #[test]
    fn out_of_file_descriptors_is_named_as_such() {
        let hint = |errno| socket_hint(&std::io::Error::from_raw_os_error(errno));
        assert!(
            hint(libc::EMFILE).contains("EMFILE") && hint(libc::EMFILE).contains("LimitNOFILE=")
        );
        assert!(hint(libc::ENFILE).contains("ENFILE"));
        assert!(hint(libc::EAFNOSUPPORT).contains("protocol family"));
    }

    #[test]
    fn receive_buffer_holds_one_timeout_of_probes_within_bounds() {
        let s = Duration::from_secs(1);
        // 1 ms: 1000 probes in a timeout, the 32 MiB floor.
        assert_eq!(rcvbuf_bytes(Duration::from_millis(1), s), 32 << 20);
        // 10 µs: 100 k probes x 4 KiB.
        assert_eq!(rcvbuf_bytes(Duration::from_micros(10), s), 100_000 * 4096);
        // 1 µs: capped.
        assert_eq!(rcvbuf_bytes(Duration::from_micros(1), s), 512 << 20);
        assert_eq!(rcvbuf_bytes(Duration::ZERO, s), 512 << 20);
    }
}
