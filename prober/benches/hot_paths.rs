//! Per-probe hot paths: what rtprobe itself costs per probe. Run with
//! `cargo bench -p rtprobe --bench hot_paths`.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rtprobe::{
    export::csv::format_row,
    model::record::{ProbeRecord, TsSource},
    probe::{
        cmsg::{self, ExtErr, SCM_TSTAMP_SND, SO_EE_ORIGIN_TIMESTAMPING, TxKind},
        matcher::{Event, Expect, Matcher},
        packet::Probe,
    },
    stats::RunStats,
};

fn record(seq: u64) -> ProbeRecord {
    let t = 1_700_000_000_000_000_000 + seq as i64 * 1_000_000;
    ProbeRecord {
        seq,
        size: 64,
        sched_ns: t,
        send_ns: t + 900,
        tx_ns: Some(t + 4_000),
        rx_ns: Some(t + 9_000 + (seq % 97) as i64),
        echo_ns: Some(t + 30_000),
        one_way_ns: Some(5_000 + (seq % 97) as i64),
        rtt_ns: Some(26_000),
        tx_src: Some(TsSource::Software),
        rx_src: Some(TsSource::Software),
        echo_src: Some(TsSource::Software),
        ts_source: Some(TsSource::Software),
        turnaround_ns: Some(8_000),
        ..Default::default()
    }
}

#[allow(clippy::too_many_lines)]
fn benches(c: &mut Criterion) {
    let ext = ExtErr {
        errno: libc::ENOMSG as u32,
        origin: SO_EE_ORIGIN_TIMESTAMPING,
        info: SCM_TSTAMP_SND,
        data: 7,
    };
    let tx_buf = cmsg::encode_for_test(Some([(1_700_000_000, 123), (0, 0), (0, 0)]), Some(ext));
    let rx_buf = cmsg::encode_for_test(Some([(1_700_000_000, 456), (0, 0), (0, 0)]), None);
    let mut g = c.benchmark_group("per_probe");
    g.throughput(Throughput::Elements(1));
    g.bench_function("cmsg_parse_tx_timestamp", |b| {
        b.iter(|| black_box(cmsg::parse(black_box(&tx_buf))).tx_opt_id())
    });
    g.bench_function("cmsg_parse_rx_timestamp", |b| {
        b.iter(|| black_box(cmsg::parse(black_box(&rx_buf))).best())
    });

    let mut payload = vec![0u8; 64];
    g.bench_function("packet_encode_decode", |b| {
        let mut seq = 0;
        b.iter(|| {
            seq += 1;
            Probe {
                session: 42,
                seq,
                flow: 0,
                echo: false,
                send_ns: 1,
                kernel_times: None,
            }
            .encode(&mut payload);
            black_box(Probe::decode(black_box(&payload), 42).ok())
        })
    });

    let mut stats = RunStats::new();
    let mut seq = 0;
    g.bench_function("histogram_record", |b| {
        b.iter(|| {
            seq += 1;
            stats.on_record(black_box(&record(seq)));
        })
    });

    let mut line = String::with_capacity(256);
    let r = record(12345);
    g.bench_function("csv_row_format", |b| {
        b.iter(|| {
            line.clear();
            format_row(&mut line, black_box(&r));
            black_box(line.len())
        })
    });

    // One probe through the matcher: sent, SCHED and driver TX stamps,
    // arrival, echo, drained (with the stage derivation).
    let mut m = Matcher::new(
        64,
        0,
        1_000_000_000,
        Expect {
            tx: true,
            ..Expect::default()
        },
    );
    let mut st = RunStats::new();
    let mut seq = 0u64;
    g.bench_function("probe_matching", |b| {
        b.iter(|| {
            let t = seq as i64 * 1000;
            m.on_event(
                Event::Sent {
                    seq,
                    opt_id: seq as u32,
                    sched_ns: t,
                    send_ns: t + 1,
                },
                &mut st,
            );
            m.on_event(
                Event::TxTimestamp {
                    opt_id: seq as u32,
                    kind: TxKind::Sched,
                    ts_ns: t + 2,
                },
                &mut st,
            );
            m.on_event(
                Event::TxTimestamp {
                    opt_id: seq as u32,
                    kind: TxKind::Software,
                    ts_ns: t + 3,
                },
                &mut st,
            );
            m.on_event(
                Event::Arrived {
                    seq,
                    sw_ns: Some(t + 5),
                    hw_ns: None,
                    user_ns: t + 7,
                    echo_send_ns: Some(t + 8),
                },
                &mut st,
            );
            m.on_event(
                Event::Echoed {
                    seq,
                    sw_ns: Some(t + 9),
                    hw_ns: None,
                    user_ns: t + 11,
                    reflector: None,
                },
                &mut st,
            );
            m.drain(t, false, |r| {
                black_box(r);
            });
            seq += 1;
        })
    });
    g.finish();
}

criterion_group!(hot, benches);
criterion_main!(hot);
