//! End-to-end: a real Prometheus server (Debian's `prometheus`, started on
//! a loopback port with a temporary config and storage) scrapes a running
//! probe's `--metrics-listen` endpoint every second and answers a PromQL
//! `histogram_quantile(0.99, ...)` over rtprobe's RTT histogram. Needs
//! root for the testbed; run by `cargo xtask test` with `--ignored
//! --test-threads=1`. Without the prometheus binary it prints SKIPPED, and
//! fails under CI=true (`cargo xtask setup` installs it).
//! Then what strangers cost the endpoint, in namespaces: 300 clients that
//! ask for `/metrics` and never read against a 100-target run (its memory
//! stays within 32 MiB of the same run's quiet memory, scrapes are
//! served meanwhile), and one such client closed after the write timeout.
//! The checks that a rejected run never binds its metrics port, of
//! `/-/healthy` and of the bearer token, and the refusal of a label rtprobe
//! emits itself need neither root nor Prometheus.

mod common;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use common::{pair::*, *};

const PROMETHEUS: &str = "/usr/bin/prometheus";

/// Kills and reaps the process on drop, whatever the test's outcome.
struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET over HTTP/1.0 on loopback: (status line, body), or None if nothing
/// listens yet.
fn http_get(port: u16, path: &str) -> Option<(String, String)> {
    let mut c = TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(c, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut out = String::new();
    c.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_string(), body.to_string()))
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of a PromQL instant query with one result, if there is one yet.
fn query(port: u16, promql: &str) -> Option<f64> {
    let (status, body) = http_get(port, &format!("/api/v1/query?query={}", urlencode(promql)))?;
    if !status.contains(" 200 ") {
        panic!("{promql}: {status}\n{body}");
    }
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let result = v["data"]["result"].as_array()?;
    let value = result.first()?["value"][1].as_str()?;
    value.parse().ok().filter(|x: &f64| x.is_finite())
}

fn write_config(dir: &Path, target_port: u16) -> std::path::PathBuf {
    let cfg = dir.join("prometheus.yml");
    std::fs::write(
        &cfg,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: rtprobe\n    scrape_interval: 1s\n    scrape_timeout: 1s\n\
             \x20   static_configs:\n      - targets: ['127.0.0.1:{target_port}']\n"
        ),
    )
    .unwrap();
    cfg
}

/// rtprobe on a testbed of its own for 60 s, serving its metrics on
/// `metrics_port` and writing its CSV to `csv`.
fn start_probe(metrics_port: u16, csv: &Path) -> Killed {
    let probe = Command::new(bin())
        .args([
            "--xdp-mode",
            "off",
            "--duration",
            "60s",
            "--interval",
            "1ms",
            "--quiet",
        ])
        .arg("--metrics-listen")
        .arg(format!("127.0.0.1:{metrics_port}"))
        .arg("--out")
        .arg(csv)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rtprobe");
    Killed(probe)
}

/// Prometheus on `prom_port`, scraping `metrics_port`, its files in `dir`.
fn start_prometheus(dir: &Path, metrics_port: u16, prom_port: u16) -> Killed {
    let cfg = write_config(dir, metrics_port);
    let storage = dir.join("tsdb");
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let prom = Command::new(PROMETHEUS)
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!("--storage.tsdb.path={}", storage.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    Killed(prom)
}

/// Stops the probe with SIGINT and waits (20 s at most) for it to end.
fn stop_with_sigint(probe: &mut Killed) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(probe.0.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let stop_by = Instant::now() + Duration::from_secs(20);
    while probe.0.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < stop_by,
            "rtprobe did not stop after SIGINT"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn prometheus_scrapes_a_running_probe_and_answers_histogram_quantile() {
    if !Path::new(PROMETHEUS).exists() {
        let msg =
            format!("SKIPPED metrics e2e: {PROMETHEUS} not installed (run `cargo xtask setup`)");
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{msg}; under CI=true this is a failure");
        }
        eprintln!("{msg}");
        return;
    }
    if !is_root("prometheus_scrapes_a_running_probe_and_answers_histogram_quantile") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let prom_port = free_port();
    let csv = dir.path().join("out.csv");
    let mut probe = start_probe(metrics_port, &csv);

    let _prom = start_prometheus(dir.path(), metrics_port, prom_port);

    // Bounded: the probe runs 60 s; the answer must come well before.
    let promql = "histogram_quantile(0.99, sum by (le) (rate(rtprobe_rtt_seconds_bucket[10s])))";
    let deadline = Instant::now() + Duration::from_secs(45);
    let p99 = loop {
        if let Some(v) = query(prom_port, promql) {
            break v;
        }
        if let Some(status) = probe.0.try_wait().unwrap() {
            let mut err = String::new();
            let _ = probe.0.stderr.take().unwrap().read_to_string(&mut err);
            panic!("rtprobe ended early ({status}): {err}");
        }
        if Instant::now() > deadline {
            let plog =
                std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default();
            let direct = http_get(metrics_port, "/metrics").map(|r| r.0);
            panic!(
                "no answer to {promql} within 45 s; /metrics answered {direct:?}; prometheus log:\n{}",
                plog.lines().rev().take(20).collect::<Vec<_>>().join("\n")
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    };
    eprintln!("Prometheus: p99 RTT over 10 s = {:.1} µs", p99 * 1e6);
    // In seconds: within the histogram's bounds (1 µs .. 11.9 s), not
    // microseconds or nanoseconds mistaken for seconds. No speed is
    // asserted: a loaded machine may make the RTT anything in there.
    assert!((1e-6..=11.9).contains(&p99), "p99 RTT {p99} s");

    check_what_prometheus_scraped(prom_port);

    // The probe stops cleanly on SIGINT with its summary; the namespaces go.
    stop_with_sigint(&mut probe);
    let (meta, _) = read_csv(&csv);
    let _sweep = NsSweep(meta.testbed_id.clone());
    assert!(namespaces_of(&meta.testbed_id).is_empty());
}

/// The counters, the info gauges, the process metrics and every stage
/// histogram of a testbed run, as Prometheus stored them.
fn check_what_prometheus_scraped(prom_port: u16) {
    let sent = query(prom_port, "sum(rtprobe_probes_sent_total)").expect("sent counter scraped");
    assert!(sent > 0.0);
    let mode = query(prom_port, "rtprobe_xdp_mode_info{requested=\"off\"}");
    assert_eq!(mode, Some(1.0), "the XDP mode gauge is scraped");
    let build = query(prom_port, "rtprobe_build_info{command=\"probe\"}");
    assert_eq!(build, Some(1.0), "the build info is scraped");
    let rss = query(prom_port, "process_resident_memory_bytes{job=\"rtprobe\"}");
    assert!(
        rss.is_some_and(|b| b > 1e6),
        "process metrics are scraped: {rss:?}"
    );
    // A histogram per chain stage the run stamps (4 with --xdp-mode off),
    // none empty: a stage's histogram appears with its first figure, so
    // wait for Prometheus to have scraped all four (10 s at most).
    let count = |q: &str| query(prom_port, &format!("count(count by (stage) ({q}))"));
    let t0 = Instant::now();
    let (stages, filled) = loop {
        let stages = count("rtprobe_stage_seconds_count");
        let filled = count("rtprobe_stage_seconds_count > 0");
        if stages.is_some_and(|n| n >= 4.0) || t0.elapsed() > Duration::from_secs(10) {
            break (stages, filled);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!("stage histograms: {stages:?}, with probes: {filled:?}");
    assert!(stages.is_some_and(|n| n >= 4.0) && stages == filled);
}

/// Issue 18: `--metrics-listen` bound its port before the run's own option
/// checks rejected it. With the port taken by this test, a run that binds
/// first says the port is in use; one that checks first names the bad
/// option. No root: `--target` runs need none, and nothing is sent.
#[test]
fn a_rejected_run_never_binds_its_metrics_port() {
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let key = dir.path().join("key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(bin())
            .args(["--quiet", "--count", "1"])
            .arg("--metrics-listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--out")
            .arg(dir.path().join("out.csv"))
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let in_use = "cannot listen there";
    // The control: a valid run does try the port, and is told it is taken.
    let (code, err) = run(&["--target", "127.0.0.1:9"]);
    assert_ne!(code, Some(0));
    assert!(err.contains(in_use), "a valid run binds: {err}");
    let key = key.to_str().unwrap();
    for (bad, says) in [
        (
            &["--target", "127.0.0.1:9", "--xdp-mode", "native"][..],
            "--xdp-mode",
        ),
        (
            &["--target", "127.0.0.1:9", "--timestamps", "hardware"],
            "--timestamps",
        ),
        (
            &["--target", "127.0.0.1:9", "--auth-key", key],
            "--auth-key",
        ),
        (&["--target", "127.0.0.1:0"], "port 0"),
        (
            &[
                "--target",
                "127.0.0.1:9",
                "--protocol",
                "stamp",
                "--auth-key",
                "/nonexistent/k",
                "--size",
                "112",
            ],
            "key file",
        ),
    ] {
        let (code, err) = run(bad);
        eprintln!("{bad:?}: exit {code:?}: {}", err.trim());
        assert_ne!(code, Some(0), "{bad:?}");
        assert!(err.contains(says), "{bad:?} names the option: {err}");
        assert!(!err.contains(in_use), "{bad:?} bound the port first: {err}");
    }
}

/// The write timeout of the metrics server (a client that reads nothing
/// for this long is closed).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Where the 100-target run serves its metrics, in namespace A.
const MESH_METRICS: &str = "10.77.0.1:9464";

/// `rtprobe --targets` in namespace A probing `n` ports of one reflector
/// in B, 10 probes a second each, for good, serving metrics on
/// [`MESH_METRICS`]: a page of about 6 KB a target. Killed on drop.
struct Mesh {
    run: Killed,
    _reflector: Reflector,
    _dir: tempfile::TempDir,
}

impl Mesh {
    fn start(p: &Pair, n: u16) -> Mesh {
        const PORT0: u16 = 21000;
        let listens: Vec<String> = (0..n).map(|i| format!("{B_IP}:{}", PORT0 + i)).collect();
        let args: Vec<&str> = listens
            .iter()
            .flat_map(|l| ["--listen", l.as_str()])
            .collect();
        let reflector = Reflector::start(p, &args);
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::from("[defaults]\ninterval = \"100ms\"\n");
        for i in 0..n {
            text += &format!(
                "[[target]]\nname = \"t{i}\"\naddress = \"{B_IP}:{}\"\n",
                PORT0 + i
            );
        }
        let targets = dir.path().join("targets.toml");
        std::fs::write(&targets, text).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", &p.a])
            .arg(bin())
            .args(["--quiet", "--forever", "--out", "/dev/null", "--targets"])
            .arg(&targets)
            .args(["--metrics-listen", MESH_METRICS])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start rtprobe --targets");
        let mesh = Mesh {
            run: Killed(child),
            _reflector: reflector,
            _dir: dir,
        };
        // Serving, with every target's series: 60 s at most.
        let t0 = Instant::now();
        loop {
            if let Some(body) = curl_scrape(&p.a, 20)
                && body.matches("rtprobe_probes_sent_total{").count() == usize::from(n)
            {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the mesh serves no metrics after 60 s"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        mesh
    }

    fn rss_kib(&self) -> u64 {
        // `ip netns exec` execs rtprobe: the same pid.
        rss_kib(self.run.0.id())
    }
}

/// A scrape of [`MESH_METRICS`] from namespace `ns` with curl: the body of
/// a whole 200 answer, or None (refused, cut, timed out after `max_s`).
fn curl_scrape(ns: &str, max_s: u32) -> Option<String> {
    let o = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "curl",
            "-sf",
            "--max-time",
            &max_s.to_string(),
        ])
        .arg(format!("http://{MESH_METRICS}/metrics"))
        .output()
        .expect("run curl");
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// A client in the calling thread's namespace that asks for /metrics with
/// a 4 KiB receive buffer and never reads: the server's writes stall.
fn never_reads(addr: SocketAddr) -> TcpStream {
    use std::os::fd::AsRawFd;

    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrIn, connect, setsockopt, socket, sockopt,
    };
    let SocketAddr::V4(v4) = addr else {
        panic!("{addr}: IPv4 only")
    };
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::empty(),
        None,
    )
    .unwrap();
    setsockopt(&fd, sockopt::RcvBuf, &4096).unwrap();
    connect(fd.as_raw_fd(), &SockaddrIn::from(v4)).unwrap();
    let mut c = TcpStream::from(fd);
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    c
}

/// Whether the server has reset or closed `c`, without reading from it (a
/// read would let the stalled answer go on).
fn closed_by_server(c: &TcpStream) -> bool {
    use std::os::fd::AsFd;

    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(c.as_fd(), PollFlags::empty())];
    poll(&mut fds, PollTimeout::ZERO).unwrap();
    fds[0]
        .revents()
        .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP))
}

/// Keeps `n` clients that never read open against [`MESH_METRICS`] from
/// namespace `ns` until `stop`, opening a new one for each the server
/// closes; counts the first `n` the server closed and all it closed.
fn slow_readers(
    ns: &str,
    n: usize,
    stop: &AtomicBool,
    first_closed: &AtomicU64,
    closed: &AtomicU64,
) {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("open netns");
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
    let addr: SocketAddr = MESH_METRICS.parse().unwrap();
    let mut conns: Vec<(bool, TcpStream)> = (0..n).map(|_| (true, never_reads(addr))).collect();
    while !stop.load(Ordering::SeqCst) {
        for (first, c) in &mut conns {
            if closed_by_server(c) {
                closed.fetch_add(1, Ordering::SeqCst);
                if *first {
                    first_closed.fetch_add(1, Ordering::SeqCst);
                }
                *first = false;
                *c = never_reads(addr);
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 24: 300 clients that send `GET /metrics` and never read took a
/// 1000-target mesh from 28 MiB to 1.54 GB (a rendered page each) and 8
/// of 13 scrapes failed. Against a 100-target run (a page of 0.6 MB: 300
/// such clients added 162 MiB before), the same run's memory under the
/// attack stays within 32 MiB of its memory quiet, every client of the
/// first wave is closed by the server (the write timeout, or making room
/// for others), and scrapes are answered during the attack, which goes on
/// the whole time (each closed client is replaced).
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn slow_readers_cost_no_memory_and_scrapes_are_served() {
    if !is_root("slow_readers_cost_no_memory_and_scrapes_are_served") {
        return;
    }
    const READERS: usize = 300;
    let p = Pair::new();
    let mesh = Mesh::start(&p, 100);
    // Quiet: a scrape a second (as Prometheus would), RSS sampled for 5 s.
    let (mut quiet_kib, mut page_bytes) = (0, 0);
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        let page = curl_scrape(&p.a, 30).expect("a quiet scrape failed");
        page_bytes = page.len();
        for _ in 0..5 {
            quiet_kib = quiet_kib.max(mesh.rss_kib());
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let (stop, first_closed, closed) =
        (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    let (attack_kib, served, took) = std::thread::scope(|s| {
        s.spawn(|| slow_readers(&p.b, READERS, &stop, &first_closed, &closed));
        // Under attack: scrapes as a Prometheus would make them, each
        // waiting up to 30 s for its answer, and RSS sampled, until every
        // reader of the first wave has been closed and 3 scrapes answered
        // (120 s at most).
        let (mut attack_kib, mut served) = (0, 0);
        let t0 = Instant::now();
        while (served < 3 || first_closed.load(Ordering::SeqCst) < READERS as u64)
            && t0.elapsed() < Duration::from_secs(120)
        {
            let done = std::sync::atomic::AtomicBool::new(false);
            let ok = std::thread::scope(|s2| {
                s2.spawn(|| {
                    while !done.load(Ordering::SeqCst) {
                        attack_kib = attack_kib.max(mesh.rss_kib());
                        std::thread::sleep(Duration::from_millis(100));
                    }
                });
                let ok = curl_scrape(&p.a, 30).is_some();
                done.store(true, Ordering::SeqCst);
                ok
            });
            served += u32::from(ok);
            std::thread::sleep(Duration::from_millis(500));
        }
        stop.store(true, Ordering::SeqCst);
        (attack_kib, served, t0.elapsed())
    });
    let mib = |k: u64| k as f64 / 1024.0;
    eprintln!(
        "{READERS} slow readers against 100 targets (a page of {:.2} MB): RSS quiet {:.1} MiB, under \
         attack {:.1} MiB (+{:.1}); {served} scrapes answered in {took:.1?}; the server closed {} slow \
         readers ({} of the first wave)",
        page_bytes as f64 / 1e6,
        mib(quiet_kib),
        mib(attack_kib),
        mib(attack_kib.saturating_sub(quiet_kib)),
        closed.load(Ordering::SeqCst),
        first_closed.load(Ordering::SeqCst)
    );
    assert!(served >= 3, "{served} scrapes answered during the attack");
    assert_eq!(
        first_closed.load(Ordering::SeqCst),
        READERS as u64,
        "every slow reader of the first wave is closed by the server"
    );
    assert!(
        attack_kib <= quiet_kib + 32 * 1024,
        "RSS {:.1} MiB under attack, {:.1} MiB quiet",
        mib(attack_kib),
        mib(quiet_kib)
    );
}

/// A client that asks for `/metrics` and never reads is closed by the
/// server once its write has waited the write timeout, and not before.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_client_that_never_reads_is_closed_after_the_write_timeout() {
    if !is_root("a_client_that_never_reads_is_closed_after_the_write_timeout") {
        return;
    }
    let p = Pair::new();
    let _mesh = Mesh::start(&p, 100);
    let (open_for, c) = in_ns(&p.b, || {
        let t0 = Instant::now();
        let c = never_reads(MESH_METRICS.parse().unwrap());
        while !closed_by_server(&c) && t0.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(50));
        }
        (t0.elapsed(), c)
    });
    eprintln!("a client that never reads: closed by the server after {open_for:.1?}");
    assert!(closed_by_server(&c), "still open after 60 s");
    assert!(
        open_for >= WRITE_TIMEOUT,
        "closed after {open_for:?}, before the write timeout"
    );
}

/// `rtprobe --target` on loopback as any user, probing an `rtprobe
/// reflect` there and serving metrics on a free port with `extra` flags;
/// the two processes (killed on drop) and the metrics address once the
/// run prints it.
fn served_run(extra: &[&std::ffi::OsStr]) -> ((Killed, Killed), SocketAddr) {
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let reflector_addr = udp.local_addr().unwrap().to_string();
    drop(udp);
    let reflector = Killed(
        Command::new(bin())
            .args(["reflect", "--quiet", "--listen", &reflector_addr])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start rtprobe reflect"),
    );
    let mut child = Command::new(bin())
        .args(["--quiet", "--target", &reflector_addr, "--duration", "60s"])
        .args(["--out", "/dev/null", "--metrics-listen", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rtprobe --target");
    let stderr = child.stderr.take().unwrap();
    let run = Killed(child);
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(stderr).lines();
    let addr = loop {
        let line = lines
            .next()
            .expect("rtprobe ended without serving metrics")
            .unwrap();
        if let Some(url) = line.strip_prefix("rtprobe: serving metrics at http://") {
            break url.trim_end_matches("/metrics").parse().unwrap();
        }
    };
    ((run, reflector), addr)
}

/// A GET of `path` with `headers`: (status line, body). The server closes
/// the connection after one answer.
fn get(addr: SocketAddr, path: &str, headers: &str) -> (String, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n{headers}\r\n").unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_string(), body.to_string())
}

/// `/-/healthy` answers OK; with `--metrics-token-file`, /metrics answers
/// only the bearer of the token (401 otherwise), the health check anyone.
/// No root: a `--target` run on loopback.
#[test]
fn healthy_and_the_bearer_token() {
    let (run, addr) = served_run(&[]);
    assert_eq!(
        get(addr, "/-/healthy", ""),
        ("HTTP/1.1 200 OK".into(), "OK\n".into())
    );
    let (status, body) = get(addr, "/metrics", "");
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.contains("rtprobe_build_info{"), "{body}");
    assert!(!body.contains("rtprobe_reflector_sessions"), "{body}");
    drop(run);

    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "0123456789abcdef0123456789abcdef\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o640)).unwrap();
    let (_run, addr) = served_run(&["--metrics-token-file".as_ref(), token.as_os_str()]);
    let (status, body) = get(addr, "/metrics", "");
    assert_eq!(status, "HTTP/1.1 401 Unauthorized", "{body}");
    assert!(!body.contains("rtprobe_"), "{body}");
    let wrong = get(
        addr,
        "/metrics",
        "Authorization: Bearer 0123456789abcdef\r\n",
    );
    assert_eq!(wrong.0, "HTTP/1.1 401 Unauthorized");
    let (status, body) = get(
        addr,
        "/metrics",
        "Authorization: Bearer 0123456789abcdef0123456789abcdef\r\n",
    );
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(body.contains("rtprobe_probes_sent_total{"), "{body}");
    assert_eq!(get(addr, "/-/healthy", "").0, "HTTP/1.1 200 OK");
    // A token file every user can read is refused before anything runs.
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = Command::new(bin())
        .args([
            "--quiet",
            "--target",
            "127.0.0.1:9",
            "--count",
            "1",
            "--out",
            "/dev/null",
        ])
        .args(["--metrics-listen", "127.0.0.1:0", "--metrics-token-file"])
        .arg(&token)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0));
    assert!(
        err.contains("--metrics-token-file") && err.contains("chmod o-r"),
        "{err}"
    );
}

/// Issue 24: a target's label named `source` gave
/// `rtprobe_timestamp_source_info{...,source="spoofed",source="software"}`,
/// which Prometheus refuses. Every label rtprobe emits is refused in a
/// targets file, in one line naming it. No root: nothing is sent.
#[test]
fn a_label_rtprobe_emits_is_refused_in_a_targets_file() {
    let dir = tempfile::tempdir().unwrap();
    for label in ["source", "direction", "stage", "outcome", "le"] {
        let file = dir.path().join(format!("{label}.toml"));
        std::fs::write(
            &file,
            format!("[[target]]\nname = \"a\"\naddress = \"127.0.0.1:9\"\nlabels = {{ {label} = \"spoofed\" }}\n"),
        )
        .unwrap();
        let o = Command::new(bin())
            .args(["--quiet", "--count", "1", "--out", "/dev/null", "--targets"])
            .arg(&file)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        eprintln!("{label}: exit {:?}: {}", o.status.code(), err.trim());
        assert_ne!(o.status.code(), Some(0), "{label}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(err.contains(&format!("\"{label}\" is reserved")), "{err}");
    }
}
