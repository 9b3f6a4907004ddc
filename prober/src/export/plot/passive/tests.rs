use super::*;

/// A row as `rtprobe flows` writes it (stages in ns, None: empty cell).
fn row(t_ms: i64, cookie: u64, comm: &str, stages: [Option<u64>; 4], given_up: bool) -> String {
    let ns = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
    let (local, remote) = if cookie == 1 {
        ("10.0.0.1:40000", "10.0.0.2:5201")
    } else {
        ("[fd00::1]:41000", "[fd00::2]:5201")
    };
    format!(
        "{},{cookie},42,\"{}\",7,{local},{remote},1448,{},{},{},{},{},0\n",
        1_700_000_000_000_000_000 + t_ms * 1_000_000,
        comm.replace('"', "\"\""),
        ns(stages[0]),
        ns(stages[1]),
        ns(stages[2]),
        ns(stages[3]),
        u8::from(given_up)
    )
}

/// Flow 1 ("iperf3, x"): stack 100/200/300, queue 10/20/30, no NIC,
/// round trip 1000/2000/3000 ns; a fourth send given up. Flow 2 ("nginx"):
/// two sends, all four stages.
fn csv_text() -> String {
    let mut t = format!("{SENDS_CSV_HEADER}\n");
    for (i, k) in [1u64, 3, 2].into_iter().enumerate() {
        t += &row(
            i as i64,
            1,
            "iperf3, x",
            [Some(100 * k), Some(10 * k), None, Some(1000 * k)],
            false,
        );
    }
    t += &row(3, 1, "iperf3, x", [Some(150), None, None, None], true);
    for i in 0..2u64 {
        t += &row(
            10 + i as i64,
            2,
            "nginx",
            [Some(500), Some(600 + i), Some(700), Some(800_000)],
            false,
        );
    }
    t
}

fn read_text(text: &str) -> Result<Vec<SampledSend>, ReadError> {
    let mut v = Vec::new();
    read_sends("flows.csv", text.as_bytes(), |s| v.push(s))?;
    Ok(v)
}

#[test]
fn sniffs_the_header_line_only() {
    assert!(sniff(SENDS_CSV_HEADER.as_bytes()));
    assert!(sniff(format!("{SENDS_CSV_HEADER}\r\n1,2").as_bytes()));
    assert!(sniff(format!("{SENDS_CSV_HEADER}\n").as_bytes()));
    assert!(!sniff(format!("{SENDS_CSV_HEADER},extra\n").as_bytes()));
    assert!(!sniff(b"seq,flow,one_way_ns,rtt_ns\n"));
    assert!(!sniff(b"{\"steps\": []}"));
    assert!(!sniff(b""));
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("flows.csv");
    std::fs::write(&p, csv_text()).unwrap();
    assert!(is_flows_csv(&p));
    std::fs::write(&p, "seq,one_way_ns\n1,2\n").unwrap();
    assert!(!is_flows_csv(&p));
    assert!(!is_flows_csv(&dir.path().join("missing.csv")));
}

#[test]
fn reads_quoted_comm_and_empty_stage_cells() {
    let sends = read_text(&csv_text()).unwrap();
    assert_eq!(sends.len(), 6);
    let s = &sends[0];
    assert_eq!(s.comm, "iperf3, x");
    assert_eq!(s.local, "10.0.0.1:40000".parse().unwrap());
    assert_eq!(s.stages(), [Some(100), Some(10), None, Some(1000)]);
    assert_eq!(sends[3].stages(), [Some(150), None, None, None]);
    assert!(sends[3].given_up);
    assert_eq!(sends[4].remote, "[fd00::2]:5201".parse().unwrap());
    // Doubled quotes inside the quoted comm.
    let text = format!(
        "{SENDS_CSV_HEADER}\n{}",
        row(0, 1, "a \"b\", c", [None; 4], true)
    );
    let sends = read_text(&text).unwrap();
    assert_eq!(sends[0].comm, "a \"b\", c");
    assert_eq!(sends[0].stages(), [None; 4]);
}

#[test]
fn a_malformed_row_names_file_line_and_column() {
    let mut text = csv_text();
    text +=
        &row(20, 1, "x", [Some(1), Some(2), None, Some(3)], false).replace(",1448,", ",1448,12us,");
    // 15 cells: the extra one is named by its place.
    let e = read_text(&text).unwrap_err().to_string();
    assert_eq!(e.lines().count(), 1, "{e}");
    assert!(e.starts_with("flows.csv: line 8, column 15:"), "{e}");

    let mut text = csv_text();
    text += &row(20, 1, "x", [Some(1), Some(2), None, Some(3)], true).replace(",1,0\n", ",yes,0\n");
    let e = read_text(&text).unwrap_err().to_string();
    assert!(
        e.starts_with("flows.csv: line 8, column 13 (given_up): \"yes\" is not 0 or 1"),
        "{e}"
    );

    let bad_stage = csv_text().replace(",1000,0,0\n", ",1ms,0,0\n");
    let e = read_text(&bad_stage).unwrap_err().to_string();
    assert!(
        e.starts_with("flows.csv: line 2, column 12 (round_trip_ns): \"1ms\" is not a time in ns"),
        "{e}"
    );
    let bad_addr = csv_text().replace("10.0.0.2:5201", "10.0.0.2");
    let e = read_text(&bad_addr).unwrap_err().to_string();
    assert!(
        e.starts_with("flows.csv: line 2, column 7 (remote):"),
        "{e}"
    );

    let e = read_text(&format!("{SENDS_CSV_HEADER}\n"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("line 2: no sampled send after the header"),
        "{e}"
    );
    let e = read_text("seq,one_way_ns\n1,2\n").unwrap_err().to_string();
    assert!(e.contains("line 1: not an `rtprobe flows` CSV"), "{e}");
    // A line without end is refused at the cap, not held.
    let long = format!("{SENDS_CSV_HEADER}\n{}", "9".repeat(200_000));
    let e = read_text(&long).unwrap_err().to_string();
    assert!(e.contains("longer than"), "{e}");
}

#[test]
fn p50_per_stage_per_flow() {
    let mut d = FlowsData::new();
    for s in read_text(&csv_text()).unwrap() {
        d.record(&s);
    }
    assert_eq!((d.rows, d.given_up), (6, 1));
    assert_eq!(d.stage_ns, Some((10, 800_000)));
    let b = bars(&d.stats.flows());
    assert_eq!(b.len(), 2);
    // The most sampled first; the given-up send counts, its stack too.
    assert_eq!(
        b[0].label,
        "iperf3, x 10.0.0.1:40000 -> 10.0.0.2:5201 (4 sends)"
    );
    assert_eq!(b[0].samples, 4);
    // stack: 100, 150, 200, 300 -> 150; queue 10, 20, 30 -> 20; no NIC.
    assert_eq!(b[0].p50_ns, [Some(150), Some(20), None, Some(2000)]);
    assert_eq!(
        b[1].label,
        "nginx [fd00::1]:41000 -> [fd00::2]:5201 (2 sends)"
    );
    let rt = b[1].p50_ns[3].unwrap();
    // 800 µs: within the histogram's 3 significant digits.
    assert!(rt.abs_diff(800_000) <= 800, "{rt}");
    assert_eq!(b[1].p50_ns[..3], [Some(500), Some(600), Some(700)]);
    assert_eq!(
        breakdown(&b[0]),
        "p50 stack 0.15, sender queue 0.02, round trip 2 µs"
    );
    let none = FlowBar {
        p50_ns: [None; 4],
        ..b[0].clone()
    };
    assert_eq!(breakdown(&none), "no stage reported");
    assert_eq!(shorten("abcdefghij", 20), "abcdefghij");
    assert_eq!(shorten("abcdefghij", 5), "abc…ij");
}

#[test]
fn at_most_the_ten_most_sampled_flows_are_bars() {
    let mut d = FlowsData::new();
    let mut text = format!("{SENDS_CSV_HEADER}\n");
    for cookie in 1..=12u64 {
        for i in 0..cookie {
            text += &row(i as i64, cookie, "c", [Some(1000); 4], false);
        }
    }
    for s in read_text(&text).unwrap() {
        d.record(&s);
    }
    let b = bars(&d.stats.flows());
    assert_eq!(b.len(), TOP_FLOWS);
    assert_eq!(b[0].samples, 12);
    assert_eq!(b[9].samples, 3);
}

fn options(dir: &Path, inputs: Vec<PathBuf>, formats: Vec<ImageFormat>) -> PlotOptions {
    PlotOptions {
        formats,
        ..PlotOptions::new(inputs, dir.join("figs"))
    }
}

#[test]
fn writes_both_figures_as_png_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("flows.csv");
    std::fs::write(&csv, csv_text()).unwrap();
    let opts = options(
        dir.path(),
        vec![csv],
        vec![ImageFormat::Png, ImageFormat::Svg],
    );
    // Through the plot entry point: the header sends it here.
    let written = super::super::plot(&opts).unwrap();
    let names: Vec<String> = written
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "flows-flows-stages.png",
            "flows-flows-stages.svg",
            "flows-flows-time.png",
            "flows-flows-time.svg"
        ]
    );
    for p in &written {
        let bytes = std::fs::read(p).unwrap();
        assert!(bytes.len() > 1000, "{}", p.display());
        if p.extension().unwrap() == "png" {
            assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{}", p.display());
        }
    }
    let svg = std::fs::read_to_string(&written[1]).unwrap();
    for text in [
        "Where each flow",
        "iperf3, x 10.0.0.1:40000 -&gt; 10.0.0.2:5201 (4 sends)",
        "sender queue",
        "round trip",
        "p50 per stage, stacked (µs)",
        "1 send(s) given up",
    ] {
        assert!(svg.contains(text), "{text} missing");
    }
}

#[test]
fn time_points_follow_the_sends() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("flows.csv");
    std::fs::write(&csv, csv_text()).unwrap();
    let opts = options(dir.path(), vec![csv], vec![ImageFormat::Svg]);
    let mut d = FlowsData::new();
    read_inputs(&opts, |s| d.record(&s)).unwrap();
    let f = time_fig(&d, &opts).unwrap();
    assert!((f.x_max_s - 0.011).abs() < 1e-12);
    // Distinct values and times: one point per stage value.
    assert_eq!(f.points.each_ref().map(Vec::len), [6, 5, 2, 5]);
    for p in f.points.iter().flatten() {
        assert!(p.0 >= 0.0 && p.0 <= f.x_max_s);
        assert!(p.1 > f.axis.lo && p.1 < f.axis.hi);
    }
    // The round trip of 800 µs sits near log10(800).
    let top = f.points[3].iter().map(|p| p.1).fold(f64::MIN, f64::max);
    assert!((top - 800f64.log10()).abs() < 0.02, "{top}");
    let svg = to_svg_string(&Fig::Time(f), (1000, 600)).unwrap();
    assert!(svg.contains("Seconds since the first sample"));
    assert!(svg.contains("Stage time (µs, log scale)"));
}

#[test]
fn flows_csvs_and_probe_csvs_are_plotted_apart() {
    let dir = tempfile::tempdir().unwrap();
    let flows = dir.path().join("flows.csv");
    std::fs::write(&flows, csv_text()).unwrap();
    let probe = dir.path().join("probe.csv");
    std::fs::write(&probe, "seq,one_way_ns\n1,2000\n").unwrap();
    let opts = options(dir.path(), vec![flows, probe], vec![ImageFormat::Svg]);
    let e = format!("{:#}", super::super::plot(&opts).unwrap_err());
    assert_eq!(e.lines().count(), 1);
    assert!(e.contains("plot them apart"), "{e}");

    // Every send given up: nothing to draw, said.
    let all_given_up = format!("{SENDS_CSV_HEADER}\n{}", row(0, 1, "x", [None; 4], true));
    let p = dir.path().join("given-up.csv");
    std::fs::write(&p, all_given_up).unwrap();
    let e = format!(
        "{:#}",
        plot(&options(dir.path(), vec![p], vec![ImageFormat::Svg])).unwrap_err()
    );
    assert!(e.contains("nothing to plot"), "{e}");
}
