//! `rtprobe plot` on one million rows: read + boxplot + CDF + time series
//! of one metric, as SVG. The target is "a couple of seconds" in release;
//! memory is bounded by the reader keeping two `Vec<i64>` per metric.
//!
//! Run with `cargo bench -p rtprobe --bench plot`.

use std::{hint::black_box, path::Path, time::Duration};

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use rtprobe::export::{
    csv::{CsvWriter, ProbeRecord, RunMeta, TsSource},
    plot::{
        self, FigureKind, ImageFormat, PlotOptions, Scale,
        read::{ReadOptions, Want, read_csv_file},
    },
};

const ROWS: u64 = 1_000_000;

/// A realistic run: 1 ms interval, ~50 µs one-way with jitter, a 0.1 %
/// tail of slow probes and 0.05 % losses, from a fixed-seed generator.
fn write_csv(path: &Path) {
    let meta = RunMeta {
        version: "bench".into(),
        xdp_mode_attached: "native".into(),
        size: 64,
        interval_ns: 1_000_000,
        ..Default::default()
    };
    let mut w = CsvWriter::create(path, &meta).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        // xorshift64*: deterministic, no dependency.
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    for seq in 0..ROWS {
        let t = 1_763_771_234_000_000_000 + seq as i64 * 1_000_000;
        let r = rnd();
        let lost = r % 2000 == 0;
        let mut ow = 45_000 + (r >> 32) as i64 % 10_000;
        if r % 1000 == 1 {
            ow += (r >> 20) as i64 % 2_000_000;
        }
        let tx = t + 1_500;
        w.write(&ProbeRecord {
            seq,
            size: 64,
            sched_ns: t,
            send_ns: t + 1_000,
            tx_ns: Some(tx),
            rx_ns: (!lost).then_some(tx + ow),
            echo_ns: (!lost).then_some(tx + 2 * ow + 3_000),
            one_way_ns: (!lost).then_some(ow),
            rtt_ns: (!lost).then_some(2 * ow + 3_000),
            tx_src: Some(TsSource::Software),
            rx_src: (!lost).then_some(TsSource::Software),
            echo_src: (!lost).then_some(TsSource::Software),
            ts_source: (!lost).then_some(TsSource::Software),
            lost,
            ..Default::default()
        })
        .unwrap();
    }
    w.flush().unwrap();
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("million.csv");
    write_csv(&csv);
    let out = dir.path().join("figs");

    let mut g = c.benchmark_group("plot_1M_rows");
    // One plot takes about half a second: ten flat samples are plenty.
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8));

    let ropts = ReadOptions {
        one_way: Want::Required,
        rtt: Want::Skip,
        allow_truncated: false,
        stages: false,
    };
    g.bench_function("read_one_way", |b| {
        b.iter(|| black_box(read_csv_file(&csv, &ropts).unwrap()))
    });

    let opts = PlotOptions {
        inputs: vec![csv.clone()],
        labels: Vec::new(),
        out_dir: out.clone(),
        prefix: "million".into(),
        metrics: vec![plot::Metric::OneWay],
        metric_required: true,
        kinds: vec![FigureKind::Box, FigureKind::Cdf, FigureKind::Time],
        kinds_given: true,
        group_by: None,
        split_by: None,
        auto_split: false,
        scale: Scale::Linear,
        formats: vec![ImageFormat::Svg],
        size_px: (1000, 600),
        y_min_ns: None,
        y_max_ns: None,
        title: None,
        ignore_truncated: false,
    };
    g.bench_function("box_cdf_time_svg_one_way", |b| {
        b.iter(|| black_box(plot::plot(&opts).unwrap()))
    });
    g.finish();

    for f in std::fs::read_dir(&out).unwrap() {
        let f = f.unwrap();
        println!(
            "{}: {} bytes",
            f.file_name().to_string_lossy(),
            f.metadata().unwrap().len()
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
