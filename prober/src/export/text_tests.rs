//! Unit tests of `text.rs` (kept apart so that the module itself stays short).

use super::*;

#[test]
fn stamp_words_say_hop_limit_over_ipv6() {
    let r = ReflectorReport {
        protocol: Some("stamp".into()),
        ssid: Some(7),
        authenticated: Some(false),
        sender_ttl_min: Some(Some(63)),
        sender_ttl_max: Some(Some(64)),
        ..Default::default()
    };
    assert_eq!(
        protocol_words(&r, false),
        ", protocol stamp, SSID 7, probes arrived with TTL 63..64"
    );
    assert!(protocol_words(&r, true).ends_with("with hop limit 63..64"));
    assert_eq!(protocol_words(&ReflectorReport::default(), true), "");
}

#[test]
fn cpu_lists_and_unknown_waits() {
    assert_eq!(cpu_list(&[3]), "CPU 3");
    assert_eq!(cpu_list(&[0, 1]), "CPUs 0-1");
    assert_eq!(cpu_list(&[0, 2, 3, 5]), "CPUs 0,2-3,5");
    let mut w = crate::stats::CpuWaits {
        over_ns: 1_000_000_000,
        runq_wait_ns: None,
        steal_ns: Some(0),
        cpus: vec![1],
    };
    assert_eq!(
        waits_words(&w).unwrap(),
        "the hypervisor stole nothing from CPU 1 (0.00 %)"
    );
    w.steal_ns = None;
    assert_eq!(waits_words(&w), None);
    // 2 % steal without a latency limit held: the summary names the knob.
    let mut s = Summary {
        pacing: Some(Pacing {
            waits: Some(crate::stats::CpuWaits {
                over_ns: 1_000_000_000,
                runq_wait_ns: Some(0),
                steal_ns: Some(20_000_000),
                cpus: vec![0],
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let m = RunMeta::default();
    let hinted = |s: &Summary| format_summary(s, &m).contains("--cpu-dma-latency 0 keeps");
    assert!(hinted(&s));
    s.pacing.as_mut().unwrap().cpu_dma_latency_us = Some(0);
    assert!(!hinted(&s), "held already");
    assert!(format_summary(&s, &m).contains("; CPU idle-latency limit 0 µs held"));
}

#[test]
fn unknown_drop_counters_and_memory_show_as_a_dash() {
    let mut s = Summary::default();
    assert_eq!(drops_line(&s), None, "nothing measured, nothing said");
    s.report.kernel_drops = Some(Some(KernelDrops {
        receiver_rcvbuf_errors: Some(0),
        receiver_in_errors: Some(2),
        host_backlog_drops: Some(7),
        ..Default::default()
    }));
    s.report.peak_rss_kib = Some(None);
    let l = drops_line(&s).unwrap();
    assert_eq!(
        l,
        "  kernel drops: receiver rcvbuf 0, in-errors 2; sender rcvbuf -, sndbuf -; \
         host backlog 7; peak RSS - KiB"
    );
    let text = format_summary(&s, &RunMeta::default());
    assert!(text.contains(&l), "{text}");
}

/// A sender whose PHC was sampled and a receiver without one.
fn phc_sender_no_phc_receiver() -> crate::stats::report::HardwareClocks {
    crate::stats::report::HardwareClocks {
        sender: Some(HardwareClock::Sampled(crate::stats::report::SampledClock {
            phc: crate::stats::report::PhcReport {
                phc_index: Some(2),
                samples: 50,
                rejected_batches: 0,
                read_window_median_ns: Some(310),
                read_window_max_ns: Some(900),
                drift_ppb: Some(12345.6),
                steps: 0,
            },
            read_errors: None,
            last_read_error: None,
        })),
        receiver: Some(HardwareClock::Failed {
            error: "veth-rcv has no PTP hardware clock".into(),
        }),
    }
}

/// Adaptive pacing with every figure the text shows.
fn adaptive_pacing() -> Pacing {
    Pacing {
        mode: "adaptive".into(),
        margin_ns: Some(142_000),
        margin_max_ns: Some(150_000),
        wake_late_ns: Latency {
            count: 10,
            p50: Some(34_000),
            p99: Some(139_000),
            max: Some(2_600_000),
            ..Default::default()
        },
        overslept: 1,
        spin_ns_per_probe: 13_900.0,
        spin_cpu_pct: 1.39,
        sender_cpu_pct: Some(3.25),
        clock_steps: 0,
        waits: Some(crate::stats::CpuWaits {
            over_ns: 2_000_000_000,
            runq_wait_ns: Some(1_250_000),
            steal_ns: Some(40_000_000),
            cpus: vec![0, 1],
        }),
        cpu_dma_latency_us: None,
        warm_up_ns_per_probe: Some(4_200.0),
        send_failures: 3,
        reader: None,
    }
}

/// A target among several bins up to 1.07 s: one RTT of 3 s above it.
fn capped_rtt() -> Latency {
    Latency {
        count: 9,
        min: Some(8_000),
        p50: Some(9_000),
        p90: Some(10_000),
        p99: None,
        p999: None,
        max: Some(3_000_000_000),
        mean: Some(333_341_000.0),
        unbinned: Some(crate::stats::hist::Unbinned {
            cap_ns: 1_073_741_823,
            above_cap: 1,
            bucket_full: 0,
        }),
    }
}

/// What [`summary_mentions_everything_asked`]'s summary must say.
const EVERYTHING_ASKED: &[&str] = &[
    "\n  host: 2 cores (AMD EPYC), kernel 6.18.44, preemption unknown",
    "  rtt                  8 µs       9 µs      10 µs > 1.074 s  > 1.074 s        3 s ",
    "hardware clock, sender NIC: PHC /dev/ptp2 on the system clock by 50 samples; offset uncertainty (read window) median 310 ns, max 900 ns; drift 12346 ppb",
    "hardware clock, receiver NIC: veth-rcv has no PTP hardware clock",
    "pacing (timer + adaptive spin: margin 142 µs, warm-up on loopback 4.2 µs/probe, spin 13.9 µs/probe = 1.39 % of a CPU)",
    "sender wake-ups: late p50 34 µs / p99 139 µs / max 2.6 ms (10 sleeps, 1 overslept the send); sender thread 3.2 % of a CPU",
    "\n  send failed: 3 probes (counted as lost; the log names the target and the error)\n",
    "  sender not running: waited for a CPU 1.25 ms (0.06 % of the sending); the hypervisor stole 40 ms from CPUs 0-1 (1.00 %)",
    "sent 10",
    "received 9",
    "lost 1 (10.00 %)",
    "requested auto, attached native",
    "software",
    "redirected 18 pkt",
    // Units follow the value; numbers and units are aligned.
    "  one-way              5 µs       6 µs       -          -          -         20 ms",
    "   sender queue        -        5.5 µs",
    "p99.9",
    "0xc0",
    "missed ticks 0 (0.00 %",
    "unaccounted probes 0",
    "send->tx",
    "rtt net",
    "enters the sender's qdisc (kernel SCHED stamp)",
    " sender queue",
    "where the time went: 92 % of the one-way p50 is the sender's queue",
    "late 0",
];

/// Every row of the latency table is as wide as its header.
fn assert_table_aligned(t: &str) {
    let widths: Vec<usize> = t
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("min "))
        .take_while(|l| !l.contains("where the time went"))
        .map(|l| l.chars().count())
        .collect();
    assert!(
        widths.len() > 3 && widths.iter().all(|&w| w == widths[0]),
        "{widths:?}\n{t}"
    );
}

#[test]
fn summary_mentions_everything_asked() {
    let mut s = Summary {
        sent: 10,
        received: 9,
        lost: 1,
        loss_pct: 10.0,
        ..Default::default()
    };
    s.one_way_ns = Latency {
        count: 9,
        min: Some(5_000),
        p50: Some(6_000),
        max: Some(20_000_000),
        ..Default::default()
    };
    s.timestamp_source = "software".into();
    s.one_way_start = "sched".into();
    s.stages_ns.sender_queue = Latency {
        count: 9,
        p50: Some(5_500),
        ..Default::default()
    };
    s = s.with_dominant_stages();
    s.xdp_counters.insert(
        "redirected".into(),
        crate::stats::summary::PacketsBytes {
            packets: 18,
            bytes: 1800,
        },
    );
    let m = RunMeta {
        size: 64,
        interval_ns: 1_000_000,
        tos: 0xc0,
        port: 5061,
        testbed: "veth".into(),
        xdp_mode_requested: "auto".into(),
        xdp_mode_attached: "native".into(),
        xdp_action: "redirect".into(),
        ..Default::default()
    };
    s.report.hardware_clocks = Some(phc_sender_no_phc_receiver());
    s.pacing = Some(adaptive_pacing());
    s.report.host = Some(crate::model::host::HostFacts {
        cores: Some(2),
        cpu_model: Some("AMD EPYC".into()),
        kernel: "6.18.44".into(),
        cpuidle_driver: "haltpoll".into(),
        cpuidle_governor: "haltpoll".into(),
        ..Default::default()
    });
    s.rtt_ns = capped_rtt();
    let t = format_summary(&s, &m);
    for needle in EVERYTHING_ASKED {
        assert!(t.contains(needle), "missing {needle:?} in\n{t}");
    }
    assert_table_aligned(&t);
    assert!(
        !t.contains("driver/ring"),
        "a stage without data is left out"
    );
}
