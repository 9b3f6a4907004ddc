//! The probe send path: one datagram with sendmsg(2), or a [`SendBatch`]
//! with one sendmmsg(2), each probe with the OPT_ID its TX timestamp will
//! carry: set per send (SCM_TS_OPT_ID) on an unconnected socket, counted
//! by the kernel on a connected one, where a control message would cost a
//! route lookup per datagram.
//!
//! Kernel interfaces: sendmmsg (Linux >= 3.0), SCM_TS_OPT_ID to set the id
//! per send (>= 6.13; older kernels fall back to the socket's own
//! counter).

use std::{io, mem::zeroed, net::SocketAddr, sync::atomic::Ordering::Relaxed};

use super::{
    ProbeSocket, SCM_TS_OPT_ID,
    addr::{RawAddr, sockaddr},
    zeroed_vec,
};

impl ProbeSocket {
    /// Sends one datagram and returns the OPT_ID its TX timestamp will carry.
    pub(crate) fn send_to(&self, buf: &[u8], dst: SocketAddr, opt_id: u32) -> io::Result<u32> {
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

    /// Sends the probes `from..` of `batch` with one sendmmsg(2) (one
    /// probe: sendmsg(2)), each with
    /// its own OPT_ID (SCM_TS_OPT_ID; on a connected socket the kernel's
    /// counter, see below). Returns how many the kernel took
    /// (at least one, or the error of the first); their OPT_IDs are in
    /// `batch.opt_id(i)`.
    pub(crate) fn send_batch(&self, batch: &mut SendBatch, from: usize) -> io::Result<usize> {
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
        // One probe goes with sendmsg(2): sendmmsg's loop (and the
        // cond_resched() after each datagram) cost about 0.3 µs more before
        // the SCHED stamp on a calm veth pair.
        let r = if n == 1 {
            // SAFETY: as below; one header.
            let r = unsafe { libc::sendmsg(self.fd(), &batch.hdrs[from].msg_hdr, 0) };
            if r < 0 { -1 } else { 1 }
        } else {
            // SAFETY: the headers point into `batch`, which outlives the call.
            unsafe { libc::sendmmsg(self.fd(), batch.hdrs[from..].as_mut_ptr(), n as u32, 0) }
        };
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
    pub(crate) fn per_send_opt_id(&self) -> bool {
        self.per_send_opt_id.load(Relaxed)
    }
}

/// Probes for one sendmmsg() call, each with its own payload and OPT_ID.
pub(crate) struct SendBatch {
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
    pub(crate) fn new(cap: usize, size: usize, dst: SocketAddr) -> Self {
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

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// Empties the batch and makes it send `size`-byte probes to `dst`:
    /// one batch serves the sender's every target, its buffers reused.
    pub(crate) fn retarget(&mut self, dst: SocketAddr, size: usize) {
        self.dst = sockaddr(dst);
        for b in &mut self.bufs {
            b.resize(size, 0);
        }
        self.len = 0;
    }

    /// Adds a probe whose TX timestamp should carry `opt_id` and returns its
    /// payload to fill. Panics past the capacity (a caller bug).
    pub(crate) fn push(&mut self, opt_id: u32) -> &mut [u8] {
        let i = self.len;
        self.len += 1;
        self.opt_ids[i] = opt_id;
        &mut self.bufs[i]
    }

    /// The OPT_ID the TX timestamp of probe `i` will carry (after sending).
    pub(crate) fn opt_id(&self, i: usize) -> u32 {
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

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use crate::probe::socket::{ProbeSocket, RecvBatch, SendBatch, TsFlags, testing::local_port};

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
