//! Unit tests of `run_stats.rs` (kept apart so that the module itself stays short).

use super::*;
use crate::model::record::TsSource;

fn rec(seq: u64, ow: Option<i64>, rtt: Option<i64>) -> ProbeRecord {
    ProbeRecord {
        seq,
        size: 64,
        sched_ns: 1000 * seq as i64,
        send_ns: 1000 * seq as i64 + 5,
        tx_ns: Some(1000 * seq as i64 + 10),
        rx_ns: ow.map(|o| 1000 * seq as i64 + 10 + o),
        echo_ns: rtt.map(|r| 1000 * seq as i64 + 10 + r),
        one_way_ns: ow,
        rtt_ns: rtt,
        ts_source: ow.map(|_| TsSource::Software),
        lost: ow.is_none(),
        ..Default::default()
    }
}

/// A target probed every 100 ms for 10 minutes, with every stamp and
/// latencies spread over 0.1–10 ms: the statistics it keeps, alone
/// (sparse, 3 digits) and among several (fixed), against dense
/// `hdrhistogram`s of the same precision sized to the same values.
#[test]
fn statistics_of_a_target_fit_in_a_few_kib() {
    let single = ten_minutes_of_records(RunStats::with_interval(100_000_000));
    let many = ten_minutes_of_records(RunStats::one_of_many(100_000_000));
    for (what, s) in [("alone", &single), ("one of many", &many)] {
        let used = s.hists().filter(|h| !h.is_empty()).count();
        let buckets: usize = s.hists().map(Hist::buckets).sum();
        let dense: usize = s.hists().map(|h| h.to_hdr().distinct_values() * 8).sum();
        eprintln!(
            "a target {what}, 6000 records: {used} histograms in use, {buckets} buckets, \
             {} KiB on the heap (dense u64 histograms: {} KiB)",
            s.heap_bytes() / 1024,
            dense / 1024
        );
        assert_eq!(
            used, 14,
            "every stage, one-way, RTT, IPDV, send error/TX, turnaround"
        );
    }
    assert!(
        single.heap_bytes() <= 600 * 1024,
        "{} bytes",
        single.heap_bytes()
    );
    // A target among several holds its fixed histograms, no more.
    assert_eq!(many.heap_bytes(), RunStats::FIXED_HEAP_BYTES);
    assert_eq!(
        RunStats::one_of_many(1).heap_bytes(),
        RunStats::FIXED_HEAP_BYTES
    );
    let mut total = RunStats::new();
    total.merge(&many);
    assert_eq!(
        total.summary().report.stats_bytes_per_target,
        Some(RunStats::FIXED_HEAP_BYTES as u64)
    );
    // Hdrhistogram's own figures, from the same buckets.
    let (a, b) = (single.summary(), many.summary());
    assert_eq!(
        a.stages_ns.path,
        Latency::from_hist(&single.stage_hist(Stage::Path))
    );
    for (what, p, q) in [
        ("RTT", a.rtt_ns.p50, b.rtt_ns.p50),
        ("RTT p99", a.rtt_ns.p99, b.rtt_ns.p99),
        ("one-way", a.one_way_ns.p50, b.one_way_ns.p50),
        ("path", a.stages_ns.path.p50, b.stages_ns.path.p50),
    ] {
        let (p, q) = (p.unwrap(), q.unwrap());
        // 0.1 % and 1.6 % wide buckets, both read at their top.
        assert!(
            p.abs_diff(q) * 1000 <= p * 16,
            "{what} within 1.6 %: {p} {q}"
        );
    }
}

fn ten_minutes_of_records(mut s: RunStats) -> RunStats {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut jitter = |lo: i64, spread: i64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Mostly near `lo`, with a long tail (a square of a uniform).
        let u = (x >> 11) as f64 / (1u64 << 53) as f64;
        lo + (u * u * spread as f64) as i64
    };
    for seq in 0..6000u64 {
        let t = seq as i64 * 100_000_000;
        let stack = jitter(3_000, 20_000);
        let queue = jitter(500, 5_000);
        let driver = jitter(1_000, 10_000);
        let path = jitter(100_000, 5_000_000);
        let receiver = jitter(5_000, 50_000);
        let reflector = jitter(10_000, 200_000);
        let ret = jitter(100_000, 5_000_000);
        let ow = stack + queue + driver + path + receiver;
        let rtt = ow + reflector + ret;
        s.on_record(&ProbeRecord {
            seq,
            sched_ns: t,
            send_ns: t + jitter(1_000, 100_000),
            tx_sched_ns: Some(t + stack),
            tx_ns: Some(t + stack + queue + driver),
            rx_ns: Some(t + ow),
            echo_ns: Some(t + rtt),
            one_way_ns: Some(ow),
            rtt_ns: Some(rtt),
            turnaround_ns: Some(reflector),
            stack_ns: Some(stack),
            sender_queue_ns: Some(queue),
            driver_ns: Some(driver),
            path_ns: Some(path),
            receiver_ns: Some(receiver),
            reflector_ns: Some(reflector),
            return_ns: Some(ret),
            ts_source: Some(TsSource::Software),
            ..Default::default()
        });
    }
    s
}

#[test]
fn merged_statistics_are_the_total_of_the_targets() {
    let (mut a, mut b) = (RunStats::new(), RunStats::new());
    for i in 0..10 {
        a.on_record(&rec(i, Some(100), Some(1_000)));
        b.on_record(&rec(i, (i % 2 == 0).then_some(300), Some(3_000_000)));
    }
    a.set_attempts(10);
    b.set_attempts(10);
    let mut total = RunStats::new();
    total.merge(&a);
    total.merge(&b);
    let s = total.summary();
    assert_eq!((s.sent, s.received, s.lost), (20, 15, 5));
    assert_eq!(s.unaccounted, 0);
    assert_eq!(s.rtt_ns.count, 15);
    assert_eq!(s.rtt_ns.min, Some(1_000));
    // 3 ms: the grown histogram keeps the same 3 significant digits.
    assert!(s.rtt_ns.max.unwrap().abs_diff(3_000_000) < 3_000 * 2);
    assert_eq!(
        a.summary().rtt_ns.p50,
        Some(1_000),
        "merging leaves the parts"
    );
}

#[test]
fn counts_loss_ipdv_and_percentiles() {
    let mut s = RunStats::new();
    for (i, ow) in [Some(100), Some(130), None, Some(90), Some(100)]
        .into_iter()
        .enumerate()
    {
        s.on_record(&rec(i as u64, ow, ow.map(|o| 2 * o)));
    }
    let sum = s.summary();
    assert_eq!(sum.sent, 5);
    assert_eq!(sum.received, 4);
    assert_eq!(sum.lost, 1);
    assert!((sum.loss_pct - 20.0).abs() < 1e-9);
    assert_eq!(sum.one_way_ns.min, Some(90));
    assert_eq!(sum.one_way_ns.max, Some(130));
    assert_eq!(sum.rtt_ns.max, Some(260));
    // IPDV only across consecutive received pairs: |130-100| and |100-90|.
    assert_eq!(sum.ipdv_ns.count, 2);
    assert_eq!(sum.ipdv_ns.max, Some(30));
    assert_eq!(sum.ipdv_ns.min, Some(10));
    assert_eq!(sum.send_error_ns.p50, Some(5));
    assert_eq!(sum.timestamp_source, "software");
    assert_eq!(sum.rtt_net_ns.count, 0, "no turnaround known");
    let mut s = RunStats::new();
    s.on_record(&ProbeRecord {
        turnaround_ns: Some(30),
        ..rec(0, Some(100), Some(200))
    });
    let sum = s.summary();
    assert_eq!(sum.rtt_net_ns.p50, Some(170));
    assert_eq!(sum.reflector_turnaround_ns.p50, Some(30));
}

#[test]
fn missed_ticks_are_sends_more_than_one_interval_late() {
    assert!(!is_missed_tick(0, 1000));
    assert!(
        !is_missed_tick(1000, 1000),
        "exactly one interval late still made its tick"
    );
    assert!(is_missed_tick(1001, 1000));
    assert!(!is_missed_tick(5000, 0), "no interval: nothing to miss");
    let mut s = RunStats::with_interval(1000);
    for (seq, late) in [(0u64, 10i64), (1, 999), (2, 1500), (3, 2500), (4, -3)] {
        let t = seq as i64 * 1000;
        s.on_record(&ProbeRecord {
            seq,
            sched_ns: t,
            send_ns: t + late,
            tx_ns: (seq != 1).then_some(t + late + 7),
            lost: true,
            ..Default::default()
        });
    }
    let sum = s.summary();
    assert_eq!(sum.missed_ticks, 2);
    // Five sends from 10 to 3997 ns: four gaps.
    assert!((sum.send_rate_pps - 4.0 * 1e9 / 3987.0).abs() < 1e-3);
    // HDR histograms keep 3 significant digits.
    assert!((2500..=2503).contains(&sum.send_error_ns.max.unwrap()));
    // An early send (clock step) is recorded as 1 ns, not as a huge number.
    assert_eq!(sum.send_error_ns.min, Some(1));
    assert_eq!(sum.send_to_tx_ns.count, 4);
    assert_eq!(sum.send_to_tx_ns.max, Some(7));
    assert_eq!(sum.tx_timestamp_missing, 1);
}

#[test]
fn unaccounted_probes_are_attempts_without_a_record() {
    let mut s = RunStats::new();
    for i in 0..3 {
        s.on_record(&rec(i, (i != 1).then_some(100), Some(200)));
    }
    assert_eq!(s.summary().unaccounted, 0, "attempts unknown: records only");
    s.set_attempts(3);
    assert_eq!(s.summary().unaccounted, 0);
    s.set_attempts(5);
    let sum = s.summary();
    assert_eq!(sum.unaccounted, 2);
    assert_eq!(sum.sent, 3);
    s.set_unmatched(1);
    assert_eq!(s.summary().unaccounted, 3, "a dropped matcher slot counts");
}

#[test]
fn stages_and_the_dominant_one() {
    let mut s = RunStats::new();
    for seq in 0..10 {
        let mut r = ProbeRecord {
            seq,
            send_ns: 0,
            tx_sched_ns: Some(2),
            tx_ns: Some(1_002),
            rx_ns: Some(1_052),
            rx_user_ns: Some(1_100),
            echo_tx_ns: Some(1_120),
            echo_ns: Some(1_170),
            ..Default::default()
        };
        crate::stats::chain::derive(&mut r);
        s.on_record(&r);
    }
    let sum = s.summary();
    assert_eq!(sum.one_way_start, "sched");
    assert_eq!(sum.one_way_ns.p50, Some(1_050));
    assert_eq!(sum.stages_ns.sender_queue.p50, Some(1_000));
    assert_eq!(sum.stages_ns.path.p50, Some(50));
    assert_eq!(sum.stages_ns.driver.count, 0, "no hardware stamps");
    let d = sum.one_way_dominant.as_ref().unwrap();
    assert_eq!(d.stage, "sender_queue");
    assert!((d.share_pct - 95.238).abs() < 0.01);
    assert_eq!(
        d.text,
        "95 % of the one-way p50 is the sender's queue (qdisc and driver xmit)"
    );
    assert_eq!(sum.rtt_dominant.unwrap().stage, "sender_queue");
    let json = serde_json::to_value(&sum.stages_ns).unwrap();
    assert!(json.get("return").is_some() && json.get("sender_queue").is_some());
    assert!(json["driver"]["p50"].is_null(), "unknown is null, not 0");
}

#[test]
fn reorder_and_duplicates_in_arrival_order() {
    let mut s = RunStats::new();
    s.on_arrival(0, true);
    s.on_arrival(2, true);
    s.on_arrival(1, true); // late: reordered
    s.on_arrival(2, false); // second copy
    s.on_arrival(3, true);
    let sum = s.summary();
    assert_eq!(sum.reordered, 1);
    assert_eq!(sum.duplicates, 1);
}

#[test]
fn empty_run_has_no_percentiles() {
    let s = RunStats::new().summary();
    assert_eq!(s.sent, 0);
    assert_eq!(s.one_way_ns.p50, None);
    assert_eq!(s.timestamp_source, "none");
}
