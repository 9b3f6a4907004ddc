//! Unit tests of `report.rs` (kept apart so that the module itself stays short).

use super::*;

/// The schema file next to the docs that describe it.
const SCHEMA_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../docs/run-report.schema.json"
);

fn schema_text() -> String {
    serde_json::to_string_pretty(&run_report_schema()).unwrap() + "\n"
}

/// The checked-in schema is what the types say: a renamed, added or
/// removed field fails here until the file is regenerated (and the
/// change is then visible in review).
#[test]
fn checked_in_schema_matches_the_types() {
    let now = schema_text();
    if std::env::var("RTPROBE_WRITE_SCHEMA").is_ok_and(|v| v == "1") {
        std::fs::write(SCHEMA_FILE, &now).unwrap();
        eprintln!("RTPROBE_WRITE_SCHEMA=1: wrote {SCHEMA_FILE}");
        return;
    }
    let file = std::fs::read_to_string(SCHEMA_FILE).unwrap_or_default();
    assert!(
        file == now,
        "{SCHEMA_FILE} differs from the run report's types; if the change is meant, \
         regenerate it with RTPROBE_WRITE_SCHEMA=1 cargo test -p rtprobe --lib \
         checked_in_schema_matches_the_types (and say so in docs/OUTPUTS.md)"
    );
}

/// A summary with every part of the report filled in, both kinds of
/// each untagged part among the flows.
fn full_summary() -> Summary {
    let flow = |flow: u8, report: RunReport| FlowSummary {
        flow,
        interval_ns: 1_000_000,
        port: 5061 + u16::from(flow),
        size: 64,
        summary: Summary {
            report,
            ..Default::default()
        },
        tos: 0,
    };
    let remote = remote_report();
    let knobs = crate::model::knobs::AppliedKnobs {
        qdisc_tree: Some(crate::model::knobs::QdiscTreeApplied {
            status: "applied".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let report = RunReport {
        clock: Some(ClockReport::OneClock(OneClock {
            note: "one clock".into(),
            one_way_shown: true,
        })),
        csv_rotation: Some(CsvRotation {
            keep: 3,
            when: "1h".into(),
        }),
        flows: vec![flow(0, RunReport::default()), flow(1, remote)],
        hardware_clocks: Some(hardware_clocks()),
        hardware_timestamping: Some(HardwareTimestamping::default()),
        host: Some(HostFacts {
            cores: Some(2),
            cpuidle_driver: "haltpoll".into(),
            vm: Some(true),
            ..Default::default()
        }),
        interrupted: true,
        ip: Some(IpReport {
            receiver: "10.77.0.2".into(),
            sender: "10.77.0.1".into(),
            version: 4,
        }),
        kernel_drops: Some(Some(KernelDrops {
            host_backlog_drops: Some(1),
            ..Default::default()
        })),
        knobs: Some(knobs),
        late_arrivals: Some(0),
        load: Some(tcp_load()),
        loss_split: Some(LossSplit {
            forward: Some(1),
            r#return: None,
            unknown: 0,
            basis: "counted".into(),
        }),
        negative_one_way: None,
        output_error: Some("disk full".into()),
        peak_rss_kib: Some(Some(2048)),
        reflector: Some(kernel_reflector()),
        skipped: vec!["qdisc fq_codel".into()],
        stats_bytes_per_target: Some(89_600),
        targets: vec![one_target()],
    };
    Summary {
        report,
        rtt_ns: capped_rtt(),
        ..Default::default()
    }
}

/// One TCP load flow with its fetch times, and the bottleneck's window.
fn tcp_load() -> LoadReport {
    LoadReport {
        flows: vec![FlowReport {
            kind: "tcp".into(),
            fetch: Some(FetchTimes::default()),
            ..Default::default()
        }],
        total_achieved_bps: 1e6,
        bottleneck: Some(QueueWindow::default()),
    }
}

/// RTTs with one value above the histogram's cap.
fn capped_rtt() -> crate::stats::Latency {
    crate::stats::Latency {
        count: 3,
        p50: Some(900),
        p99: None,
        max: Some(2_000_000_000),
        unbinned: Some(crate::stats::hist::Unbinned {
            cap_ns: 1_073_741_823,
            above_cap: 1,
            bucket_full: 0,
        }),
        ..Default::default()
    }
}

/// A remote flow's report: a clock verdict and an authenticated STAMP
/// reflector.
fn remote_report() -> RunReport {
    RunReport {
        clock: Some(ClockReport::Verdict(ClockVerdict {
            one_way_shown: false,
            bound_ns: None,
            sender_synchronized: true,
            sender_max_error_ns: 5,
            reflector_synchronized: Some(false),
            reflector_error_ns: None,
            note: "not shown".into(),
        })),
        reflector: Some(ReflectorReport {
            counters: Some(ReflectorCounts::User(ReflectorCounters::default())),
            protocol: Some("stamp".into()),
            ssid: Some(9),
            authenticated: Some(true),
            sender_ttl_min: Some(None),
            sender_ttl_max: Some(None),
            echoes: Some(3),
            target: Some("[fd77::2]:862".into()),
            ..ReflectorReport::of_kind("remote")
        }),
        negative_one_way: Some(2),
        ..Default::default()
    }
}

/// A receiver whose clock failed and a sender whose PHC was sampled.
fn hardware_clocks() -> HardwareClocks {
    let phc = PhcReport {
        phc_index: Some(0),
        samples: 10,
        rejected_batches: 0,
        read_window_max_ns: Some(900),
        read_window_median_ns: None,
        drift_ppb: Some(-3.5),
        steps: 0,
    };
    HardwareClocks {
        receiver: Some(HardwareClock::Failed {
            error: "no PHC".into(),
        }),
        sender: Some(HardwareClock::Sampled(SampledClock {
            phc,
            read_errors: Some(0),
            last_read_error: Some("EIO".into()),
        })),
    }
}

/// The in-kernel reflector, with its counters.
fn kernel_reflector() -> ReflectorReport {
    ReflectorReport {
        counters: Some(ReflectorCounts::Kernel(XdpCounters::from([(
            "reflected".into(),
            super::super::summary::PacketsBytes {
                packets: 1,
                bytes: 64,
            },
        )]))),
        xdp_mode: Some("native".into()),
        note: Some("kernel".into()),
        rate_limit: Some("none".into()),
        ..ReflectorReport::of_kind("kernel")
    }
}

/// One target of several, with an error.
fn one_target() -> TargetSummary {
    TargetSummary {
        name: "db-1".into(),
        address: "192.0.2.7:5061".into(),
        protocol: "rtprobe".into(),
        interval_ns: 1_000_000,
        size: 64,
        tos: 0,
        labels: BTreeMap::from([("site".into(), "fra1".into())]),
        errors: 2,
        last_error: Some(
            "connect the probe socket to 192.0.2.7:5061: Network is unreachable".into(),
        ),
        summary: Summary::default(),
    }
}

fn schema_errors(json: &serde_json::Value) -> Vec<String> {
    let schema = run_report_schema();
    let v = jsonschema::validator_for(&schema).expect("the schema compiles");
    v.iter_errors(json)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// Every field the report can hold passes the schema; a key the
/// schema does not know, or a field of the wrong type, does not.
#[test]
fn the_schema_takes_every_field_and_refuses_strangers() {
    let mut json = serde_json::to_value(full_summary()).unwrap();
    assert_eq!(schema_errors(&json), Vec::<String>::new(), "{json:#}");
    let back: Summary = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back, full_summary(), "reads back as written");
    json["extra"]["reflector"]["kindd"] = "typo".into();
    json["extra"]["flows"][1]["summary"]["extra"]["clock"]["note"] = 1.into();
    json["extra"]["hardware_clocks"]["sender"]["phc_index"] = "0".into();
    let errors = schema_errors(&json);
    for at in [
        "/extra/reflector",
        "/extra/flows/1/summary/extra/clock",
        // Said of the optional field that holds the wrong part.
        "/extra/hardware_clocks",
    ] {
        assert!(
            errors.iter().any(|e| e.starts_with(at)),
            "{at}: {errors:#?}"
        );
    }
}

/// A key that was null stays null, an absent one absent.
#[test]
fn null_and_absent_keys_round_trip() {
    let r = RunReport {
        peak_rss_kib: Some(None),
        reflector: Some(ReflectorReport {
            sender_ttl_min: Some(None),
            sender_ttl_max: Some(Some(64)),
            ..ReflectorReport::of_kind("remote")
        }),
        ..Default::default()
    };
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"peak_rss_kib": null,
            "reflector": {"kind": "remote", "sender_ttl_min": null, "sender_ttl_max": 64}})
    );
    assert_eq!(serde_json::from_value::<RunReport>(v).unwrap(), r);
    assert!(RunReport::default().is_empty());
    let s = serde_json::to_value(Summary::default()).unwrap();
    assert!(s.get("extra").is_none(), "an empty report is left out");
}

/// Both kinds of clock report and both kinds of reflector counters
/// read back as what they were.
#[test]
fn untagged_parts_read_back_as_their_kind() {
    let one = ClockReport::OneClock(OneClock {
        note: "one clock".into(),
        one_way_shown: true,
    });
    let verdict = ClockReport::Verdict(ClockVerdict {
        one_way_shown: false,
        bound_ns: None,
        sender_synchronized: true,
        sender_max_error_ns: 5,
        reflector_synchronized: None,
        reflector_error_ns: None,
        note: "two clocks".into(),
    });
    for c in [one, verdict] {
        let back: ClockReport = serde_json::from_value(serde_json::to_value(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }
    let user = ReflectorCounts::User(ReflectorCounters {
        reflected: 3,
        ..Default::default()
    });
    let back: ReflectorCounts =
        serde_json::from_value(serde_json::to_value(&user).unwrap()).unwrap();
    assert_eq!(back, user);
}
