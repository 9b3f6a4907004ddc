//! End-to-end: no thread of rtprobe sleeps on a probe socket while probes
//! go out. The sender reads its own socket between its sends (and a
//! testbed's receiver socket with the in-kernel reflector), so no TX
//! stamp or echo wakes anyone from inside a probe's send; only the
//! in-process reflector's I/O thread waits, on the receiver's socket, as
//! any reflector does. The test samples what every thread of a running
//! rtprobe is blocked on (tests/common/waits.rs) over the sending, at
//! 5 ms, a rate at which a thread used to wait on the sender's socket.
//! Needs root; run by `cargo xtask test` with `--ignored --test-threads=1`.

mod common;

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::{
    pair::{B_IP, Pair, Reflector},
    waits::{UdpSocket, Wait, has_thread, udp_sockets, waits},
    *,
};

const COUNT: u64 = 600;
const INTERVAL: Duration = Duration::from_millis(5);
const PORT: &str = "5071";

/// What the sampling saw over the sending.
struct Seen {
    samples: usize,
    /// Samples in which an I/O thread existed.
    io_thread: usize,
    sockets: Vec<UdpSocket>,
    /// Each wait on one of the run's UDP sockets, with the socket.
    on_udp: Vec<(Wait, UdpSocket)>,
}

/// Waits (at most 60 s: set-up under load) until `child` runs its probe
/// session, then samples what its threads wait on about every
/// millisecond while it can only be sending: the pacer never sends ahead
/// of its schedule, so the probes take at least (COUNT - 1) x INTERVAL
/// from the session's start.
fn watch(child: &mut Child) -> Seen {
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !has_thread(pid, "rtprobe-sender") {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("rtprobe ended ({status}) before it probed");
        }
        assert!(Instant::now() < deadline, "no probe session within 60 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    let sending_until = Instant::now() + INTERVAL * (COUNT as u32 - 1) - Duration::from_millis(300);
    // The sockets are open for the whole session; finding them (`ss` in
    // every namespace) takes a while, so it runs beside the sampling.
    let sockets = std::thread::spawn(move || udp_sockets(pid));
    let (mut samples, mut io_thread, mut all) = (0, 0, Vec::new());
    while Instant::now() < sending_until && has_thread(pid, "rtprobe-sender") {
        all.extend(waits(pid));
        io_thread += usize::from(has_thread(pid, "rtprobe-io"));
        samples += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
    let sockets = sockets.join().unwrap();
    let on_udp = all
        .into_iter()
        .flat_map(|w| {
            sockets
                .iter()
                .filter(|s| w.fds.contains(&s.fd))
                .map(|s| (w.clone(), *s))
                .collect::<Vec<_>>()
        })
        .collect();
    Seen {
        samples,
        io_thread,
        sockets,
        on_udp,
    }
}

/// Waits for `child` to end; its exit code and output.
fn finish(child: Child) -> (i32, String) {
    let o = child.wait_with_output().expect("wait for rtprobe");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.code().unwrap_or(-1), text)
}

fn spawn(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rtprobe")
}

/// rtprobe's own probe arguments: COUNT probes every INTERVAL, outputs in `dir`.
fn probe_args(dir: &std::path::Path) -> Vec<String> {
    let out = |f: &str| dir.join(f).to_string_lossy().into_owned();
    [
        "--quiet",
        "--count",
        &COUNT.to_string(),
        "--interval",
        &format!("{}ms", INTERVAL.as_millis()),
        "--out",
        &out("out.csv"),
        "--json",
        &out("out.json"),
    ]
    .map(String::from)
    .to_vec()
}

/// A sampling that saw enough to mean something: the run's sockets were
/// found and the sampler ran through the sending.
fn assert_sampled(seen: &Seen, sockets_at_least: usize) {
    assert!(
        seen.sockets.len() >= sockets_at_least,
        "the run's UDP sockets were not found: {:?}",
        seen.sockets
    );
    assert!(seen.samples >= 20, "only {} samples", seen.samples);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_target_run_never_waits_on_its_socket_while_sending() {
    if !is_root("a_target_run_never_waits_on_its_socket_while_sending") {
        return;
    }
    let p = Pair::new();
    let r = Reflector::start(&p, &["--listen", &format!("{B_IP}:{PORT}")]);
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn(
        Command::new("ip")
            .args(["netns", "exec", &p.a])
            .arg(bin())
            .args(["--target", &format!("{B_IP}:{PORT}")])
            .args(probe_args(dir.path())),
    );
    let seen = watch(&mut child);
    let (code, out) = finish(child);
    drop(r);
    assert_eq!(code, 0, "{out}");
    assert_sampled(&seen, 1);
    assert_no_wait_on_a_probe_socket(&seen);
    assert_eq!(seen.io_thread, 0, "the sender reads its own socket");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_testbed_run_with_the_kernel_reflector_never_waits_on_a_probe_socket() {
    if !is_root("a_testbed_run_with_the_kernel_reflector_never_waits_on_a_probe_socket") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn(
        Command::new(bin())
            .args(["--xdp-mode", "native", "--reflector", "kernel"])
            .args(probe_args(dir.path())),
    );
    let seen = watch(&mut child);
    let (code, out) = finish(child);
    let _sweep = NsSweep(read_csv(&dir.path().join("out.csv")).0.testbed_id);
    assert_eq!(code, 0, "{out}");
    // The sender's socket and the receiver's (which sees only other runs').
    assert_sampled(&seen, 2);
    assert_no_wait_on_a_probe_socket(&seen);
    assert_eq!(seen.io_thread, 0, "the sender reads both sockets");
}

/// No thread of the run was seen waiting on a probe socket while probes
/// went out.
fn assert_no_wait_on_a_probe_socket(seen: &Seen) {
    assert!(
        seen.on_udp.is_empty(),
        "threads waited on a probe socket while probes went out ({} waits seen in {} samples): {:?}",
        seen.on_udp.len(),
        seen.samples,
        &seen.on_udp[..seen.on_udp.len().min(5)]
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn with_the_user_space_reflector_only_the_receivers_socket_is_waited_on() {
    if !is_root("with_the_user_space_reflector_only_the_receivers_socket_is_waited_on") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = spawn(
        Command::new(bin())
            .args(["--xdp-mode", "native", "--reflector", "user"])
            .args(probe_args(dir.path())),
    );
    let seen = watch(&mut child);
    let (code, out) = finish(child);
    let _sweep = NsSweep(read_csv(&dir.path().join("out.csv")).0.testbed_id);
    assert_eq!(code, 0, "{out}");
    assert_sampled(&seen, 2);
    let on_sender: Vec<_> = seen.on_udp.iter().filter(|(_, s)| s.connected).collect();
    assert!(
        on_sender.is_empty(),
        "threads waited on the sender's socket ({} waits seen in {} samples): {:?}",
        on_sender.len(),
        seen.samples,
        &on_sender[..on_sender.len().min(5)]
    );
    // The reflector waits for probes: the sampler sees waits when there are.
    assert!(
        seen.on_udp
            .iter()
            .any(|(w, s)| !s.connected && w.thread == "rtprobe-io"),
        "the I/O thread was never seen waiting on the receiver's socket in {} samples",
        seen.samples
    );
}
