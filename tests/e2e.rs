//! End-to-end: the real binary builds its testbed, attaches the XDP router,
//! probes and tears down. Needs root; run by `cargo xtask test` with
//! `--ignored --test-threads=1`.

mod common;

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use common::*;

const N: u64 = 300;

fn assert_clean_run(r: &Run, n: u64) {
    assert_eq!(r.code, 0, "stderr: {}\nstdout: {}", r.stderr, r.stdout);
    assert_eq!(r.json["sent"], n, "{}", r.stdout);
    assert_lost_only_by_the_kernel(r);
    assert_eq!(r.rows.len() as u64, n, "one CSV row per probe");
    assert!(
        r.rows
            .iter()
            .all(|row| row[14] == "0" && !row[8].is_empty()),
        "every row received with a one-way time"
    );
    assert_eq!(
        r.json["timestamp_source"], "software",
        "veth only has software timestamps"
    );
    for k in ["min", "p50", "p90", "p99", "p999", "max", "mean"] {
        assert!(r.json["one_way_ns"][k].is_number(), "one_way_ns.{k}");
        assert!(r.json["rtt_ns"][k].is_number(), "rtt_ns.{k}");
    }
    assert!(r.stdout.contains("one-way") && r.stdout.contains("p99.9"));
}

fn counter(r: &Run, name: &str) -> u64 {
    r.json["xdp_counters"][name]["packets"]
        .as_u64()
        .unwrap_or(0)
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn kernel_forwarding_baseline() {
    if !is_root("kernel_forwarding_baseline") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let r = probe(
        dir.path(),
        &[
            "--xdp-mode",
            "off",
            "--count",
            &N.to_string(),
            "--interval",
            "1ms",
            "--tos",
            "0xC0",
        ],
    );
    assert_clean_run(&r, N);
    assert_eq!(r.meta.xdp_mode_attached, "none");
    assert_eq!(r.json["xdp_mode_attached"], "none");
    assert_eq!(r.meta.tos, 0xc0);
    assert!(
        r.json["xdp_counters"]
            .as_object()
            .is_none_or(|m| m.is_empty())
    );
}

fn xdp_mode_run(mode: &str, expect_attached: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let r = probe(
        dir.path(),
        &[
            "--xdp-mode",
            mode,
            "--count",
            &N.to_string(),
            "--interval",
            "1ms",
        ],
    );
    assert_clean_run(&r, N);
    assert_eq!(r.json["xdp_mode_requested"], mode);
    assert_eq!(r.json["xdp_mode_attached"], expect_attached, "{}", r.stdout);
    assert!(
        r.stdout.contains(&format!("attached {expect_attached}")),
        "{}",
        r.stdout
    );
    // Every probe and every echo crosses the router once: redirected in XDP.
    let redirected = counter(&r, "redirected");
    assert!(
        redirected >= 2 * N,
        "redirected {redirected} < {} (probes + echoes)",
        2 * N
    );
    // Warm-up datagrams and the first packets before neighbours resolve may add a few.
    assert!(
        redirected <= 2 * N + 20,
        "redirected {redirected} is far above {}",
        2 * N
    );
    r
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn xdp_skb_mode() {
    if is_root("xdp_skb_mode") {
        let r = xdp_mode_run("skb", "skb");
        // Generic-XDP redirect out of a veth timestamps the same send again
        // at the router: counted, and the first (the sender's) kept.
        assert!(
            r.json["tx_timestamp_duplicates"].as_u64().unwrap() > 0,
            "{}",
            r.stdout
        );
        let p50 = r.json["one_way_ns"]["p50"].as_u64().unwrap();
        assert!(
            p50 > 1_000,
            "one-way p50 {p50} ns: the router's stamp was used instead of the sender's"
        );
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn xdp_native_mode() {
    if is_root("xdp_native_mode") {
        let _ = xdp_mode_run("native", "native");
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn xdp_auto_mode_reports_what_it_got() {
    if is_root("xdp_auto_mode_reports_what_it_got") {
        // veth has native XDP, so the kernel picks native.
        let _ = xdp_mode_run("auto", "native");
    }
}

/// `--ip 6` on the dual-stack testbed with the router in XDP mode `mode`:
/// no probe lost; every IPv6 probe and echo crosses the router once,
/// counted by its IPv6 counters (nothing IPv4 is forwarded).
fn ipv6_mode_run(mode: &str, expect_attached: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let r = probe(
        dir.path(),
        &[
            "--ip",
            "6",
            "--xdp-mode",
            mode,
            "--count",
            &N.to_string(),
            "--interval",
            "1ms",
        ],
    );
    assert_clean_run(&r, N);
    let ip = &r.json["extra"]["ip"];
    assert_eq!(ip["version"], 6, "{ip}");
    assert_eq!(ip["sender"], "fd71:1::2", "{ip}");
    assert_eq!(ip["receiver"], "fd71:2::2", "{ip}");
    // The in-kernel reflector answers IPv6 probes too, with its times.
    let refl = &r.json["extra"]["reflector"];
    assert_eq!(refl["kind"], "kernel", "{refl}");
    assert_eq!(r.meta.reflector, "kernel");
    let turnaround = &r.json["reflector_turnaround_ns"];
    assert!(
        turnaround["count"].as_u64() == Some(N) && turnaround["p50"].as_u64().is_some(),
        "every echo carries the reflector's times: {turnaround}"
    );
    assert_eq!(r.json["xdp_mode_attached"], expect_attached, "{}", r.stdout);
    if mode == "off" {
        assert!(
            r.json["xdp_counters"]
                .as_object()
                .is_none_or(|m| m.is_empty())
        );
        return r;
    }
    let bytes = |name: &str| r.json["xdp_counters"][name]["bytes"].as_u64().unwrap_or(0);
    let redirected = counter(&r, "ipv6_redirected");
    assert!(
        (2 * N..=2 * N + 20).contains(&redirected),
        "ipv6_redirected {redirected}, want {} (probes + echoes) + a few warm-ups",
        2 * N
    );
    // Each of them one 64-byte probe in a frame: 14 Ethernet + 40 IPv6 + 8 UDP.
    assert_eq!(
        bytes("ipv6_redirected"),
        redirected * (14 + 40 + 8 + 64),
        "only probe frames were forwarded"
    );
    assert_eq!(counter(&r, "redirected"), 0, "no IPv4 forwarded in XDP");
    assert_eq!(counter(&r, "ipv6_dropped_unreachable"), 0);
    assert_eq!(counter(&r, "ipv6_malformed"), 0);
    r
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn ipv6_xdp_off_kernel_forwards() {
    if is_root("ipv6_xdp_off_kernel_forwards") {
        let _ = ipv6_mode_run("off", "none");
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn ipv6_xdp_skb_mode() {
    if is_root("ipv6_xdp_skb_mode") {
        let _ = ipv6_mode_run("skb", "skb");
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn ipv6_xdp_native_mode() {
    if is_root("ipv6_xdp_native_mode") {
        let _ = ipv6_mode_run("native", "native");
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn ipv6_xdp_auto_mode() {
    if is_root("ipv6_xdp_auto_mode") {
        let _ = ipv6_mode_run("auto", "native");
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn ipv6_stamp_through_the_testbed() {
    if !is_root("ipv6_stamp_through_the_testbed") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let r = probe(
        dir.path(),
        &[
            "--ip",
            "6",
            "--protocol",
            "stamp",
            // The stateful one, which counts per session (the in-kernel
            // one: remote_e2e's stamp_over_ipv6_testbed_...).
            "--reflector",
            "user",
            "--xdp-mode",
            "native",
            "--count",
            &N.to_string(),
            "--interval",
            "1ms",
        ],
    );
    assert_eq!(r.code, 0, "stderr: {}\nstdout: {}", r.stderr, r.stdout);
    assert_eq!(r.json["sent"], N, "{}", r.stdout);
    assert_lost_only_by_the_kernel(&r);
    let refl = &r.json["extra"]["reflector"];
    assert_eq!(refl["kind"], "user", "{refl}");
    assert_eq!(refl["protocol"], "stamp", "{refl}");
    // The stateful user-space reflector counts: the split is known.
    let split = &r.json["extra"]["loss_split"];
    assert_eq!(
        (split["forward"].as_u64(), split["return"].as_u64()),
        (Some(0), Some(0)),
        "{split}"
    );
    // One router hop from the default hop limit 64.
    assert_eq!(refl["sender_ttl_min"], 63, "{refl}");
    assert!(counter(&r, "ipv6_redirected") >= 2 * N, "{}", r.stdout);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn xdp_pass_only_variant_forwards_in_the_kernel() {
    if !is_root("xdp_pass_only_variant_forwards_in_the_kernel") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let r = probe(
        dir.path(),
        &[
            "--xdp-mode",
            "native",
            "--xdp-action",
            "pass",
            "--count",
            &N.to_string(),
        ],
    );
    assert_clean_run(&r, N);
    assert_eq!(counter(&r, "redirected"), 0);
    assert!(counter(&r, "pass_only") >= 2 * N, "{}", r.stdout);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn nic_pair_mode_gives_interfaces_back() {
    if !is_root("nic_pair_mode_gives_interfaces_back") {
        return;
    }
    let a = unique("rtpta");
    let b = unique("rtptb");
    sh_ok(&format!("ip link add {a} type veth peer name {b}"));
    let _ga = LinkGuard(a.clone());
    sh_ok(&format!(
        "ip addr add 192.0.2.1/32 dev {a} && ip link set {a} up && ip link set {b} mtu 1400"
    ));
    let before_a = sh_ok(&format!("ip -br addr show dev {a}"));
    let dir = tempfile::tempdir().unwrap();
    let r = probe(
        dir.path(),
        &[
            "--tx-if",
            &a,
            "--rx-if",
            &b,
            "--xdp-mode",
            "off",
            "--count",
            &N.to_string(),
        ],
    );
    assert_clean_run(&r, N);
    assert_eq!(r.meta.testbed, "nic-pair");
    // Back in the root namespace with address, state and MTU as before.
    let after_a = sh_ok(&format!("ip -br addr show dev {a}"));
    assert!(
        after_a.contains("192.0.2.1/32"),
        "address not restored: {after_a}"
    );
    assert_eq!(
        before_a.split_whitespace().nth(2),
        after_a.split_whitespace().nth(2)
    );
    assert!(sh_ok(&format!("ip link show dev {b}")).contains("mtu 1400"));
    assert!(
        !sh_ok(&format!("ip link show dev {b}")).contains(",UP"),
        "{b} was down before"
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn nic_pair_mode_over_ipv6() {
    if !is_root("nic_pair_mode_over_ipv6") {
        return;
    }
    let a = unique("rtp6a");
    let b = unique("rtp6b");
    sh_ok(&format!("ip link add {a} type veth peer name {b}"));
    let _ga = LinkGuard(a.clone());
    let dir = tempfile::tempdir().unwrap();
    let r = probe(
        dir.path(),
        &[
            "--tx-if",
            &a,
            "--rx-if",
            &b,
            "--xdp-mode",
            "off",
            "--ip",
            "6",
            "--count",
            &N.to_string(),
        ],
    );
    assert_clean_run(&r, N);
    assert_eq!(r.meta.testbed, "nic-pair");
    let ip = &r.json["extra"]["ip"];
    assert_eq!(
        (ip["sender"].as_str(), ip["receiver"].as_str()),
        (Some("fd71::1"), Some("fd71::2")),
        "{ip}"
    );
    // Given back without the testbed's addresses.
    for dev in [&a, &b] {
        let after = sh_ok(&format!("ip -br addr show dev {dev}"));
        assert!(
            !after.contains("fd71:"),
            "{dev} kept a testbed address: {after}"
        );
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn missing_interface_is_a_clear_error() {
    if !is_root("missing_interface_is_a_clear_error") {
        return;
    }
    let o = Command::new(bin())
        .args([
            "--tx-if",
            "rtpt-nonexist0",
            "--rx-if",
            "rtpt-nonexist1",
            "--out",
            "/tmp/rtprobe-nx.csv",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains("interface rtpt-nonexist0 not found"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn sigint_mid_run_keeps_every_probe_and_cleans_up() {
    if !is_root("sigint_mid_run_keeps_every_probe_and_cleans_up") {
        return;
    }
    for mode in ["off", "native"] {
        let dir = tempfile::tempdir().unwrap();
        let csv = dir.path().join("out.csv");
        let json = dir.path().join("out.json");
        let child = Command::new(bin())
            .args([
                "--quiet",
                "--xdp-mode",
                mode,
                "--count",
                "100000",
                "--interval",
                "1ms",
            ])
            .args([
                "--out",
                csv.to_str().unwrap(),
                "--json",
                json.to_str().unwrap(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(2500));
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )
        .unwrap();
        let o = child.wait_with_output().unwrap();
        let (meta, rows) = read_csv(&csv);
        let _sweep = NsSweep(meta.testbed_id.clone());
        assert_eq!(
            o.status.code(),
            Some(130),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let j: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let sent = j["sent"].as_u64().unwrap();
        assert!(sent > 100 && sent < 100_000, "sent {sent}");
        assert_eq!(rows.len() as u64, sent, "every probe sent is in the CSV");
        assert_eq!(j["lost"], 0, "in-flight probes were waited for");
        assert!(
            namespaces_of(&meta.testbed_id).is_empty(),
            "namespaces left after SIGINT ({mode})"
        );
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn hardware_timestamps_on_veth_is_a_clear_error() {
    if !is_root("hardware_timestamps_on_veth_is_a_clear_error") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(bin())
        .args([
            "--quiet",
            "--xdp-mode",
            "off",
            "--timestamps",
            "hardware",
            "--count",
            "10",
        ])
        .arg("--out")
        .arg(dir.path().join("o.csv"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("cannot timestamp in hardware") && err.contains("--timestamps software"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // Its own testbed is gone: a testbed's record (/run/rtprobe/ID.json,
    // naming the process that built it) goes only once all of it is
    // removed. Other root test binaries may hold testbeds meanwhile.
    let left = records_of(pid);
    assert!(
        left.is_empty(),
        "testbed records of pid {pid} left: {left:?}"
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn datagrams_without_the_session_id_are_ignored_and_counted() {
    if !is_root("datagrams_without_the_session_id_are_ignored_and_counted") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("out.csv");
    let json = dir.path().join("out.json");
    let child = Command::new(bin())
        .args([
            "--quiet",
            "--xdp-mode",
            "native",
            "--count",
            "1500",
            "--interval",
            "1ms",
        ])
        .args([
            "--out",
            csv.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The metadata line names the testbed as soon as probing starts.
    let mut id = String::new();
    for _ in 0..100 {
        std::thread::sleep(Duration::from_millis(50));
        if let Ok(t) = std::fs::read_to_string(&csv)
            && t.lines().count() > 1
        {
            id = read_csv(&csv).0.testbed_id;
            break;
        }
    }
    let _sweep = NsSweep(id.clone());
    assert!(!id.is_empty(), "the run did not start");
    let ns = format!("rtprobe-{id}-sender");
    for msg in ["hello", "RTPB-not-a-probe", "x"] {
        sh_ok(&format!(
            "ip netns exec {ns} bash -c 'echo {msg} > /dev/udp/10.71.2.2/5061'"
        ));
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success());
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(j["foreign_packets"], 3, "{j}");
    assert_eq!(j["sent"], 1500);
    assert_eq!(j["received"], 1500);
    assert_eq!(read_csv(&csv).1.len(), 1500);
}

/// The testbed records in /run/rtprobe that process `pid` wrote.
fn records_of(pid: u32) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/run/rtprobe") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read_to_string(e.path())
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .is_some_and(|v| v["pid"] == pid)
        })
        .map(|e| e.path().display().to_string())
        .collect()
}
