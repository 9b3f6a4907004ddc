//! The fetch load: a page server in the sender namespace and a client in
//! the receiver namespace that fetches a page, waits, and fetches again,
//! timing each fetch from connect to last byte.

use std::{
    io::{Read, Write},
    net::{SocketAddrV4, TcpListener, TcpStream},
    os::fd::AsFd,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use super::{
    Counters, Flow, Load, LoadSpec, LoadTarget, MAX_FETCH_SIZE, POLL,
    acct::FetchStats,
    tcp::{default_cc, set_cc, tcp_connect_within},
};
use crate::sys::{Netns, Sys};

/// The fetch client's record of the current window.
pub(super) struct FetchWindow {
    /// Fetches started before this belong to the warm-up.
    pub(super) since: Instant,
    pub(super) stats: FetchStats,
}

pub(super) struct FetchParams {
    pub(super) size: u64,
    pub(super) every: Duration,
    pub(super) cc: Option<String>,
    pub(super) timeout: Duration,
}

/// The page server in the sender namespace and the fetching client in the
/// receiver namespace (see the module docs for why this way round).
pub(super) fn start_fetch(
    load: &mut Load,
    t: &LoadTarget<'_>,
    spec: &LoadSpec,
    port: u16,
    p: FetchParams,
) -> Result<()> {
    let addr = SocketAddrV4::new(t.src, port);
    let cc = p.cc.clone();
    let listener = t.sender.run(|| {
        let l = TcpListener::bind(addr)
            .with_context(|| format!("listen on {addr} for the fetch load's page server"))?;
        // Checked here so that a missing congestion control fails the start,
        // not every fetch.
        if let Some(c) = &cc {
            set_cc(Some(t.sys), &l, c)?;
        }
        Ok(l)
    })?;
    listener.set_nonblocking(true)?;
    let receiver_ns = t
        .receiver
        .file()
        .try_clone()
        .context("duplicate the receiver namespace handle")?;
    let c = Arc::new(Counters::default());
    let window = Arc::new(Mutex::new(FetchWindow {
        since: Instant::now(),
        stats: FetchStats::new(),
    }));
    // The server outlives the client (it stops with the receivers, after
    // the senders): a fetch the client starts just before the stop finds
    // it listening rather than refused.
    let stop = load.stop_recv.clone();
    let server_cc = p.cc.clone();
    let server = std::thread::Builder::new()
        .name(format!("fetch-srv-{port}"))
        .spawn(move || page_server(listener, server_cc.as_deref(), &stop))?;
    let stop = load.stop_send.clone();
    let (cc_client, w, cc2) = (p.cc.clone(), window.clone(), c.clone());
    let size = p.size;
    let client = std::thread::Builder::new()
        .name(format!("fetch-cli-{port}"))
        .spawn(move || -> Result<()> {
            crate::sys::netns::enter(receiver_ns.as_fd())
                .context("enter the receiver namespace for the fetch client")?;
            fetch_loop(addr, &p, cc_client.as_deref(), &w, &cc2, &stop)
        })?;
    c.connected.store(true, Ordering::Relaxed);
    load.flows.push(Flow {
        kind: "fetch",
        spec: spec.to_string(),
        port,
        cc: p_cc_or_default(spec, t.sys, t.sender),
        target_bps: None,
        udp_size: 0,
        counters: c,
        // The client stops with the senders (a fetch under way is
        // dropped, neither done nor failed); the server with the receivers.
        sender: Some(client),
        receiver: Some(server),
        mark_bytes: 0,
        tcp_info_fd: None,
        mark_acked: None,
        fetch: Some((window, size)),
    });
    Ok(())
}

fn p_cc_or_default(spec: &LoadSpec, sys: &dyn Sys, sender: &Netns) -> Option<String> {
    spec.cc()
        .map(str::to_string)
        .or_else(|| default_cc(sys, sender).ok())
}

/// Serves one fetch at a time: reads the 8-byte request (the page size,
/// big endian), sends that many bytes, closes.
fn page_server(listener: TcpListener, cc: Option<&str>, stop: &AtomicBool) -> Result<()> {
    let page = vec![0x3cu8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        let conn = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => return Err(e).context("accept a fetch"),
        };
        // A failed fetch (the client gave up, reset) is the client's to
        // count; the server just takes the next one.
        if let Err(e) = serve_page(conn, cc, &page, stop) {
            log::debug!("fetch server: {e:#}");
        }
    }
    Ok(())
}

fn serve_page(mut s: TcpStream, cc: Option<&str>, page: &[u8], stop: &AtomicBool) -> Result<()> {
    s.set_nonblocking(false)?;
    if let Some(c) = cc {
        set_cc(None, &s, c)?;
    }
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(POLL))?;
    s.set_write_timeout(Some(POLL))?;
    let mut req = [0u8; 8];
    let mut got = 0;
    while got < req.len() {
        match s.read(&mut req[got..]) {
            Ok(0) => bail!("the client closed before asking"),
            Ok(n) => got += n,
            Err(e) if is_retry(&e) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e).context("read the fetch request"),
        }
    }
    let mut left = u64::from_be_bytes(req).min(MAX_FETCH_SIZE);
    while left > 0 {
        let n = left.min(page.len() as u64) as usize;
        match s.write(&page[..n]) {
            Ok(w) => left -= w as u64,
            Err(e) if is_retry(&e) => {
                if stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
            }
            Err(e) => return Err(e).context("send the page"),
        }
    }
    Ok(())
}

fn is_retry(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock
            | std::io::ErrorKind::TimedOut
            | std::io::ErrorKind::Interrupted
    )
}

enum FetchOutcome {
    Done,
    Failed(anyhow::Error),
    Stopped,
}

/// Fetches, waits `every`, fetches again, until stopped.
fn fetch_loop(
    addr: SocketAddrV4,
    p: &FetchParams,
    cc: Option<&str>,
    window: &Mutex<FetchWindow>,
    c: &Counters,
    stop: &AtomicBool,
) -> Result<()> {
    let mut failures_logged = 0;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let mut outcome = fetch_once(addr, p.size, cc, started + p.timeout, c, stop);
        if matches!(outcome, FetchOutcome::Failed(_)) && stop.load(Ordering::Relaxed) {
            // Cut short by the stop, not by the path.
            outcome = FetchOutcome::Stopped;
        }
        let took = started.elapsed();
        {
            let mut w = window.lock().unwrap_or_else(|e| e.into_inner());
            let counts = started >= w.since;
            match &outcome {
                FetchOutcome::Done if counts => w.stats.record(took),
                FetchOutcome::Failed(_) if counts => w.stats.fail(),
                _ => {}
            }
        }
        match outcome {
            FetchOutcome::Stopped => break,
            FetchOutcome::Failed(e) => {
                if failures_logged < 3 {
                    log::warn!("a fetch of {} bytes from {addr} failed: {e:#}", p.size);
                    failures_logged += 1;
                }
            }
            FetchOutcome::Done => {}
        }
        let next = Instant::now() + p.every;
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= next {
                break;
            }
            std::thread::sleep((next - now).min(POLL));
        }
    }
    Ok(())
}

fn fetch_once(
    addr: SocketAddrV4,
    size: u64,
    cc: Option<&str>,
    deadline: Instant,
    c: &Counters,
    stop: &AtomicBool,
) -> FetchOutcome {
    let left = |d: Instant| d.saturating_duration_since(Instant::now());
    let mut s = match tcp_connect_within(None, addr, cc, None, Some(left(deadline))) {
        Ok(s) => s,
        Err(e) => return FetchOutcome::Failed(e),
    };
    let r = (|| -> Result<bool> {
        s.set_write_timeout(Some(left(deadline).max(Duration::from_millis(1))))?;
        s.write_all(&size.to_be_bytes())
            .context("send the request")?;
        let mut buf = vec![0u8; 64 * 1024];
        let mut got = 0u64;
        while got < size {
            if stop.load(Ordering::Relaxed) {
                return Ok(false);
            }
            let l = left(deadline);
            if l.is_zero() {
                bail!("timed out after {got} of {size} bytes");
            }
            s.set_read_timeout(Some(l.min(POLL)))?;
            match s.read(&mut buf) {
                Ok(0) => bail!("the server closed after {got} of {size} bytes"),
                Ok(n) => {
                    got += n as u64;
                    c.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if is_retry(&e) => {}
                Err(e) => return Err(e).context("read the page"),
            }
        }
        Ok(true)
    })();
    match r {
        Ok(true) => FetchOutcome::Done,
        Ok(false) => FetchOutcome::Stopped,
        Err(e) => FetchOutcome::Failed(e),
    }
}
