//! The probe sockets: UDP with SO_TIMESTAMPING, TX timestamps from the error
//! queue matched by OPT_ID, batch receive with recvmmsg(2), and hardware
//! timestamping switched on with SIOCSHWTSTAMP where the NIC has it.
//!
//! Kernel interfaces: SO_TIMESTAMPING (Linux >= 2.6.30), SOF_TIMESTAMPING_TX_SCHED
//! (>= 3.17), SOF_TIMESTAMPING_OPT_ID
//! and OPT_TSONLY (>= 4.0), SCM_TS_OPT_ID to set the id per send (>= 6.13;
//! older kernels fall back to the socket's own counter), a TX stamp asked
//! for per send with an SO_TIMESTAMPING control message (>= 4.6; the
//! reflector's sampled stamps, [`ProbeSocket::bind_tx_on_request`]),
//! recvmmsg (>= 2.6.33), sendmmsg (>= 3.0), SIOCSHWTSTAMP / SIOCGHWTSTAMP
//! (>= 2.6.30).

use std::{
    io,
    mem::{size_of, zeroed},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6},
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed},
};

use anyhow::{Context, Result};

use super::cmsg::{self, Cmsgs};

/// `SCM_TS_OPT_ID` from asm-generic/socket.h (Linux 6.13).
const SCM_TS_OPT_ID: libc::c_int = 81;
/// What a send on a [`ProbeSocket::bind_tx_on_request`] socket asks for in
/// its SO_TIMESTAMPING control message: the driver's software stamp only
/// (no SCHED stamp: one error-queue message per stamped send).
const TX_ON_REQUEST: u32 = libc::SOF_TIMESTAMPING_TX_SOFTWARE;
/// Control buffer per echo: room for SO_TIMESTAMPING and SCM_TS_OPT_ID,
/// each CMSG_SPACE(4) = 24 bytes on 64-bit, and the reply's source
/// ([`cmsg::SOURCE_SPACE`], 40 bytes) (checked in a test).
const ECHO_CONTROL_U64S: usize = 12;
const SIOCGHWTSTAMP: libc::c_ulong = 0x89b1;
const HWTSTAMP_TX_OFF: libc::c_int = 0;
const HWTSTAMP_TX_ON: libc::c_int = 1;
const HWTSTAMP_FILTER_NONE: libc::c_int = 0;
const HWTSTAMP_FILTER_ALL: libc::c_int = 1;

/// Which kernel timestamps a socket asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TsFlags {
    pub tx: bool,
    pub rx: bool,
    pub hardware: bool,
}

impl TsFlags {
    /// Flags for a socket that reports software stamps with OPT_ID but
    /// generates a TX stamp only for a send that asks for one
    /// ([`TX_ON_REQUEST`] in its control message): RX stamps if `rx`.
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

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn setsockopt<T>(fd: RawFd, level: libc::c_int, name: libc::c_int, val: &T) -> io::Result<()> {
    // SAFETY: val points to a live T of the given size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (val as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// A socket address of either family as the kernel takes it, with its length.
#[derive(Clone, Copy)]
struct RawAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl RawAddr {
    fn ptr(&self) -> *const libc::sockaddr {
        (&self.storage as *const libc::sockaddr_storage).cast()
    }
}

fn sockaddr(a: SocketAddr) -> RawAddr {
    // SAFETY: sockaddr_storage is plain old data, valid when zeroed.
    let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match a {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for a
            // sockaddr_in, plain old data, and borrowed only here.
            let s = unsafe {
                &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>()
            };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = a.port().to_be();
            s.sin_addr.s_addr = u32::from(*a.ip()).to_be();
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for a sockaddr_in6.
            let s = unsafe {
                &mut *(&mut storage as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = a.port().to_be();
            s.sin6_addr.s6_addr = a.ip().octets();
            s.sin6_flowinfo = a.flowinfo().to_be();
            s.sin6_scope_id = a.scope_id();
            size_of::<libc::sockaddr_in6>()
        }
    };
    RawAddr {
        storage,
        len: len as libc::socklen_t,
    }
}

/// Whether a datagram from `src` comes from `peer`: same address and
/// port (an IPv6 flow label or scope id the kernel adds does not matter).
pub fn same_endpoint(src: SocketAddr, peer: SocketAddr) -> bool {
    src.ip() == peer.ip() && src.port() == peer.port()
}

/// The address the kernel wrote; an unknown family reads as 0.0.0.0:0.
fn from_sockaddr(s: &libc::sockaddr_storage) -> SocketAddr {
    match s.ss_family as libc::c_int {
        libc::AF_INET6 => {
            // SAFETY: the kernel wrote a sockaddr_in6 (family AF_INET6).
            let s = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(s.sin6_addr.s6_addr),
                u16::from_be(s.sin6_port),
                u32::from_be(s.sin6_flowinfo),
                s.sin6_scope_id,
            ))
        }
        libc::AF_INET => {
            // SAFETY: the kernel wrote a sockaddr_in (family AF_INET).
            let s = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                u16::from_be(s.sin_port),
            ))
        }
        _ => SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)),
    }
}

/// A UDP socket with kernel timestamping. Create it on a thread inside the
/// namespace it belongs to; it stays there.
pub struct ProbeSocket {
    fd: OwnedFd,
    /// Set the OPT_ID per send with SCM_TS_OPT_ID (else the kernel counts).
    per_send_opt_id: AtomicBool,
    /// The kernel's own OPT_ID counter, mirrored for the fallback. One
    /// thread sends at a time; atomics only make the type shareable.
    next_opt_id: AtomicU32,
    /// Connected to the one destination of its batches ([`Self::connect`]).
    connected: AtomicBool,
    /// TX stamps only for sends that ask ([`Self::bind_tx_on_request`]).
    tx_on_request: bool,
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
pub fn rcvbuf_bytes(interval: std::time::Duration, timeout: std::time::Duration) -> i32 {
    let interval_ns = interval.as_nanos().max(1);
    let in_flight = (timeout.as_nanos() / interval_ns).min(u64::MAX as u128) as u64;
    let bytes = in_flight
        .saturating_mul(RCVBUF_PER_PROBE_BYTES)
        .clamp(RCVBUF_MIN_BYTES, RCVBUF_MAX_BYTES);
    bytes as i32
}

impl ProbeSocket {
    /// `rcvbuf_bytes`: the receive buffer to force (see [`rcvbuf_bytes`]).
    /// The family follows `addr`: an IPv6 socket takes IPv6 only
    /// (IPV6_V6ONLY), so `[::]` and `0.0.0.0` on one port can coexist;
    /// `tos` is its traffic class. The port must be free: no SO_REUSEADDR,
    /// which for UDP would let two sockets share it and split the datagrams.
    pub fn bind(addr: SocketAddr, tos: u8, ts: TsFlags, rcvbuf_bytes: i32) -> Result<Self> {
        Self::bind_flags(addr, tos, ts.bits(), ts.tx, false, rcvbuf_bytes)
    }

    /// Like [`Self::bind`], but no send is TX-timestamped unless it asks:
    /// only the echoes [`Self::send_back_stamping`] is given an OPT_ID for
    /// get one software stamp each. The socket still reports software
    /// stamps with their OPT_ID (and RX stamps if `rx`). Each TX stamp is
    /// an error-queue message charged to the receive buffer the datagrams
    /// arrive in: a reflector that stamped every reply lost datagrams to
    /// its own stamps under a flood, so it stamps a bounded sample.
    pub fn bind_tx_on_request(
        addr: SocketAddr,
        tos: u8,
        rx: bool,
        rcvbuf_bytes: i32,
    ) -> Result<Self> {
        Self::bind_flags(
            addr,
            tos,
            TsFlags::on_request_bits(rx),
            true,
            true,
            rcvbuf_bytes,
        )
    }

    fn bind_flags(
        addr: SocketAddr,
        tos: u8,
        flags: u32,
        opt_id: bool,
        tx_on_request: bool,
        rcvbuf_bytes: i32,
    ) -> Result<Self> {
        let (family, family_name) = match addr {
            SocketAddr::V4(_) => (libc::AF_INET, "AF_INET"),
            SocketAddr::V6(_) => (libc::AF_INET6, "AF_INET6"),
        };
        // SAFETY: plain socket(2) call.
        let fd = cvt(unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })
            .with_context(|| {
                format!("socket({family_name}, SOCK_DGRAM): is this protocol family enabled?")
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
    /// [`SendBatch`] it sends: those then go without an address, and the
    /// kernel reuses the socket's cached route instead of looking one up
    /// per datagram (measured: the route lookup was about 3 % of the
    /// sender's CPU at 100 k probes/s). Datagrams from anywhere but `dst`
    /// are no longer delivered to it.
    pub fn connect(&self, dst: SocketAddr) -> io::Result<()> {
        let sa = sockaddr(dst);
        // SAFETY: sa holds a valid sockaddr of its family, sa.len bytes long.
        cvt(unsafe { libc::connect(self.fd(), sa.ptr(), sa.len) })?;
        self.connected.store(true, Relaxed);
        Ok(())
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Sends one datagram and returns the OPT_ID its TX timestamp will carry.
    pub fn send_to(&self, buf: &[u8], dst: SocketAddr, opt_id: u32) -> io::Result<u32> {
        let sa = sockaddr(dst);
        let mut iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut _,
            iov_len: buf.len(),
        };
        // Space for one cmsg carrying a u32.
        let mut control = [0u64; 4];
        // SAFETY: msghdr is POD.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_name = sa.ptr() as *mut _;
        msg.msg_namelen = sa.len;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if self.per_send_opt_id.load(Relaxed) {
            // SAFETY: control is large and aligned enough for one CMSG_SPACE(4).
            unsafe {
                msg.msg_control = control.as_mut_ptr().cast();
                msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = SCM_TS_OPT_ID;
                (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u32>(), opt_id);
            }
        }
        // SAFETY: msg points to live buffers for the duration of the call.
        let r = unsafe { libc::sendmsg(self.fd(), &msg, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if self.per_send_opt_id.load(Relaxed) && e.raw_os_error() == Some(libc::EINVAL) {
                // Kernel older than 6.13: fall back to the socket counter.
                self.per_send_opt_id.store(false, Relaxed);
                return self.send_to(buf, dst, opt_id);
            }
            return Err(e);
        }
        if self.per_send_opt_id.load(Relaxed) {
            Ok(opt_id)
        } else {
            Ok(self.next_opt_id.fetch_add(1, Relaxed))
        }
    }

    /// Sends the probes `from..` of `batch` with one sendmmsg(2), each with
    /// its own OPT_ID (SCM_TS_OPT_ID; on a connected socket the kernel's
    /// counter, see below). Returns how many the kernel took
    /// (at least one, or the error of the first); their OPT_IDs are in
    /// `batch.opt_id(i)`.
    pub fn send_batch(&self, batch: &mut SendBatch, from: usize) -> io::Result<usize> {
        let connected = self.connected.load(Relaxed);
        // No control message on a connected socket: udp_sendmsg(2) takes
        // any non-UDP cmsg as "not connected" and looks the route up for
        // every datagram (measured: 0.3 µs of the 1.6 µs from send_ns to
        // the SCHED stamp on a calm veth pair, 1.4-3.9 µs on a busy one).
        // The kernel's counter numbers these stamps instead; every send on
        // this socket goes through here or send_to, which keep the mirror
        // in step, and a failed send gives its key back (the kernels with
        // SCM_TS_OPT_ID).
        let per_send = self.per_send_opt_id.load(Relaxed) && !connected;
        let n = batch.prepare(from, per_send, !connected);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: the headers point into `batch`, which outlives the call.
        let r = unsafe { libc::sendmmsg(self.fd(), batch.hdrs[from..].as_mut_ptr(), n as u32, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if per_send && e.raw_os_error() == Some(libc::EINVAL) {
                // Kernel older than 6.13: fall back to the socket counter.
                self.per_send_opt_id.store(false, Relaxed);
                return self.send_batch(batch, from);
            }
            return Err(e);
        }
        let sent = r as usize;
        if !per_send {
            let first = self.next_opt_id.fetch_add(sent as u32, Relaxed);
            for (k, id) in batch.opt_ids[from..from + sent].iter_mut().enumerate() {
                *id = first.wrapping_add(k as u32);
            }
        }
        Ok(sent)
    }

    /// Whether TX timestamps carry the OPT_ID given per send (SCM_TS_OPT_ID,
    /// Linux >= 6.13) rather than the socket's own counter.
    pub fn per_send_opt_id(&self) -> bool {
        self.per_send_opt_id.load(Relaxed)
    }

    /// Sends received datagrams `idx` of `batch` back to where each came
    /// from, in as few sendmmsg(2) calls as the kernel allows; with TX
    /// timestamping on, echo `k` carries OPT_ID `opt_ids[k]`. Returns how
    /// many went out; the first error is returned only if none did.
    pub fn send_back(
        &self,
        batch: &mut RecvBatch,
        idx: &[usize],
        opt_ids: &[u32],
    ) -> io::Result<usize> {
        self.echo(batch, idx, |k| opt_ids.get(k).copied(), |_| None)
    }

    /// [`Self::send_back`] for a socket bound with
    /// [`Self::bind_tx_on_request`]: echo `k` gets a TX stamp, with OPT_ID
    /// `stamps[k]`, only if that is `Some`. On a kernel without per-send
    /// OPT_IDs (< 6.13) nothing is stamped (see [`Self::per_send_opt_id`]):
    /// the socket's counter would count only stamped sends, but a send the
    /// kernel refused after numbering it would shift every later id, and
    /// a shifted id pairs a stamp with another probe's arrival.
    /// Echo `k` leaves from address `from[k]` if that is `Some` (a socket
    /// bound to a wildcard address would otherwise answer from whichever
    /// address routing picks).
    pub fn send_back_stamping(
        &self,
        batch: &mut RecvBatch,
        idx: &[usize],
        stamps: &[Option<u32>],
        from: &[Option<IpAddr>],
    ) -> io::Result<usize> {
        self.echo(
            batch,
            idx,
            |k| stamps.get(k).copied().flatten(),
            |k| from.get(k).copied().flatten(),
        )
    }

    fn echo(
        &self,
        batch: &mut RecvBatch,
        idx: &[usize],
        opt_id: impl Fn(usize) -> Option<u32>,
        from: impl Fn(usize) -> Option<IpAddr>,
    ) -> io::Result<usize> {
        let mut per_send = self.per_send_opt_id.load(Relaxed);
        let no_id = |_| None;
        if per_send {
            batch.prepare_echo(idx, self.tx_on_request, &opt_id, &from);
        } else {
            batch.prepare_echo(idx, false, &no_id, &from);
        }
        // Retrying without ids after an EINVAL: an IPv6 source address that
        // has gone since the probe arrived is refused with EINVAL too (IPv4
        // says ENETUNREACH), so only a retry that goes out proves the
        // kernel lacks per-send ids.
        let mut retrying_without_ids = false;
        let mut done = 0;
        let mut failed = 0;
        let mut first_err = None;
        while done < idx.len() {
            // SAFETY: the echo headers point into `batch`'s own buffers.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd(),
                    batch.echo_hdrs[done..idx.len()].as_mut_ptr(),
                    (idx.len() - done) as u32,
                    0,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if per_send && e.raw_os_error() == Some(libc::EINVAL) {
                    // Kernel older than 6.13 (no per-send OPT_ID), or a
                    // refused source: the retry tells.
                    per_send = false;
                    retrying_without_ids = true;
                    batch.prepare_echo(idx, false, &no_id, &from);
                    continue;
                }
                if std::mem::take(&mut retrying_without_ids) {
                    per_send = true;
                    batch.prepare_echo(idx, self.tx_on_request, &opt_id, &from);
                }
                first_err.get_or_insert(e);
                // Skip the datagram that failed (counted) and go on with the rest.
                done += 1;
                failed += 1;
            } else {
                if std::mem::take(&mut retrying_without_ids) {
                    self.per_send_opt_id.store(false, Relaxed);
                }
                done += r as usize;
            }
        }
        match first_err {
            Some(e) if failed == idx.len() => Err(e),
            _ => Ok(idx.len() - failed),
        }
    }

    /// Waits up to `timeout_ms` for data (POLLIN) or error-queue messages
    /// (POLLERR). Returns (readable, errqueue).
    pub fn wait(&self, timeout_ms: i32) -> io::Result<(bool, bool)> {
        let mut p = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok((false, false));
            }
            return Err(e);
        }
        Ok((
            p.revents & libc::POLLIN != 0,
            p.revents & libc::POLLERR != 0,
        ))
    }

    /// Receives up to a batch of datagrams without blocking (recvmmsg with
    /// MSG_DONTWAIT), from the error queue when `errqueue`. Returns how many.
    pub fn recv_batch(&self, batch: &mut RecvBatch, errqueue: bool) -> io::Result<usize> {
        let flags = libc::MSG_DONTWAIT | if errqueue { libc::MSG_ERRQUEUE } else { 0 };
        self.recvmmsg(batch, flags)
    }

    fn recvmmsg(&self, batch: &mut RecvBatch, flags: libc::c_int) -> io::Result<usize> {
        batch.prepare();
        // SAFETY: batch owns every buffer the headers point to.
        let n = unsafe {
            libc::recvmmsg(
                self.fd(),
                batch.hdrs.as_mut_ptr(),
                batch.hdrs.len() as u32,
                flags,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        batch.filled = n as usize;
        Ok(n as usize)
    }
}

/// Waits up to `timeout_ms` until any of `socks` has data or error-queue
/// messages (sockets of different namespaces can share one poll).
pub fn poll_any(socks: &[&ProbeSocket], timeout_ms: i32) -> io::Result<()> {
    let mut fds: Vec<libc::pollfd> = socks
        .iter()
        .map(|s| libc::pollfd {
            fd: s.fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: fds is a valid array of fds.len() pollfds.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// Waits up to `timeout_ms` for any of `socks` to have data or queued
/// timestamps, and puts the indexes of those that do in `ready`. `fds` is
/// the caller's buffer, reused from call to call.
pub fn poll_ready(
    socks: &[&ProbeSocket],
    timeout_ms: i32,
    fds: &mut Vec<libc::pollfd>,
    ready: &mut Vec<usize>,
) -> io::Result<()> {
    fds.clear();
    fds.extend(socks.iter().map(|s| libc::pollfd {
        fd: s.fd(),
        events: libc::POLLIN,
        revents: 0,
    }));
    ready.clear();
    // SAFETY: fds is a valid array of fds.len() pollfds.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
        return Ok(());
    }
    // POLLERR: a TX timestamp waits on the error queue.
    ready.extend((0..fds.len()).filter(|&i| fds[i].revents != 0));
    Ok(())
}

const CONTROL_LEN: usize = 256;

/// Writes SOL_SOCKET control messages of one u32 each (type, value) into
/// `h.msg_control` and sets `h.msg_controllen`.
///
/// # Safety
/// `h.msg_control` must point to 8-byte aligned memory of at least
/// `cmsgs.len() * CMSG_SPACE(4)` bytes that nothing else uses meanwhile.
unsafe fn write_u32_cmsgs(h: &mut libc::msghdr, cmsgs: &[(libc::c_int, u32)]) {
    // SAFETY: the caller vouches for the buffer. Each header is placed at
    // k * CMSG_SPACE(4) (what CMSG_NXTHDR would give) without reading the
    // stale length CMSG_NXTHDR looks at.
    unsafe {
        let space = libc::CMSG_SPACE(4) as usize;
        h.msg_controllen = cmsgs.len() * space;
        let base = h.msg_control.cast::<u8>();
        for (k, &(ty, v)) in cmsgs.iter().enumerate() {
            let c = base.add(k * space).cast::<libc::cmsghdr>();
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = ty;
            (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u32>(), v);
        }
    }
}

/// Buffers for one recvmmsg() call (and for echoing what it received).
pub struct RecvBatch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    bufs: Vec<Vec<u8>>,
    controls: Vec<[u64; CONTROL_LEN / 8]>,
    addrs: Vec<libc::sockaddr_storage>,
    filled: usize,
    echo_hdrs: Vec<libc::mmsghdr>,
    echo_iovs: Vec<libc::iovec>,
    echo_controls: Vec<[u64; ECHO_CONTROL_U64S]>,
}

/// `n` all-zero C structs (msghdr, mmsghdr, iovec, sockaddr_storage: all-zero
/// is a valid, empty value for each of them).
fn zeroed_vec<T: ZeroedPod>(n: usize) -> Vec<T> {
    // SAFETY: ZeroedPod is only implemented for C structs valid when zeroed.
    (0..n).map(|_| unsafe { zeroed() }).collect()
}

/// C structs for which all-zero bytes are a valid value.
trait ZeroedPod {}
impl ZeroedPod for libc::mmsghdr {}
impl ZeroedPod for libc::iovec {}
impl ZeroedPod for libc::sockaddr_storage {}

// SAFETY: the raw pointers in the headers only point into the batch's own
// buffers, which nothing else shares, and `prepare`/`prepare_echo` rewrite
// them (under `&mut self`) right before every recvmmsg/sendmmsg that reads
// them; no pointer made on one thread is used after a move to another.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    pub fn new(n: usize, buf_len: usize) -> Self {
        Self {
            hdrs: zeroed_vec(n),
            iovs: zeroed_vec(n),
            bufs: (0..n).map(|_| vec![0u8; buf_len]).collect(),
            controls: vec![[0u64; CONTROL_LEN / 8]; n],
            addrs: zeroed_vec(n),
            filled: 0,
            echo_hdrs: zeroed_vec(n),
            echo_iovs: zeroed_vec(n),
            echo_controls: vec![[0u64; ECHO_CONTROL_U64S]; n],
        }
    }

    /// Headers for sending received messages `idx` back to their sources;
    /// echo `k` carries OPT_ID `opt_id(k)` if it is `Some`, and with
    /// `request_tx` also asks for its TX stamp ([`TX_ON_REQUEST`]); it
    /// leaves from address `from(k)` if that is `Some`.
    fn prepare_echo(
        &mut self,
        idx: &[usize],
        request_tx: bool,
        opt_id: &dyn Fn(usize) -> Option<u32>,
        from: &dyn Fn(usize) -> Option<IpAddr>,
    ) {
        for (k, &i) in idx.iter().enumerate() {
            let len = (self.hdrs[i].msg_len as usize).min(self.bufs[i].len());
            self.echo_iovs[k] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: len,
            };
            let h = &mut self.echo_hdrs[k].msg_hdr;
            // The length the kernel wrote on receive (the source's family).
            h.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = self.hdrs[i].msg_hdr.msg_namelen;
            h.msg_iov = &mut self.echo_iovs[k];
            h.msg_iovlen = 1;
            h.msg_flags = 0;
            h.msg_control = self.echo_controls[k].as_mut_ptr().cast();
            h.msg_controllen = 0;
            if let Some(id) = opt_id(k) {
                let cmsgs = [(SCM_TS_OPT_ID, id), (libc::SO_TIMESTAMPING, TX_ON_REQUEST)];
                let n = if request_tx { 2 } else { 1 };
                // SAFETY: echo_controls[k] is ECHO_CONTROL_U64S * 8
                // aligned bytes, enough for two CMSG_SPACE(4) (tested).
                unsafe { write_u32_cmsgs(h, &cmsgs[..n]) };
            }
            if let Some(src) = from(k) {
                // SAFETY: u64s viewed as the bytes they are, borrowed
                // only here.
                let bytes: &mut [u8] = unsafe {
                    std::slice::from_raw_parts_mut(
                        self.echo_controls[k].as_mut_ptr().cast(),
                        ECHO_CONTROL_U64S * 8,
                    )
                };
                let at = h.msg_controllen;
                let room = (&mut bytes[at..at + cmsg::SOURCE_SPACE])
                    .try_into()
                    .expect("room for the source after two u32 messages (tested)");
                h.msg_controllen += cmsg::put_source(room, src);
            }
            if h.msg_controllen == 0 {
                h.msg_control = std::ptr::null_mut();
            }
            self.echo_hdrs[k].msg_len = 0;
        }
    }

    fn prepare(&mut self) {
        self.filled = 0;
        for i in 0..self.hdrs.len() {
            self.iovs[i] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: self.bufs[i].len(),
            };
            let h = &mut self.hdrs[i].msg_hdr;
            h.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as u32;
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = self.controls[i].as_mut_ptr().cast();
            h.msg_controllen = CONTROL_LEN;
            h.msg_flags = 0;
            self.hdrs[i].msg_len = 0;
        }
    }

    pub fn len(&self) -> usize {
        self.filled
    }

    /// How many messages one receive can take.
    pub fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.filled == 0
    }

    /// Payload, source address and parsed control messages of message `i`.
    pub fn get(&mut self, i: usize) -> (&mut [u8], SocketAddr, Cmsgs) {
        let h = &self.hdrs[i];
        let len = (h.msg_len as usize).min(self.bufs[i].len());
        let clen = h.msg_hdr.msg_controllen.min(CONTROL_LEN);
        // SAFETY: controls[i] is CONTROL_LEN bytes of initialized u64s.
        let control =
            unsafe { std::slice::from_raw_parts(self.controls[i].as_ptr().cast::<u8>(), clen) };
        let c = cmsg::parse(control);
        let src = from_sockaddr(&self.addrs[i]);
        (&mut self.bufs[i][..len], src, c)
    }
}

/// Probes for one sendmmsg() call, each with its own payload and OPT_ID.
pub struct SendBatch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    bufs: Vec<Vec<u8>>,
    controls: Vec<[u64; 4]>,
    opt_ids: Vec<u32>,
    dst: RawAddr,
    len: usize,
}

// SAFETY: the raw pointers in the headers only point into the batch's own
// buffers (and `dst`), which nothing else shares, and `prepare` rewrites them
// (under `&mut self`) right before every sendmmsg that reads them, so a move
// to another thread leaves no pointer to the old place in use.
unsafe impl Send for SendBatch {}

impl SendBatch {
    /// Room for `cap` probes of `size` bytes (zero padded) to `dst`.
    pub fn new(cap: usize, size: usize, dst: SocketAddr) -> Self {
        Self {
            hdrs: zeroed_vec(cap),
            iovs: zeroed_vec(cap),
            bufs: (0..cap).map(|_| vec![0u8; size]).collect(),
            controls: vec![[0u64; 4]; cap],
            opt_ids: vec![0; cap],
            dst: sockaddr(dst),
            len: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.bufs.len()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Empties the batch and makes it send `size`-byte probes to `dst`:
    /// one batch serves the sender's every target, its buffers reused.
    pub fn retarget(&mut self, dst: SocketAddr, size: usize) {
        self.dst = sockaddr(dst);
        for b in &mut self.bufs {
            b.resize(size, 0);
        }
        self.len = 0;
    }

    /// Adds a probe whose TX timestamp should carry `opt_id` and returns its
    /// payload to fill. Panics past the capacity (a caller bug).
    pub fn push(&mut self, opt_id: u32) -> &mut [u8] {
        let i = self.len;
        self.len += 1;
        self.opt_ids[i] = opt_id;
        &mut self.bufs[i]
    }

    /// The OPT_ID the TX timestamp of probe `i` will carry (after sending).
    pub fn opt_id(&self, i: usize) -> u32 {
        self.opt_ids[i]
    }

    /// Headers for probes `from..`; `with_name`: each carries the
    /// destination (else the socket is connected to it).
    fn prepare(&mut self, from: usize, per_send_opt_id: bool, with_name: bool) -> usize {
        for i in from..self.len {
            self.iovs[i] = libc::iovec {
                iov_base: self.bufs[i].as_mut_ptr().cast(),
                iov_len: self.bufs[i].len(),
            };
            let h = &mut self.hdrs[i].msg_hdr;
            if with_name {
                h.msg_name = (&mut self.dst.storage as *mut libc::sockaddr_storage).cast();
                h.msg_namelen = self.dst.len;
            } else {
                h.msg_name = std::ptr::null_mut();
                h.msg_namelen = 0;
            }
            h.msg_iov = &mut self.iovs[i];
            h.msg_iovlen = 1;
            h.msg_flags = 0;
            if per_send_opt_id {
                h.msg_control = self.controls[i].as_mut_ptr().cast();
                // SAFETY: controls[i] is 32 aligned bytes, enough for CMSG_SPACE(4).
                unsafe {
                    h.msg_controllen = libc::CMSG_SPACE(4) as usize;
                    let c = libc::CMSG_FIRSTHDR(h);
                    (*c).cmsg_level = libc::SOL_SOCKET;
                    (*c).cmsg_type = SCM_TS_OPT_ID;
                    (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u32>(), self.opt_ids[i]);
                }
            } else {
                h.msg_control = std::ptr::null_mut();
                h.msg_controllen = 0;
            }
            self.hdrs[i].msg_len = 0;
        }
        self.len.saturating_sub(from)
    }
}

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
pub struct HwTimestamping {
    sock: OwnedFd,
    ifname: String,
    previous: HwtstampConfig,
}

impl HwTimestamping {
    /// Asks the NIC for TX and all-RX hardware timestamps. Call inside the
    /// interface's namespace. Err means the NIC/driver cannot (veth: EOPNOTSUPP).
    pub fn enable(ifname: &str) -> io::Result<Self> {
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

#[cfg(test)]
mod addr_tests {
    use std::net::SocketAddr;

    use super::{from_sockaddr, sockaddr};

    #[test]
    fn both_families_round_trip_through_the_kernel_layout() {
        for a in [
            "192.0.2.7:862",
            "0.0.0.0:0",
            "[2001:db8::2]:862",
            "[::]:5061",
            "[fe80::1%3]:9",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            let raw = sockaddr(a);
            let want = match a {
                SocketAddr::V4(_) => size_of::<libc::sockaddr_in>(),
                SocketAddr::V6(_) => size_of::<libc::sockaddr_in6>(),
            };
            assert_eq!(raw.len as usize, want, "{a}");
            assert_eq!(from_sockaddr(&raw.storage), a);
        }
        // Network byte order, as the kernel reads it.
        let raw = sockaddr("[2001:db8::2]:862".parse().unwrap());
        // SAFETY: raw.ptr() points to raw.storage, at least raw.len bytes.
        let bytes: &[u8] =
            unsafe { std::slice::from_raw_parts(raw.ptr().cast::<u8>(), raw.len as usize) };
        assert_eq!(&bytes[2..4], &862u16.to_be_bytes());
        assert_eq!(&bytes[8..12], &[0x20, 0x01, 0x0d, 0xb8]);
    }

    #[test]
    fn an_unknown_family_reads_as_unspecified() {
        // SAFETY: all-zero is a valid sockaddr_storage (family AF_UNSPEC).
        let s: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        assert_eq!(
            from_sockaddr(&s),
            "0.0.0.0:0".parse::<SocketAddr>().unwrap()
        );
    }
}

#[cfg(test)]
mod rcvbuf_tests {
    use std::time::Duration;

    use super::rcvbuf_bytes;

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

#[cfg(test)]
mod connected_tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use super::{ProbeSocket, RecvBatch, SendBatch, TsFlags};

    pub(super) fn local_port(s: &ProbeSocket) -> u16 {
        // SAFETY: sockaddr_in is plain old data.
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: getsockname fills a sockaddr_in of the given size.
        let r = unsafe {
            libc::getsockname(s.fd(), (&mut sa as *mut libc::sockaddr_in).cast(), &mut len)
        };
        assert_eq!(r, 0);
        u16::from_be(sa.sin_port)
    }

    #[test]
    fn a_connected_socket_sends_batches_without_an_address_and_keeps_every_stamp() {
        let lo = Ipv4Addr::LOCALHOST;
        let ts = TsFlags {
            tx: true,
            rx: true,
            hardware: false,
        };
        let rx = ProbeSocket::bind(SocketAddr::new(lo.into(), 0), 0, ts, 1 << 20).unwrap();
        let dst = SocketAddr::new(lo.into(), local_port(&rx));
        let tx = ProbeSocket::bind(SocketAddr::new(lo.into(), 0), 0, ts, 1 << 20).unwrap();
        tx.connect(dst).unwrap();
        // A warm-up probe first, as the engine sends one: its id must not
        // shift the batch's.
        let warm_up_id = tx.send_to(&[6u8; 32], dst, u32::MAX - 1).unwrap();
        let mut batch = SendBatch::new(4, 32, dst);
        for id in [7u32, 8, 9] {
            batch.push(id)[0] = id as u8;
        }
        let mut sent = 0;
        while sent < batch.len() {
            sent += tx.send_batch(&mut batch, sent).unwrap();
        }
        // Headers without a destination: the socket's own is used; and
        // without a control message, which would make the kernel look the
        // route up per datagram instead of using the connected one.
        assert!(batch.hdrs[0].msg_hdr.msg_name.is_null());
        assert_eq!(batch.hdrs[0].msg_hdr.msg_namelen, 0);
        assert_eq!(batch.hdrs[0].msg_hdr.msg_controllen, 0);
        let mut got = RecvBatch::new(8, 64);
        let mut payloads = Vec::new();
        for _ in 0..100 {
            let n = rx.recv_batch(&mut got, false).unwrap();
            payloads.extend((0..n).map(|i| got.get(i).0[0]));
            if payloads.len() == 4 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(payloads, [6, 7, 8, 9]);
        // Every datagram's TX stamps carry the OPT_ID the socket reported
        // for it: the batch's from the kernel's counter (0.. whether or not
        // the warm-up had its own id), the warm-up's its own or the counter's.
        let mut want: Vec<u32> = (0..3).map(|i| batch.opt_id(i)).collect();
        want.push(warm_up_id);
        want.sort_unstable();
        if tx.per_send_opt_id() {
            assert_eq!(want, [0, 1, 2, u32::MAX - 1]);
        } else {
            assert_eq!(want, [0, 1, 2, 3]);
        }
        let mut ids = Vec::new();
        for _ in 0..100 {
            let n = tx.recv_batch(&mut got, true).unwrap();
            ids.extend((0..n).filter_map(|i| got.get(i).2.tx_stamp().map(|(id, _, _)| id)));
            if n == 0 && !ids.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids, want);
    }
}

#[cfg(test)]
mod on_request_tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use super::{
        ECHO_CONTROL_U64S, ProbeSocket, RecvBatch, SendBatch, TX_ON_REQUEST, TsFlags,
        connected_tests::local_port, write_u32_cmsgs,
    };
    use crate::probe::cmsg::TxKind;

    fn lo(port: u16) -> SocketAddr {
        SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port)
    }

    /// Every TX stamp on `s`'s error queue, waiting up to about 300 ms for
    /// `want` of them (and 30 ms more for any extra).
    fn tx_stamps(s: &ProbeSocket, want: usize) -> Vec<(u32, TxKind)> {
        let mut got = RecvBatch::new(16, 256);
        let mut out = Vec::new();
        for round in 0..40 {
            let n = s.recv_batch(&mut got, true).unwrap();
            out.extend((0..n).filter_map(|i| got.get(i).2.tx_stamp().map(|(id, k, _)| (id, k))));
            if out.len() >= want && round > 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        out.sort_unstable_by_key(|&(id, _)| id);
        out
    }

    #[test]
    fn two_cmsgs_fit_the_echo_control_buffer() {
        // SAFETY: CMSG_SPACE is arithmetic.
        let space = unsafe { libc::CMSG_SPACE(4) } as usize;
        assert!(
            2 * space + super::cmsg::SOURCE_SPACE <= ECHO_CONTROL_U64S * 8,
            "{space}"
        );
    }

    #[test]
    fn only_the_echoes_asked_for_are_stamped_once_each_with_their_ids() {
        let plain = TsFlags {
            tx: false,
            rx: false,
            hardware: false,
        };
        let refl = ProbeSocket::bind_tx_on_request(lo(0), 0, true, 1 << 20).unwrap();
        let client = ProbeSocket::bind(lo(0), 0, plain, 1 << 20).unwrap();
        let dst = lo(local_port(&refl));
        let mut out = SendBatch::new(4, 32, dst);
        for id in 0..4u32 {
            out.push(id)[0] = id as u8;
        }
        let mut sent = 0;
        while sent < out.len() {
            sent += client.send_batch(&mut out, sent).unwrap();
        }
        let mut batch = RecvBatch::new(8, 64);
        let mut n = 0;
        for _ in 0..100 {
            n = refl.recv_batch(&mut batch, false).unwrap();
            if n > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(n, 4, "all four arrive in one batch on loopback");
        let idx = [0, 1, 2, 3];
        let stamps = [Some(10), None, Some(12), None];
        assert_eq!(
            refl.send_back_stamping(&mut batch, &idx, &stamps, &[None; 4])
                .unwrap(),
            4
        );
        let got = tx_stamps(&refl, 2);
        if refl.per_send_opt_id() {
            // One driver stamp per stamped echo, no SCHED stamp.
            assert_eq!(got, [(10, TxKind::Software), (12, TxKind::Software)]);
        } else {
            // Kernel < 6.13: the fallback stamps nothing.
            assert_eq!(got, []);
        }
        // Stamped or not, every echo went out.
        let mut echoes = 0;
        for _ in 0..100 {
            echoes += client.recv_batch(&mut batch, false).unwrap();
            if echoes == 4 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(echoes, 4);
    }

    /// What the OPT_ID fallback would rely on, checked on this kernel: the
    /// socket's counter numbers only the sends that asked for a stamp.
    #[test]
    fn the_kernels_opt_id_counter_counts_only_stamped_sends() {
        let refl = ProbeSocket::bind_tx_on_request(lo(0), 0, false, 1 << 20).unwrap();
        let sink = ProbeSocket::bind_tx_on_request(lo(0), 0, false, 1 << 20).unwrap();
        let dst = super::sockaddr(lo(local_port(&sink)));
        for k in 0..6u8 {
            let buf = [k; 8];
            let mut iov = libc::iovec {
                iov_base: buf.as_ptr() as *mut _,
                iov_len: buf.len(),
            };
            let mut control = [0u64; ECHO_CONTROL_U64S];
            // SAFETY: msghdr is POD.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_name = dst.ptr() as *mut _;
            msg.msg_namelen = dst.len;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            // Sends 1, 3 and 4 ask for a stamp, without an id of their own.
            if matches!(k, 1 | 3 | 4) {
                msg.msg_control = control.as_mut_ptr().cast();
                // SAFETY: control is 64 aligned bytes, room for one cmsg.
                unsafe { write_u32_cmsgs(&mut msg, &[(libc::SO_TIMESTAMPING, TX_ON_REQUEST)]) };
            }
            // SAFETY: msg points to live buffers for the call.
            assert_eq!(unsafe { libc::sendmsg(refl.fd(), &msg, 0) }, 8);
        }
        let got = tx_stamps(&refl, 3);
        eprintln!("kernel OPT_IDs of the three stamped sends out of six: {got:?}");
        assert_eq!(
            got,
            [
                (0, TxKind::Software),
                (1, TxKind::Software),
                (2, TxKind::Software)
            ]
        );
    }
}
