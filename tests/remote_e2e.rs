//! End-to-end: `rtprobe reflect` in one namespace, `rtprobe --target` (as
//! the unprivileged user nobody) in another, joined by a veth pair this
//! test creates and removes; with the rtprobe protocol and STAMP, loss
//! split by direction under a tc filter, authenticated STAMP with a good
//! and a wrong key, a flood of malformed datagrams, scapy's STAMP on the
//! wire in both roles, and STAMP through the testbed answered by the
//! in-kernel and the user-space reflector. Needs root; run by `cargo xtask
//! test` with `--ignored --test-threads=1`.

mod common;

use std::{
    path::Path,
    process::{Command, Stdio},
};

use common::{pair::*, *};

const N: u64 = 500;

fn assert_counters_add_up(c: &serde_json::Value) {
    let n = |k: &str| c[k].as_u64().unwrap_or_else(|| panic!("{k} in {c}"));
    assert_eq!(
        n("datagrams"),
        n("reflected")
            + n("not_for_us")
            + n("bad_source")
            + n("malformed")
            + n("rate_limited")
            + n("auth_failed"),
        "{c}"
    );
    assert!(n("bytes_out") <= n("bytes_in"), "{c}");
}

/// RTT is always there; one-way only with both clocks synchronised.
fn check_rtt_and_one_way(t: &Run) {
    assert_eq!(t.json["rtt_ns"]["count"], N);
    let clock = &t.json["extra"]["clock"];
    if clock["one_way_shown"] == false {
        assert!(
            t.stdout
                .contains("clocks not synchronised: one-way not shown"),
            "{}",
            t.stdout
        );
        assert!(t.json["one_way_ns"]["p50"].is_null());
        // Nor in the CSV (column 8, one_way_ns); the raw stamps stay.
        assert!(t.rows.iter().all(|r| r[8].is_empty()), "one-way in the CSV");
        assert!(t.rows.iter().all(|r| !r[6].is_empty()), "rx_ns kept");
    } else {
        assert!(clock["bound_ns"].as_u64().is_some(), "{clock}");
    }
}

/// A 1 kHz client is inside the stamp budget: every reply stamped, and
/// every stamp came back as a turnaround.
fn check_every_reply_stamped(refl: &serde_json::Value, log: &str) {
    let c = &refl["counters"];
    let sampled = refl["turnaround_sampled"].as_u64().unwrap();
    eprintln!(
        "reflector turnaround: {} of {sampled} stamped replies (budget {}/s), p50 {} ns p99 {} ns",
        refl["turnaround_ns"]["count"],
        refl["turnaround_stamps_per_s"],
        refl["turnaround_ns"]["p50"],
        refl["turnaround_ns"]["p99"]
    );
    assert_eq!(sampled, c["reflected"].as_u64().unwrap(), "{refl}");
    assert_eq!(refl["turnaround_ns"]["count"], sampled, "{refl}");
    assert!(refl["turnaround_ns"]["p50"].as_u64().unwrap() > 0, "{refl}");
    assert!(
        log.contains(&format!(
            "over {sampled} of {sampled} replies stamped (at most 2000/s)"
        )),
        "the summary names the sample: {log}"
    );
}

/// 500 probes at 1 ms through `rtprobe reflect`: none lost, split 0/0, the
/// reflector saw one session and answered every probe. Over IPv6 the
/// reflector listens on `[::]:PORT` and the target is `[fd77::2]:PORT`.
fn clean_run(protocol: &str, port: &str, ipv6: bool) {
    let p = Pair::new();
    // No --listen: the default answers both families on the port.
    let r = Reflector::start(&p, &["--protocol", protocol]);
    let dst = if ipv6 {
        format!("[{B_IP6}]:{port}")
    } else {
        format!("{B_IP}:{port}")
    };
    let t = target(
        &p,
        &[
            "--target",
            &dst,
            "--protocol",
            protocol,
            "--count",
            &N.to_string(),
            "--interval",
            "1ms",
        ],
    );
    let (refl, log) = r.stop();
    assert_eq!(t.code, 0, "stderr: {}\nstdout: {}", t.stderr, t.stdout);
    assert_eq!(t.json["sent"], N, "{}", t.stdout);
    assert_lost_only_by_the_kernel(&t);
    assert_eq!(
        refl["listen"],
        serde_json::json!([format!("0.0.0.0:{port}"), format!("[::]:{port}")]),
        "{refl}"
    );
    assert_eq!(t.rows.len() as u64, N);
    assert_eq!(t.meta.testbed, "remote");
    assert_eq!(
        t.meta.rx_if.as_deref(),
        Some(dst.as_str()),
        "the target, in the CSV meta"
    );
    let split = &t.json["extra"]["loss_split"];
    assert_eq!(
        (split["forward"].as_u64(), split["return"].as_u64()),
        (Some(0), Some(0)),
        "{split}"
    );
    assert_eq!(t.json["extra"]["reflector"]["protocol"], protocol);
    check_rtt_and_one_way(&t);
    assert!(t.json["extra"]["reflector"]["echoes"].as_u64() == Some(N));
    let c = &refl["counters"];
    assert_counters_add_up(c);
    assert!(
        c["reflected"].as_u64().unwrap() > N,
        "probes + warm-up + status: {c}"
    );
    assert_eq!(c["malformed"], 0, "{c}");
    check_every_reply_stamped(&refl, &log);
    assert!(log.contains("new session"), "{log}");
    if ipv6 {
        // The session line names the IPv6 source.
        assert!(log.contains(&format!("from [{A_IP6}]:")), "{log}");
    }
    if protocol == "stamp" {
        assert_eq!(
            t.json["extra"]["reflector"]["sender_ttl_min"], 64,
            "one veth hop"
        );
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn rtprobe_protocol_to_reflect_500_probes_none_lost_as_nobody() {
    if !is_root("rtprobe_protocol_to_reflect_500_probes_none_lost_as_nobody") {
        return;
    }
    clean_run("rtprobe", "5061", false);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn rtprobe_protocol_over_ipv6_500_probes_none_lost() {
    if !is_root("rtprobe_protocol_over_ipv6_500_probes_none_lost") {
        return;
    }
    clean_run("rtprobe", "5061", true);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn stamp_over_ipv6_500_probes_none_lost() {
    if !is_root("stamp_over_ipv6_500_probes_none_lost") {
        return;
    }
    clean_run("stamp", "862", true);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn stamp_to_reflect_500_probes_none_lost_as_nobody() {
    if !is_root("stamp_to_reflect_500_probes_none_lost_as_nobody") {
        return;
    }
    clean_run("stamp", "862", false);
}

/// The probes whose sequence number is a multiple of 16 are dropped one
/// way (32 of 500; warm-ups and the status probe are not): the loss lands
/// on that direction only.
fn split_run(protocol: &str, port: &str, forward: bool) {
    let p = Pair::new();
    let r = Reflector::start(&p, &["--protocol", protocol]);
    // The low byte of the sequence number, from the IP header: rtprobe's
    // seq (u64 at payload 16) in probes and echoes alike; STAMP's sender
    // seq (u32 at payload 0), which the reply carries at payload 24.
    let offset = match (protocol, forward) {
        ("rtprobe", _) => 20 + 8 + 23,
        ("stamp", true) => 20 + 8 + 3,
        _ => 20 + 8 + 27,
    };
    if forward {
        p.drop_low_nibble_zero(&p.a, &p.va, offset);
    } else {
        p.drop_low_nibble_zero(&p.b, &p.vb, offset);
    }
    let t = target(
        &p,
        &[
            "--target",
            &format!("{B_IP}:{port}"),
            "--protocol",
            protocol,
            "--count",
            &N.to_string(),
            "--interval",
            "1ms",
        ],
    );
    p.clear_filters();
    let (refl, _) = r.stop();
    assert_eq!(t.code, 0, "stderr: {}\nstdout: {}", t.stderr, t.stdout);
    let lost = t.json["lost"].as_u64().unwrap();
    assert_eq!(lost, N.div_ceil(16), "seq 0, 16, .. 496: {}", t.stdout);
    let split = &t.json["extra"]["loss_split"];
    let (f, r_, u) = (
        split["forward"].as_u64(),
        split["return"].as_u64(),
        split["unknown"].as_u64(),
    );
    if forward {
        assert_eq!((f, r_, u), (Some(lost), Some(0), Some(0)), "{}", t.stdout);
    } else {
        assert_eq!((f, r_, u), (Some(0), Some(lost), Some(0)), "{}", t.stdout);
    }
    assert!(
        t.stdout.contains("loss by direction: forward"),
        "{}",
        t.stdout
    );
    assert_counters_add_up(&refl["counters"]);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn loss_split_forward_and_return_rtprobe() {
    if !is_root("loss_split_forward_and_return_rtprobe") {
        return;
    }
    split_run("rtprobe", "5061", true);
    split_run("rtprobe", "5061", false);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn loss_split_forward_and_return_stamp() {
    if !is_root("loss_split_forward_and_return_stamp") {
        return;
    }
    split_run("stamp", "862", true);
    split_run("stamp", "862", false);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn authenticated_stamp_good_key_answered_wrong_key_counted() {
    if !is_root("authenticated_stamp_good_key_answered_wrong_key_counted") {
        return;
    }
    auth_run(false);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn authenticated_stamp_over_ipv6_good_key_answered_wrong_key_counted() {
    if !is_root("authenticated_stamp_over_ipv6_good_key_answered_wrong_key_counted") {
        return;
    }
    auth_run(true);
}

/// Authenticated STAMP: 500 probes with the reflector's key, none lost; 50
/// with another key, none answered and every one counted as auth_failed.
fn auth_run(ipv6: bool) {
    let dir = tempfile::tempdir().unwrap();
    sh_ok(&format!("chmod 755 {}", dir.path().display()));
    let (good, bad) = (dir.path().join("good.key"), dir.path().join("bad.key"));
    std::fs::write(&good, [0x5au8; 32]).unwrap();
    std::fs::write(&bad, [0xa5u8; 32]).unwrap();
    sh_ok(&format!("chmod 644 {} {}", good.display(), bad.display()));
    let p = Pair::new();
    let mut args = vec!["--protocol", "stamp", "--auth-key", good.to_str().unwrap()];
    if ipv6 {
        args.extend(["--listen", "[::]:862"]);
    }
    let r = Reflector::start(&p, &args);
    let dst = if ipv6 {
        format!("[{B_IP6}]")
    } else {
        B_IP.to_string()
    };
    let base = |key: &Path, count: &str| {
        target(
            &p,
            &[
                "--target",
                &dst,
                "--protocol",
                "stamp",
                "--auth-key",
                key.to_str().unwrap(),
                "--size",
                "112",
                "--count",
                count,
                "--interval",
                "1ms",
            ],
        )
    };
    let ok = base(&good, &N.to_string());
    let wrong = base(&bad, "50");
    let (refl, _) = r.stop();
    assert_eq!(ok.code, 0, "{}{}", ok.stderr, ok.stdout);
    assert_eq!(ok.json["sent"], N, "{}", ok.stdout);
    assert_lost_only_by_the_kernel(&ok);
    assert_eq!(ok.json["extra"]["reflector"]["authenticated"], true);
    assert_ne!(wrong.code, 0, "the wrong key got answers: {}", wrong.stdout);
    assert!(wrong.stderr.contains("no answer from"), "{}", wrong.stderr);
    assert!(wrong.stderr.contains("--auth-key"), "{}", wrong.stderr);
    let c = &refl["counters"];
    assert_counters_add_up(c);
    // The wrong key's warm-ups, every 100 ms for 3 s, all refused.
    assert!(
        (25..=31).contains(&c["auth_failed"].as_u64().unwrap()),
        "{c}"
    );
    assert!(c["reflected"].as_u64().unwrap() >= N, "{c}");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn malformed_flood_changes_counters_only() {
    if !is_root("malformed_flood_changes_counters_only") {
        return;
    }
    for (protocol, port) in [("rtprobe", "5061"), ("stamp", "862")] {
        let p = Pair::new();
        let r = Reflector::start(&p, &["--protocol", protocol, "--quiet"]);
        let rss_before = rss_kib(r.pid());
        let o = sh_ok(&format!(
            "ip netns exec {} python3 {} {B_IP} {port} 7",
            p.a,
            fixture("reflector_flood.py").display()
        ));
        let flood: serde_json::Value = serde_json::from_str(&o).unwrap();
        let rss_after = rss_kib(r.pid());
        // Still answering after the flood.
        let t = target(
            &p,
            &[
                "--target",
                &format!("{B_IP}:{port}"),
                "--protocol",
                protocol,
                "--count",
                "100",
            ],
        );
        let (refl, _) = r.stop();
        assert_eq!(t.code, 0, "{}{}", t.stderr, t.stdout);
        assert_lost_only_by_the_kernel(&t);
        let c = &refl["counters"];
        assert_counters_add_up(c);
        let sent = flood["sent"].as_u64().unwrap();
        // Every flood datagram is in the counters (the run after it adds
        // its probes, warm-up and status probe to `reflected`).
        let replies = flood["replies"].as_array().unwrap();
        let flood_answered = replies.len() as u64;
        assert_eq!(
            c["datagrams"].as_u64().unwrap(),
            sent + c["reflected"].as_u64().unwrap() - flood_answered,
            "{protocol}: {c}, flood sent {sent}, answered {flood_answered}"
        );
        // No reply longer than a request, none without its request's length.
        let mut lengths: Vec<u64> = flood["lengths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        for r in replies {
            let len = r.as_u64().unwrap();
            let i = lengths
                .iter()
                .position(|&l| l == len)
                .unwrap_or_else(|| panic!("{protocol}: a {len}-byte reply matches no request"));
            lengths.swap_remove(i);
        }
        if protocol == "rtprobe" {
            assert_eq!(flood_answered, 0, "random bytes are no rtprobe probe");
            assert_eq!(c["malformed"].as_u64().unwrap(), sent, "{c}");
        } else {
            // 44+ random bytes with a valid NTP timestamp are a STAMP packet.
            assert!(c["malformed"].as_u64().unwrap() >= 43 + 4 + 5, "{c}");
        }
        assert!(
            rss_after < rss_before + 16 * 1024,
            "{protocol}: RSS grew from {rss_before} to {rss_after} KiB"
        );
    }
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn scapy_sender_against_reflect_and_scapy_reflector_against_target() {
    if !is_root("scapy_sender_against_reflect_and_scapy_reflector_against_target") {
        return;
    }
    scapy_both_roles(false);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn scapy_stamp_over_ipv6_both_roles() {
    if !is_root("scapy_stamp_over_ipv6_both_roles") {
        return;
    }
    scapy_both_roles(true);
}

/// scapy's session-sender against `rtprobe reflect`, then `rtprobe
/// --target` against scapy's session-reflector, over IPv4 or IPv6.
/// Reads `pipe` line by line until one is `want` (panics if the pipe ends
/// first or 60 s pass); the thread returned keeps reading and gives back
/// everything read, for the test's messages.
fn wait_for_line(
    pipe: impl std::io::Read + Send + 'static,
    want: &'static str,
) -> std::thread::JoinHandle<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
            if line == want {
                let _ = tx.send(());
            }
            all += &line;
            all.push('\n');
        }
        all
    });
    if rx.recv_timeout(std::time::Duration::from_secs(60)).is_err() {
        panic!("no '{want}' line within 60 s: {}", reader.join().unwrap());
    }
    reader
}

fn scapy_both_roles(ipv6: bool) {
    let p = Pair::new();
    let b_ip = if ipv6 { B_IP6 } else { B_IP };
    scapy_sender_to_reflect(&p, b_ip, ipv6);
    target_to_scapy_reflector(&p, b_ip, ipv6);
}

/// scapy's session-sender -> rtprobe reflect --protocol stamp.
fn scapy_sender_to_reflect(p: &Pair, b_ip: &str, ipv6: bool) {
    let r = if ipv6 {
        Reflector::start(p, &["--protocol", "stamp", "--listen", "[::]:862"])
    } else {
        Reflector::start(p, &["--protocol", "stamp"])
    };
    let o = sh_ok(&format!(
        "ip netns exec {} python3 {} send {b_ip} 862 20",
        p.a,
        fixture("stamp_wire.py").display()
    ));
    let (refl, _) = r.stop();
    let v: serde_json::Value = serde_json::from_str(&o).unwrap();
    let sent = v["sent"].as_array().unwrap();
    let replies = v["replies"].as_array().unwrap();
    assert_eq!(replies.len(), 20, "{o}");
    for (i, (s, r)) in sent.iter().zip(replies).enumerate() {
        assert_eq!(r["len"], s["len"], "reply {i}: same length as the request");
        assert_eq!(r["seq"], i as u64, "stateful: the reflector's own count");
        assert_eq!(r["seq_sender"], s["seq"]);
        assert_eq!(r["ts_sender"], s["ts"], "sender's timestamp copied");
        assert_eq!(r["ssid"], 0x2A2A);
        assert_eq!(r["ttl_sender"], 64, "one veth hop from TTL 64");
        assert_eq!(r["padding"], s["padding"], "padding mirrored");
        assert_eq!(r["ee_sender"]["multiplier"], 1);
        // T2 <= T3, both within a second of scapy's clock (the same host).
        let (t2, t3, now) = (
            r["ts_rx"].as_u64().unwrap(),
            r["ts"].as_u64().unwrap(),
            r["now"].as_u64().unwrap(),
        );
        assert!(t2 <= t3 && t3 <= now && now - t2 < (1u64 << 32), "{r}");
        assert_ne!(r["ee"]["multiplier"], 0, "RFC 4656: never 0");
        assert_eq!(r["ee"]["Z"], 0, "NTP timestamps");
    }
    assert_counters_add_up(&refl["counters"]);
}

/// rtprobe --target --protocol stamp -> scapy's session-reflector.
fn target_to_scapy_reflector(p: &Pair, b_ip: &str, ipv6: bool) {
    let n = 200;
    let mut scapy = Command::new("ip")
        .args(["netns", "exec", &p.b, "python3"])
        .arg(fixture("stamp_wire.py"))
        .args(["reflect", b_ip, "9862", &n.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let scapy_stderr = wait_for_line(scapy.stderr.take().unwrap(), "ready");
    let t = target(
        p,
        &[
            "--target",
            &if ipv6 {
                format!("[{b_ip}]:9862")
            } else {
                format!("{b_ip}:9862")
            },
            "--protocol",
            "stamp",
            "--size",
            "80",
            "--count",
            &n.to_string(),
        ],
    );
    let o = scapy.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", scapy_stderr.join().unwrap());
    assert_eq!(t.code, 0, "{}{}", t.stderr, t.stdout);
    assert_lost_only_by_the_kernel(&t);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let got: Vec<&serde_json::Value> = v["received"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["ssid"].as_u64().unwrap() & 0x8000 == 0)
        .collect();
    assert_eq!(got.len(), n);
    let ssid = t.json["extra"]["reflector"]["ssid"].as_u64().unwrap();
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r["len"], 80, "--size");
        assert_eq!(r["seq"], i as u64, "rtprobe numbers from 0");
        assert_eq!(r["ssid"], ssid, "the SSID rtprobe reports");
        assert_eq!(r["padding_zero"], true);
        assert_eq!(r["ee"]["Z"], 0);
        assert_ne!(r["ee"]["multiplier"], 0);
        assert_eq!(r["ttl"], 64);
        let (ts, rx) = (r["ts"].as_u64().unwrap(), r["rx"].as_u64().unwrap());
        assert!(
            ts <= rx && rx - ts < (1u64 << 32),
            "send time before arrival: {r}"
        );
    }
    // scapy's reflector numbers its replies 0..: no forward loss told.
    let split = &t.json["extra"]["loss_split"];
    assert_eq!(split["forward"], 0, "{split}");
}

/// STAMP through the testbed: rtprobe's session-sender answered by the
/// in-kernel reflector (stateless) or the user-space one (stateful).
fn stamp_testbed(reflector: &str, ip: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let r = probe(
        dir.path(),
        &[
            "--protocol",
            "stamp",
            "--reflector",
            reflector,
            "--ip",
            ip,
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
    assert_eq!(r.rows.len() as u64, N);
    assert_eq!(r.json["extra"]["reflector"]["kind"], reflector);
    assert_eq!(r.json["extra"]["reflector"]["protocol"], "stamp");
    assert_eq!(
        r.json["extra"]["clock"]["one_way_shown"], true,
        "one host clock"
    );
    assert_eq!(r.json["one_way_ns"]["count"], N, "{}", r.stdout);
    r
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn stamp_testbed_run_answered_by_the_kernel_reflector() {
    if !is_root("stamp_testbed_run_answered_by_the_kernel_reflector") {
        return;
    }
    check_kernel_stamp(&stamp_testbed("kernel", "4"));
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn stamp_over_ipv6_testbed_answered_by_the_kernel_reflector() {
    if !is_root("stamp_over_ipv6_testbed_answered_by_the_kernel_reflector") {
        return;
    }
    let r = stamp_testbed("kernel", "6");
    check_kernel_stamp(&r);
    assert_eq!(r.json["extra"]["ip"]["version"], 6);
    // The Session-Sender TTL field carries the hop limit it arrived with.
    assert_eq!(r.json["extra"]["reflector"]["sender_ttl_min"], 63);
}

fn check_kernel_stamp(r: &Run) {
    let c = &r.json["extra"]["reflector"]["counters"];
    assert!(
        c["reflected_stamp"]["packets"].as_u64().unwrap() >= N,
        "the kernel answered the STAMP packets: {c}"
    );
    assert_eq!(c["reflected_rtprobe"]["packets"], 0, "{c}");
    assert_eq!(
        r.json["extra"]["loss_split"]["forward"],
        serde_json::Value::Null,
        "a stateless reflector tells no direction"
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn stamp_testbed_run_answered_by_the_user_reflector() {
    if !is_root("stamp_testbed_run_answered_by_the_user_reflector") {
        return;
    }
    let r = stamp_testbed("user", "4");
    let c = &r.json["extra"]["reflector"]["counters"];
    assert!(c["reflected"].as_u64().unwrap() > N, "{c}");
    assert_eq!(r.json["extra"]["loss_split"]["forward"], 0);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn reflect_kernel_answers_from_xdp() {
    if !is_root("reflect_kernel_answers_from_xdp") {
        return;
    }
    reflect_kernel_run(B_IP);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn reflect_kernel_answers_from_xdp_over_ipv6() {
    if !is_root("reflect_kernel_answers_from_xdp_over_ipv6") {
        return;
    }
    reflect_kernel_run(&format!("[{B_IP6}]"));
}

/// `rtprobe reflect --kernel --listen ADDR:5061` answered from XDP, a
/// client probing ADDR.
fn reflect_kernel_run(addr: &str) {
    let p = Pair::new();
    // What a veth peer needs to take the in-kernel reflector's replies
    // (rtprobe reflect --kernel says so when it attaches to a veth).
    sh_ok(&format!(
        "ip netns exec {a} ethtool -K {va} gro off && ip netns exec {a} ethtool -K {va} gro on \
         && ip netns exec {a} ethtool -K {va} tx off >/dev/null",
        a = p.a,
        va = p.va
    ));
    let r = Reflector::start(&p, &["--kernel", "--listen", &format!("{addr}:5061")]);
    let t = target(
        &p,
        &[
            "--target",
            addr,
            "--count",
            &N.to_string(),
            "--interval",
            "1ms",
        ],
    );
    let (refl, log) = r.stop();
    assert!(log.contains("in-kernel reflector on"), "{log}");
    assert_eq!(t.code, 0, "{}{}", t.stderr, t.stdout);
    assert_lost_only_by_the_kernel(&t);
    let k = &refl["kernel_counters"];
    assert!(
        k["reflected_rtprobe"]["packets"].as_u64().unwrap() >= N,
        "{k}"
    );
    // The kernel answered first: the socket saw none of the probes.
    assert_eq!(refl["counters"]["reflected"], 0, "{refl}");
}

/// `promtool check metrics` of `scrape`: its exit and what it said.
fn promtool_check(scrape: &str) -> (std::process::Output, String) {
    let lint = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(scrape.as_bytes())?;
            c.wait_with_output()
        })
        .expect("run promtool");
    let lint_out =
        String::from_utf8_lossy(&lint.stdout).into_owned() + &String::from_utf8_lossy(&lint.stderr);
    (lint, lint_out)
}

/// The kernel reflector's frames of `outcome` in `scrape`.
fn kernel_frames(scrape: &str, outcome: &str) -> u64 {
    let want = format!("rtprobe_kernel_reflector_frames_total{{outcome=\"{outcome}\"}} ");
    scrape
        .lines()
        .find_map(|l| l.strip_prefix(&want))
        .unwrap_or_else(|| panic!("no {want} in:\n{scrape}"))
        .trim()
        .parse()
        .unwrap()
}

/// `rtprobe reflect --kernel --metrics-listen`: a scrape after a run has
/// the XDP reflector's frames by outcome next to the user-space
/// reflector's datagrams, and `promtool check metrics` takes it.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn reflect_kernel_metrics_count_frames_by_outcome() {
    if !is_root("reflect_kernel_metrics_count_frames_by_outcome") {
        return;
    }
    let p = Pair::new();
    sh_ok(&format!(
        "ip netns exec {a} ethtool -K {va} gro off && ip netns exec {a} ethtool -K {va} gro on \
         && ip netns exec {a} ethtool -K {va} tx off >/dev/null",
        a = p.a,
        va = p.va
    ));
    let r = Reflector::start(
        &p,
        &[
            "--kernel",
            "--listen",
            &format!("{B_IP}:5061"),
            "--metrics-listen",
            "127.0.0.1:9464",
            "-q",
        ],
    );
    let t = target(
        &p,
        &[
            "--target",
            B_IP,
            "--count",
            &N.to_string(),
            "--interval",
            "1ms",
        ],
    );
    assert_eq!(t.code, 0, "{}{}", t.stderr, t.stdout);
    // The reflector publishes on its 250 ms tick.
    std::thread::sleep(std::time::Duration::from_millis(600));
    let scrape = sh_ok(&format!(
        "ip netns exec {} curl -sf --max-time 5 http://127.0.0.1:9464/metrics",
        p.b
    ));
    let (lint, lint_out) = promtool_check(&scrape);
    let (refl, _) = r.stop();
    let frames = |outcome: &str| kernel_frames(&scrape, outcome);
    let json_reflected = refl["kernel_counters"]["reflected_rtprobe"]["packets"]
        .as_u64()
        .unwrap();
    eprintln!(
        "scrape: kernel reflected_rtprobe {}, not_for_us {}, bad_source {}, rate_limited {}, \
         global_limited {} (JSON at exit: reflected {json_reflected}); promtool exit {:?}: {}",
        frames("reflected_rtprobe"),
        frames("not_for_us"),
        frames("bad_source"),
        frames("rate_limited"),
        frames("global_limited"),
        lint.status.code(),
        lint_out.trim().replace('\n', "; ")
    );
    assert!(frames("reflected_rtprobe") >= N, "{scrape}");
    assert!(frames("reflected_rtprobe") <= json_reflected, "{scrape}");
    assert!(
        scrape.contains("rtprobe_reflector_datagrams_total{outcome=\"reflected\"}"),
        "{scrape}"
    );
    // promtool reads the classic text format: it parses OpenMetrics, but
    // takes a counter's `_total` samples for a family without HELP (exit
    // 3, a lint). Anything else (a parse error: exit 1) fails.
    let only_total_help = lint_out
        .lines()
        .filter(|l| !l.trim().is_empty())
        .all(|l| l.ends_with("_total no help text"));
    assert!(
        lint.status.success() || (lint.status.code() == Some(3) && only_total_help),
        "promtool: {lint_out}"
    );
}

/// Unmounts on drop (a failing test must not leave the mount behind).
struct Mount(std::path::PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A full disk under a `--target` run stops it as an output failure, not
/// as an interruption, and what the CSV lacks is counted: the run
/// said "every probe sent is in the CSV" with 4785 sent and 4684 rows.
#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_full_disk_under_a_target_run_counts_what_the_csv_lacks() {
    if !is_root("a_full_disk_under_a_target_run_counts_what_the_csv_lacks") {
        return;
    }
    let p = Pair::new();
    let r = Reflector::start(&p, &["--listen", &format!("{B_IP}:5061")]);
    let dir = tempfile::tempdir().unwrap();
    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=128k", "rtprobe-remote-full"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(ok.success(), "mount a 128 KiB tmpfs");
    let _mount = Mount(small.clone());
    let csv = small.join("out.csv");
    let json = dir.path().join("out.json");
    let o = Command::new("ip")
        .args(["netns", "exec", &p.a])
        .arg(bin())
        .args(["--target", B_IP, "--count", "60000", "--interval", "200us"])
        .arg("--out")
        .arg(&csv)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    drop(r);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    let summary = read_summary(&json);
    let sent = summary["sent"].as_u64().unwrap();
    let (_, rows) = read_csv(&csv);
    assert!(
        (rows.len() as u64) < sent,
        "{sent} sent, {} rows",
        rows.len()
    );
    let missing = format!(
        ": {} of the {sent} probes sent are not in it",
        sent - rows.len() as u64
    );
    assert!(stdout.contains(&missing), "no '{missing}' in: {stdout}");
    assert!(!stdout.contains("interrupted"), "{stdout}");
    assert!(summary["extra"].get("interrupted").is_none(), "{summary}");
}
