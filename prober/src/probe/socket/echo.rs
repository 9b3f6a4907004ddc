//! The reflector's replies: received datagrams of a [`RecvBatch`] sent back
//! to their sources with sendmmsg(2), in place, each with the OPT_ID its TX
//! stamp will carry and, where asked, the local address it leaves from; a
//! socket opened with [`ProbeSocket::bind_tx_on_request`] asks for a TX
//! stamp only on the echoes it samples.
//!
//! Kernel interfaces: sendmmsg (Linux >= 3.0), a TX stamp asked for per
//! send with an SO_TIMESTAMPING control message (>= 4.6), SCM_TS_OPT_ID
//! (>= 6.13; older kernels stamp no echo), the source per reply with
//! IP_PKTINFO / IPV6_PKTINFO (>= 2.6.14).

use std::{io, net::IpAddr, sync::atomic::Ordering::Relaxed};

use super::{ProbeSocket, RecvBatch, SCM_TS_OPT_ID};
use crate::probe::cmsg;

/// What a send on a [`ProbeSocket::bind_tx_on_request`] socket asks for in
/// its SO_TIMESTAMPING control message: the driver's software stamp only
/// (no SCHED stamp: one error-queue message per stamped send).
pub(super) const TX_ON_REQUEST: u32 = libc::SOF_TIMESTAMPING_TX_SOFTWARE;
/// Control buffer per echo: room for SO_TIMESTAMPING and SCM_TS_OPT_ID,
/// each CMSG_SPACE(4) = 24 bytes on 64-bit, and the reply's source
/// ([`cmsg::SOURCE_SPACE`], 40 bytes) (checked in a test).
pub(super) const ECHO_CONTROL_U64S: usize = 12;

impl ProbeSocket {
    /// Sends received datagrams `idx` of `batch` back to where each came
    /// from, in as few sendmmsg(2) calls as the kernel allows; with TX
    /// timestamping on, echo `k` carries OPT_ID `opt_ids[k]`. Returns how
    /// many went out; the first error is returned only if none did.
    pub(crate) fn send_back(
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
    pub(crate) fn send_back_stamping(
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
}

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

impl RecvBatch {
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
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use super::{ECHO_CONTROL_U64S, TX_ON_REQUEST, write_u32_cmsgs};
    use crate::probe::cmsg::TxKind;
    use crate::probe::socket::{
        ProbeSocket, RecvBatch, SendBatch, TsFlags, addr::sockaddr, testing::local_port,
    };

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
        let dst = sockaddr(lo(local_port(&sink)));
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
