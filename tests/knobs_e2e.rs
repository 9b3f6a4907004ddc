//! Issue-4 relations with the real probe: a shaped link under TCP load
//! queues, a small queue limit queues less, a CBR UDP load above the link
//! rate loses what the arithmetic says, and every knob is put back. These
//! assert relations, not absolute times. Root; run by `cargo xtask test`.

mod common;

use std::process::Command;

use common::*;

fn run_json(args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let r = probe(dir.path(), args);
    assert_eq!(r.code, 0, "rtprobe {args:?}: {}", r.stderr);
    r.json
}

fn p50_ms(j: &serde_json::Value) -> f64 {
    j["one_way_ns"]["p50"].as_f64().unwrap() / 1e6
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn tcp_load_on_a_shaped_link_queues_and_a_small_queue_helps() {
    if !is_root("tcp_load_on_a_shaped_link_queues_and_a_small_queue_helps") {
        return;
    }
    // The router's egress is the bottleneck, between the TX and RX stamps.
    let base = [
        "--xdp-mode",
        "off",
        "--count",
        "2000",
        "--interval",
        "1ms",
        "--link-rate",
        "100mbit",
        "--bottleneck",
        "router",
    ];
    let idle = run_json(&base);
    let mut loaded_args = base.to_vec();
    loaded_args.extend(["--load", "tcp:100%"]);
    let loaded = run_json(&loaded_args);
    let mut small_args = loaded_args.clone();
    small_args.extend(["--queue-limit", "20", "--gso", "off"]);
    let small = run_json(&small_args);
    let (i, l, s) = (p50_ms(&idle), p50_ms(&loaded), p50_ms(&small));
    eprintln!(
        "one-way p50: idle {i:.3} ms, TCP load {l:.3} ms, TCP load + 20-packet queue {s:.3} ms"
    );
    assert!(
        l >= i + 1.0,
        "TCP load should add at least 1 ms: idle {i:.3} ms, loaded {l:.3} ms"
    );
    assert!(
        s < l / 2.0,
        "a 20-packet queue should clearly lower the p50: {s:.3} ms vs {l:.3} ms"
    );
    // How much of the link TCP fills is the machine's speed (`cargo xtask
    // bench --only study`); that it queues is the mechanism above.
    assert_eq!(loaded["extra"]["knobs"]["qdisc_tree"]["status"], "applied");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn cbr_udp_at_150_percent_loses_what_the_kernel_dropped() {
    if !is_root("cbr_udp_at_150_percent_loses_what_the_kernel_dropped") {
        return;
    }
    let j = run_json(&[
        "--xdp-mode",
        "off",
        // 6 s of window: enough datagrams that a scheduling hiccup
        // averages out.
        "--count",
        "6000",
        "--interval",
        "1ms",
        "--link-rate",
        "100mbit",
        "--bottleneck",
        "router",
        "--load",
        "udp:150%,size=1470",
    ]);
    let flow = &j["extra"]["load"]["flows"][0];
    let measured = flow["loss_pct"].as_f64().unwrap();
    let calculated = flow["expected_loss_pct"].as_f64().unwrap();
    let achieved = flow["achieved_bps"].as_f64().unwrap() / 1e6;
    eprintln!(
        "CBR UDP at 150 %: loss measured {measured:.2} %, calculated {calculated:.2} %, \
         achieved {achieved:.2} Mbit/s, sent {} lost {}, sender lag max {} ms",
        flow["sent_packets"], flow["lost_packets"], flow["max_send_lag_ms"]
    );
    // Sent, received and lost count the same datagrams.
    assert_eq!(
        flow["sent_packets"].as_u64().unwrap(),
        flow["received_packets"].as_u64().unwrap() + flow["lost_packets"].as_u64().unwrap()
    );
    // The kernel's witness: the router's shaper dropped the load's lost
    // datagrams and the lost probes (the queue's 1000 packets at each
    // window edge are the slack).
    let q = &j["extra"]["load"]["bottleneck"];
    let dropped = q["dropped_packets"].as_u64().unwrap();
    let ours = flow["lost_packets"].as_u64().unwrap() + j["lost"].as_u64().unwrap();
    eprintln!(
        "kernel at {} ({}): {dropped} dropped, {} Mbit/s of frames; rtprobe lost {ours} (probes {})",
        q["dev"],
        q["qdisc"],
        q["delivered_bps"].as_f64().unwrap() / 1e6,
        j["lost"]
    );
    assert_eq!(q["dev"], "veth-rout", "the router's egress: {q}");
    // Every datagram rtprobe counts lost, the kernel dropped: at the
    // shaper, or at a starved receiver's socket or backlog (the kernel's
    // counters over the same window; the queue's 1000 packets at each
    // window edge are the slack). How close the loss comes to the
    // calculation is a figure of the machine's speed: `cargo xtask bench
    // --only study` prints it next to its bound.
    let k = &j["extra"]["kernel_drops"];
    let elsewhere: u64 = [
        "receiver_rcvbuf_errors",
        "receiver_in_errors",
        "host_backlog_drops",
    ]
    .iter()
    .map(|c| k[c].as_u64().unwrap_or_else(|| panic!("no {c} in {k}")))
    .sum();
    assert!(
        ours + 2000 >= dropped && ours <= dropped + elsewhere + 2000,
        "rtprobe lost {ours}; the kernel dropped {dropped} at the shaper and {elsewhere} at the \
         receiver ({k})"
    );
    // The loss is the shaper's work: never below the calculation by more
    // than the window's edges (a shaper does not beat its rate).
    assert!(
        measured >= calculated - 0.5,
        "measured {measured:.2} % vs calculated {calculated:.2} %"
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn knobs_on_nic_pair_interfaces_are_restored() {
    if !is_root("knobs_on_nic_pair_interfaces_are_restored") {
        return;
    }
    let a = unique("rtpka");
    let b = unique("rtpkb");
    sh_ok(&format!("ip link add {a} type veth peer name {b}"));
    let _g = LinkGuard(a.clone());
    let state = |dev: &str| {
        sh_ok(&format!(
            "tc qdisc show dev {dev}; tc class show dev {dev}; ip -d link show dev {dev} | grep -o 'qlen [0-9]*'; \
             ethtool -k {dev} | grep -E '^(tx-checksumming|generic-receive-offload|generic-segmentation-offload|tcp-segmentation-offload):'"
        ))
    };
    let (before_a, before_b) = (state(&a), state(&b));
    let tsq_before = sh_ok("sysctl -n net.ipv4.tcp_limit_output_bytes");
    let j = run_json(&[
        "--tx-if",
        &a,
        "--rx-if",
        &b,
        "--xdp-mode",
        "native",
        "--count",
        "500",
        "--link-rate",
        "50mbit",
        "--qdisc",
        "pfifo,limit=50",
        "--txqueuelen",
        "300",
        "--tsq",
        "64KiB",
        "--gso",
        "off",
        "--load",
        "tcp:50%",
    ]);
    assert_eq!(j["sent"], 500);
    assert!(
        j["extra"]["knobs"]["qdisc_tree"].is_object(),
        "{}",
        j["extra"]
    );
    assert_eq!(state(&a), before_a, "{a} not restored");
    assert_eq!(state(&b), before_b, "{b} not restored");
    // TSQ was set in the sender namespace only.
    assert_eq!(
        sh_ok("sysctl -n net.ipv4.tcp_limit_output_bytes"),
        tsq_before
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn two_priority_flows_share_the_path_with_per_flow_statistics() {
    if !is_root("two_priority_flows_share_the_path_with_per_flow_statistics") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("o.csv");
    let json = dir.path().join("o.json");
    let o = Command::new(bin())
        .args([
            "--quiet",
            "--xdp-mode",
            "native",
            "--tos",
            "0xC0",
            "--count",
            "500",
            "--interval",
            "1ms",
        ])
        .args(["--flow", "port=5062,tos=0,size=1472,interval=250us"])
        .args([
            "--out",
            csv.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let (meta, rows) = read_csv(&csv);
    let _sweep = NsSweep(meta.testbed_id.clone());
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let count = |flow: &str| rows.iter().filter(|r| r[1] == flow).count();
    assert_eq!(count("0"), 500);
    assert_eq!(
        count("1"),
        2000,
        "the second flow covers the same wall time"
    );
    assert!(rows.iter().filter(|r| r[1] == "1").all(|r| r[2] == "1472"));
    assert_eq!(meta.extra_flows.len(), 1);
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let flows = j["extra"]["flows"].as_array().expect("per-flow statistics");
    assert_eq!(flows.len(), 2);
    assert_eq!(flows[1]["port"], 5062);
    assert_eq!(flows[1]["summary"]["sent"], 2000);
    assert_eq!(flows[1]["summary"]["lost"], 0);
    assert_eq!(j["sent"], 500, "the headline figures are the main flow's");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("per flow") && out.contains("5062"), "{out}");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_scenario_file_runs_every_cell_and_reports_with_figures() {
    if !is_root("a_scenario_file_runs_every_cell_and_reports_with_figures") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("mini.toml");
    std::fs::write(
        &cfg,
        r#"name = "mini"
[probe]
sizes = [64]
intervals = ["1ms"]
count = 300
xdp_modes = ["off", "native"]
[set.baseline]
[set.txqueuelen-100]
txqueuelen = 100
"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = Command::new(bin())
        .args(["run", "--quiet"])
        .arg(&cfg)
        .arg("--out-dir")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    let csvs: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        csvs.iter().filter(|f| f.ends_with(".csv")).count(),
        4,
        "{csvs:?}"
    );
    assert!(
        csvs.iter().filter(|f| f.ends_with("-box.svg")).count() >= 3,
        "figures: {csvs:?}"
    );
    for f in csvs.iter().filter(|f| f.ends_with(".svg")) {
        assert!(report.contains(f.as_str()), "report.md does not link {f}");
    }
    for c in csvs.iter().filter(|f| f.ends_with(".csv")) {
        let (meta, rows) = read_csv(&out.join(c));
        assert_eq!(rows.len(), 300);
        assert!(namespaces_of(&meta.testbed_id).is_empty());
    }
    assert!(report.contains("txqueuelen-100"));
}
