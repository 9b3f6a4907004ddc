//! [`MetricsServer`]: `GET /metrics` and `GET /-/healthy` over hyper, on
//! a thread of its own that stands behind the probing threads
//! (sched_setattr(2): nice 10 and a long EEVDF slice, which Linux >= 6.12
//! honours; setpriority(2) where that is refused). TCP through tokio:
//! listen(2) with a deep backlog, and no accept(2) while every connection
//! slot is taken.
//!
//! # What a client can cost
//!
//! - **Memory**: at most [`PAGES_PER_FORMAT`](super::pages::PAGES_PER_FORMAT)
//!   rendered pages per format (two formats), however many connections
//!   read them (a page is shared, never copied per reader), plus one page
//!   while a render converts to the text format: 5 pages in all (a page is
//!   about 110 bytes per series; docs/CONTINUOUS.md has the series per
//!   target). Each of the [`MAX_CONNECTIONS`] connections adds its request
//!   buffer ([`MAX_REQUEST`]) and hyper's state, about 10 KiB. The kernel
//!   holds each socket's send buffer (autotuned up to net.ipv4.tcp_wmem's
//!   maximum; no more than the client's window lets through) outside the
//!   process, and drops it when a stalled connection is closed (reset).
//! - **Time**: a client has [`HEADER_TIMEOUT`] to send its request head, a
//!   write waits at most [`WRITE_TIMEOUT`] for the client to read, and a
//!   connection lives at most [`CONNECTION_TIMEOUT`]. A page is rendered
//!   at most once per [`RENDER_EVERY`](super::pages::RENDER_EVERY) per
//!   format, on this thread.
//! - **Connections**: at most [`MAX_CONNECTIONS`] open; over it the one
//!   longest without progress makes room, or new ones wait in the listen
//!   backlog (see [`Slots`]), so scrapes queue rather than fail.
//! - **Rate**: at most [`ACCEPTS_PER_SEC`] connections accepted per
//!   second (in bursts of up to a tenth of that); the rest wait in the
//!   listen backlog. A closed loop of scrapers (each connects again once
//!   answered) is thereby held to that rate, and so is the kernel's work
//!   for their connections (handshakes, teardowns, softirqs), which no
//!   thread priority of this server's bounds: 2000 concurrent scrapers
//!   on loopback made 16 000 connections a second without it.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use hyper::body::Bytes;

use super::{
    access::Access,
    format::Format,
    pages::Pages,
    registry::Metrics,
    slots::{Room, Slot, Slots},
    watch::Watched,
};

/// Serves `GET /metrics` on a thread of its own until dropped.
///
/// HTTP is hyper's (HTTP/1.1, one request per connection) on a
/// single-threaded tokio runtime that lives on that thread, so the probe's
/// own threads never run any of it. The module docs state what a client
/// can cost it.
pub(crate) struct MetricsServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Longest a client may take to send its whole request head: a slowloris
/// client is closed after it, and so is one that connects and says nothing.
pub(super) const HEADER_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a write of the answer waits for the client to read: a client
/// that reads nothing for this long is closed.
pub(super) const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a connection stays open, request and answer together: bounds a
/// client that reads, but too slowly to matter.
pub(super) const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Most connections open at once; a scraper needs one, so this is room for
/// several Prometheus servers and curl. Each costs a file descriptor of
/// the process, which the probes need too.
pub(super) const MAX_CONNECTIONS: usize = 256;
/// Most connections accepted per second: room for a hundred Prometheus
/// servers scraping every 15 s many times over, and a bound on what a
/// crowd of strangers costs the host.
pub(super) const ACCEPTS_PER_SEC: u32 = 500;

/// The server's limits: the constants above, which tests shorten or
/// lengthen to make a mechanism visible without waiting on a clock.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) header_timeout: Duration,
    pub(super) write_timeout: Duration,
    pub(super) connection_timeout: Duration,
    pub(super) max_connections: usize,
    /// Connections accepted per second at most (None: no cap).
    pub(super) accepts_per_sec: Option<u32>,
    /// Whether the server's thread yields the CPU to the probing threads
    /// (the unit tests, with no probing threads, leave it at the default).
    pub(super) yield_cpu: bool,
}

impl Limits {
    pub(super) const DEFAULT: Limits = Limits {
        header_timeout: HEADER_TIMEOUT,
        write_timeout: WRITE_TIMEOUT,
        connection_timeout: CONNECTION_TIMEOUT,
        max_connections: MAX_CONNECTIONS,
        accepts_per_sec: Some(ACCEPTS_PER_SEC),
        yield_cpu: true,
    };
}
/// Connections the kernel holds until they are accepted (the kernel caps
/// it at net.core.somaxconn, 4096 by default): where scrapes wait while
/// every slot is taken; a full backlog drops SYNs, which clients resend.
const LISTEN_BACKLOG: u32 = 4096;
/// Largest request head read (hyper's smallest read buffer); a larger one
/// gets 431.
const MAX_REQUEST: usize = 8192;

/// The error answers' type.
const TEXT: &str = "text/plain; charset=utf-8";

impl MetricsServer {
    /// Binds `addr` (port 0: a free port) and serves `metrics` to whom
    /// `access` allows.
    pub(crate) fn start(addr: SocketAddr, metrics: Arc<Metrics>, access: Access) -> Result<Self> {
        Self::start_with(addr, metrics, access, Limits::DEFAULT)
    }

    pub(super) fn start_with(
        addr: SocketAddr,
        metrics: Arc<Metrics>,
        access: Access,
        limits: Limits,
    ) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .context("the metrics server's runtime")?;
        let listening = {
            let _in = runtime.enter();
            listen(addr)
        };
        let listener = match listening {
            Ok(l) => l,
            Err(e) => {
                // A runtime dropped the ordinary way panics in an async
                // context, and a caller may be in one.
                runtime.shutdown_background();
                return Err(e).with_context(|| {
                    format!("--metrics-listen {addr}: cannot listen there (is the port in use? pick another, or port 0 for a free one)")
                });
            }
        };
        let addr = listener
            .local_addr()
            .context("the metrics listener's address")?;
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let thread = std::thread::Builder::new()
            .name("rtprobe-metrics".into())
            .spawn(move || {
                if limits.yield_cpu {
                    yield_the_cpu();
                }
                // Dropping the runtime at the end closes every open connection.
                runtime.block_on(serve(listener, metrics, access, limits, stopped));
            })
            .context("spawn the metrics server thread")?;
        Ok(Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it listens on (with the port picked for port 0).
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The server thread's nice value: when the CPUs are contended it gets
/// about a tenth of the share of a probing thread (weight 110 against
/// 1024), so scrapes cannot crowd the probes out, yet a busy host still
/// answers them (SCHED_IDLE would get 0.3 % of a CPU next to one busy
/// thread, and scrapes would time out on any loaded host).
const NICE: i32 = 10;
/// The server thread's time slice (EEVDF's custom slice, Linux >= 6.12;
/// ignored before): far longer than the probing threads' default, so that
/// a probing thread waking up takes the CPU from this one at once instead
/// of waiting for its slice to end (PREEMPT_SHORT).
const SLICE_NS: u64 = 100_000_000;

/// Puts the calling thread (the server's) behind the probing threads:
/// [`NICE`] and [`SLICE_NS`] through sched_setattr(2), or the nice value
/// alone through setpriority(2) where that is refused.
fn yield_the_cpu() {
    // SAFETY: sched_attr is plain data; all zeroes is a valid value.
    let mut attr: libc::sched_attr = unsafe { std::mem::zeroed() };
    attr.size = std::mem::size_of::<libc::sched_attr>() as u32;
    attr.sched_policy = libc::SCHED_OTHER as u32;
    attr.sched_nice = NICE;
    attr.sched_runtime = SLICE_NS;
    // SAFETY: pid 0 is the calling thread; attr is valid and sized.
    if unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) } == 0 {
        return;
    }
    let setattr = std::io::Error::last_os_error();
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority on this thread's id changes only its nice value.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, NICE) } == 0 {
        log::debug!("metrics server: sched_setattr refused ({setattr}); nice {NICE} only");
        return;
    }
    log::warn!(
        "metrics server: cannot lower its thread's priority (sched_setattr: {setattr}; \
         setpriority: {}): scrapes take CPU time from the probes as any thread does",
        std::io::Error::last_os_error()
    );
}

/// A listening socket whose backlog holds the connections waiting for a
/// slot, and a burst arriving while this thread is not scheduled.
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    // As std's TcpListener::bind: a restart binds while the previous
    // run's connections are in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What every connection's task shares.
#[derive(Clone)]
struct Shared {
    http: hyper::server::conn::http1::Builder,
    pages: Arc<Mutex<Pages>>,
    access: Access,
    limits: Limits,
}

async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    access: Access,
    limits: Limits,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    let slots = Slots::new(limits.max_connections);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        // One request per connection, as Prometheus is happy with: no
        // connection idles between scrapes holding a slot.
        .keep_alive(false)
        // "Content-Type", as the hand-written server sent it.
        .title_case_headers(true)
        .max_buf_size(MAX_REQUEST);
    let shared = Shared {
        http,
        pages: Arc::new(Mutex::new(Pages::new(metrics))),
        access,
        limits,
    };
    let mut pace = limits.accepts_per_sec.map(AcceptPace::new);
    loop {
        if let Some(at) = pace.as_ref().and_then(|p| p.wait_until(Instant::now())) {
            tokio::select! {
                _ = &mut stop => return,
                () = tokio::time::sleep_until(at.into()) => {}
            }
        }
        let (stream, peer) = tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: wait for some
                    // to be closed rather than spin on the error.
                    log::debug!("metrics server: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // At the cap this one connection waits here, and the next ones in
        // the kernel's backlog, until a slot is free or made free.
        tokio::select! {
            _ = &mut stop => return,
            () = room(&slots) => {}
        }
        if let Some(p) = pace.as_mut() {
            p.took(Instant::now());
        }
        let slot = slots.admit(Instant::now());
        let id = slot.id;
        let task = tokio::spawn(connection(shared.clone(), stream, peer, slot));
        slots.set_task(id, task.abort_handle());
    }
}

/// The accept rate's pace (GCRA: a token bucket of [`Self::burst`]
/// accepts refilled at `per_sec`). Pure apart from the times it is given.
#[derive(Debug, Clone)]
pub(super) struct AcceptPace {
    every: Duration,
    burst: u32,
    /// When the bucket would be full again (the "theoretical arrival time").
    tat: Option<Instant>,
}

impl AcceptPace {
    pub(super) fn new(per_sec: u32) -> AcceptPace {
        let per_sec = per_sec.max(1);
        AcceptPace {
            every: Duration::from_secs(1) / per_sec,
            burst: (per_sec / 10).max(1),
            tat: None,
        }
    }

    /// None when an accept may go now, else when it may.
    pub(super) fn wait_until(&self, now: Instant) -> Option<Instant> {
        let tat = self.tat?;
        let earliest = tat.checked_sub(self.every * (self.burst - 1))?;
        (earliest > now).then_some(earliest)
    }

    /// Counts an accept made at `now`.
    pub(super) fn took(&mut self, now: Instant) {
        let from = self.tat.map_or(now, |t| t.max(now));
        self.tat = Some(from + self.every);
    }
}

/// Returns once the connection just accepted may have a slot: at once
/// under the cap, or when one has made room (see [`Slots`]).
async fn room(slots: &Slots) {
    loop {
        match slots.make_room(Instant::now()) {
            Room::Free => return,
            Room::Evicted => {
                // Lets the closed connection's task end (and its socket
                // close) before the next accept.
                tokio::task::yield_now().await;
                return;
            }
            Room::Full(None) => slots.changed().await,
            Room::Full(Some(at)) => {
                tokio::select! {
                    () = slots.changed() => {}
                    () = tokio::time::sleep_until(at.into()) => {}
                }
            }
        }
    }
}

/// One connection, from accept to close; it gives its slot back on drop.
async fn connection(shared: Shared, stream: tokio::net::TcpStream, peer: SocketAddr, slot: Slot) {
    let slot = Arc::new(slot);
    slot.running();
    let Shared {
        http,
        pages,
        access,
        limits,
    } = shared;
    let io = Watched::new(stream, slot.clone(), limits.write_timeout);
    let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        slot.head_received();
        // The request body, if any, is never read.
        let response = answer(&req, &pages, &access);
        async move { Ok::<_, std::convert::Infallible>(response) }
    });
    let conn = http.serve_connection(hyper_util::rt::TokioIo::new(io), service);
    let most = limits.connection_timeout;
    match tokio::time::timeout(most, conn).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => log::debug!("metrics server: {peer}: {e}"),
        Err(_) => log::debug!("metrics server: {peer}: open for {most:?}; closed"),
    }
}

type Body = http_body_util::Full<Bytes>;

fn answer(
    req: &hyper::Request<hyper::body::Incoming>,
    pages: &Mutex<Pages>,
    access: &Access,
) -> hyper::Response<Body> {
    use hyper::{StatusCode, header};
    let header_of = |name| req.headers().get(name).map(|v| v.as_bytes());
    match route(req.method(), req.uri().path()) {
        Route::Metrics if !access.allows(header_of(header::AUTHORIZATION)) => {
            let mut r = respond(
                StatusCode::UNAUTHORIZED,
                TEXT,
                Bytes::from_static(
                    b"unauthorized: send the bearer token of --metrics-token-file\n",
                ),
            );
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"rtprobe\""),
            );
            r
        }
        Route::Metrics => {
            let accept = header_of(header::ACCEPT).and_then(|v| std::str::from_utf8(v).ok());
            let format = Format::negotiate(accept);
            // Only this thread takes the lock; a poisoned one still holds pages.
            let page = pages
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .page(format, Instant::now());
            respond(StatusCode::OK, format.content_type(), page)
        }
        Route::Healthy => respond(StatusCode::OK, TEXT, Bytes::from_static(b"OK\n")),
        Route::NotFound => respond(
            StatusCode::NOT_FOUND,
            TEXT,
            Bytes::from_static(b"not found: rtprobe serves /metrics and /-/healthy\n"),
        ),
        Route::MethodNotAllowed => {
            let mut r = respond(
                StatusCode::METHOD_NOT_ALLOWED,
                TEXT,
                Bytes::from_static(b"only GET and HEAD are served\n"),
            );
            r.headers_mut()
                .insert(header::ALLOW, header::HeaderValue::from_static("GET, HEAD"));
            r
        }
    }
}

#[derive(Debug, PartialEq)]
enum Route {
    Metrics,
    /// Liveness for a load balancer or a unit's watchdog: answered without
    /// a render or the token.
    Healthy,
    NotFound,
    MethodNotAllowed,
}

/// What to answer a request with (hyper answers a malformed or oversized
/// request head itself: 400, 431). HEAD is GET without the body, which
/// hyper leaves out.
fn route(method: &hyper::Method, path: &str) -> Route {
    use hyper::Method;
    match (method, path) {
        (&Method::GET | &Method::HEAD, "/metrics") => Route::Metrics,
        (&Method::GET | &Method::HEAD, "/-/healthy") => Route::Healthy,
        (&Method::GET | &Method::HEAD, _) => Route::NotFound,
        _ => Route::MethodNotAllowed,
    }
}

fn respond(
    status: hyper::StatusCode,
    content_type: &'static str,
    body: Bytes,
) -> hyper::Response<Body> {
    let mut r = hyper::Response::new(Body::new(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

#[cfg(test)]
mod tests;
