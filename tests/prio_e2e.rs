//! Study 4's relation with the real probe: under `htb-prio` the
//! high-priority flow's p99 stays near its idle value when a TCP flow fills
//! the link, while a low-priority probe flow through the same port waits
//! behind the bulk queue; without priority (a FIFO) both wait. And a
//! priority qdisc the kernel lacks fails clearly, or is skipped and said.
//! Relations, not absolute times. Root; run by `cargo xtask test`.

mod common;

use std::process::Command;

use common::*;

/// p99 in ms of flow `i` (0 = main, high priority) from the per-flow
/// summaries.
fn p99_ms(j: &serde_json::Value, i: usize) -> f64 {
    j["extra"]["flows"][i]["summary"]["one_way_ns"]["p99"]
        .as_f64()
        .unwrap_or_else(|| panic!("no p99 for flow {i}: {}", j["extra"]["flows"]))
        / 1e6
}

fn run_json(args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let r = probe(dir.path(), args);
    assert_eq!(r.code, 0, "rtprobe {args:?}: {}", r.stderr);
    r.json
}

/// High flow: 64 B every 200 us (TOS 0xC0, port 5061); low flow: 1472 B
/// every 1 ms (port 5062); the router's port shaped to 100 Mbit/s with
/// frames (no GSO) in its queue.
fn args(qdisc: &str, load: bool) -> Vec<&str> {
    let mut a = vec![
        "--xdp-mode",
        "off",
        "--duration",
        "5s",
        "--interval",
        "200us",
        "--size",
        "64",
        "--tos",
        "0xC0",
        "--flow",
        "port=5062,tos=0,size=1472,interval=1ms",
        "--link-rate",
        "100mbit",
        "--bottleneck",
        "router",
        "--gso",
        "off",
        "--qdisc",
        qdisc,
        // The study's sender ran SCHED_FIFO; without it a busy machine's
        // scheduler, not the qdisc, sets the tail.
        "--rt-priority",
        "80",
    ];
    if load {
        a.extend(["--load", "tcp:100%,cc=cubic", "--load-warmup", "2s"]);
    }
    a
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn htb_prio_bounds_the_high_flow_and_a_fifo_does_not() {
    if !is_root("htb_prio_bounds_the_high_flow_and_a_fifo_does_not") {
        return;
    }
    let idle = run_json(&args("htb-prio", false));
    let mut loaded = run_json(&args("htb-prio", true));
    let (hi_idle, lo_idle) = (p99_ms(&idle, 0), p99_ms(&idle, 1));
    // A stall of the machine (the router's softirq or the shaper starved
    // of CPU for tens of ms: once here the low flow's p99 went from 12.7
    // to 17.7 ms and the high flow's to 5 ms) reaches every flow alike:
    // once more, and every check below holds for the run that counts. A
    // lost priority fails both.
    if p99_ms(&loaded, 0) - hi_idle > (p99_ms(&loaded, 1) - lo_idle) / 4.0 {
        eprintln!(
            "htb-prio p99 under load: high {:.3} ms, low {:.3} ms (a stall?): measuring once more",
            p99_ms(&loaded, 0),
            p99_ms(&loaded, 1)
        );
        loaded = run_json(&args("htb-prio", true));
    }
    assert_eq!(loaded["extra"]["knobs"]["qdisc_tree"]["status"], "applied");
    let (hi_load, lo_load) = (p99_ms(&loaded, 0), p99_ms(&loaded, 1));
    eprintln!(
        "htb-prio p99: high {hi_idle:.3} -> {hi_load:.3} ms, low {lo_idle:.3} -> {lo_load:.3} ms"
    );
    // The bulk queue (100 frames, ~12 ms at 100 Mbit/s) is what the low
    // flow waits behind; the high flow must not see it. Its bound is the
    // one bulk frame already being sent (0.12 ms) plus the router's
    // softirq time on a shared machine, which the TCP load itself makes
    // busier: CI runs here saw the high p99 rise by 0.36 ms and once by
    // 1.10 ms. A lost bound costs the whole bulk queue, what the low flow
    // waits (12-14 ms here). So the high flow's rise must stay under a
    // quarter of the low flow's, and the FIFO run below shows what a lost
    // bound looks like. Not a factor of the idle p99: that is ~10-40 us on
    // veth, so the unavoidable frame alone is several times it.
    assert!(
        lo_load > lo_idle + 1.0,
        "the low-priority flow should wait behind the TCP queue: p99 {lo_idle:.3} -> {lo_load:.3} ms"
    );
    let bound = (lo_load - lo_idle) / 4.0;
    assert!(
        hi_load - hi_idle <= bound,
        "high-priority p99 rose {hi_idle:.3} -> {hi_load:.3} ms under load, more than a quarter \
         of the low flow's queueing ({bound:.3} ms)"
    );
    let bps = loaded["extra"]["load"]["total_achieved_bps"]
        .as_f64()
        .unwrap();
    assert!(
        bps > 50e6,
        "the TCP load should fill most of the link: {bps}"
    );

    // The same load through one FIFO: the high flow waits too.
    let fifo = run_json(&args("pfifo,limit=100", true));
    let hi_fifo = p99_ms(&fifo, 0);
    eprintln!("pfifo p99 under load: high {hi_fifo:.3} ms");
    assert!(
        hi_fifo > hi_load + 1.0,
        "without priority the high flow should wait behind the queue: fifo {hi_fifo:.3} ms vs htb-prio {hi_load:.3} ms"
    );
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_missing_priority_qdisc_fails_or_is_skipped() {
    if !is_root("a_missing_priority_qdisc_fails_or_is_skipped") {
        return;
    }
    // sch_prio: present on most kernels, not on this project's test
    // kernel. Whichever it is, rtprobe must say so.
    let has_prio = {
        let ns = unique("rtpprio");
        let _ = sh(&format!("ip netns add {ns}"));
        let ok = sh(&format!(
            "ip netns exec {ns} tc qdisc add dev lo root handle 1: prio"
        ))
        .status
        .success();
        let _ = sh(&format!("ip netns del {ns}"));
        ok
    };
    let base = [
        "--xdp-mode",
        "off",
        "--count",
        "200",
        "--interval",
        "1ms",
        "--link-rate",
        "100mbit",
        "--qdisc",
        "prio,leaf=pfifo",
    ];
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("out.csv");
    let o = Command::new(bin())
        .args(["--quiet", "--out", csv.to_str().unwrap()])
        .args(base)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    if has_prio {
        assert!(o.status.success(), "{stderr}");
    } else {
        assert!(!o.status.success(), "prio is missing but the run passed");
        assert!(
            stderr.contains("qdisc prio needs prio") && stderr.contains("--missing skip"),
            "{stderr}"
        );
    }
    let mut skip = base.to_vec();
    skip.extend(["--missing", "skip"]);
    let j = run_json(&skip);
    let skipped = j["extra"]["skipped"].to_string();
    if has_prio {
        assert_eq!(j["extra"]["knobs"]["qdisc_tree"]["qdisc"]["kind"], "prio");
    } else {
        assert!(
            skipped.contains("skipped: the kernel lacks prio"),
            "{skipped}"
        );
    }
}
