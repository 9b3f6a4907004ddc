//! A rehearsal of a probe's way through this host's stack, on loopback,
//! shortly before each send: one datagram from a socket with the probe
//! socket's options to itself, read back with its TX stamps. A sender
//! that sleeps between probes finds its CPU's caches and branch history
//! taken by whatever ran meanwhile (on a VM, by the host while the vCPU
//! halted), and its probe pays for the refill on the way: on the project's
//! VM the first of two probes sent back to back after a 1 ms sleep took
//! 5.4-6.4 µs from the user-space send to the echo's RX stamp, the second
//! 4.2-4.4 µs, as fast as a sender that never sleeps (`--busy-poll`).
//! The rehearsal refills them with the same kernel code (UDP send, the
//! timestamping, the qdisc layer, the device's transmit and the receive
//! softirq, UDP receive, the error queue) without a packet on the path
//! being measured. See docs/BENCHMARKS.md ("What a sleeping sender pays").
//!
//! Kernel interfaces: a UDP socket on the loopback device of the sender's
//! network namespace with SO_TIMESTAMPING, connect(2), sendmsg(2),
//! recvmmsg(2) and MSG_ERRQUEUE; getsockname(2).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use super::{ProbeSocket, RecvBatch, SendBatch, TsFlags};

/// The warm-up socket's receive buffer: a few datagrams and their stamps.
const RCVBUF_BYTES: i32 = 256 << 10;

/// Rehearses the send path on loopback (see the module doc).
pub(crate) struct Warmer {
    sock: ProbeSocket,
    send: SendBatch,
    size: usize,
    batch: RecvBatch,
    errq: RecvBatch,
}

impl Warmer {
    /// A warmer for `size`-byte probes with traffic class `tos`, over
    /// IPv6 (`::1`) for IPv6 probes where it can, else IPv4; None (with
    /// the reason at debug level) where loopback cannot carry it, e.g. a
    /// namespace whose `lo` is down: the sender then goes without.
    pub(crate) fn new(size: usize, tos: u8, ipv6: bool) -> Option<Self> {
        let v6 = ipv6
            .then(|| Self::on(SocketAddr::new(Ipv6Addr::LOCALHOST.into(), 0), size, tos))
            .and_then(|w| w.map_err(|e| log::debug!("no warm-up on ::1: {e}")).ok());
        v6.or_else(|| {
            Self::on(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0), size, tos)
                .map_err(|e| log::debug!("no send-path warm-up on loopback: {e}"))
                .ok()
        })
    }

    /// One on the loopback address `any` (port 0).
    fn on(any: SocketAddr, size: usize, tos: u8) -> std::io::Result<Self> {
        let ts = TsFlags {
            tx: true,
            rx: true,
            hardware: false,
        };
        // Room for the datagram and its two stamps (each charged to it).
        let sock = ProbeSocket::bind(any, tos, ts, RCVBUF_BYTES).map_err(std::io::Error::other)?;
        let own = sock.local_addr()?;
        // Connected, as the probe sockets are: the same send path.
        sock.connect(own)?;
        let mut w = Warmer {
            sock,
            send: SendBatch::new(1, size, own),
            size,
            batch: RecvBatch::new(4, size.max(64)),
            errq: RecvBatch::new(4, 64),
        };
        // The first datagram proves the way (its receive may be left to
        // ksoftirqd on a busy CPU: give it a moment).
        if w.rehearse()? > 0 {
            return Ok(w);
        }
        for _ in 0..100 {
            std::thread::sleep(std::time::Duration::from_millis(1));
            if w.sock.recv_batch(&mut w.batch, false)? > 0 {
                return Ok(w);
            }
        }
        Err(std::io::Error::other("the datagram did not come back"))
    }

    /// One rehearsal: the datagram out and back, and what its socket has
    /// queued read (on loopback the datagram and its stamps are queued by
    /// the time the send returns, unless a busy CPU left the receive to
    /// ksoftirqd: then the next rehearsal reads it).
    pub(crate) fn run(&mut self) {
        let _ = self.rehearse();
    }

    /// [`Self::run`]: how many datagrams it read, or why it could not send.
    fn rehearse(&mut self) -> std::io::Result<usize> {
        self.send.clear();
        self.send.push(0)[..self.size.min(8)].fill(0);
        self.sock.send_batch(&mut self.send, 0)?;
        let mut got = 0;
        loop {
            let n = self.sock.recv_batch(&mut self.batch, false).unwrap_or(0);
            got += n;
            if n < self.batch.capacity() {
                break;
            }
        }
        while self.sock.recv_batch(&mut self.errq, true).unwrap_or(0) == self.errq.capacity() {}
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rehearsals_leave_nothing_queued_for_long() {
        let mut w = Warmer::new(64, 0, false).expect("loopback is up where the unit tests run");
        for _ in 0..100 {
            w.run();
        }
        // What a busy CPU left for later is read by the next rehearsals;
        // nothing piles up (each reads up to a batch more than it sent).
        std::thread::sleep(std::time::Duration::from_millis(20));
        w.run();
        std::thread::sleep(std::time::Duration::from_millis(20));
        w.run();
        assert!(w.sock.recv_batch(&mut w.batch, false).unwrap() <= 1);
    }
}
