//! End-to-end tests of `rtprobe plot` through the built binary: exit codes,
//! the files it writes, and the one-line error for each mistake a user can
//! make. No root needed.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use rtprobe::{
    export::csv::CsvWriter,
    model::{
        meta::RunMeta,
        record::{ProbeRecord, TsSource},
    },
};

fn rtprobe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rtprobe"))
        .args(args)
        // Warnings are part of what a user sees; keep the default level.
        .env_remove("RUST_LOG")
        .output()
        .expect("run rtprobe")
}

fn good_csv(path: &Path) {
    let meta = RunMeta {
        xdp_mode_attached: "native".into(),
        size: 64,
        interval_ns: 1_000_000,
        ..Default::default()
    };
    let mut w = CsvWriter::create(path, &meta).unwrap();
    for seq in 0..200u64 {
        let t = 1_000_000_000 + seq as i64 * 1_000_000;
        let ow = 20_000 + (seq % 13) as i64 * 150;
        w.write(&ProbeRecord {
            seq,
            size: 64,
            sched_ns: t,
            send_ns: t + 100,
            tx_ns: Some(t + 200),
            rx_ns: Some(t + 200 + ow),
            echo_ns: Some(t + 200 + 2 * ow),
            one_way_ns: Some(ow),
            rtt_ns: Some(2 * ow),
            ts_source: Some(TsSource::Software),
            ..Default::default()
        })
        .unwrap();
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Asserts a failed run with exactly one line on stderr, returned.
fn one_line_error(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr {stderr:?}"
    );
    assert_eq!(out.status.code(), Some(1), "stderr {stderr:?}");
    assert_eq!(stderr.lines().count(), 1, "not one line: {stderr:?}");
    assert!(stderr.starts_with("Error: "), "{stderr:?}");
    stderr.trim_end().to_string()
}

#[test]
fn plots_a_good_csv_and_lists_the_figures() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("out.csv");
    good_csv(&csv);
    let out = rtprobe(&["plot", s(&csv)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let listed: Vec<PathBuf> = stdout.lines().map(PathBuf::from).collect();
    let want: Vec<PathBuf> = [
        "one-way-box",
        "one-way-cdf",
        "one-way-time",
        "one-way-percentiles",
        "rtt-box",
        "rtt-cdf",
        "rtt-time",
        "rtt-percentiles",
    ]
    .iter()
    .map(|k| dir.path().join(format!("out-{k}.svg")))
    .collect();
    assert_eq!(listed, want);
    for p in &want {
        let svg = std::fs::read_to_string(p).unwrap();
        assert!(svg.starts_with("<svg"), "{}", p.display());
    }
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn out_dir_png_and_options() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("run.csv");
    good_csv(&csv);
    let figs = dir.path().join("figs/nested");
    let out = rtprobe(&[
        "plot",
        s(&csv),
        "--out-dir",
        s(&figs),
        "--metric",
        "rtt",
        "--kind",
        "box,cdf",
        "--format",
        "png",
        "--log",
        "--y-max",
        "1ms",
        "--label",
        "native",
        "--figure-size",
        "800x500",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for k in ["rtt-box", "rtt-cdf"] {
        let png = std::fs::read(figs.join(format!("run-{k}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG"));
    }
}

/// A CSV written before rtprobe recorded the stamp chain: the first sixteen
/// columns only.
fn before_chain_csv() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/before-chain.csv")
}

#[test]
fn csv_from_before_the_stamp_chain_plots_without_stages() {
    let dir = tempfile::tempdir().unwrap();
    let old = before_chain_csv();
    let out_dir = s(dir.path());
    // Default kinds: no stages figure, no complaint.
    let out = rtprobe(&["plot", s(&old), "--out-dir", out_dir, "--metric", "rtt"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = String::from_utf8_lossy(&out.stdout);
    let kinds: Vec<&str> = listed
        .lines()
        .map(|l| l.rsplit('-').next().unwrap())
        .collect();
    assert_eq!(kinds, ["box.svg", "cdf.svg", "time.svg", "percentiles.svg"]);

    // Asked for stages and more: one warning line, the rest drawn.
    let out = rtprobe(&[
        "plot",
        s(&old),
        "--out-dir",
        out_dir,
        "--kind",
        "stages,box",
        "--prefix",
        "x",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("before-chain.csv has no stage columns (written before rtprobe recorded the stamp chain)"),
        "{stderr}"
    );
    assert!(dir.path().join("x-rtt-box.svg").exists());
    assert!(!dir.path().join("x-stages.svg").exists());

    // Only stages: nothing to draw, said in one line.
    let err = one_line_error(&rtprobe(&[
        "plot",
        s(&old),
        "--out-dir",
        out_dir,
        "--kind",
        "stages",
    ]));
    assert!(
        err.ends_with("before-chain.csv has no stage columns (written before rtprobe recorded the stamp chain): the other kinds (box, cdf, time, percentiles) still work"),
        "{err}"
    );
}

#[test]
fn log_and_linear_conflict() {
    let out = rtprobe(&["plot", s(&before_chain_csv()), "--log", "--linear"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--linear"));
}

#[test]
fn malformed_csv_is_one_line_naming_file_line_column() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("bad.csv");
    std::fs::write(&csv, "seq,one_way_ns,rtt_ns\n0,100,200\n1,fast,300\n").unwrap();
    let err = one_line_error(&rtprobe(&["plot", s(&csv)]));
    assert_eq!(
        err,
        format!(
            "Error: {}: line 3, column 2 (one_way_ns): expected a latency in nanoseconds, found \"fast\"",
            csv.display()
        )
    );
    // Nothing half-written.
    assert!(!dir.path().join("bad-one-way-box.svg").exists());
}

#[test]
fn wrong_files_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("figure.png");
    std::fs::write(&png, b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x10").unwrap();
    let err = one_line_error(&rtprobe(&["plot", s(&png)]));
    assert!(err.ends_with("figure.png: line 1: this is a PNG image, not an rtprobe CSV: pass the per-probe CSV written with --out"), "{err}");

    let empty = dir.path().join("empty.csv");
    std::fs::write(&empty, "").unwrap();
    let err = one_line_error(&rtprobe(&["plot", s(&empty)]));
    assert!(
        err.contains("empty.csv: line 1: the file is empty"),
        "{err}"
    );

    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "remember to buy milk\nand eggs\n").unwrap();
    let err = one_line_error(&rtprobe(&["plot", s(&text)]));
    assert!(
        err.contains("notes.txt: line 1: not an rtprobe CSV"),
        "{err}"
    );

    let cut = dir.path().join("cut.csv");
    std::fs::write(&cut, "seq,one_way_ns,lost\n0,5,0\n1,6,0\n2,7").unwrap();
    let err = one_line_error(&rtprobe(&["plot", s(&cut)]));
    assert!(
        err.contains("cut.csv: line 4, column 3 (lost): the last line is cut short"),
        "{err}"
    );
    let out = rtprobe(&["plot", s(&cut), "--ignore-truncated", "--kind", "box"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("skipped the cut-short last line 4"));
}

#[test]
fn user_mistakes_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("out.csv");
    good_csv(&csv);

    let missing = dir.path().join("nope.csv");
    let err = one_line_error(&rtprobe(&["plot", s(&csv), s(&missing)]));
    assert_eq!(
        err,
        format!("Error: {}: no such file: check the path", missing.display())
    );

    let err = one_line_error(&rtprobe(&["plot", s(dir.path())]));
    assert!(
        err.contains("is a directory, not a CSV file: pass the CSV files in it"),
        "{err}"
    );

    // A regular file where a directory should be: cannot be created, even as root.
    let err = one_line_error(&rtprobe(&[
        "plot",
        s(&csv),
        "--out-dir",
        s(&csv.join("figs")),
    ]));
    assert!(
        err.starts_with(&format!(
            "Error: cannot create --out-dir {}",
            csv.join("figs").display()
        )),
        "{err}"
    );

    let err = one_line_error(&rtprobe(&["plot", s(&csv), "--group-by", "xdpmode"]));
    assert_eq!(
        err,
        "Error: unknown --group-by \"xdpmode\": use size, interval or mode"
    );

    let err = one_line_error(&rtprobe(&["plot", s(&csv), s(&csv), "--label", "only-one"]));
    assert_eq!(
        err,
        "Error: --label given 1 time(s) for 2 CSV file(s): give one --label per CSV, in the same order"
    );

    let err = one_line_error(&rtprobe(&[
        "plot",
        s(&csv),
        s(&csv),
        "--label",
        "x",
        "--label",
        "x",
    ]));
    assert!(err.contains("--label \"x\" names both"), "{err}");

    // --group-by mode on a CSV without metadata.
    let old = dir.path().join("old.csv");
    std::fs::write(&old, "seq,one_way_ns\n0,5\n1,6\n").unwrap();
    let err = one_line_error(&rtprobe(&["plot", s(&old), "--group-by", "mode"]));
    assert!(err.contains("no run metadata line"), "{err}");

    // Asking for a metric the file lacks.
    let err = one_line_error(&rtprobe(&["plot", s(&old), "--metric", "rtt"]));
    assert!(err.ends_with("old.csv: line 1: this file has no rtt_ns column: plot the other metric with --metric one-way"), "{err}");
}

#[test]
fn unwritable_out_dir_is_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("out.csv");
    good_csv(&csv);
    // An existing directory nobody can create files in, root included.
    let err = one_line_error(&rtprobe(&["plot", s(&csv), "--out-dir", "/proc"]));
    assert!(
        err.starts_with(
            "Error: cannot write in --out-dir /proc: pick a directory you can write to: "
        ),
        "{err}"
    );
    // For other users, permission bits too (root ignores them).
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        use std::os::unix::fs::PermissionsExt;
        let ro = dir.path().join("ro");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        let err = one_line_error(&rtprobe(&["plot", s(&csv), "--out-dir", s(&ro)]));
        assert!(err.contains("cannot write in --out-dir"), "{err}");
    }
}

#[test]
fn plots_an_hdr_interval_log_and_names_a_broken_one() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/interval.hlog");
    let out = rtprobe(&[
        "plot",
        fixture,
        "--out-dir",
        s(dir.path()),
        "--format",
        "png",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    // Box, CDF, time series and percentiles for each of the two tags.
    assert_eq!(listed.len(), 8, "{listed:?}");
    for p in &listed {
        let bytes = std::fs::read(p).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"), "{p}");
    }
    // A log whose histogram line is cut: one line naming file and line.
    let broken = dir.path().join("broken.hlog");
    let text = std::fs::read_to_string(fixture).unwrap();
    let cut: String = text.lines().take(4).collect::<Vec<_>>().join("\n");
    std::fs::write(&broken, &cut[..cut.len() - 10]).unwrap();
    let e = one_line_error(&rtprobe(&["plot", s(&broken), "--out-dir", s(dir.path())]));
    assert!(e.contains("broken.hlog: line 4: "), "{e}");
}
