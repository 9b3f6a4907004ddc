//! The send-path floor: the lightest sender that keeps rtprobe's socket
//! options (IP_TOS, the forced buffers, SO_TIMESTAMPING with TX_SCHED,
//! TX_SOFTWARE, RX_SOFTWARE, OPT_ID, OPT_TSONLY, connected) and sends
//! rtprobe's datagram, so an rtprobe reflector (the in-kernel one
//! included) answers it. One thread, as ping: sleep until due, read
//! CLOCK_REALTIME, write the probe, one sendmsg(2); then wait for its
//! stamps and its echo. `cargo xtask bench --only rtt` runs it on the bare
//! veth pair next to rtprobe and ping; its figures are the reference for
//! rtprobe's `stack` stage (user send -> SCHED stamp) and for the user
//! send -> echo RX round trip.
//!
//! cargo bench -p rtprobe --bench send_floor -- --target ADDR:PORT
//!     [--count N] [--interval-us U] [--size B] [--no-tx-stamps] [--opt-id-cmsg]
//!     [--poller] [--spin] [--icmp] [--json F]
//!
//! `--icmp` sends ICMP echo requests instead, as ping does, with the same
//! socket options and stamps: an ICMP datagram socket
//! (`socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP)`, allowed by
//! net.ipv4.ping_group_range), else, as iputils ping falls back, a raw
//! socket (CAP_NET_RAW); the JSON says which. The target's own kernel
//! answers (`icmp_echo`), so against a host running `rtprobe reflect
//! --kernel` the two variants compare the XDP reflector's path with the
//! kernel's ICMP reply from the same sender. The payload is `--size`
//! bytes after the 8-byte ICMP header, so the IP packet has the UDP
//! probe's size (`ping -s 64` sends the same); the port is not used.
//! IPv4 only.
//!
//! `--spin` never sleeps, as iputils ping does at intervals under 10 ms
//! (`ping -i 0.001` loops on a non-blocking recvmsg(2) and sched_yield(2)
//! between sends, about 60 % of a core on this project's VM): it waits
//! for the send time and for the echo in that loop, so no send starts on
//! a CPU just woken from idle.
//!
//! `--no-tx-stamps` asks for RX stamps only (as ping does);
//! `--opt-id-cmsg` numbers the stamps with an SCM_TS_OPT_ID per send, as
//! rtprobe's connected sockets did before (any control message makes
//! udp_sendmsg(2) skip the connected socket's cached route and look one up
//! per send); `--poller`
//! receives on a second thread blocked in poll(2), as rtprobe's I/O thread
//! does, so the send path pays that thread's wake-ups.
//!
//! Kernel interfaces: SO_TIMESTAMPING (TX_SCHED >= 3.17, OPT_ID >= 4.0,
//! SCM_TS_OPT_ID >= 6.13), clock_nanosleep(2) TIMER_ABSTIME, poll(2),
//! ICMP datagram sockets (>= 3.0) and raw sockets.

use std::{
    mem::{size_of, zeroed},
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::PathBuf,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use anyhow::{Context, Result, bail};
use icmp::{ICMP_HEADER_LEN, decode_reply, encode_echo, unwrap_seq};
use rtprobe::probe::{
    cmsg::{self, TxKind},
    packet::Probe,
};

/// `SCM_TS_OPT_ID` (asm-generic/socket.h, Linux 6.13), as rtprobe sends it.
const SCM_TS_OPT_ID: libc::c_int = 81;
/// The session id the floor's probes carry (the reflector echoes any).
const SESSION: u64 = 0x5e9d_f100_0000_0001;

#[path = "send_floor/icmp.rs"]
mod icmp;

/// What the floor sends.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Proto {
    /// rtprobe's datagram to an rtprobe reflector.
    Udp,
    /// ICMP echo on an ICMP datagram socket (the kernel sets id and checksum).
    IcmpDgram,
    /// ICMP echo on a raw socket (id and checksum ours; replies come with
    /// their IP header, and every ICMP packet for this host comes).
    IcmpRaw,
}

impl Proto {
    fn name(self) -> &'static str {
        match self {
            Proto::Udp => "udp",
            Proto::IcmpDgram => "icmp-dgram",
            Proto::IcmpRaw => "icmp-raw",
        }
    }
}

struct Args {
    target: SocketAddr,
    icmp: bool,
    count: u64,
    interval_ns: i64,
    size: usize,
    tx_stamps: bool,
    /// Numbers the TX stamps by an SCM_TS_OPT_ID per send (else the
    /// socket's own counter, which counts the same here: every send is
    /// stamped, in order).
    opt_id_cmsg: bool,
    poller: bool,
    /// Wait by spinning (non-blocking reads and sched_yield), never sleep.
    spin: bool,
    json: Option<PathBuf>,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        target: "127.0.0.1:5061".parse()?,
        icmp: false,
        count: 1000,
        interval_ns: 1_000_000,
        size: 64,
        tx_stamps: true,
        opt_id_cmsg: false,
        poller: false,
        spin: false,
        json: None,
    };
    let mut target = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |what: &str| it.next().with_context(|| format!("{arg} needs {what}"));
        match arg.as_str() {
            "--target" => {
                let v = val("ADDR:PORT")?;
                let addr = match v.parse::<SocketAddr>() {
                    Ok(a) => a,
                    // A bare address: ICMP needs no port.
                    Err(_) => SocketAddr::new(
                        v.parse::<IpAddr>()
                            .with_context(|| format!("--target {v}: not ADDR:PORT"))?,
                        0,
                    ),
                };
                target = Some(addr);
            }
            "--icmp" => a.icmp = true,
            "--count" => a.count = val("a count")?.parse().context("--count: not a count")?,
            "--interval-us" => {
                let us: i64 = val("µs")?.parse().context("--interval-us: not a number")?;
                a.interval_ns = us.max(1) * 1000;
            }
            "--size" => a.size = val("bytes")?.parse().context("--size: not a number")?,
            "--no-tx-stamps" => a.tx_stamps = false,
            "--opt-id-cmsg" => a.opt_id_cmsg = true,
            "--poller" => a.poller = true,
            "--spin" => a.spin = true,
            "--json" => a.json = Some(val("a path")?.into()),
            // Passed by `cargo bench`.
            "--bench" => {}
            other => bail!(
                "unknown argument {other}: use --target ADDR:PORT [--count N] [--interval-us U] \
                 [--size B] [--no-tx-stamps] [--opt-id-cmsg] [--poller] [--spin] [--icmp] [--json FILE]"
            ),
        }
    }
    a.target = target.context("give --target ADDR:PORT (an rtprobe reflector)")?;
    if a.icmp {
        if a.target.is_ipv6() {
            bail!("--icmp: IPv4 targets only");
        }
        if a.opt_id_cmsg {
            bail!("--icmp numbers its stamps by the socket's counter: leave out --opt-id-cmsg");
        }
    } else if a.target.port() == 0 {
        bail!(
            "--target {}: give the reflector's port (ADDR:PORT)",
            a.target.ip()
        );
    }
    if a.size < rtprobe::probe::packet::HEADER_LEN || a.size > 1472 {
        bail!(
            "--size {}: between {} and 1472 bytes",
            a.size,
            rtprobe::probe::packet::HEADER_LEN
        );
    }
    if a.count == 0 {
        bail!("--count 0: send at least one probe");
    }
    if a.spin && a.poller {
        bail!("--spin waits for the echoes in the sending thread: leave out --poller");
    }
    Ok(a)
}

fn cvt(r: libc::c_int, what: &str) -> Result<libc::c_int> {
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context(what.to_string());
    }
    Ok(r)
}

fn setsockopt<T>(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    val: T,
    what: &str,
) -> Result<()> {
    // SAFETY: val is a live T of the given size.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&val as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    cvt(r, what).map(drop)
}

fn raw_addr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain old data.
    let mut s: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match a {
        SocketAddr::V4(v) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&mut s as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as _;
            sin.sin_port = v.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v.ip()).to_be();
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut s as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as _;
            sin6.sin6_port = v.port().to_be();
            sin6.sin6_addr.s6_addr = v.ip().octets();
            size_of::<libc::sockaddr_in6>()
        }
    };
    (s, len as libc::socklen_t)
}

/// A socket of `kind` and `protocol`, or the errno of socket(2).
fn open(family: libc::c_int, kind: libc::c_int, protocol: libc::c_int) -> Result<OwnedFd, i32> {
    // SAFETY: plain socket(2).
    let fd = unsafe { libc::socket(family, kind | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
    }
    // SAFETY: fd was just returned by socket(2).
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The sending socket: UDP, or for `--icmp` an ICMP datagram socket,
/// else a raw one, as ping picks.
fn open_for(a: &Args) -> Result<(OwnedFd, Proto)> {
    let family = if a.target.is_ipv6() {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    if !a.icmp {
        let fd = open(family, libc::SOCK_DGRAM, 0)
            .map_err(std::io::Error::from_raw_os_error)
            .context("socket")?;
        return Ok((fd, Proto::Udp));
    }
    match open(libc::AF_INET, libc::SOCK_DGRAM, libc::IPPROTO_ICMP) {
        Ok(fd) => Ok((fd, Proto::IcmpDgram)),
        // Not in net.ipv4.ping_group_range: ping's fallback.
        Err(libc::EACCES) | Err(libc::EPERM) => {
            match open(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) {
                Ok(fd) => Ok((fd, Proto::IcmpRaw)),
                Err(e) => Err(std::io::Error::from_raw_os_error(e)).context(
                    "--icmp: no ICMP datagram socket (this group is outside \
                     net.ipv4.ping_group_range) and no raw socket (needs CAP_NET_RAW): widen \
                     the range or run as root",
                ),
            }
        }
        Err(e) => Err(std::io::Error::from_raw_os_error(e)).context("ICMP datagram socket"),
    }
}

/// The socket as rtprobe's `ProbeSocket::bind` makes it, connected to the
/// target as rtprobe's sender socket is; for `--icmp` an ICMP one with the
/// same options.
fn socket(a: &Args) -> Result<(OwnedFd, Proto)> {
    let v6 = a.target.is_ipv6();
    let (fd, proto) = open_for(a)?;
    let raw = fd.as_raw_fd();
    if v6 {
        setsockopt(
            raw,
            libc::IPPROTO_IPV6,
            libc::IPV6_TCLASS,
            0i32,
            "IPV6_TCLASS",
        )?;
    } else {
        setsockopt(raw, libc::IPPROTO_IP, libc::IP_TOS, 0i32, "IP_TOS")?;
    }
    let _ = setsockopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 1i32 << 20, "");
    let _ = setsockopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 8i32 << 20, "");
    let mut flags = libc::SOF_TIMESTAMPING_SOFTWARE | libc::SOF_TIMESTAMPING_RX_SOFTWARE;
    if a.tx_stamps {
        flags |= libc::SOF_TIMESTAMPING_TX_SOFTWARE
            | libc::SOF_TIMESTAMPING_TX_SCHED
            | libc::SOF_TIMESTAMPING_OPT_ID
            | libc::SOF_TIMESTAMPING_OPT_TSONLY;
    }
    setsockopt(
        raw,
        libc::SOL_SOCKET,
        libc::SO_TIMESTAMPING,
        flags,
        "SO_TIMESTAMPING",
    )?;
    let (sa, len) = raw_addr(a.target);
    // SAFETY: sa holds a sockaddr of len bytes.
    let r = unsafe { libc::connect(raw, (&sa as *const libc::sockaddr_storage).cast(), len) };
    cvt(r, "connect")?;
    Ok((fd, proto))
}

fn realtime_ns() -> i64 {
    clock_ns(libc::CLOCK_REALTIME)
}

fn clock_ns(clock: libc::clockid_t) -> i64 {
    // SAFETY: ts is a valid timespec to fill.
    let mut ts: libc::timespec = unsafe { zeroed() };
    // SAFETY: as above.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Waits for `ns` as ping does at short intervals: yielding the CPU but
/// never sleeping, so it never goes idle.
fn spin_until_monotonic(ns: i64) {
    while clock_ns(libc::CLOCK_MONOTONIC) < ns {
        // SAFETY: sched_yield takes no arguments.
        unsafe { libc::sched_yield() };
    }
}

fn sleep_until_monotonic(ns: i64) {
    let ts = libc::timespec {
        tv_sec: ns / 1_000_000_000,
        tv_nsec: ns % 1_000_000_000,
    };
    // SAFETY: ts is a valid absolute time; a null remainder is allowed.
    unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    };
}

/// One probe: its user-space send time, its SCHED stamp, its echo's RX stamp.
#[derive(Clone, Copy, Default)]
struct Stamps {
    user_ns: i64,
    sched_ns: Option<i64>,
    echo_rx_ns: Option<i64>,
}

/// What the receive side needs to know of the sender.
#[derive(Clone, Copy)]
struct Echoes {
    proto: Proto,
    /// A raw ICMP socket's identifier.
    ident: u16,
}

/// Reads everything waiting on `fd` (error queue and datagrams) without
/// blocking and files the stamps by seq (`sent`: probes sent so far).
fn drain(fd: RawFd, stamps: &mut [Stamps], e: Echoes, sent: u64) {
    let mut buf = [0u8; 2048];
    let mut control = [0u64; 64];
    for errqueue in [true, false] {
        loop {
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            // SAFETY: msghdr is plain old data.
            let mut msg: libc::msghdr = unsafe { zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = size_of::<[u64; 64]>();
            let flags = libc::MSG_DONTWAIT | if errqueue { libc::MSG_ERRQUEUE } else { 0 };
            // SAFETY: msg points to live buffers for the call.
            let n = unsafe { libc::recvmsg(fd, &mut msg, flags) };
            if n < 0 {
                break;
            }
            // SAFETY: the kernel wrote msg_controllen bytes of control.
            let control_bytes = unsafe {
                std::slice::from_raw_parts(control.as_ptr().cast::<u8>(), msg.msg_controllen)
            };
            let c = cmsg::parse(control_bytes);
            if errqueue {
                if let Some((id, TxKind::Sched, t)) = c.tx_stamp()
                    && let Some(s) = stamps.get_mut(id as usize)
                {
                    s.sched_ns = Some(t);
                }
            } else if let Some(t) = c.sw_ns
                && let Some(seq) = echo_seq(&buf[..n as usize], e, sent)
                && let Some(s) = stamps.get_mut(seq as usize)
            {
                s.echo_rx_ns = Some(t);
            }
        }
    }
}

/// The probe an echo answers, None for what is not an echo of ours.
fn echo_seq(pkt: &[u8], e: Echoes, sent: u64) -> Option<u64> {
    match e.proto {
        Proto::Udp => Probe::decode(pkt, SESSION).ok().map(|p| p.seq),
        proto => unwrap_seq(decode_reply(pkt, proto == Proto::IcmpRaw, e.ident)?, sent),
    }
}

fn poll_in(fd: RawFd, timeout_ms: i32) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLERR,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, timeout_ms) };
}

/// Sends probe `seq` the lightest way rtprobe's options allow; returns its
/// user-space send time.
fn send_one(fd: RawFd, seq: u64, buf: &mut [u8], opt_id_cmsg: bool, e: Echoes) -> Result<i64> {
    let user_ns = realtime_ns();
    match e.proto {
        Proto::Udp => Probe {
            session: SESSION,
            seq,
            flow: 0,
            echo: false,
            send_ns: user_ns,
            kernel_times: None,
        }
        .encode(buf),
        proto => encode_echo(buf, seq, proto == Proto::IcmpRaw, e.ident),
    };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain old data.
    let mut msg: libc::msghdr = unsafe { zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if opt_id_cmsg {
        // SAFETY: control is large and aligned enough for CMSG_SPACE(4).
        unsafe {
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as usize;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = SCM_TS_OPT_ID;
            (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u32>(), seq as u32);
        }
    }
    // SAFETY: msg points to live buffers for the call.
    let r = unsafe { libc::sendmsg(fd, &msg, 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error()).context("sendmsg");
    }
    Ok(user_ns)
}

fn run(a: &Args) -> Result<(Vec<Stamps>, Proto)> {
    let (fd, proto) = socket(a)?;
    let raw = fd.as_raw_fd();
    let e = Echoes {
        proto,
        ident: std::process::id() as u16,
    };
    let stamps = Arc::new(Mutex::new(vec![Stamps::default(); a.count as usize]));
    let done = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let poller = a.poller.then(|| {
        let (stamps, done, sent) = (stamps.clone(), done.clone(), sent.clone());
        std::thread::spawn(move || {
            let mut local = vec![Stamps::default(); stamps.lock().expect("lock").len()];
            while !done.load(Ordering::Relaxed) {
                poll_in(raw, 50);
                drain(raw, &mut local, e, sent.load(Ordering::Acquire));
            }
            let mut s = stamps.lock().expect("lock");
            for (d, l) in s.iter_mut().zip(local) {
                d.sched_ns = l.sched_ns;
                d.echo_rx_ns = l.echo_rx_ns;
            }
        })
    });
    let header = if proto == Proto::Udp {
        0
    } else {
        ICMP_HEADER_LEN
    };
    let mut buf = vec![0u8; header + a.size];
    let mut user = Vec::with_capacity(a.count as usize);
    let mut local = vec![Stamps::default(); a.count as usize];
    let start = clock_ns(libc::CLOCK_MONOTONIC) + 10_000_000;
    for seq in 0..a.count {
        let due = start + seq as i64 * a.interval_ns;
        if a.spin {
            spin_until_monotonic(due);
        } else {
            sleep_until_monotonic(due);
        }
        user.push(send_one(
            raw,
            seq,
            &mut buf,
            a.tx_stamps && a.opt_id_cmsg,
            e,
        )?);
        sent.store(seq + 1, Ordering::Release);
        if !a.poller {
            // As ping: wait for this probe's echo (and stamps) before the next.
            let deadline = clock_ns(libc::CLOCK_MONOTONIC) + a.interval_ns / 2;
            let s = seq as usize;
            while (local[s].echo_rx_ns.is_none() || (a.tx_stamps && local[s].sched_ns.is_none()))
                && clock_ns(libc::CLOCK_MONOTONIC) < deadline
            {
                if a.spin {
                    // SAFETY: sched_yield takes no arguments.
                    unsafe { libc::sched_yield() };
                } else {
                    poll_in(raw, 1);
                }
                drain(raw, &mut local, e, seq + 1);
            }
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    done.store(true, Ordering::Relaxed);
    if let Some(p) = poller {
        p.join()
            .map_err(|_| anyhow::anyhow!("the poller thread panicked"))?;
        local = stamps.lock().expect("lock").clone();
    } else {
        drain(raw, &mut local, e, a.count);
    }
    for (s, u) in local.iter_mut().zip(user) {
        s.user_ns = u;
    }
    Ok((local, proto))
}

fn median(mut v: Vec<i64>) -> Option<i64> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    Some(v[v.len() / 2])
}

fn main() -> Result<()> {
    let a = parse_args()?;
    let (stamps, proto) = run(&a)?;
    let pick = |f: &dyn Fn(&Stamps) -> Option<i64>| median(stamps.iter().filter_map(f).collect());
    let answered = stamps.iter().filter(|s| s.echo_rx_ns.is_some()).count();
    let user_rtt = pick(&|s| s.echo_rx_ns.map(|e| e - s.user_ns));
    let stack = pick(&|s| s.sched_ns.map(|t| t - s.user_ns));
    let sched_rtt = pick(&|s| Some(s.echo_rx_ns? - s.sched_ns?));
    let ns = |v: Option<i64>| v.map_or("null".to_string(), |v| v.to_string());
    let json = format!(
        "{{\"sent\": {}, \"answered\": {answered}, \"send\": \"{}\", \"tx_stamps\": {}, \"opt_id_cmsg\": {}, \
         \"poller\": {}, \"spin\": {}, \"rtt_user_start_p50_ns\": {}, \"stack_p50_ns\": {}, \"rtt_sched_start_p50_ns\": {}}}",
        a.count,
        proto.name(),
        a.tx_stamps,
        a.tx_stamps && a.opt_id_cmsg,
        a.poller,
        a.spin,
        ns(user_rtt),
        ns(stack),
        ns(sched_rtt)
    );
    println!("{json}");
    if let Some(p) = &a.json {
        std::fs::write(p, &json).with_context(|| format!("write {}", p.display()))?;
    }
    if answered == 0 {
        if proto != Proto::Udp {
            bail!("no echo reply from {}: does it answer ping?", a.target.ip());
        }
        bail!(
            "no echo from {}: is an rtprobe reflector listening there?",
            a.target
        );
    }
    Ok(())
}
