//! The probe sockets: UDP with SO_TIMESTAMPING, TX timestamps from the error
//! queue matched by OPT_ID, batch send and receive with sendmmsg(2) and
//! recvmmsg(2), and hardware timestamping switched on with SIOCSHWTSTAMP
//! where the NIC has it.
//!
//! One [`ProbeSocket`], its methods split by what they do:
//! - `open.rs`: socket(2), the timestamping flags, traffic class, buffer
//!   sizes, bind and connect;
//! - `send.rs`: probes out, one datagram or a [`SendBatch`] per
//!   sendmmsg(2), each with the OPT_ID its TX stamp will carry;
//! - `recv.rs`: datagrams and error-queue stamps in, a [`RecvBatch`] per
//!   recvmmsg(2), and poll(2) over the sockets of many namespaces;
//! - `echo.rs`: the reflector's replies, a received batch sent back, a
//!   bounded sample of them TX-stamped;
//! - `addr.rs`: socket addresses in the kernel's layout;
//! - `hwtstamp.rs`: hardware timestamping on a NIC, put back on drop;
//! - `warm.rs`: the send path rehearsed on loopback before a send.
//!
//! Each file names the kernel interfaces it uses and their minimum
//! version. The newest, SCM_TS_OPT_ID (Linux >= 6.13), is optional: older
//! kernels fall back to the socket's own OPT_ID counter.

mod addr;
mod echo;
mod hwtstamp;
mod open;
mod recv;
mod send;
mod warm;

use std::{
    io,
    mem::{size_of, zeroed},
    os::fd::{AsRawFd, OwnedFd, RawFd},
    sync::atomic::{AtomicBool, AtomicU32},
};

pub(crate) use addr::same_endpoint;
pub(crate) use hwtstamp::HwTimestamping;
pub(crate) use open::{TsFlags, rcvbuf_bytes};
pub(crate) use recv::{RecvBatch, poll_any, poll_ready};
pub(crate) use send::SendBatch;
pub(crate) use warm::Warmer;

/// `SCM_TS_OPT_ID` from asm-generic/socket.h (Linux 6.13).
const SCM_TS_OPT_ID: libc::c_int = 81;

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

impl ProbeSocket {
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The address the socket is bound to (getsockname(2)).
    pub(crate) fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        // SAFETY: sockaddr_storage is plain old data, valid when zeroed.
        let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
        let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: getsockname writes at most `len` bytes into `ss`.
        let r = unsafe { libc::getsockname(self.fd(), (&raw mut ss).cast(), &mut len) };
        cvt(r)?;
        Ok(addr::from_sockaddr(&ss))
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

#[cfg(test)]
mod testing {
    use super::ProbeSocket;

    /// The port the kernel gave `s` (an IPv4 socket bound to port 0).
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
}
