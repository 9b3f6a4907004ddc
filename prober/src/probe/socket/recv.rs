//! The receive path: datagrams, and TX timestamps from the error queue
//! (MSG_ERRQUEUE), a [`RecvBatch`] per recvmmsg(2) without blocking, with
//! their RX stamps parsed from the control messages; poll(2) on one socket
//! or on the sockets of many namespaces at once.
//!
//! Kernel interfaces: recvmmsg (Linux >= 2.6.33), MSG_ERRQUEUE with
//! SO_TIMESTAMPING (>= 2.6.30).

use std::{io, mem::size_of, net::SocketAddr};

use super::{ProbeSocket, addr::from_sockaddr, echo::ECHO_CONTROL_U64S, zeroed_vec};
use crate::probe::cmsg::{self, Cmsgs};

const CONTROL_LEN: usize = 256;

/// Buffers for one recvmmsg() call (and for echoing what it received).
pub(crate) struct RecvBatch {
    pub(super) hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    pub(super) bufs: Vec<Vec<u8>>,
    controls: Vec<[u64; CONTROL_LEN / 8]>,
    pub(super) addrs: Vec<libc::sockaddr_storage>,
    filled: usize,
    pub(super) echo_hdrs: Vec<libc::mmsghdr>,
    pub(super) echo_iovs: Vec<libc::iovec>,
    pub(super) echo_controls: Vec<[u64; ECHO_CONTROL_U64S]>,
}

// SAFETY: the raw pointers in the headers only point into the batch's own
// buffers, which nothing else shares, and `prepare`/`prepare_echo` rewrite
// them (under `&mut self`) right before every recvmmsg/sendmmsg that reads
// them; no pointer made on one thread is used after a move to another.
unsafe impl Send for RecvBatch {}

impl RecvBatch {
    pub(crate) fn new(n: usize, buf_len: usize) -> Self {
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

    /// How many messages one receive can take.
    pub(crate) fn capacity(&self) -> usize {
        self.hdrs.len()
    }

    /// Payload, source address and parsed control messages of message `i`.
    pub(crate) fn get(&mut self, i: usize) -> (&mut [u8], SocketAddr, Cmsgs) {
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

impl ProbeSocket {
    /// Receives up to a batch of datagrams without blocking (recvmmsg with
    /// MSG_DONTWAIT), from the error queue when `errqueue`. Returns how many.
    pub(crate) fn recv_batch(&self, batch: &mut RecvBatch, errqueue: bool) -> io::Result<usize> {
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
pub(crate) fn poll_any(socks: &[&ProbeSocket], timeout_ms: i32) -> io::Result<()> {
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
pub(crate) fn poll_ready(
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
