//! Golden tests for `rtprobe plot`: small synthetic CSVs written with the
//! probe's own `CsvWriter`, figures drawn through the library, and the SVG
//! checked for the elements a reader relies on (one box per group and run,
//! every outlier, legend entries, axis labels, titles), not for bytes.

use std::path::{Path, PathBuf};

use rtprobe::{
    cli::{MetricChoice, PlotArgs},
    export::{
        csv::CsvWriter,
        plot::{self, FigureKind, ImageFormat, draw},
    },
    model::{
        meta::RunMeta,
        record::{ProbeRecord, TsSource},
    },
};

/// Outliers every run gets, as multiples of its base RTT: far enough apart
/// to land on distinct pixel rows.
const OUTLIER_FACTORS: [i64; 3] = [3, 4, 5];
/// Lost probes per run.
const LOST: [u64; 2] = [50, 51];

fn write_run(path: &Path, mode: &str, size: u32, interval_ns: u64, base_ns: i64, n: u64) {
    let meta = RunMeta {
        version: "test".into(),
        xdp_mode_requested: mode.into(),
        xdp_mode_attached: mode.into(),
        xdp_action: "redirect".into(),
        size,
        interval_ns,
        testbed: "veth".into(),
        timestamps_requested: "auto".into(),
        ..Default::default()
    };
    let mut w = CsvWriter::create(path, &meta).unwrap();
    for seq in 0..n {
        let sched = 1_700_000_000_000_000_000 + (seq * interval_ns) as i64;
        let lost = LOST.contains(&seq);
        // A tight body (base .. base + 600 ns) and three far outliers.
        let mut rtt = base_ns + (seq % 7) as i64 * 100;
        if let Some(k) = [10, 20, 30].iter().position(|&s| s == seq) {
            rtt = base_ns * OUTLIER_FACTORS[k];
        }
        let tx = sched + 1_000;
        w.write(&ProbeRecord {
            seq,
            flow: 0,
            size,
            sched_ns: sched,
            send_ns: sched + 500,
            tx_ns: Some(tx),
            rx_ns: (!lost).then_some(tx + rtt / 2),
            echo_ns: (!lost).then_some(tx + rtt),
            one_way_ns: (!lost).then_some(rtt / 2),
            rtt_ns: (!lost).then_some(rtt),
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

fn args(csv: Vec<PathBuf>, out_dir: &Path) -> PlotArgs {
    PlotArgs {
        csv,
        out_dir: Some(out_dir.to_path_buf()),
        prefix: None,
        metric: None,
        kind: vec![FigureKind::Box, FigureKind::Cdf, FigureKind::Time],
        label: Vec::new(),
        group_by: None,
        split_by: None,
        log: false,
        linear: false,
        y_min: None,
        y_max: None,
        format: vec![ImageFormat::Svg],
        figure_size: (1000, 600),
        title: None,
        ignore_truncated: false,
    }
}

fn names(paths: &[PathBuf]) -> Vec<String> {
    paths
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect()
}

/// Rects drawn as box bodies in colour `i` (the box fill opacity is unique
/// to boxes).
fn boxes(svg: &str, color: usize) -> usize {
    let needle = format!(
        "opacity=\"{}\" fill=\"{}\"",
        draw::BOX_FILL_OPACITY,
        draw::color_hex(color)
    );
    svg.lines()
        .filter(|l| l.starts_with("<rect") && l.contains(&needle))
        .count()
}

fn circles(svg: &str, color: usize) -> usize {
    let needle = format!("stroke=\"{}\"", draw::color_hex(color));
    svg.lines()
        .filter(|l| l.starts_with("<circle") && l.contains(&needle))
        .count()
}

/// The text of every `<text>` element (plotters puts it on its own line).
fn texts(svg: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = svg.lines();
    while let Some(l) = lines.next() {
        if l.starts_with("<text") {
            out.push(lines.next().unwrap_or("").trim().to_string());
        }
    }
    out
}

fn has_text(svg: &str, want: &str) -> bool {
    texts(svg).iter().any(|t| t == want)
}

#[test]
fn two_runs_overlay_box_cdf_time_per_metric() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("baseline.csv");
    let xdp = dir.path().join("xdp.csv");
    write_run(&base, "off", 64, 1_000_000, 100_000, 400);
    write_run(&xdp, "native", 64, 1_000_000, 60_000, 400);
    let opts = (args(vec![base, xdp], dir.path()).options()).unwrap();
    let written = plot::plot(&opts).unwrap();
    assert_eq!(
        names(&written),
        [
            "baseline-vs-xdp-one-way-box.svg",
            "baseline-vs-xdp-one-way-cdf.svg",
            "baseline-vs-xdp-one-way-time.svg",
            "baseline-vs-xdp-rtt-box.svg",
            "baseline-vs-xdp-rtt-cdf.svg",
            "baseline-vs-xdp-rtt-time.svg",
        ]
    );
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();

    let svg = read("baseline-vs-xdp-rtt-box.svg");
    let title = "Round-trip time — 64 B probes every 1 ms, sw timestamps, 400 probes each";
    assert!(has_text(&svg, title), "{:?}", texts(&svg));
    // First run red, second blue: one box each, and all three outliers each.
    assert_eq!((boxes(&svg, 0), boxes(&svg, 1)), (1, 1));
    assert_eq!((circles(&svg, 0), circles(&svg, 1)), (3, 3));
    // Labels from the metadata: the XDP mode is what differs.
    for t in ["XDP off", "XDP native", "Run", "Round-trip time (µs)"] {
        assert!(has_text(&svg, t), "{t:?} missing from {:?}", texts(&svg));
    }
    // Axis ticks in µs: the RTTs run from 60 to 500 µs.
    assert!(
        has_text(&svg, "100") && has_text(&svg, "500"),
        "{:?}",
        texts(&svg)
    );

    let svg = read("baseline-vs-xdp-one-way-cdf.svg");
    assert!(has_text(&svg, "One-way latency (µs)"));
    assert!(has_text(&svg, "Fraction of probes at or below"));
    assert!(has_text(&svg, "XDP off") && has_text(&svg, "XDP native"));
    let curves = svg.lines().filter(|l| l.starts_with("<polyline")).count();
    assert!(curves >= 2, "one staircase per run");

    let svg = read("baseline-vs-xdp-rtt-time.svg");
    assert!(has_text(&svg, "Time since the first probe (s)"));
    assert!(has_text(&svg, "XDP off, 2 lost") && has_text(&svg, "XDP native, 2 lost"));
    assert!(has_text(&svg, "lost probe"));
}

#[test]
fn grouped_like_the_study_one_figure_per_size_intervals_side_by_side() {
    let dir = tempfile::tempdir().unwrap();
    let mut csvs = Vec::new();
    for (mode, base) in [("off", 100_000), ("native", 60_000)] {
        for size in [64, 1472] {
            for interval in [100_000, 1_000_000, 10_000_000] {
                let p = dir.path().join(format!("{mode}-{size}-{interval}.csv"));
                write_run(&p, mode, size, interval, base + size as i64 * 10, 200);
                csvs.push(p);
            }
        }
    }
    let mut a = args(csvs, dir.path());
    // No --split-by: grouping by interval splits by size on its own.
    a.group_by = Some("interval".into());
    a.metric = Some(MetricChoice::Rtt);
    a.kind = vec![FigureKind::Box, FigureKind::Cdf];
    a.log = true;
    let written = plot::plot(&a.options().unwrap()).unwrap();
    assert_eq!(
        names(&written),
        [
            "compare-rtt-64B-box.svg",
            "compare-rtt-64B-100us-cdf.svg",
            "compare-rtt-64B-1ms-cdf.svg",
            "compare-rtt-64B-10ms-cdf.svg",
            "compare-rtt-1472B-box.svg",
            "compare-rtt-1472B-100us-cdf.svg",
            "compare-rtt-1472B-1ms-cdf.svg",
            "compare-rtt-1472B-10ms-cdf.svg",
        ]
    );
    for size in ["64", "1472"] {
        let svg = std::fs::read_to_string(dir.path().join(format!("compare-rtt-{size}B-box.svg")))
            .unwrap();
        // One box per interval and run: three red (XDP off), three blue.
        assert_eq!((boxes(&svg, 0), boxes(&svg, 1)), (3, 3), "{size} B");
        assert_eq!((circles(&svg, 0), circles(&svg, 1)), (9, 9), "{size} B");
        for t in [
            "100 µs",
            "1 ms",
            "10 ms",
            "Probe interval",
            "XDP off",
            "XDP native",
        ] {
            assert!(has_text(&svg, t), "{t:?} missing from {:?}", texts(&svg));
        }
        let title = format!("Round-trip time — {size} B probes, sw timestamps, 200 probes each");
        assert!(has_text(&svg, &title), "{:?}", texts(&svg));
        // Log axis: 1-2-5 ticks.
        assert!(
            has_text(&svg, "100") && has_text(&svg, "200"),
            "{:?}",
            texts(&svg)
        );
    }
    let svg = std::fs::read_to_string(dir.path().join("compare-rtt-64B-1ms-cdf.svg")).unwrap();
    let title = "Round-trip time — 64 B probes every 1 ms, sw timestamps, 200 probes each";
    assert!(has_text(&svg, title), "{:?}", texts(&svg));

    // --split-by none: every run on one axis, the labels name mode and size.
    let out = dir.path().join("together");
    a.split_by = Some("none".into());
    a.kind = vec![FigureKind::Box];
    a.out_dir = Some(out.clone());
    let written = plot::plot(&a.options().unwrap()).unwrap();
    assert_eq!(names(&written), ["compare-rtt-box.svg"]);
    let svg = std::fs::read_to_string(&written[0]).unwrap();
    for (color, label) in [
        "XDP off, 64 B",
        "XDP off, 1472 B",
        "XDP native, 64 B",
        "XDP native, 1472 B",
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(boxes(&svg, color), 3, "{label}");
        assert!(
            has_text(&svg, label),
            "{label:?} missing from {:?}",
            texts(&svg)
        );
    }
}

#[test]
fn user_labels_title_and_png() {
    let dir = tempfile::tempdir().unwrap();
    let a_csv = dir.path().join("a.csv");
    write_run(&a_csv, "skb", 200, 100_000, 80_000, 300);
    let mut a = args(vec![a_csv], dir.path());
    a.label = vec!["generic <XDP> & co".into()];
    a.metric = Some(MetricChoice::OneWay);
    a.kind = vec![FigureKind::Box];
    a.format = vec![ImageFormat::Svg, ImageFormat::Png];
    a.title = Some("lab run 3".into());
    let written = plot::plot(&a.options().unwrap()).unwrap();
    assert_eq!(names(&written), ["a-one-way-box.svg", "a-one-way-box.png"]);
    let svg = std::fs::read_to_string(&written[0]).unwrap();
    assert!(has_text(&svg, "One-way latency — lab run 3"));
    // Escaped, so the SVG stays well-formed.
    assert!(
        has_text(&svg, "generic &lt;XDP&gt; &amp; co"),
        "{:?}",
        texts(&svg)
    );
    let png = std::fs::read(&written[1]).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    // Text rasterised: a plain white 1000x600 PNG compresses to ~2 KB.
    assert!(png.len() > 10_000, "{} bytes", png.len());
}

#[test]
fn lone_run_title_counts_probes_and_losses() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("out.csv");
    write_run(&csv, "native", 64, 1_000_000, 50_000, 100);
    let mut a = args(vec![csv], dir.path());
    a.kind = vec![FigureKind::Time];
    a.metric = Some(MetricChoice::OneWay);
    let written = plot::plot(&a.options().unwrap()).unwrap();
    let svg = std::fs::read_to_string(&written[0]).unwrap();
    let title =
        "One-way latency — 64 B probes every 1 ms, XDP native, sw timestamps, 100 probes (2 lost)";
    assert!(has_text(&svg, title), "{:?}", texts(&svg));
    // Lone run: the legend describes it in full.
    assert!(
        has_text(&svg, "XDP native, 64 B, 1 ms, 2 lost"),
        "{:?}",
        texts(&svg)
    );
}

/// Values a CSV can hold but a sane run never writes (clock steps, i64
/// extremes, negative one-way latency from unsynchronised clocks) must give
/// figures or a one-line error, never a panic, on linear and log axes.
#[test]
fn extreme_values_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let sets: [&[i64]; 5] = [
        &[i64::MIN, -5, 0, i64::MAX],
        &[0, 0, 0],
        &[-3, -2, -1],
        &[7],
        &[1, i64::MAX, i64::MAX, 2],
    ];
    for (k, values) in sets.iter().enumerate() {
        let csv = dir.path().join(format!("x{k}.csv"));
        let mut text = String::from("seq,sched_ns,one_way_ns,lost\n");
        for (i, v) in values.iter().enumerate() {
            // Clock steps in the time column too.
            let t = if i % 2 == 0 {
                i64::MAX - i as i64
            } else {
                i64::MIN + i as i64
            };
            text.push_str(&format!("{i},{t},{v},0\n"));
        }
        text.push_str(&format!("{},0,,1\n", values.len()));
        std::fs::write(&csv, text).unwrap();
        for log in [false, true] {
            let mut a = args(vec![csv.clone()], dir.path());
            a.log = log;
            a.format = vec![ImageFormat::Svg, ImageFormat::Png];
            // Small: PNG encoding is slow in debug builds, and the size does
            // not matter for what is tested.
            a.figure_size = (320, 200);
            match a.options().and_then(|o| plot::plot(&o)) {
                Ok(files) => assert!(!files.is_empty()),
                Err(e) => {
                    let msg = format!("{e:#}");
                    assert!(!msg.contains('\n'), "{msg}");
                    // Only a log axis over no positive sample may refuse.
                    assert!(log && msg.contains("positive"), "set {k}: {msg}");
                }
            }
        }
    }
}

/// Group keys come from metadata text; they must not escape --out-dir.
#[test]
fn metadata_text_stays_inside_out_dir() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("m.csv");
    write_run(&csv, "../../evil mode", 64, 1_000_000, 50_000, 50);
    let mut a = args(vec![csv], dir.path());
    a.group_by = Some("mode".into());
    a.kind = vec![FigureKind::Cdf];
    a.metric = Some(MetricChoice::Rtt);
    let written = plot::plot(&a.options().unwrap()).unwrap();
    assert_eq!(names(&written), ["m-rtt-.._.._evil_mode-cdf.svg"]);
    assert_eq!(written[0].parent(), Some(dir.path()));
}

/// A run with the whole software stamp chain (no hardware stamps, so no
/// driver stage): a ~5 µs path, `queue_ns` in the sender's qdisc, one
/// 1.5 ms path outlier, derived as the probe derives it.
fn write_chain_run(path: &Path, label: &str, queue_ns: i64, n: u64) {
    let meta = RunMeta {
        version: "test".into(),
        label: Some(label.into()),
        size: 64,
        interval_ns: 1_000_000,
        ..Default::default()
    };
    let mut w = CsvWriter::create(path, &meta).unwrap();
    for seq in 0..n {
        let j = (seq % 11) as i64;
        let send = 1_700_000_000_000_000_000 + (seq * 1_000_000) as i64;
        let sched = send + 1_500 + j * 20;
        let tx = sched + queue_ns + j * 30;
        let path_ns = if seq == 77 { 1_500_000 } else { 5_000 + j * 40 };
        let rx = tx + path_ns;
        let user = rx + 7_000 + j * 50;
        let echo_tx = user + 3_000;
        let mut r = ProbeRecord {
            seq,
            size: 64,
            sched_ns: send,
            send_ns: send,
            tx_sched_ns: Some(sched),
            tx_ns: Some(tx),
            rx_ns: Some(rx),
            rx_user_ns: Some(user),
            echo_tx_ns: Some(echo_tx),
            echo_ns: Some(echo_tx + 5_000 + j * 10),
            ..Default::default()
        };
        rtprobe::stats::chain::derive(&mut r);
        w.write(&r).unwrap();
    }
    w.flush().unwrap();
}

/// Tick labels of the latency axis of a figure (numbers only).
fn numbers(svg: &str) -> Vec<f64> {
    texts(svg).iter().filter_map(|t| t.parse().ok()).collect()
}

#[test]
fn stages_one_box_per_stage_and_run_on_a_log_axis() {
    let dir = tempfile::tempdir().unwrap();
    let fast = dir.path().join("fast.csv");
    let queued = dir.path().join("queued.csv");
    write_chain_run(&fast, "fq_codel", 1_000, 300);
    write_chain_run(&queued, "pfifo", 10_000_000, 300);
    let mut a = args(vec![fast, queued], dir.path());
    a.kind = vec![FigureKind::Stages];
    let written = plot::plot(&a.options().unwrap()).unwrap();
    assert_eq!(names(&written), ["fast-vs-queued-stages.svg"]);
    let svg = std::fs::read_to_string(&written[0]).unwrap();
    // Stack, sender queue, path, receiver, reflector, return: one box per
    // stage and run; no driver stage without hardware stamps.
    assert_eq!((boxes(&svg, 0), boxes(&svg, 1)), (6, 6));
    for t in [
        "stack",
        "sender queue",
        "path",
        "receiver",
        "reflector",
        "return path",
        "fq_codel",
        "pfifo",
        "Stage of the timestamp chain",
        "Time in stage (ms)",
    ] {
        assert!(has_text(&svg, t), "{t:?} missing from {:?}", texts(&svg));
    }
    assert!(!has_text(&svg, "driver/ring"));
    assert!(
        texts(&svg)
            .iter()
            .any(|t| t.starts_with("Time per stage — 64 B probes every 1 ms")),
        "{:?}",
        texts(&svg)
    );
    // 10 ms of queue next to µs stages: a log axis, decades as ticks.
    let ticks = numbers(&svg);
    for t in [0.001, 0.01, 0.1, 1.0, 10.0] {
        assert!(ticks.contains(&t), "{t} not among {ticks:?}");
    }

    // --metric one-way: only the stages inside the one-way delay.
    a.metric = Some(MetricChoice::OneWay);
    a.prefix = Some("ow".into());
    let written = plot::plot(&a.options().unwrap()).unwrap();
    let svg = std::fs::read_to_string(&written[0]).unwrap();
    assert_eq!((boxes(&svg, 0), boxes(&svg, 1)), (3, 3));
    assert!(!has_text(&svg, "receiver"));

    // --linear forces it, and the axis does not go below zero.
    a.linear = true;
    a.prefix = Some("lin".into());
    let written = plot::plot(&a.options().unwrap()).unwrap();
    let svg = std::fs::read_to_string(&written[0]).unwrap();
    let ticks = numbers(&svg);
    assert!(
        ticks.contains(&0.0) && ticks.iter().all(|t| *t >= 0.0),
        "{ticks:?}"
    );
}

#[test]
fn percentiles_default_kinds_and_tail_axes() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("tail.csv");
    write_chain_run(&csv, "XDP native", 1_000, 2_000);
    let mut a = args(vec![csv], dir.path());
    a.kind = Vec::new();
    a.metric = Some(MetricChoice::OneWay);
    let written = plot::plot(&a.options().unwrap()).unwrap();
    assert_eq!(
        names(&written),
        [
            "tail-one-way-box.svg",
            "tail-one-way-cdf.svg",
            "tail-one-way-time.svg",
            "tail-one-way-percentiles.svg",
            "tail-stages.svg",
        ]
    );
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    let svg = read("tail-one-way-percentiles.svg");
    // 2000 samples resolve 99.9 % but not 99.99 %.
    for t in ["0 %", "50 %", "90 %", "99 %", "99.9 %", "XDP native"] {
        assert!(has_text(&svg, t), "{t:?} missing from {:?}", texts(&svg));
    }
    assert!(!has_text(&svg, "99.99 %"));
    assert!(has_text(&svg, "One-way latency (µs)"));
    let curves = svg.lines().filter(|l| l.starts_with("<polyline")).count();
    assert!(curves >= 1);
    // A ~7.5 µs body under a 1.5 ms outlier: box, CDF, time series and
    // percentiles default to a log axis (1-2-5 ticks, 1000 among them).
    for kind in ["box", "cdf", "time", "percentiles"] {
        let svg = read(&format!("tail-one-way-{kind}.svg"));
        let ticks = numbers(&svg);
        assert!(
            ticks.contains(&10.0) && ticks.contains(&1000.0) && ticks.contains(&20.0),
            "{kind}: {ticks:?}"
        );
    }
    // --linear: the CDF's axis starts at 0, not below.
    a.linear = true;
    a.kind = vec![FigureKind::Cdf];
    a.prefix = Some("lin".into());
    let written = plot::plot(&a.options().unwrap()).unwrap();
    let ticks = numbers(&std::fs::read_to_string(&written[0]).unwrap());
    assert!(
        ticks.contains(&0.0) && ticks.iter().all(|t| *t >= 0.0),
        "{ticks:?}"
    );
}

/// A CSV from before the stamp chain next to a new one: the stages figure
/// shows the new run and names the old one in a note.
#[test]
fn stages_name_the_run_without_stage_columns() {
    let dir = tempfile::tempdir().unwrap();
    let new = dir.path().join("new.csv");
    write_chain_run(&new, "new", 1_000, 200);
    let old = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/before-chain.csv");
    let mut a = args(vec![new, old], dir.path());
    a.kind = vec![FigureKind::Stages];
    a.label = vec!["after".into(), "before".into()];
    a.prefix = Some("mixed".into());
    let written = plot::plot(&a.options().unwrap()).unwrap();
    assert_eq!(names(&written), ["mixed-stages.svg"]);
    let svg = std::fs::read_to_string(&written[0]).unwrap();
    assert_eq!((boxes(&svg, 0), boxes(&svg, 1)), (6, 0));
    assert!(
        has_text(
            &svg,
            "not shown, no stage columns (CSV from before the stamp chain): before"
        ),
        "{:?}",
        texts(&svg)
    );
}

/// A small HdrHistogram interval log committed to the repository, written
/// by the hdrhistogram crate's `IntervalLogWriter` (V2-deflate, as
/// HdrHistogram's `HistogramLogWriter` writes); regenerate with
/// `RTPROBE_WRITE_FIXTURES=1 cargo test -p rtprobe --test plot_golden hdr_log_fixture_is`.
const HDR_FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/interval.hlog");

/// Ten one-second intervals tagged one-way and rtt: 200 samples each
/// from 40 to 60 µs, and one 3 ms outlier in interval 6.
fn write_hdr_log(path: &Path) {
    use hdrhistogram::{
        Histogram,
        serialization::{V2DeflateSerializer, interval_log},
    };
    use std::time::{Duration, SystemTime};
    let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_763_771_234);
    let mut out = Vec::new();
    let mut ser = V2DeflateSerializer::new();
    let mut w = interval_log::IntervalLogWriterBuilder::new()
        .add_comment("rtprobe test fixture: 10 x 1 s, one-way and rtt in ns")
        .with_start_time(base)
        .with_base_time(base)
        .begin_log_with(&mut out, &mut ser)
        .unwrap();
    for i in 0..10u64 {
        for (tag, scale) in [("one-way", 1), ("rtt", 2)] {
            let mut h = Histogram::<u64>::new(3).unwrap();
            for k in 0..200u64 {
                h.record((40_000 + (k * 101 + i * 7) % 20_000) * scale)
                    .unwrap();
            }
            if i == 6 {
                h.record(3_000_000 * scale).unwrap();
            }
            w.write_histogram(
                &h,
                Duration::from_secs(i),
                Duration::from_secs(1),
                interval_log::Tag::new(tag),
            )
            .unwrap();
        }
    }
    drop(w);
    std::fs::write(path, out).unwrap();
}

#[test]
fn hdr_log_fixture_draws_every_kind_by_content_not_name() {
    let dir = tempfile::tempdir().unwrap();
    // The same log under a .csv name: the content decides.
    let log = dir.path().join("hdr.csv");
    std::fs::copy(HDR_FIXTURE, &log).unwrap();
    let mut a = args(vec![log], dir.path());
    a.kind = vec![
        FigureKind::Box,
        FigureKind::Cdf,
        FigureKind::Time,
        FigureKind::Percentiles,
    ];
    a.metric = Some(MetricChoice::OneWay);
    let written = plot::plot(&a.options().unwrap()).unwrap();
    assert_eq!(
        names(&written),
        [
            "hdr-one-way-box.svg",
            "hdr-one-way-cdf.svg",
            "hdr-one-way-time.svg",
            "hdr-one-way-percentiles.svg",
        ]
    );
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    let svg = read("hdr-one-way-box.svg");
    let title = "One-way latency — 2,001 samples (HdrHistogram log)";
    assert!(has_text(&svg, title), "{:?}", texts(&svg));
    // One box, the 3 ms sample its one outlier, on a log axis (3 ms over
    // a 50 µs median): 1-2-5 ticks from 50 µs to 5 ms.
    assert_eq!((boxes(&svg, 0), circles(&svg, 0)), (1, 1));
    let ticks = numbers(&svg);
    for t in [50.0, 100.0, 200.0, 500.0, 1000.0, 5000.0] {
        assert!(ticks.contains(&t), "{t} not among {ticks:?}");
    }
    let svg = read("hdr-one-way-percentiles.svg");
    for t in ["50 %", "90 %", "99 %", "99.9 %"] {
        assert!(has_text(&svg, t), "{t:?} missing from {:?}", texts(&svg));
    }
    // Ten intervals: the band of min..max per interval and its median.
    let svg = read("hdr-one-way-time.svg");
    assert!(
        has_text(&svg, "median per column, band min–max"),
        "{:?}",
        texts(&svg)
    );
    assert!(!has_text(&svg, "lost probe"), "an HDR log knows no losses");
    assert!(has_text(
        &svg,
        "Time since the middle of the first interval (s)"
    ));
    assert_eq!(svg.lines().filter(|l| l.starts_with("<polygon")).count(), 1);
}

/// Also the fixture's writer, but only when asked with
/// `RTPROBE_WRITE_FIXTURES=1`: no test run (root runs with `--ignored`
/// included) rewrites a committed file.
#[test]
fn hdr_log_fixture_is_what_the_crate_writes() {
    if std::env::var("RTPROBE_WRITE_FIXTURES").is_ok_and(|v| v == "1") {
        write_hdr_log(Path::new(HDR_FIXTURE));
        eprintln!("RTPROBE_WRITE_FIXTURES=1: wrote {HDR_FIXTURE}");
    }
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("fresh.hlog");
    write_hdr_log(&fresh);
    let opts = rtprobe::export::plot::run_data::ReadOptions::default();
    let a = rtprobe::export::plot::read::read_input_file(Path::new(HDR_FIXTURE), &opts).unwrap();
    let b = rtprobe::export::plot::read::read_input_file(&fresh, &opts).unwrap();
    for run in [&a, &b] {
        let f = &run.flows[0];
        assert_eq!(f.one_way.as_ref().unwrap().dist.n(), 2001);
        assert_eq!(f.rtt.as_ref().unwrap().dist.n(), 2001);
        assert_eq!(f.one_way.as_ref().unwrap().time.finish().len(), 10);
    }
    let q = |r: &rtprobe::export::plot::run_data::CsvRun| {
        r.flows[0]
            .one_way
            .as_ref()
            .unwrap()
            .dist
            .clone()
            .finish()
            .quantile(0.99)
    };
    assert_eq!(q(&a), q(&b));
}

#[test]
fn time_series_marks_the_load_coming_on() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("loaded.csv");
    write_run(&csv, "off", 64, 1_000_000, 100_000, 300);
    // The metadata a run with --load writes: the load started 1 s before
    // the first probe (its warm-up).
    let text = std::fs::read_to_string(&csv).unwrap();
    let first_sched = 1_700_000_000_000_000_000i64;
    let load = serde_json::json!({"load": {"specs": ["tcp:100%,cc=bbr"], "warmup": "1s",
        "started_ns": first_sched - 1_000_000_000, "measured_from_ns": first_sched - 1_000}});
    let text = text.replacen("\"knobs\":{}", &format!("\"knobs\":{load}"), 1);
    assert!(text.contains("started_ns"), "metadata line changed shape");
    std::fs::write(&csv, text).unwrap();
    let mut a = args(vec![csv], dir.path());
    a.kind = vec![FigureKind::Time];
    a.metric = Some(MetricChoice::Rtt);
    let written = plot::plot(&a.options().unwrap()).unwrap();
    let svg = std::fs::read_to_string(&written[0]).unwrap();
    assert!(
        has_text(&svg, "load on: tcp:100%,cc=bbr"),
        "{:?}",
        texts(&svg)
    );
    // The axis reaches back to the load's start, 1 s before the first probe.
    assert!(numbers(&svg).iter().any(|&t| t < 0.0), "{:?}", texts(&svg));
}

#[test]
fn nothing_attached_reads_as_xdp_off() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("base.csv");
    // What a --xdp-mode off run records: no program attached.
    write_run(&csv, "none", 64, 1_000_000, 100_000, 100);
    let mut a = args(vec![csv], dir.path());
    a.kind = vec![FigureKind::Box];
    a.metric = Some(MetricChoice::Rtt);
    let written = plot::plot(&a.options().unwrap()).unwrap();
    let svg = std::fs::read_to_string(&written[0]).unwrap();
    let t = texts(&svg);
    assert!(t.iter().any(|t| t.contains("XDP off")), "{t:?}");
    assert!(!t.iter().any(|t| t.contains("XDP none")), "{t:?}");
}
