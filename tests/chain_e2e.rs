//! The timestamp chain with the real probe: the headline figures contain
//! the queues the knobs act on, and the stages put the time where the
//! queue is. Relations, not absolute times. Root; run by `cargo xtask test`.

mod common;

use common::*;

fn run_json(args: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let r = probe(dir.path(), args);
    assert_eq!(r.code, 0, "rtprobe {args:?}: {}", r.stderr);
    r.json
}

fn ms(j: &serde_json::Value, path: &[&str]) -> f64 {
    let mut v = j;
    for p in path {
        v = &v[*p];
    }
    v.as_f64().unwrap_or_else(|| panic!("no {path:?} in {j}")) / 1e6
}

fn one_way_p50(j: &serde_json::Value) -> f64 {
    ms(j, &["one_way_ns", "p50"])
}

fn stage_p50(j: &serde_json::Value, stage: &str) -> f64 {
    ms(j, &["stages_ns", stage, "p50"])
}

/// Runs idle and under 100 % TCP load on a shaped 100 Mbit/s link with the
/// bottleneck at `bottleneck`; checks the rise is in the headline and that
/// `stage` holds most of it.
fn queue_rise_lands_in(bottleneck: &str, stage: &str) {
    let base = [
        "--xdp-mode",
        "off",
        "--size",
        "200",
        "--count",
        "2000",
        "--interval",
        "1ms",
        "--link-rate",
        "100mbit",
        "--bottleneck",
        bottleneck,
    ];
    let idle = run_json(&base);
    let mut loaded_args = base.to_vec();
    loaded_args.extend(["--load", "tcp:100%"]);
    let loaded = run_json(&loaded_args);
    let (i, l) = (one_way_p50(&idle), one_way_p50(&loaded));
    let (si, sl) = (stage_p50(&idle, stage), stage_p50(&loaded, stage));
    eprintln!(
        "bottleneck {bottleneck}: one-way p50 idle {i:.3} ms, loaded {l:.3} ms; {stage} p50 {si:.3} -> {sl:.3} ms; {}",
        loaded["one_way_dominant"]["text"]
    );
    assert_eq!(idle["one_way_start"], "sched", "veth gives SCHED stamps");
    assert!(
        l >= i + 1.0,
        "TCP load should add at least 1 ms to the one-way p50: idle {i:.3} ms, loaded {l:.3} ms"
    );
    assert!(
        sl - si >= 0.5 * (l - i),
        "the {stage} stage should hold most of the rise: it rose {:.3} ms of {:.3} ms",
        sl - si,
        l - i
    );
    assert_eq!(loaded["one_way_dominant"]["stage"], stage);
    // The RTT starts at the same point: it contains the queue too.
    assert!(ms(&loaded, &["rtt_ns", "p50"]) >= l);
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn sender_bottleneck_queue_is_in_the_headline_and_in_the_sender_queue_stage() {
    if !is_root("sender_bottleneck_queue_is_in_the_headline_and_in_the_sender_queue_stage") {
        return;
    }
    queue_rise_lands_in("sender", "sender_queue");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn router_bottleneck_queue_is_in_the_path_stage() {
    if !is_root("router_bottleneck_queue_is_in_the_path_stage") {
        return;
    }
    queue_rise_lands_in("router", "path");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn cbr_udp_into_a_full_queue_delays_by_the_queue_length() {
    if !is_root("cbr_udp_into_a_full_queue_delays_by_the_queue_length") {
        return;
    }
    let queue_packets = 100.0;
    // 1470 B of payload + UDP/IPv4/Ethernet headers: the frame as the
    // kernel counts it; the shaper charges 24 B of wire overhead
    // (preamble, FCS, gap) on top.
    let frame_bytes = 1470.0 + 8.0 + 20.0 + 14.0;
    let j = run_json(&[
        "--xdp-mode",
        "off",
        "--count",
        "1500",
        "--interval",
        "2ms",
        "--link-rate",
        "100mbit",
        "--queue-limit",
        "100",
        "--load",
        "udp:150%,size=1470",
    ]);
    // The shaper is set to its rate.
    let shaping = &j["extra"]["knobs"]["qdisc_tree"]["shaping"];
    assert_eq!(j["extra"]["knobs"]["qdisc_tree"]["status"], "applied");
    assert_eq!(
        (shaping["shaper"].as_str(), shaping["rate_bps"].as_f64()),
        (Some("htb"), Some(100e6)),
        "{shaping}"
    );
    // The kernel's witness: the rate the shaper's qdisc delivered over the
    // run (its own byte counter). It never beats its rate; how far below
    // it a shaper starved of CPU falls is the machine's (`cargo xtask
    // bench --only study` prints it against its 85 % bound).
    let q = &j["extra"]["load"]["bottleneck"];
    let rate = q["delivered_bps"]
        .as_f64()
        .unwrap_or_else(|| panic!("no shaper counters in {q}"));
    let set_frames_bps = 100e6 * frame_bytes / (frame_bytes + 24.0);
    assert!(
        rate <= set_frames_bps * 1.02,
        "the shaper delivered {:.2} Mbit/s of frames, above its rate",
        rate / 1e6
    );
    // A full queue drains at the rate the shaper delivered: the probes
    // wait the queue's length at that rate.
    let expected_ms = queue_packets * frame_bytes * 8.0 / rate * 1e3;
    let p50 = one_way_p50(&j);
    eprintln!(
        "CBR UDP 150 % into a 100-packet queue: one-way p50 {p50:.3} ms; queue length x frame / rate \
         = {expected_ms:.3} ms at the {:.2} Mbit/s of frames the shaper delivered; {}",
        rate / 1e6,
        j["one_way_dominant"]["text"]
    );
    assert!(
        (p50 - expected_ms).abs() <= 0.15 * expected_ms,
        "one-way p50 {p50:.3} ms should be within 15 % of {expected_ms:.3} ms"
    );
    assert_eq!(j["one_way_dominant"]["stage"], "sender_queue");
}

#[test]
#[ignore = "needs root: run by cargo xtask test"]
fn every_stamp_of_the_chain_lands_in_the_csv_in_order() {
    if !is_root("every_stamp_of_the_chain_lands_in_the_csv_in_order") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let r = probe(
        dir.path(),
        &[
            "--xdp-mode",
            "native",
            "--reflector",
            "user",
            "--count",
            "300",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let rows = &r.rows;
    let header = rtprobe::export::csv::HEADER;
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let num = |row: &Vec<String>, name: &str| row[col(name)].parse::<i64>().ok();
    assert_eq!(rows.len(), 300);
    for row in rows {
        // The chain in time order, as each stamp is taken on one host clock.
        let chain = [
            "send_ns",
            "tx_sched_ns",
            "tx_ns",
            "rx_ns",
            "rx_user_ns",
            "echo_send_ns",
            "echo_tx_sched_ns",
            "echo_tx_ns",
            "echo_ns",
            "echo_user_ns",
        ];
        let times: Vec<i64> = chain
            .iter()
            .map(|c| num(row, c).unwrap_or_else(|| panic!("{c} empty in {row:?}")))
            .collect();
        for (w, names) in times.windows(2).zip(chain.windows(2)) {
            assert!(w[0] <= w[1], "{} after {} in {row:?}", names[0], names[1]);
        }
        assert_eq!(row[col("start_src")], "sched");
        assert_eq!(
            num(row, "one_way_ns"),
            Some(num(row, "rx_ns").unwrap() - num(row, "tx_sched_ns").unwrap())
        );
        // The stages of the one-way figure add up to it.
        assert_eq!(
            num(row, "one_way_ns"),
            Some(num(row, "sender_queue_ns").unwrap() + num(row, "path_ns").unwrap())
        );
        assert!(
            row[col("tx_hw_ns")].is_empty(),
            "veth has no hardware stamps"
        );
    }
    let j = &r.json;
    assert_eq!(j["tx_timestamp_missing"], 0);
    assert_eq!(j["unaccounted"], 0);
    assert!(j["stages_ns"]["driver"]["p50"].is_null());
    assert!(j["stages_ns"]["reflector"]["p50"].is_u64());
}
