//! The fetch load (study §5, bufferbloat): repeated page fetches across a
//! 10 Mbit/s router bottleneck that one bulk cubic flow keeps full. Asserts
//! the study's mechanism, not absolute times: a queue of 100 packets makes
//! the median fetch slower than a queue of 20, and every fetch completes;
//! the ratio (more than 1.25x, reasoned below) is printed by `cargo xtask
//! bench --only study`. Root; run by `cargo xtask test`.
//!
//! The median, not the mean: at 20 packets the full tail-drop queue now
//! and then drops a fetch's SYN or first flight, and that fetch waits a
//! 1 s timeout (1.2 to 3.3 s instead of 0.3 s). A handful of those in 40
//! fetches moved the mean of q=20 above q=100 in one scenario run (the
//! study's q=20 had a standard deviation of 0.82 s too); the median
//! follows the queue's delay.
//!
//! Why more than 1.25x: the bulk flow keeps the queue near full, so each of
//! a fetch's round trips waits behind it. 100 full frames at 10 Mbit/s are
//! 121 ms, 20 are 24 ms: ~100 ms more per round trip (the measured RTT p50
//! is ~85 vs ~20 ms, the queue is not always full). A 100 KiB page takes
//! the handshake, the request and ~3 rounds of slow start from 10 segments
//! (10 + 20 + 40 > 71 segments): 4 to 5 round trips, 0.25 to 0.5 s more
//! than at q=20, where the median fetch took 0.28 to 0.37 s on this
//! machine (its share of the link decides the rest). Expected ratio 1.7
//! to 2.2, measured 1.4 (scenario) to 2.1; 1.25 leaves room for a noisy shared
//! machine.

mod common;

use common::*;

fn fetch_run(queue: &str) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let r = probe(
        dir.path(),
        &[
            "--xdp-mode",
            "off",
            "--duration",
            "20s",
            "--interval",
            "100ms",
            "--link-rate",
            "10mbit",
            "--bottleneck",
            "router",
            "--gso",
            "off",
            "--queue-limit",
            queue,
            "--load",
            "tcp,cc=cubic",
            "--load",
            "fetch:100KiB,every=500ms,cc=cubic,timeout=10s",
            "--load-warmup",
            "2s",
        ],
    );
    assert_eq!(r.code, 0, "rtprobe (queue {queue}): {}", r.stderr);
    let flows = r.json["extra"]["load"]["flows"].as_array().unwrap().clone();
    let fetch = flows
        .iter()
        .find(|f| f["kind"] == "fetch")
        .expect("a fetch flow in the report");
    fetch["fetch"].clone()
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn a_big_queue_slows_the_fetches_and_all_complete() {
    if !is_root("a_big_queue_slows_the_fetches_and_all_complete") {
        return;
    }
    let small = fetch_run("20");
    let big = fetch_run("100");
    let p50 = |f: &serde_json::Value| f["p50_s"].as_f64().unwrap();
    let (s, b) = (p50(&small), p50(&big));
    eprintln!("fetch p50: q=20 {s:.3} s ({small}), q=100 {b:.3} s ({big})");
    for (q, f) in [("20", &small), ("100", &big)] {
        assert_eq!(f["failures"], 0, "queue {q}: fetches failed: {f}");
        assert!(f["count"].as_u64().unwrap() > 0, "queue {q}: no fetch: {f}");
    }
    // The mechanism: each round trip of a fetch waits behind the queue, so
    // the bigger queue's fetches are slower. By how much (the study's
    // 1.25x and more) is a figure of the machine: `cargo xtask bench
    // --only study` prints it.
    assert!(
        b > s,
        "a 100-packet queue should slow the median fetch: q=20 {s:.3} s, q=100 {b:.3} s"
    );
}
