//! The server over loopback: routing, formats, the token, and what
//! idle, slow and never-reading clients cost. Each test waits for its
//! condition with a deadline and asserts the mechanism (which connection
//! was closed, and that scrapes were answered), never a speed; the
//! limits that are not under test are set far out of the way.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    os::fd::AsFd,
    time::Instant,
};

use super::*;
use crate::{export::metrics::FlowLabels, model::record::ProbeRecord};

/// Long enough that a test never meets a limit it does not test.
const NEVER: Duration = Duration::from_secs(600);
/// How long a test waits for what must happen, on a loaded machine.
const DEADLINE: Duration = Duration::from_secs(30);

#[test]
fn requests_are_routed() {
    use hyper::Method;
    assert_eq!(route(&Method::GET, "/metrics"), Route::Metrics);
    assert_eq!(route(&Method::HEAD, "/metrics"), Route::Metrics);
    assert_eq!(route(&Method::GET, "/-/healthy"), Route::Healthy);
    assert_eq!(route(&Method::HEAD, "/-/healthy"), Route::Healthy);
    assert_eq!(route(&Method::GET, "/"), Route::NotFound);
    assert_eq!(route(&Method::GET, "/metrics/"), Route::NotFound);
    for m in [Method::POST, Method::PUT, Method::DELETE, Method::OPTIONS] {
        assert_eq!(route(&m, "/metrics"), Route::MethodNotAllowed, "{m}");
    }
}

/// A server on loopback; its thread is not lowered (no probing threads
/// here to yield to, and a loaded machine would only slow the tests).
fn start(m: Arc<Metrics>, access: Access, limits: Limits) -> MetricsServer {
    let limits = Limits {
        yield_cpu: false,
        ..limits
    };
    MetricsServer::start_with("127.0.0.1:0".parse().unwrap(), m, access, limits).unwrap()
}

/// Sends `request`, reads the whole answer (or what came within the deadline).
fn http(addr: SocketAddr, request: &[u8]) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(DEADLINE)).unwrap();
    c.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

fn scrape(addr: SocketAddr) -> String {
    http(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
}

#[test]
fn the_server_answers_scrapes_and_survives_garbage() {
    let m = Arc::new(Metrics::new());
    let mut f = m.flow(FlowLabels::new("t", 0, 0, 64), false);
    f.observe(&ProbeRecord {
        one_way_ns: Some(50_000),
        ..Default::default()
    });
    let server = start(m.clone(), Access::open(), Limits::DEFAULT);
    let addr = server.local_addr();
    assert_ne!(addr.port(), 0);
    // A client that connects and says nothing, one that sends binary,
    // one that sends a huge head: none stops the server.
    drop(TcpStream::connect(addr).unwrap());
    assert!(http(addr, b"\x00\x01\x02garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
    assert!(http(addr, &vec![b'A'; 9000]).starts_with("HTTP/1.1 431"));
    assert!(http(addr, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
    // Any other method gets 405 and what is allowed; its body is not read.
    let post = http(
        addr,
        b"POST /metrics HTTP/1.1\r\nContent-Length: 1000000\r\n\r\nabc",
    );
    assert!(post.starts_with("HTTP/1.1 405"), "{post}");
    assert!(post.contains("Allow: GET, HEAD\r\n"), "{post}");
    let head = http(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "no body: {head}");
    let healthy = http(addr, b"GET /-/healthy HTTP/1.1\r\n\r\n");
    assert!(healthy.starts_with("HTTP/1.1 200 OK\r\n"), "{healthy}");
    assert!(healthy.ends_with("\r\n\r\nOK\n"), "{healthy}");
    let ok = http(
        addr,
        b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text\r\n\r\n",
    );
    assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
    assert!(ok.contains("Content-Type: application/openmetrics-text; version=1.0.0"));
    assert!(ok.contains(
        "rtprobe_one_way_seconds_count{target=\"t\",flow=\"0\",tos=\"0x00\",size=\"64\"} 1"
    ));
    assert!(ok.trim_end().ends_with("# EOF"));
    // Without an Accept header: the Prometheus text format.
    let text = scrape(addr);
    assert!(
        text.contains("Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE rtprobe_probes_sent_total counter\n"),
        "{text}"
    );
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );
    drop(server);
    assert!(TcpStream::connect(addr).is_err(), "stopped on drop");
}

#[test]
fn a_token_guards_the_metrics_and_not_the_health_check() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "s3cret-s3cret-s3cret\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let access = Access::from_token_file(Some(&file)).unwrap();
    let server = start(Arc::new(Metrics::new()), access, Limits::DEFAULT);
    let addr = server.local_addr();
    for refused in [
        &b"GET /metrics HTTP/1.1\r\n\r\n"[..],
        b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer s3cret\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nAuthorization: Basic s3cret-s3cret-s3cret\r\n\r\n",
    ] {
        let a = http(addr, refused);
        assert!(a.starts_with("HTTP/1.1 401"), "{a}");
        assert!(
            a.contains("Www-Authenticate: Bearer realm=\"rtprobe\"\r\n"),
            "{a}"
        );
        assert!(!a.contains("rtprobe_"), "{a}");
    }
    let a = http(
        addr,
        b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer s3cret-s3cret-s3cret\r\n\r\n",
    );
    assert!(
        a.starts_with("HTTP/1.1 200 OK\r\n") && a.contains("rtprobe_build_info"),
        "{a}"
    );
    assert!(http(addr, b"GET /-/healthy HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200 OK"));
}

/// Whether the server has closed `c` (EOF or a reset), without waiting.
fn closed_now(mut c: &TcpStream) -> bool {
    c.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    let closed = loop {
        match c.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    c.set_nonblocking(false).unwrap();
    closed
}

/// Polls `closed` until it holds or the deadline passes.
fn within_deadline(mut closed: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < DEADLINE {
        if closed() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A client that sends a never-finished request head one byte every
/// 200 ms (slowloris); returns how long the server kept it open.
fn slowloris(addr: SocketAddr) -> Option<Duration> {
    let t0 = Instant::now();
    let mut c = TcpStream::connect(addr).unwrap();
    let head = b"GET /metrics HTTP/1.1\r\nX-Slow: ";
    let mut sent = 0usize;
    while t0.elapsed() < DEADLINE {
        let byte = head.get(sent).copied().unwrap_or(b'a');
        if c.write_all(&[byte]).is_err() || closed_now(&c) {
            return Some(t0.elapsed());
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    None
}

/// Issue 18: idle and slowloris clients are closed by the header timeout,
/// not before it, and scrapes are answered beside them.
#[test]
fn idle_and_slowloris_clients_are_closed_after_the_header_timeout() {
    let server = start(Arc::new(Metrics::new()), Access::open(), Limits::DEFAULT);
    let addr = server.local_addr();
    let t0 = Instant::now();
    let idle: Vec<TcpStream> = (0..50).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let slow: Vec<_> = (0..5)
        .map(|_| std::thread::spawn(move || slowloris(addr)))
        .collect();
    for _ in 0..5 {
        let answer = scrape(addr);
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
    }
    for c in &idle {
        let open_for = within_deadline(|| closed_now(c)).expect("an idle client stays open");
        assert!(t0.elapsed() >= HEADER_TIMEOUT, "closed after {open_for:?}");
    }
    for s in slow {
        let l = s.join().unwrap().expect("a slowloris client stays open");
        assert!(
            l >= HEADER_TIMEOUT,
            "closed after {l:?}, before the header timeout"
        );
    }
}

/// At the cap, a scrape is served by closing the connection that has
/// waited longest for its request head; the others stay open.
#[test]
fn at_the_cap_the_oldest_idle_connection_makes_room() {
    let limits = Limits {
        header_timeout: NEVER,
        max_connections: 8,
        ..Limits::DEFAULT
    };
    let server = start(Arc::new(Metrics::new()), Access::open(), limits);
    let addr = server.local_addr();
    let idle: Vec<TcpStream> = (0..8).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let answer = scrape(addr);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer:?}");
    within_deadline(|| closed_now(&idle[0])).expect("the oldest idle connection is closed");
    let open = idle[1..].iter().filter(|c| !closed_now(c)).count();
    assert_eq!(open, 7, "one connection made room, not more");
}

/// A metrics registry with `flows` flows of every series: about 55 KB
/// of page a flow.
fn metrics_of(flows: u16) -> Arc<Metrics> {
    let m = Arc::new(Metrics::new());
    for t in 0..flows {
        let target = format!("10.{}.{}.2:5061", t / 250, t % 250);
        let mut f = m.flow(FlowLabels::new(target, 0, 0, 64), false);
        f.observe(&ProbeRecord {
            one_way_ns: Some(10_000),
            rtt_ns: Some(20_000),
            stack_ns: Some(1_000),
            sender_queue_ns: Some(1_000),
            driver_ns: Some(1_000),
            path_ns: Some(1_000),
            receiver_ns: Some(1_000),
            reflector_ns: Some(1_000),
            return_ns: Some(1_000),
            ..Default::default()
        });
    }
    m
}

/// A page larger than what loopback's socket buffers take in (the send
/// buffer grows to net.ipv4.tcp_wmem's 4 MiB there), so that a client
/// that never reads stalls the server's writes.
fn big_metrics() -> Arc<Metrics> {
    metrics_of(120)
}

/// A client that asks for /metrics with a 4 KiB receive buffer and never
/// reads: the server's writes stall once the socket buffers are full.
fn never_reads(addr: SocketAddr) -> TcpStream {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrIn, connect, setsockopt, socket, sockopt,
    };
    let SocketAddr::V4(v4) = addr else {
        panic!("{addr}: the tests listen on IPv4")
    };
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::empty(),
        None,
    )
    .unwrap();
    setsockopt(&fd, sockopt::RcvBuf, &4096).unwrap();
    use std::os::fd::AsRawFd;
    connect(fd.as_raw_fd(), &SockaddrIn::from(v4)).unwrap();
    let mut c = TcpStream::from(fd);
    c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    c
}

/// Whether `c` was reset (or closed) by the server, without reading: a
/// read would let the stalled answer go on.
fn reset_now(c: &TcpStream) -> bool {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(c.as_fd(), PollFlags::empty())];
    poll(&mut fds, PollTimeout::ZERO).unwrap();
    fds[0]
        .revents()
        .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP))
}

/// A client that reads nothing of its answer is reset once the write has
/// waited the write timeout, not before.
#[test]
fn a_client_that_never_reads_is_reset_after_the_write_timeout() {
    let limits = Limits {
        write_timeout: Duration::from_secs(1),
        connection_timeout: NEVER,
        header_timeout: NEVER,
        ..Limits::DEFAULT
    };
    let server = start(big_metrics(), Access::open(), limits);
    let t0 = Instant::now();
    let c = never_reads(server.local_addr());
    within_deadline(|| reset_now(&c)).expect("the client that never reads is closed");
    assert!(t0.elapsed() >= limits.write_timeout, "{:?}", t0.elapsed());
}

/// At the cap, a scrape is served by closing the reader stalled longest;
/// the other stalled readers stay open (their write timeout is far off).
#[test]
fn at_the_cap_the_longest_stalled_reader_makes_room() {
    let limits = Limits {
        write_timeout: NEVER,
        connection_timeout: NEVER,
        max_connections: 4,
        ..Limits::DEFAULT
    };
    let server = start(big_metrics(), Access::open(), limits);
    let addr = server.local_addr();
    let slow: Vec<TcpStream> = (0..4).map(|_| never_reads(addr)).collect();
    let answer = scrape(addr);
    assert!(
        whole_page(&answer),
        "{} bytes: {:?}",
        answer.len(),
        &answer[..answer.len().min(300)]
    );
    within_deadline(|| reset_now(&slow[0])).expect("the first stalled reader is closed");
    let open = slow[1..].iter().filter(|c| !reset_now(c)).count();
    assert_eq!(open, 3, "one reader made room, not more");
}

/// A burst of scrapes far over the cap is queued, not refused: every
/// one is answered.
#[test]
fn scrapes_over_the_cap_wait_their_turn() {
    let limits = Limits {
        max_connections: 4,
        ..Limits::DEFAULT
    };
    let server = start(metrics_of(20), Access::open(), limits);
    let addr = server.local_addr();
    let answers: Vec<String> = std::thread::scope(|s| {
        let burst: Vec<_> = (0..40).map(|_| s.spawn(|| scrape(addr))).collect();
        burst.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let whole = answers.iter().filter(|a| whole_page(a)).count();
    assert_eq!(whole, answers.len(), "every scrape answered, whole");
}

/// Whether `answer` is a 200 with a body of its Content-Length, over 1 MB.
fn whole_page(answer: &str) -> bool {
    let Some((head, body)) = answer.split_once("\r\n\r\n") else {
        return false;
    };
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .and_then(|v| v.parse::<usize>().ok());
    head.starts_with("HTTP/1.1 200 OK") && length == Some(body.len()) && body.len() > 1_000_000
}

/// The accept pace: a burst of a tenth of a second's accepts at once,
/// then one every 1/rate, never more over any stretch.
#[test]
fn the_accept_pace_lets_a_burst_through_then_spaces_accepts() {
    let t0 = Instant::now();
    let mut p = AcceptPace::new(100);
    for _ in 0..10 {
        assert_eq!(p.wait_until(t0), None, "the burst goes at once");
        p.took(t0);
    }
    let next = p.wait_until(t0).expect("the 11th waits");
    assert_eq!(next - t0, Duration::from_millis(10));
    p.took(next);
    assert_eq!(p.wait_until(next), Some(next + Duration::from_millis(10)));
    // After a quiet second the whole burst is there again, no more.
    let later = next + Duration::from_secs(1);
    for _ in 0..10 {
        assert_eq!(p.wait_until(later), None);
        p.took(later);
    }
    assert!(p.wait_until(later).is_some());
}

/// A closed loop of scrapers is held to the accept rate: 40 scrapes at
/// 20/s (a burst of 2) take at least 1.9 s, and each is answered.
#[test]
fn scrapers_are_held_to_the_accept_rate() {
    let limits = Limits {
        accepts_per_sec: Some(20),
        ..Limits::DEFAULT
    };
    let server = start(Arc::new(Metrics::new()), Access::open(), limits);
    let addr = server.local_addr();
    let t0 = Instant::now();
    let answers: Vec<String> = std::thread::scope(|s| {
        let crowd: Vec<_> = (0..4)
            .map(|_| s.spawn(move || (0..10).map(|_| scrape(addr)).collect::<Vec<_>>()))
            .collect();
        crowd.into_iter().flat_map(|t| t.join().unwrap()).collect()
    });
    let took = t0.elapsed();
    assert!(
        answers.iter().all(|a| a.starts_with("HTTP/1.1 200 OK\r\n")),
        "every scrape answered"
    );
    assert!(
        took >= Duration::from_millis(1900),
        "40 accepts at 20/s in {took:?}"
    );
}
