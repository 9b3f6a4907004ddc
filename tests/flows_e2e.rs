//! `rtprobe flows` against a real iperf3 TCP flow (a tool we did not
//! write) through a shaped veth pair: the mechanism, not the figures. An
//! htb bottleneck with a 100-packet queue sits on the sender's own
//! interface, where the send stamps see the queue: the flow's stages are
//! present, and its sends wait ms in the sender queue, not on the path.
//! The figures (the agreement with the probe, the shaper's counters, `ss`
//! and a packet capture) are `cargo xtask bench --only flows`'.

mod common;

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use common::{pair::*, *};

/// Starts `rtprobe flows ARGS` and returns once it watches (its first
/// stderr line), with the rest of its stderr kept for the failure message.
fn start_flows(args: &[&str]) -> (Child, std::thread::JoinHandle<String>) {
    let mut child = Command::new(bin())
        .arg("flows")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start rtprobe flows");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    err.read_line(&mut first).unwrap();
    assert!(first.contains("watching"), "rtprobe flows: {first}");
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    (child, rest)
}

/// iperf3's server in `ns`, for one test.
struct Iperf3Server(Child);

impl Iperf3Server {
    fn start(ns: &str) -> Self {
        let c = Command::new("ip")
            .args(["netns", "exec", ns, "iperf3", "-s", "-1", "-p", "5201"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start iperf3 -s (cargo xtask setup installs iperf3)");
        // Until it listens.
        let until = Instant::now() + Duration::from_secs(5);
        while !sh(&format!("ip netns exec {ns} ss -ltn 'sport = :5201'"))
            .stdout_text()
            .contains("5201")
        {
            assert!(Instant::now() < until, "iperf3 -s did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self(c)
    }
}

impl Drop for Iperf3Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The flow whose remote port is iperf3's: the client's data socket (the
/// one with the most samples).
fn iperf3_flow(j: &serde_json::Value) -> &serde_json::Value {
    j["flows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["remote"].as_str().is_some_and(|r| r.ends_with(":5201")))
        .max_by_key(|f| f["samples"].as_u64())
        .unwrap_or_else(|| panic!("no flow to port 5201 in {j:#}"))
}

fn p50(f: &serde_json::Value, stage: &str) -> u64 {
    f[stage]["p50"]
        .as_u64()
        .unwrap_or_else(|| panic!("no {stage} p50 in {f:#}"))
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_shaped_iperf3_flow_spends_its_time_in_the_sender_queue() {
    if !is_root("a_shaped_iperf3_flow_spends_its_time_in_the_sender_queue") {
        return;
    }
    let p = Pair::new();
    for cmd in [
        format!("tc qdisc add dev {} root handle 1: htb default 1", p.va),
        format!(
            "tc class add dev {} parent 1: classid 1:1 htb rate 100mbit",
            p.va
        ),
        format!(
            "tc qdisc add dev {} parent 1:1 handle 10: pfifo limit 100",
            p.va
        ),
    ] {
        sh_ok(&format!("ip netns exec {} {cmd}", p.a));
    }
    let _server = Iperf3Server::start(&p.b);
    let dir = tempfile::tempdir().unwrap();
    let (json, csv) = (dir.path().join("f.json"), dir.path().join("f.csv"));
    let (flows, stderr) = start_flows(&[
        "--duration",
        "7s",
        "--port",
        "5201",
        "--sample-rate",
        "20",
        "--json",
        json.to_str().unwrap(),
        "--out",
        csv.to_str().unwrap(),
    ]);
    let client = Command::new("ip")
        .args([
            "netns", "exec", &p.a, "iperf3", "-c", B_IP, "-p", "5201", "-t", "4",
        ])
        .output()
        .unwrap();
    assert!(
        client.status.success(),
        "{}",
        String::from_utf8_lossy(&client.stderr)
    );
    let out = flows.wait_with_output().unwrap();
    let err = stderr.join().unwrap();
    assert!(out.status.success(), "rtprobe flows: {err}");
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_matches_flows_schema(&j);
    let f = iperf3_flow(&j);
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(f["comm"], "iperf3", "{f:#}");
    // 20/s for 4 s, one in flight at a time: a few dozen.
    let samples = f["samples"].as_u64().unwrap();
    assert!(samples >= 10, "{samples} samples: {f:#}");
    let (stack, queue, round_trip) = (
        p50(f, "stack"),
        p50(f, "sender_queue"),
        p50(f, "round_trip"),
    );
    // The bottleneck's queue is at the sender's interface: the sends wait
    // there (ms at 100 Mbit), and not on the veth's path. (A bulk sender's
    // bytes also wait in its own send buffer before the qdisc, behind the
    // data written before them and TCP's small-queue limit: the stack
    // stage, tens of ms here.)
    assert!(queue > 1_000_000, "sender queue p50 {queue} ns: {f:#}");
    assert!(queue > 10 * round_trip, "{f:#}");
    assert!(stack > 0, "{f:#}");
    assert_eq!(f["nic"]["count"], 0, "a veth has no NIC stamp: {f:#}");
    // One CSV row per sample of the run (every flow the port matched).
    let rows = std::fs::read_to_string(&csv).unwrap().lines().count() - 1;
    assert_eq!(rows as u64, j["all"]["samples"].as_u64().unwrap());
    // The program's own account: what it reported is what was read.
    assert_eq!(j["counters"]["ring_full"], 0, "{:#}", j["counters"]);
    assert!(j["counters"]["sampled"].as_u64() >= j["all"]["samples"].as_u64());
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn without_root_flows_refuses_in_one_line_and_writes_nothing() {
    if !is_root("without_root_flows_refuses_in_one_line_and_writes_nothing") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    sh_ok(&format!("chmod 777 {}", dir.path().display()));
    let csv = dir.path().join("f.csv");
    let out = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
        .arg(bin())
        .args(["flows", "--duration", "1s", "--out", csv.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(last.starts_with("Error:") && last.contains("root"), "{err}");
    assert!(!csv.exists(), "nothing written before the refusal");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_second_flows_at_once_is_refused_in_one_line() {
    if !is_root("a_second_flows_at_once_is_refused_in_one_line") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let first_csv = dir.path().join("first.csv");
    let (first, _err) = start_flows(&["--duration", "5s", "--out", first_csv.to_str().unwrap()]);
    let csv = dir.path().join("second.csv");
    let out = Command::new(bin())
        .args(["flows", "--duration", "1s", "--out", csv.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("Error:") && last.contains("another rtprobe flows"),
        "{err}"
    );
    assert!(!csv.exists(), "nothing written by the second");
    assert!(
        first.wait_with_output().unwrap().status.success(),
        "the first ends as usual"
    );
}
