//! Unit tests of `tune/mod.rs` (kept apart so that the module itself stays short).

use super::*;

#[test]
fn cross_field_validation() {
    let k = Knobs::from(KnobSpec {
        queue_limit: Some(QueueLimit::Packets(20)),
        ..Default::default()
    });
    assert_eq!(k.validate().unwrap_err().key, "queue_limit");
    let k = Knobs::from(KnobSpec {
        link_rate: Some(Rate::mbit(100)),
        queue_limit: Some(QueueLimit::Packets(20)),
        qdisc: Some("fq_codel".parse().unwrap()),
        ..Default::default()
    });
    assert!(
        k.validate()
            .unwrap_err()
            .message
            .contains("fq_codel its own limit")
    );
    let k = Knobs::from(KnobSpec {
        stress_tool: Some(StressTool::StressNg),
        ..Default::default()
    });
    assert_eq!(k.validate().unwrap_err().key, "stress_tool");
    // A real-time sender holds the CPU latency limit at 0 unless told.
    let rt = |rt_priority, cpu_dma_latency| {
        Knobs::from(KnobSpec {
            rt_priority,
            cpu_dma_latency,
            ..Default::default()
        })
        .rt()
        .cpu_dma_latency_us
    };
    assert_eq!(rt(Some(80), None), Some(0));
    assert_eq!(rt(Some(80), Some(CpuDmaLatency::Off)), None);
    assert_eq!(rt(None, None), None);
    assert_eq!(rt(None, Some(CpuDmaLatency::Us(5))), Some(5));
    // Only a limit asked for is one that must be held.
    let explicit = |c| {
        Knobs::from(KnobSpec {
            rt_priority: Some(80),
            cpu_dma_latency: c,
            ..Default::default()
        })
        .rt()
        .cpu_dma_latency_explicit
    };
    assert!(!explicit(None));
    assert!(explicit(Some(CpuDmaLatency::Us(0))));
    let k = Knobs::from(KnobSpec {
        rt_priority: Some(0),
        ..Default::default()
    });
    assert_eq!(k.validate().unwrap_err().key, "rt_priority");
    let k = Knobs::from(KnobSpec {
        bottleneck: Some(Bottleneck::Router),
        ..Default::default()
    });
    assert_eq!(k.validate().unwrap_err().key, "bottleneck");
    let mut k = Knobs::from(KnobSpec {
        load: Some(vec!["tcp,port=5061".parse().unwrap()]),
        ..Default::default()
    });
    k.validate().unwrap();
    assert_eq!(k.validate_with_probe().unwrap_err().key, "load");
    k.set_probe(6000, 64, Duration::from_millis(1));
    k.validate_with_probe().unwrap();
}

#[test]
fn word_enums_parse_from_their_toml_words() {
    assert_eq!("router".parse::<Bottleneck>(), Ok(Bottleneck::Router));
    assert_eq!("skip".parse::<MissingPolicy>(), Ok(MissingPolicy::Skip));
    assert_eq!("fail".parse::<DevicePolicy>(), Ok(DevicePolicy::Fail));
    assert_eq!("tbf".parse::<ShaperKind>(), Ok(ShaperKind::Tbf));
    assert_eq!("stress-ng".parse::<StressTool>(), Ok(StressTool::StressNg));
    let e = "switch".parse::<Bottleneck>().unwrap_err();
    assert!(e.contains("sender") && e.contains("router"), "{e}");
}

#[test]
fn probe_wire_rate() {
    let mut p = ProbeContext {
        port: 5061,
        size: 1470,
        interval: Duration::from_millis(1),
        ipv6: false,
    };
    assert_eq!(p.wire_rate(24).bps, 1536 * 8 * 1000);
    // IPv6's header is 20 bytes longer.
    p.ipv6 = true;
    assert_eq!(p.wire_rate(24).bps, 1556 * 8 * 1000);
}
