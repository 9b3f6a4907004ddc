//! The bulk TCP load: N connections from the sender namespace to a
//! listener in the receiver namespace, each written flat out (paced with
//! SO_MAX_PACING_RATE below 100 %) and read to the end; TCP_INFO's bytes
//! acknowledged for the achieved rate.

use std::{
    io::{Read, Write},
    net::{SocketAddrV4, TcpListener, TcpStream},
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};

use super::{Counters, Flow, Load, LoadSpec, LoadTarget, POLL, available_cc, check_cc, setsockopt};
use crate::{
    sys::{Netns, Sys},
    tune::amounts::Rate,
};

/// A TCP socket with congestion control and pacing set, connected to dst;
/// a congestion control the kernel lacks is named with the ones it has
/// (read through `sys`).
fn tcp_connect(
    sys: &dyn Sys,
    dst: SocketAddrV4,
    cc: Option<&str>,
    pacing: Option<Rate>,
) -> Result<TcpStream> {
    tcp_connect_within(Some(sys), dst, cc, pacing, None)
}

/// Sets TCP_CONGESTION. With `sys`, an error names the congestion controls
/// the kernel has. The fetch load's threads outlive the `Sys` they were
/// started with and pass None: the start already set their congestion
/// control once through `sys`, so the kernel's error is enough.
pub(super) fn set_cc(sys: Option<&dyn Sys>, fd: &impl AsRawFd, cc: &str) -> Result<()> {
    // SAFETY: cc bytes are valid for their length.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            cc.as_ptr() as *const libc::c_void,
            cc.len() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        let Some(sys) = sys else {
            return Err(anyhow!("TCP_CONGESTION {cc}: {e}"));
        };
        let avail = available_cc(sys).unwrap_or_default();
        return Err(match check_cc(cc, &avail) {
            Err(m) => anyhow!(m),
            Ok(()) => anyhow!("TCP_CONGESTION {cc}: {e}"),
        });
    }
    Ok(())
}

/// As `tcp_connect`; a connect that takes longer than `timeout` fails
/// (SO_SNDTIMEO bounds a blocking connect). `sys` as for [`set_cc`].
pub(super) fn tcp_connect_within(
    sys: Option<&dyn Sys>,
    dst: SocketAddrV4,
    cc: Option<&str>,
    pacing: Option<Rate>,
    timeout: Option<Duration>,
) -> Result<TcpStream> {
    // SAFETY: plain socket(2); owned right away.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("socket(AF_INET, SOCK_STREAM)");
    }
    // SAFETY: fresh descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    if let Some(cc) = cc {
        set_cc(sys, &fd, cc)?;
    }
    if let Some(r) = pacing {
        let bytes: u64 = r.bytes_per_sec().max(1);
        setsockopt(
            &fd,
            libc::SOL_SOCKET,
            libc::SO_MAX_PACING_RATE,
            &bytes,
            "SO_MAX_PACING_RATE",
        )?;
    }
    let stream = TcpStream::from(fd);
    if let Some(t) = timeout {
        stream.set_write_timeout(Some(t.max(Duration::from_millis(1))))?;
    }
    // std has no connect on an existing socket; do it by hand.
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: dst.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*dst.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sa is a valid sockaddr_in.
    let r = unsafe {
        libc::connect(
            stream.as_raw_fd(),
            &sa as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("connect to {dst}"));
    }
    Ok(stream)
}

pub(super) fn start_tcp(
    load: &mut Load,
    t: &LoadTarget<'_>,
    spec: &LoadSpec,
    port: u16,
    cc: Option<String>,
    flows: u32,
    rate: Option<Rate>,
) -> Result<()> {
    let addr = SocketAddrV4::new(t.dst, port);
    let listener = t.receiver.run(|| {
        TcpListener::bind(addr).with_context(|| format!("listen on {addr} for the TCP load"))
    })?;
    listener.set_nonblocking(true)?;
    let per_flow = rate.map(|r| Rate::from_bps(r.bps / flows as u64));
    let mut counters = Vec::new();
    for i in 0..flows {
        let c = Arc::new(Counters::default());
        counters.push(c.clone());
        let stream = t
            .sender
            .run(|| tcp_connect(t.sys, addr, cc.as_deref(), per_flow))
            .with_context(|| format!("TCP load flow {} of {spec}", i + 1))?;
        // Accept it (the SYN is already done: accept returns at once or soon).
        let deadline = Instant::now() + Duration::from_secs(5);
        let tcp_info_fd = stream
            .as_fd()
            .try_clone_to_owned()
            .context("duplicate the TCP load socket for TCP_INFO")?;
        let conn = loop {
            match listener.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        bail!("the TCP load connection to {addr} was not accepted within 5 s");
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => return Err(e).context("accept the TCP load connection"),
            }
        };
        conn.set_nonblocking(false)?;
        let stop_recv = load.stop_recv.clone();
        let rc = c.clone();
        let receiver = std::thread::Builder::new()
            .name(format!("load-rx-{port}"))
            .spawn(move || tcp_reader(conn, &rc, &stop_recv))?;
        let stop_send = load.stop_send.clone();
        let sc = c.clone();
        let sender = std::thread::Builder::new()
            .name(format!("load-tx-{port}"))
            .spawn(move || tcp_writer(stream, &sc, &stop_send))?;
        c.connected.store(true, Ordering::Relaxed);
        load.flows.push(Flow {
            kind: "tcp",
            spec: spec.to_string(),
            port,
            cc: cc.clone().or_else(|| default_cc(t.sys, t.sender).ok()),
            target_bps: per_flow.map(|r| r.bps),
            udp_size: 0,
            counters: c,
            sender: Some(sender),
            receiver: Some(receiver),
            mark_bytes: 0,
            tcp_info_fd: Some(tcp_info_fd),
            mark_acked: None,
            fetch: None,
        });
    }
    Ok(())
}

/// The congestion control new TCP sockets of `ns` get (per namespace
/// since Linux 4.15).
pub(super) fn default_cc(sys: &dyn Sys, ns: &Netns) -> Result<String> {
    sys.sysctl(ns.into(), "net.ipv4.tcp_congestion_control")
}

fn tcp_writer(mut s: TcpStream, _c: &Counters, stop: &AtomicBool) -> Result<()> {
    s.set_write_timeout(Some(POLL))?;
    let buf = vec![0x5au8; 128 * 1024];
    while !stop.load(Ordering::Relaxed) {
        match s.write(&buf) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e).context("TCP load write"),
        }
    }
    let _ = s.shutdown(std::net::Shutdown::Write);
    Ok(())
}

fn tcp_reader(mut s: TcpStream, c: &Counters, stop: &AtomicBool) -> Result<()> {
    s.set_read_timeout(Some(POLL))?;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                c.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e).context("TCP load read"),
        }
    }
}

/// Bytes the peer acknowledged on a TCP socket (tcpi_bytes_acked), None
/// where the kernel does not report it (before 4.1) or TCP_INFO fails.
pub(super) fn tcp_bytes_acked(fd: &impl AsRawFd) -> Option<u64> {
    // SAFETY: tcp_info is plain integers; all zero is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: info is a live tcp_info of `len` bytes; the kernel writes at
    // most `len` and says how much in `len`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            &mut info as *mut libc::tcp_info as *mut libc::c_void,
            &mut len,
        )
    };
    let end = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + std::mem::size_of::<u64>();
    (r == 0 && len as usize >= end).then_some(info.tcpi_bytes_acked)
}
