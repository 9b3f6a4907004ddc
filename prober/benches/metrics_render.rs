//! How long `GET /metrics` takes to render for a fleet: 1000 flows
//! (targets), each fed probes so that every series it has holds counts,
//! in both formats and at three series budgets. Issue 20's target is
//! ≤ 200 ms for 1000 targets; the last lines print each figure next to it.
//!
//! cargo bench -p rtprobe --bench metrics_render

use std::{
    hint::black_box,
    sync::Arc,
    time::{Duration, Instant},
};

use criterion::{BenchmarkId, Criterion};
use rtprobe::{
    export::{
        metrics::{FlowLabels, Format, Metrics},
        plan::{MetricsBuckets, MetricsSeries},
    },
    model::record::ProbeRecord,
    stats::Counts,
};

const TARGETS: usize = 1000;
/// Issue 20: `/metrics` for 1000 targets renders in at most this.
const TARGET_RENDER: Duration = Duration::from_millis(200);

/// A probe with every latency a testbed run measures, spread over the
/// buckets by `i`.
fn record(i: u64) -> ProbeRecord {
    let ns = |base: i64| Some(base << (i % 20));
    ProbeRecord {
        seq: i,
        one_way_ns: ns(5_000),
        rtt_ns: ns(10_000),
        stack_ns: ns(1_000),
        sender_queue_ns: ns(500),
        driver_ns: ns(700),
        path_ns: ns(2_000),
        receiver_ns: ns(900),
        reflector_ns: ns(1_500),
        return_ns: ns(3_000),
        ..Default::default()
    }
}

/// A registry with `TARGETS` flows, each having seen 40 probes.
fn fleet(series: MetricsSeries) -> Arc<Metrics> {
    let m = Arc::new(Metrics::with_series(series));
    for t in 0..TARGETS {
        let target = format!("10.{}.{}.2:5061", t / 250, t % 250);
        let mut f = m.flow(FlowLabels::new(target, 0, 0, 64), false);
        for i in 0..40 {
            f.observe(&record(i + t as u64));
        }
        let counts = Counts {
            sent: 1000,
            received: 998,
            lost: 1,
            echo_lost: 1,
            ..Default::default()
        };
        f.update(&counts, "software");
    }
    m
}

fn budgets() -> [(&'static str, MetricsSeries); 4] {
    let full = MetricsSeries::default();
    let rtt_only = MetricsSeries {
        one_way: false,
        stages: false,
        ..full.clone()
    };
    let rtt_24 = MetricsSeries {
        buckets: MetricsBuckets::Count(24),
        ..rtt_only.clone()
    };
    // The keys name the budget's flags; `cargo xtask bench` reads them.
    [
        ("full", full),
        ("fleet", MetricsSeries::for_fleet()),
        ("rtt", rtt_only),
        ("rtt-24", rtt_24),
    ]
}

fn median_render(m: &Metrics, format: Format, runs: usize) -> (Duration, usize, usize) {
    let mut took = Vec::with_capacity(runs);
    let mut text = String::new();
    for _ in 0..runs {
        let t0 = Instant::now();
        text = black_box(m.encode(format));
        took.push(t0.elapsed());
    }
    took.sort();
    let series = text.lines().filter(|l| !l.starts_with('#')).count();
    (took[runs / 2], text.len(), series)
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let fleets: Vec<_> = budgets()
        .into_iter()
        .map(|(name, series)| (name, fleet(series)))
        .collect();
    {
        let mut g = c.benchmark_group(format!("metrics_render_{TARGETS}_targets"));
        for (name, m) in &fleets {
            for format in [Format::Prometheus, Format::OpenMetrics] {
                g.bench_with_input(BenchmarkId::new(format!("{format:?}"), name), m, |b, m| {
                    b.iter(|| black_box(m.encode(format)))
                });
            }
        }
        g.finish();
    }
    c.final_summary();
    println!(
        "/metrics render, {TARGETS} targets (median of 7, this machine; target <= {} ms); \
         full: the default budget with one target (rtt, one-way, 7 stages, 48 buckets), \
         fleet: the default with several targets (rtt, one-way, 48 buckets), rtt: \
         --metrics-histograms rtt, rtt-24: also --metrics-buckets 24",
        TARGET_RENDER.as_millis()
    );
    for (name, m) in &fleets {
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let (took, bytes, series) = median_render(m, format, 7);
            println!(
                "render {name:<6} {format:<11?} {:>7.1} ms  {:>6.1} MB  {:>7} series ({} per target)  {}",
                took.as_secs_f64() * 1e3,
                bytes as f64 / 1e6,
                series,
                series / TARGETS,
                if took <= TARGET_RENDER {
                    "met"
                } else {
                    "NOT MET"
                }
            );
        }
    }
}
