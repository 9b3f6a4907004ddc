//! The scrapers section: whether 2000 concurrent `/metrics` scrapers
//! take the probing's time. The same 1 ms testbed run in one invocation,
//! quiet and then under a load generator that holds 2000 connections
//! open to `--metrics-listen` (each: connect, `GET /metrics`, read to the
//! end, again), taking turns (3 rounds; 1 with --quick); the median send
//! error p99 of the loaded runs against the quiet ones (issue 24: at most
//! 2x), and how many scrapes were answered. The generator runs on the same machine at SCHED_IDLE,
//! standing in for scrapers on other hosts: the figure is the server's
//! cost to the probes, not the generator's. It is one thread on epoll(7)
//! with non-blocking sockets.

use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddrV4, TcpListener},
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde_json::Value;

use super::{
    run::Ctx,
    table::{Row, row, us},
};

/// Concurrent connections the generator holds (issue 24's figure).
const SCRAPERS: usize = 2000;
/// The target: the loaded run's send error p99 at most this many times
/// the quiet run's.
const TARGET_P99_RATIO: f64 = 2.0;
/// A scrape not answered in full within this counts as failed (Prometheus'
/// default scrape timeout is 10 s).
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the generator saw.
#[derive(Debug, Default, Clone)]
pub(super) struct Load {
    /// Scrapes answered 200 with their whole body.
    pub ok: u64,
    /// Answered, but not 200 or cut short.
    pub bad: u64,
    /// Refused or reset before an answer.
    pub failed: u64,
    /// Not answered in full within [`SCRAPE_TIMEOUT`].
    pub timed_out: u64,
    /// Each answered scrape's time from connect to the last byte, µs.
    pub took_us: Vec<u64>,
}

impl Load {
    fn quantile_ms(&self, q: f64) -> f64 {
        let mut v = self.took_us.clone();
        v.sort_unstable();
        v.get(((v.len() as f64 * q) as usize).min(v.len().saturating_sub(1)))
            .map_or(f64::NAN, |&u| u as f64 / 1000.0)
    }
}

pub(super) fn scrapers_rows(ctx: &Ctx, quick: bool) -> Result<Vec<Row>> {
    // Quiet and loaded take turns, so that what else the machine does
    // falls on both alike.
    let (count, rounds): (u64, usize) = if quick { (10_000, 1) } else { (20_000, 3) };
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let listen = format!("127.0.0.1:{port}");
    let args = [
        "--count",
        &count.to_string(),
        "--interval",
        "1ms",
        "--metrics-listen",
        &listen,
    ];
    // The scrapes counted: those that end while the run sends (its
    // server answers from just before its first probe); the ones still
    // queued when rtprobe exits are reset by its exit, not by the server.
    let sending = Duration::from_millis(count);
    let mut runs = Vec::new();
    for round in 0..rounds {
        let quiet = ctx.probe(&format!("scrapers-quiet-{round}"), &args)?;
        let stop = Arc::new(AtomicBool::new(false));
        let addr = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
        let generator = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("scrapers".into())
                .spawn(move || generate(addr, SCRAPERS, &stop, sending))
                .context("start the load generator")?
        };
        let loaded = ctx.probe(&format!("scrapers-loaded-{round}"), &args);
        stop.store(true, Ordering::SeqCst);
        let load = generator
            .join()
            .map_err(|_| anyhow::anyhow!("the load generator panicked"))??;
        runs.push(Round {
            quiet,
            loaded: loaded?,
            load,
        });
    }
    Ok(rows(&runs))
}

/// One quiet run and one under the scrapers.
struct Round {
    quiet: Value,
    loaded: Value,
    load: Load,
}

fn median(mut v: Vec<u64>) -> Option<u64> {
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

fn rows(runs: &[Round]) -> Vec<Row> {
    let p99 = |s: &Value| s["send_error_ns"]["p99"].as_u64();
    let missed = |s: &Value| s["missed_ticks"].as_u64().unwrap_or(u64::MAX);
    let q = median(runs.iter().filter_map(|r| p99(&r.quiet)).collect());
    let l = median(runs.iter().filter_map(|r| p99(&r.loaded)).collect());
    let ratio = match (q, l) {
        (Some(q), Some(l)) => Some(l as f64 / q.max(1) as f64),
        _ => None,
    };
    let each = |f: &dyn Fn(&Round) -> String| runs.iter().map(f).collect::<Vec<_>>().join(", ");
    let p99_row = row(
        &format!("send error p99, 1 ms, {SCRAPERS} concurrent scrapers"),
        format!(
            "{} (each run {}; missed ticks {})",
            us(l),
            each(&|r| us(p99(&r.loaded))),
            each(&|r| missed(&r.loaded).to_string())
        ),
        format!(
            "quiet: {} (each run {}; missed ticks {}); ratio {}",
            us(q),
            each(&|r| us(p99(&r.quiet))),
            each(&|r| missed(&r.quiet).to_string()),
            ratio.map_or("-".into(), |r| format!("{r:.2}"))
        ),
        &format!("<= {TARGET_P99_RATIO}x quiet"),
        ratio.map(|r| r <= TARGET_P99_RATIO),
    );
    let p99_row = match ratio {
        Some(r) if r > TARGET_P99_RATIO => p99_row.because(format!(
            "the loaded runs' sender waits: {}",
            each(&|r| super::host::waits_text(&r.loaded["pacing"]["waits"]))
        )),
        _ => p99_row,
    };
    let mut load = Load::default();
    for r in runs {
        load.ok += r.load.ok;
        load.bad += r.load.bad;
        load.failed += r.load.failed;
        load.timed_out += r.load.timed_out;
        load.took_us.extend(&r.load.took_us);
    }
    let total = load.ok + load.bad + load.failed + load.timed_out;
    let answered = row(
        &format!("scrapes answered, {SCRAPERS} concurrent"),
        format!(
            "{} of {total} ({} cut or not 200, {} refused or reset, {} over {SCRAPE_TIMEOUT:?})",
            load.ok, load.bad, load.failed, load.timed_out
        ),
        format!(
            "connect to last byte p50/p99 {:.0} / {:.0} ms",
            load.quantile_ms(0.5),
            load.quantile_ms(0.99)
        ),
        "all",
        Some(total > 0 && load.ok == total),
    );
    let answered = if load.failed > 0 {
        answered.because(format!(
            "the server resets a connection whose reader has read nothing for 1 s when all 256 \
             slots are taken and others wait; the generator runs at SCHED_IDLE and stalls when \
             the machine is busy (load average now {})",
            std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split(' ')
                .next()
                .unwrap_or("?")
        ))
    } else {
        answered
    };
    vec![p99_row, answered]
}

/// One connection of the generator.
struct Conn {
    fd: OwnedFd,
    started: Instant,
    /// The request is sent.
    sent: bool,
    got: Vec<u8>,
}

/// Holds `n` scrapes in flight to `addr` until `stop`, one new for each
/// that ends; at SCHED_IDLE. Counts the scrapes that end within
/// `counted` of the server's first answer to a connect.
pub(super) fn generate(
    addr: SocketAddrV4,
    n: usize,
    stop: &AtomicBool,
    counted: Duration,
) -> Result<Load> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is this thread; param is valid.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    raise_open_files(n + 64)?;
    // SAFETY: epoll_create1 has no preconditions; the fd is owned below.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(std::io::Error::last_os_error()).context("epoll_create1");
    }
    // SAFETY: ep is a new descriptor nothing else owns.
    let ep = unsafe { OwnedFd::from_raw_fd(ep) };
    // Wait for the server before counting failures.
    let t0 = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        if stop.load(Ordering::SeqCst) || t0.elapsed() > Duration::from_secs(60) {
            return Ok(Load::default());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let counting_until = Instant::now() + counted;
    let mut load = Load::default();
    // What ends after the counting: tallied apart, never reported.
    let mut ignored = Load::default();
    let mut conns: HashMap<RawFd, Conn> = HashMap::with_capacity(n);
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    while !stop.load(Ordering::SeqCst) {
        while conns.len() < n {
            match open(ep.as_raw_fd(), addr) {
                Ok(c) => {
                    conns.insert(c.fd.as_raw_fd(), c);
                }
                Err(_) => {
                    if Instant::now() < counting_until {
                        load.failed += 1;
                    }
                    break;
                }
            }
        }
        // SAFETY: events has room for its length; ep is a valid epoll fd.
        let ready = unsafe {
            libc::epoll_wait(
                ep.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                100,
            )
        };
        for e in events.iter().take(ready.max(0) as usize) {
            let fd = e.u64 as RawFd;
            let done = conns.get_mut(&fd).is_none_or(|c| step(c, e.events));
            if done && let Some(c) = conns.remove(&fd) {
                let tally = if Instant::now() < counting_until {
                    &mut load
                } else {
                    &mut ignored
                };
                finish(c, tally);
            }
        }
        let now = Instant::now();
        let late: Vec<RawFd> = conns
            .iter()
            .filter(|(_, c)| now - c.started > SCRAPE_TIMEOUT)
            .map(|(fd, _)| *fd)
            .collect();
        for fd in late {
            conns.remove(&fd);
            if now < counting_until {
                load.timed_out += 1;
            }
        }
    }
    Ok(load)
}

/// Raises this process's open-file limit to `want` (up to the hard
/// limit): 2000 connections are over the usual soft limit of 1024.
fn raise_open_files(want: usize) -> Result<()> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getrlimit(RLIMIT_NOFILE)");
    }
    let want = want as libc::rlim_t;
    if lim.rlim_cur >= want {
        return Ok(());
    }
    if lim.rlim_max < want {
        anyhow::bail!(
            "{want} open files are needed for the scrapers and the hard limit is {}: raise it (ulimit -Hn)",
            lim.rlim_max
        );
    }
    lim.rlim_cur = want;
    // SAFETY: setrlimit reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(std::io::Error::last_os_error()).context("setrlimit(RLIMIT_NOFILE)");
    }
    Ok(())
}

/// A non-blocking connect to `addr`, registered with the epoll `ep`.
fn open(ep: RawFd, addr: SocketAddrV4) -> std::io::Result<Conn> {
    // SAFETY: socket has no preconditions; the fd is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*addr.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sa is a valid sockaddr_in of the length given.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&raw const sa).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINPROGRESS) {
        return Err(std::io::Error::last_os_error());
    }
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP) as u32,
        u64: fd.as_raw_fd() as u64,
    };
    // SAFETY: ep and fd are valid; ev is a valid event.
    if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd.as_raw_fd(), &mut ev) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Conn {
        fd,
        started: Instant::now(),
        sent: false,
        got: Vec::new(),
    })
}

/// Advances a connection on its events; true once it has ended.
fn step(c: &mut Conn, events: u32) -> bool {
    let fd = c.fd.as_raw_fd();
    if !c.sent && events & libc::EPOLLOUT as u32 != 0 {
        let req = b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n";
        // SAFETY: req is valid for its length.
        let n = unsafe { libc::send(fd, req.as_ptr().cast(), req.len(), libc::MSG_NOSIGNAL) };
        if n != req.len() as isize {
            return true;
        }
        c.sent = true;
    }
    let mut buf = [0u8; 65536];
    loop {
        // SAFETY: buf is valid for its length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        match n {
            0 => return true,
            n if n > 0 => {
                // Only the head is kept; the body is counted.
                if c.got.len() < 4096 {
                    c.got.extend_from_slice(&buf[..n as usize]);
                } else {
                    c.got.extend(std::iter::repeat_n(0, n as usize));
                }
            }
            _ => {
                let e = std::io::Error::last_os_error().raw_os_error();
                return !matches!(e, Some(libc::EAGAIN));
            }
        }
    }
}

/// Counts an ended connection: a whole 200, or not.
fn finish(c: Conn, load: &mut Load) {
    let text = String::from_utf8_lossy(&c.got[..c.got.len().min(4096)]).into_owned();
    let Some((head, _)) = text.split_once("\r\n\r\n") else {
        load.failed += 1;
        return;
    };
    let body_len = c.got.len() - head.len() - 4;
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.trim().parse::<usize>().ok());
    if head.starts_with("HTTP/1.1 200") && length == Some(body_len) {
        load.ok += 1;
        load.took_us.push(c.started.elapsed().as_micros() as u64);
    } else {
        load.bad += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The generator against a server that answers a fixed page: every
    /// scrape counted, whole.
    #[test]
    fn the_generator_counts_whole_answers() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let std::net::SocketAddr::V4(addr) = listener.local_addr().unwrap() else {
            panic!()
        };
        let stop = Arc::new(AtomicBool::new(false));
        let served = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let mut n = 0;
            for mut c in listener.incoming().flatten().take(30) {
                let mut req = [0u8; 1024];
                let _ = c.read(&mut req);
                let body = "x".repeat(100_000);
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                n += 1;
            }
            n
        });
        let s = stop.clone();
        let gen_thread =
            std::thread::spawn(move || generate(addr, 4, &s, Duration::from_secs(3600)).unwrap());
        let served = served.join().unwrap();
        stop.store(true, Ordering::SeqCst);
        let load = gen_thread.join().unwrap();
        // The probe connect while waiting for the server is one of the 30.
        assert!(load.ok >= 20 && load.ok < served, "{load:?} of {served}");
        assert_eq!(load.bad, 0, "{load:?}");
    }
}
