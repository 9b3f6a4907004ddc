//! `rtprobe plot` on long runs: time and peak memory of reading a CSV and
//! drawing box, CDF, time series and percentile figures of one metric, as
//! SVG. The streaming path (exact up to `dist::EXACT_LIMIT` samples, then
//! HDR histograms; time series decimated per column as rows arrive) is
//! printed next to its peer, the exact path that keeps every sample
//! (`exact_limit = usize::MAX`, what `rtprobe plot` did before), in the
//! same run:
//!
//! - criterion: 1 M rows, streaming vs exact;
//! - measured once each (a 10 M-row plot takes seconds): 10 M rows
//!   streaming vs exact, and 10 M / 100 M rows streaming in a compact CSV
//!   (five columns, so that 100 M rows take 6 GB of disk instead of 25 GB).
//!
//! Each once-measured case runs in a fresh child process (this binary
//! again, told by `RTPROBE_PLOT_BENCH_CHILD`), so its peak RSS (VmHWM) is
//! its own and not the heap an earlier case left behind.
//! `RTPROBE_PLOT_BENCH_ROWS=10000000` caps the largest run (to skip the
//! 100 M rows on a small disk).
//!
//! Run with `cargo bench -p rtprobe --bench plot`.

use std::{
    hint::black_box,
    io::{BufWriter, Write},
    path::Path,
    time::{Duration, Instant},
};

use criterion::{Criterion, SamplingMode, criterion_group};
use rtprobe::{
    export::{
        csv::{CsvWriter, META_PREFIX},
        plot::{self, FigureKind, PlotOptions},
    },
    model::{
        meta::RunMeta,
        record::{ProbeRecord, TsSource},
    },
};

/// A realistic run: 1 ms interval, ~50 µs one-way with jitter, a 0.1 %
/// tail of slow probes and 0.05 % losses, from a fixed-seed generator.
struct Gen {
    state: u64,
}

impl Gen {
    fn new() -> Gen {
        Gen {
            state: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// (sched_ns, one-way ns or None if lost).
    fn next(&mut self, seq: u64) -> (i64, Option<i64>) {
        // xorshift64*: deterministic, no dependency.
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        let r = self.state.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let t = 1_763_771_234_000_000_000 + seq as i64 * 1_000_000;
        let lost = r.is_multiple_of(2000);
        let mut ow = 45_000 + (r >> 32) as i64 % 10_000;
        if r % 1000 == 1 {
            ow += (r >> 20) as i64 % 2_000_000;
        }
        (t, (!lost).then_some(ow))
    }
}

fn meta() -> RunMeta {
    RunMeta {
        version: "bench".into(),
        xdp_mode_attached: "native".into(),
        size: 64,
        interval_ns: 1_000_000,
        ..Default::default()
    }
}

/// Every column rtprobe writes, through its own writer.
fn write_full_csv(path: &Path, rows: u64) {
    let mut w = CsvWriter::create(path, &meta()).unwrap();
    let mut g = Gen::new();
    for seq in 0..rows {
        let (t, ow) = g.next(seq);
        let lost = ow.is_none();
        let tx = t + 1_500;
        w.write(&ProbeRecord {
            seq,
            size: 64,
            sched_ns: t,
            send_ns: t + 1_000,
            tx_ns: Some(tx),
            rx_ns: ow.map(|ow| tx + ow),
            echo_ns: ow.map(|ow| tx + 2 * ow + 3_000),
            one_way_ns: ow,
            rtt_ns: ow.map(|ow| 2 * ow + 3_000),
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

/// The same probes in the columns the reader needs (seq, sched_ns,
/// one_way_ns, rtt_ns, lost): the reader accepts any column subset.
fn write_compact_csv(path: &Path, rows: u64) {
    let mut w = BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    writeln!(
        w,
        "{META_PREFIX}{}",
        serde_json::to_string(&meta()).unwrap()
    )
    .unwrap();
    writeln!(w, "seq,sched_ns,one_way_ns,rtt_ns,lost").unwrap();
    let mut g = Gen::new();
    for seq in 0..rows {
        match g.next(seq) {
            (t, Some(ow)) => writeln!(w, "{seq},{t},{ow},{},0", 2 * ow + 3_000),
            (t, None) => writeln!(w, "{seq},{t},,,1"),
        }
        .unwrap();
    }
    w.flush().unwrap();
}

fn opts(csv: &Path, out: &Path, exact: bool) -> PlotOptions {
    PlotOptions {
        metrics: vec![plot::Metric::OneWay],
        metric_required: true,
        kinds: vec![
            FigureKind::Box,
            FigureKind::Cdf,
            FigureKind::Time,
            FigureKind::Percentiles,
        ],
        kinds_given: true,
        exact_limit: if exact {
            usize::MAX
        } else {
            plot::dist::EXACT_LIMIT
        },
        prefix: if exact { "exact" } else { "streaming" }.into(),
        ..PlotOptions::new(vec![csv.to_path_buf()], out.to_path_buf())
    }
}

/// (kB field of /proc/self/status).
fn status_kib(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

const CHILD: &str = "RTPROBE_PLOT_BENCH_CHILD";

/// In the child: one plot, then "seconds peak_kib" on stdout.
fn child(spec: &str) {
    let mut parts = spec.split('\n');
    let (csv, out, exact) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let o = opts(Path::new(csv), Path::new(out), exact == "exact");
    let t = Instant::now();
    black_box(plot::plot(&o).unwrap());
    println!("{} {}", t.elapsed().as_secs_f64(), status_kib("VmHWM:"));
}

/// Wall time and peak RSS of one plot, in a fresh process.
fn report(what: &str, rows: u64, csv: &Path, out: &Path, exact: bool) {
    let spec = format!(
        "{}\n{}\n{}",
        csv.display(),
        out.display(),
        if exact { "exact" } else { "streaming" }
    );
    let o = std::process::Command::new("/proc/self/exe")
        .env(CHILD, spec)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    let mut f = text.split_whitespace();
    let secs: f64 = f.next().unwrap().parse().unwrap();
    let peak_kib: f64 = f.next().unwrap().parse().unwrap();
    let mb = std::fs::metadata(csv).map(|m| m.len()).unwrap_or(0) as f64 / 1e6;
    println!(
        "plot {what:<28} {:>4} M rows ({mb:>6.0} MB CSV): {:>7.2} s, {:>6.0} k rows/s, peak RSS {:>6.1} MiB",
        rows / 1_000_000,
        secs,
        rows as f64 / secs / 1e3,
        peak_kib / 1024.0,
    );
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("figs");
    let csv = dir.path().join("1M.csv");
    write_full_csv(&csv, 1_000_000);

    let mut g = c.benchmark_group("plot_1M_rows");
    // One plot takes about half a second: ten flat samples are plenty.
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8));
    for exact in [false, true] {
        let o = opts(&csv, &out, exact);
        let name = if exact {
            "box_cdf_time_pct_one_way_exact"
        } else {
            "box_cdf_time_pct_one_way_streaming"
        };
        g.bench_function(name, |b| b.iter(|| black_box(plot::plot(&o).unwrap())));
    }
    g.finish();

    let max_rows: u64 = std::env::var("RTPROBE_PLOT_BENCH_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000_000);
    for exact in [false, true] {
        report(
            if exact {
                "exact (every sample)"
            } else {
                "streaming (HDR + columns)"
            },
            1_000_000,
            &csv,
            &out,
            exact,
        );
    }
    std::fs::remove_file(&csv).unwrap();
    let csv = dir.path().join("10M.csv");
    write_full_csv(&csv, 10_000_000);
    for exact in [false, true] {
        report(
            if exact {
                "exact (every sample)"
            } else {
                "streaming (HDR + columns)"
            },
            10_000_000,
            &csv,
            &out,
            exact,
        );
    }
    std::fs::remove_file(&csv).unwrap();
    for rows in [10_000_000u64, 100_000_000] {
        if rows > max_rows {
            println!("plot 100 M rows skipped: RTPROBE_PLOT_BENCH_ROWS={max_rows}");
            continue;
        }
        let csv = dir.path().join(format!("compact-{rows}.csv"));
        write_compact_csv(&csv, rows);
        report("streaming, compact CSV", rows, &csv, &out, false);
        std::fs::remove_file(&csv).unwrap();
    }

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

fn main() {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
