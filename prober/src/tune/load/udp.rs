//! The constant-bit-rate UDP load: datagrams with a magic, the flow's
//! session and a sequence number, sent on an absolute schedule and
//! counted by a receiver that stamps their arrival in the kernel.

use std::{
    net::{Ipv4Addr, SocketAddrV4, UdpSocket},
    os::fd::AsRawFd,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::{
    Counters, Flow, Load, LoadSpec, LoadTarget, POLL, SentWindow, acct::SeqWindow, setsockopt,
};
use crate::{sys::rt::RtSettings, tune::amounts::Rate};

const MAGIC: u32 = 0x5254_504c; // "RTPL"
/// UDP load header: magic (4), session (4), sequence number (8), big endian.
const UDP_HEADER_BYTES: usize = 16;
/// SCHED_FIFO priority of the UDP load sender: above every normal thread
/// (builds, stress), below any real-time priority given to the probes.
const UDP_SENDER_FIFO_PRIORITY: u8 = 1;
/// A CBR sender this far behind its schedule cannot send this rate on this
/// machine; it gives up SCHED_FIFO so that it cannot starve the rest.
const UDP_SENDER_MAX_FIFO_LAG: Duration = Duration::from_millis(200);

pub(super) fn start_udp(
    load: &mut Load,
    t: &LoadTarget<'_>,
    spec: &LoadSpec,
    port: u16,
    size: u32,
    rate: Rate,
) -> Result<()> {
    let addr = SocketAddrV4::new(t.dst, port);
    let session: u32 = rand::random();
    let rx = t.receiver.run(|| {
        let s = UdpSocket::bind(addr).with_context(|| format!("bind {addr} for the UDP load"))?;
        let rcvbuf: libc::c_int = 8 << 20;
        setsockopt(
            &s,
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &rcvbuf,
            "SO_RCVBUFFORCE",
        )?;
        Ok(s)
    })?;
    let sndbuf_bytes = (t.queue_bytes_hint * 4).clamp(4 << 20, 256 << 20) as libc::c_int;
    let tx = t.sender.run(|| {
        let s = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).context("bind the UDP load sender")?;
        setsockopt(
            &s,
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            &sndbuf_bytes,
            "SO_SNDBUFFORCE",
        )?;
        s.connect(addr)
            .with_context(|| format!("connect the UDP load to {addr}"))?;
        Ok(s)
    })?;
    let c = Arc::new(Counters::default());
    let stop_recv = load.stop_recv.clone();
    let rc = c.clone();
    let receiver = std::thread::Builder::new()
        .name(format!("load-rx-{port}"))
        .spawn(move || udp_reader(rx, session, &rc, &stop_recv))?;
    let stop_send = load.stop_send.clone();
    let sc = c.clone();
    let sender = std::thread::Builder::new()
        .name(format!("load-tx-{port}"))
        .spawn(move || udp_cbr(tx, session, size, rate, &sc, &stop_send))?;
    load.flows.push(Flow {
        kind: "udp",
        spec: spec.to_string(),
        port,
        cc: None,
        target_bps: Some(rate.bps),
        udp_size: size,
        counters: c,
        sender: Some(sender),
        receiver: Some(receiver),
        mark_bytes: 0,
        tcp_info_fd: None,
        mark_acked: None,
        fetch: None,
    });
    Ok(())
}

/// Sends on an absolute schedule: at time t, floor(t * pps) datagrams are
/// due; whatever is due goes out, then the thread sleeps until the next
/// one. Bursts stay within one scheduler wake-up.
fn udp_cbr(
    s: UdpSocket,
    session: u32,
    size: u32,
    rate: Rate,
    c: &Counters,
    stop: &AtomicBool,
) -> Result<()> {
    let pps = rate.bps as f64 / (size as f64 * 8.0);
    let mut buf = vec![0u8; size as usize];
    buf[0..4].copy_from_slice(&MAGIC.to_be_bytes());
    buf[4..8].copy_from_slice(&session.to_be_bytes());
    let mut fifo = sender_fifo();
    let t0 = Instant::now();
    let mut seq: u64 = 0;
    let mut window = SentWindow::default();
    let mut window_open = false;
    while !stop.load(Ordering::Relaxed) {
        let due = (t0.elapsed().as_secs_f64() * pps) as u64;
        if fifo.is_some()
            && due > seq
            && Duration::from_secs_f64((due - seq) as f64 / pps) > UDP_SENDER_MAX_FIFO_LAG
        {
            log::warn!(
                "the UDP load sender is more than {} ms behind its schedule ({} Mbit/s is \
                 more than this machine sends): it continues with normal scheduling",
                UDP_SENDER_MAX_FIFO_LAG.as_millis(),
                rate.bps / 1_000_000
            );
            fifo = None;
            window.fifo = false;
        }
        let mut burst = 0;
        while seq < due && burst < 1024 {
            if c.mark_requested.swap(false, Ordering::AcqRel) {
                // Published before the datagram leaves, so the receiver
                // sees the new window before any datagram of it.
                c.window_lo.store(seq, Ordering::SeqCst);
                window = SentWindow {
                    lo: seq,
                    hi: seq,
                    fifo: fifo.is_some(),
                    ..SentWindow::default()
                };
                window_open = true;
            }
            buf[8..UDP_HEADER_BYTES].copy_from_slice(&seq.to_be_bytes());
            send_counted(&s, &buf, c)?;
            if window_open {
                note_sent(&mut window, t0 + Duration::from_secs_f64(seq as f64 / pps));
            }
            seq += 1;
            burst += 1;
        }
        let next = Duration::from_secs_f64((seq + 1) as f64 / pps);
        let now = t0.elapsed();
        if next > now {
            std::thread::sleep((next - now).min(POLL));
        }
    }
    if c.mark_requested.load(Ordering::Acquire) {
        // Marked but stopped before the next datagram: an empty window.
        c.window_lo.store(seq, Ordering::SeqCst);
        window = SentWindow {
            lo: seq,
            hi: seq,
            fifo: fifo.is_some(),
            ..SentWindow::default()
        };
    } else if window_open {
        // The window closes at the first datagram not sent.
        window.hi = seq;
    }
    *c.sent_window.lock().unwrap_or_else(|p| p.into_inner()) = window;
    Ok(())
}

/// The UDP load sender's SCHED_FIFO guard, None where it lacks the
/// privilege.
///
/// A CBR source the scheduler holds back for longer than the bottleneck
/// queue takes to drain (12 ms for 100 frames at 100 Mbit/s) leaves the
/// link idle and then bursts into a full queue: loss above the
/// calculation that the link did not cause. With a busy CPU that
/// happened for tens of ms at a time. (The study ran its probe server
/// real-time, iperf2 -z; its lab's CBR source had a machine to itself.)
/// Without the privilege it runs as it is.
fn sender_fifo() -> Option<impl Drop> {
    match (RtSettings {
        fifo_priority: Some(UDP_SENDER_FIFO_PRIORITY),
        ..RtSettings::default()
    })
    .apply_to_current_thread()
    {
        Ok(g) => Some(g),
        Err(e) => {
            log::info!("the UDP load sender runs with normal scheduling: {e:#}");
            None
        }
    }
}

/// Sends one datagram and counts it, also when the qdisc dropped it.
fn send_counted(s: &UdpSocket, buf: &[u8], c: &Counters) -> Result<()> {
    match s.send(buf) {
        Ok(_) => {
            c.tx_packets.fetch_add(1, Ordering::Relaxed);
        }
        // A qdisc drop may surface as ENOBUFS: the datagram was
        // sent into the link and lost there, which is the point.
        Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => {
            c.tx_packets.fetch_add(1, Ordering::Relaxed);
        }
        Err(e) => return Err(e).context("UDP load send"),
    }
    Ok(())
}

/// Notes a datagram due at `due_at` that just went out in the window.
fn note_sent(window: &mut SentWindow, due_at: Instant) {
    let now = Instant::now();
    window.first_at.get_or_insert(now);
    window.last_at = Some(now);
    window.max_lag = window.max_lag.max(now.saturating_duration_since(due_at));
}

fn udp_reader(s: UdpSocket, session: u32, c: &Counters, stop: &AtomicBool) -> Result<()> {
    let mut window = SeqWindow::new();
    let r = udp_read_loop(&s, session, c, stop, &mut window);
    *c.received_window.lock().unwrap_or_else(|p| p.into_inner()) = Some(window);
    r
}

fn udp_read_loop(
    s: &UdpSocket,
    session: u32,
    c: &Counters,
    stop: &AtomicBool,
    window: &mut SeqWindow,
) -> Result<()> {
    use nix::{
        errno::Errno,
        sys::{
            socket::{ControlMessageOwned, MsgFlags, recvmsg, setsockopt, sockopt},
            time::TimeSpec,
        },
    };
    s.set_read_timeout(Some(Duration::from_millis(20)))?;
    // The kernel stamps each datagram as it comes off the link (netif_rx),
    // so a receiver thread that is scheduled late does not stretch the
    // window the achieved rate is measured over.
    setsockopt(s, sockopt::ReceiveTimestampns, &true)
        .context("SO_TIMESTAMPNS on the UDP load receiver")?;
    // The socket's drop counter tells a full receive buffer (our side)
    // from a drop in the path.
    setsockopt(s, sockopt::RxqOvfl, &1).context("SO_RXQ_OVFL on the UDP load receiver")?;
    let mut buf = vec![0u8; 65536];
    let mut cmsg = nix::cmsg_space!(TimeSpec, u32);
    let mut drops_base: Option<u32> = None;
    loop {
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let got =
            recvmsg::<()>(s.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::empty()).map(|m| {
                let (mut stamp, mut drops) = (None, 0);
                for c in m.cmsgs().into_iter().flatten() {
                    match c {
                        ControlMessageOwned::ScmTimestampns(ts) => {
                            stamp = Some(Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32));
                        }
                        // Only present once the socket has dropped.
                        ControlMessageOwned::RxqOvfl(n) => drops = n,
                        _ => {}
                    }
                }
                (m.bytes, stamp, drops)
            });
        match got {
            Ok((n, stamp, drops)) if n >= UDP_HEADER_BYTES => {
                if buf[0..4] == MAGIC.to_be_bytes() && buf[4..8] == session.to_be_bytes() {
                    // SCM_TIMESTAMPNS is CLOCK_REALTIME: the same clock
                    // when a stamp is missing.
                    let at = stamp.unwrap_or_else(|| {
                        std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .unwrap_or_default()
                    });
                    c.rx_packets.fetch_add(1, Ordering::Relaxed);
                    c.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    let lo = c.window_lo.load(Ordering::SeqCst);
                    if lo != u64::MAX && window.lo() != Some(lo) {
                        window.restart(lo);
                        drops_base = Some(drops);
                    }
                    if let Some(base) = drops_base {
                        c.socket_drops
                            .store(drops.wrapping_sub(base) as u64, Ordering::Relaxed);
                    }
                    let mut seq = [0u8; 8];
                    seq.copy_from_slice(&buf[8..UDP_HEADER_BYTES]);
                    window.on_datagram(u64::from_be_bytes(seq), n as u64, at);
                }
            }
            Ok(_) => {}
            Err(Errno::EAGAIN | Errno::EINTR) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e).context("UDP load receive"),
        }
    }
}
