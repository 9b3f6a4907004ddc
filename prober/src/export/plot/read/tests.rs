//! The CSV reader's tests; `samples` and `fuzz` are shared with the
//! HdrHistogram log reader's tests.

use super::{row::*, *};
use crate::{
    export::csv::{HEADER, format_row},
    model::record::{ProbeRecord, TsSource},
};
use crate::{
    export::plot::{
        dist::Dist,
        run_data::{FlowData, Series, Want, XSource},
    },
    stats::chain::Stage,
};

fn row(seq: u64, one_way: Option<i64>, rtt: Option<i64>) -> ProbeRecord {
    let lost = one_way.is_none();
    ProbeRecord {
        seq,
        flow: 0,
        size: 64,
        sched_ns: 1_000_000 + seq as i64 * 1_000_000,
        send_ns: 1_000_100 + seq as i64 * 1_000_000,
        tx_ns: Some(1_000_200 + seq as i64 * 1_000_000),
        one_way_ns: one_way,
        rtt_ns: rtt,
        ts_source: (!lost).then_some(TsSource::Software),
        lost,
        ..Default::default()
    }
}

fn csv_text(meta: bool, rows: &[ProbeRecord]) -> String {
    let mut s = String::new();
    if meta {
        let m = RunMeta {
            size: 64,
            interval_ns: 1_000_000,
            xdp_mode_attached: "native".into(),
            ..Default::default()
        };
        s.push_str(META_PREFIX);
        s.push_str(&serde_json::to_string(&m).unwrap());
        s.push('\n');
    }
    s.push_str(&HEADER.join(","));
    s.push('\n');
    for r in rows {
        format_row(&mut s, r);
    }
    s
}

/// The samples of a distribution, ascending.
pub(crate) fn samples(d: &Dist) -> Vec<i64> {
    d.clone()
        .finish()
        .pairs()
        .flat_map(|(v, c)| std::iter::repeat_n(v, c as usize))
        .collect()
}

fn values(s: &Series) -> Vec<i64> {
    samples(&s.dist)
}

/// x of each time series column (one per probe in short runs).
fn xs(s: &Series) -> Vec<i64> {
    s.time.finish().iter().map(|c| c.x).collect()
}

fn lost_xs(f: &FlowData) -> Vec<i64> {
    f.lost_x.finish().iter().map(|c| c.lost_x).collect()
}

fn read(text: &[u8]) -> Result<CsvRun, ReadError> {
    read_csv("t.csv", text, &ReadOptions::default())
}

fn read_err(text: &[u8]) -> String {
    read(text).unwrap_err().to_string()
}

#[test]
fn a_first_line_that_is_not_utf8_says_so_and_where() {
    let e = super::sniff_foreign(b"seq,fl\xe9w\n").unwrap();
    assert!(e.starts_with("not UTF-8 (byte 0xe9 at offset 6)"), "{e}");
    assert!(
        super::sniff_foreign(b"seq\0flow\n")
            .unwrap()
            .contains("binary data")
    );
}

#[test]
fn stage_columns_only_when_asked() {
    let rows = [
        ProbeRecord {
            stack_ns: Some(3_000),
            sender_queue_ns: Some(10_000_000),
            path_ns: Some(5_000),
            ..row(0, Some(10_005_000), None)
        },
        ProbeRecord {
            sender_queue_ns: Some(9_000_000),
            path_ns: Some(-2),
            ..row(1, Some(9_000_000), None)
        },
        row(2, None, None),
    ];
    let text = csv_text(true, &rows);
    let run = read(text.as_bytes()).unwrap();
    assert!(run.has_stage_columns);
    assert!(run.flows[0].stages.is_none(), "not read unless asked");
    let opts = ReadOptions {
        stages: true,
        ..Default::default()
    };
    let run = read_csv("t.csv", text.as_bytes(), &opts).unwrap();
    let st = run.flows[0].stages.as_ref().unwrap();
    let at = |s: Stage| samples(&st[Stage::ALL.iter().position(|&x| x == s).unwrap()]);
    assert_eq!(at(Stage::Stack), [3_000]);
    assert_eq!(at(Stage::SenderQueue), [9_000_000, 10_000_000]);
    assert_eq!(at(Stage::Path), [-2, 5_000]);
    assert!(at(Stage::Driver).is_empty());
    let e = read_csv("t.csv", text.replace(",-2,", ",slow,").as_bytes(), &opts)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "t.csv: line 4, column 31 (path_ns): expected a duration in nanoseconds, found \"slow\""
    );
}

/// A CSV from before the timestamp chain: the first sixteen columns.
#[test]
fn old_sixteen_column_csv_reads_without_stages() {
    let header = HEADER[..16].join(",");
    let text = format!(
        "{header}\n0,0,64,1000,1100,1200,51200,91200,50000,90000,sw,sw,sw,sw,0,\n\
         1,0,64,2000,2100,2200,,,,,sw,,,,1,\n"
    );
    let opts = ReadOptions {
        stages: true,
        ..Default::default()
    };
    let run = read_csv("old.csv", text.as_bytes(), &opts).unwrap();
    assert!(!run.has_stage_columns);
    assert!(run.flows[0].stages.is_none());
    assert_eq!(values(run.flows[0].one_way.as_ref().unwrap()), [50_000]);
    assert_eq!(run.flows[0].lost, 1);
}

#[test]
fn reads_what_the_writer_writes() {
    let rows = [
        row(0, Some(50_000), Some(100_000)),
        row(1, None, None),
        row(2, Some(52_000), None),
    ];
    let run = read(csv_text(true, &rows).as_bytes()).unwrap();
    assert_eq!(run.meta.as_ref().unwrap().xdp_mode_attached, "native");
    assert_eq!(run.x_source, XSource::SchedNs);
    assert_eq!(run.rows, 3);
    let f = &run.flows[0];
    assert_eq!((f.rows, f.lost, f.size), (3, 1, Some(64)));
    assert_eq!(lost_xs(f), vec![2_000_000]);
    let ow = f.one_way.as_ref().unwrap();
    assert_eq!(values(ow), vec![50_000, 52_000]);
    assert_eq!(xs(ow), vec![1_000_000, 3_000_000]);
    let rtt = f.rtt.as_ref().unwrap();
    assert_eq!((values(rtt), rtt.missing), (vec![100_000], 1));
    assert_eq!(f.inferred_interval_ns(run.x_source), Some(1_000_000));
    assert_eq!(f.ts.describe(), Some("sw"));
}

#[test]
fn older_csv_without_metadata_or_time_columns() {
    // The minimal column set, no metadata line, no sched_ns.
    let text = "seq,size,tx_ns,rx_ns,one_way_ns,rtt_ns,ts_source,lost\n\
                0,64,10,20,10,30,sw,0\n\
                1,64,,,,,,1\n";
    let run = read(text.as_bytes()).unwrap();
    assert!(run.meta.is_none());
    assert_eq!(run.x_source, XSource::Seq);
    assert_eq!(lost_xs(&run.flows[0]), vec![1]);
    assert_eq!(values(run.flows[0].one_way.as_ref().unwrap()), vec![10]);
    // Only one metric column, no lost column: an empty cell is a loss.
    let run = read(b"seq,rtt_ns\n0,5\n1,\n").unwrap();
    let f = &run.flows[0];
    assert!(f.one_way.is_none());
    assert_eq!((f.lost, f.rtt.as_ref().unwrap().dist.n()), (1, 1));
}

#[test]
fn comments_crlf_bom_and_flows() {
    let text = "\u{feff}seq,flow,one_way_ns\r\n# a comment\r\n0,0,5\r\n1,1,7\r\n2,0,6\r\n";
    let run = read(text.as_bytes()).unwrap();
    assert_eq!(run.flows.len(), 2);
    assert_eq!(values(run.flows[0].one_way.as_ref().unwrap()), vec![5, 6]);
    assert_eq!(run.flows[1].flow, 1);
    // Line numbers count the comment line.
    let e = read_err(b"seq,one_way_ns\n# c\n0,1\nx,2\n");
    assert!(e.starts_with("t.csv: line 4, column 1 (seq):"), "{e}");
}

#[test]
fn skip_and_required_metrics() {
    let text = csv_text(false, &[row(0, Some(1), Some(2))]);
    let opts = ReadOptions {
        rtt: Want::Skip,
        ..Default::default()
    };
    let run = read_csv("t.csv", text.as_bytes(), &opts).unwrap();
    assert!(run.flows[0].rtt.is_none());
    let opts = ReadOptions {
        rtt: Want::Required,
        ..Default::default()
    };
    let e = read_csv("t.csv", &b"seq,one_way_ns\n0,1\n"[..], &opts)
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "t.csv: line 1: this file has no rtt_ns column: plot the other metric with --metric one-way"
    );
}

/// Malformed files and the message of each: empty, not a CSV, no
/// header or rows, bad run metadata.
fn file_cases(header_line: &str) -> Vec<(Vec<u8>, &'static str)> {
    vec![
        (
            b"".to_vec(),
            "t.csv: line 1: the file is empty: expected a CSV written by rtprobe (header seq,...,one_way_ns,rtt_ns,...)",
        ),
        (
            b"\n\n".to_vec(),
            "t.csv: line 1: the file has no CSV lines: expected a CSV written by rtprobe (header seq,...,one_way_ns,rtt_ns,...)",
        ),
        (
            b"seq,size,lost\n0,64,0\n".to_vec(),
            "t.csv: line 1: the header has neither one_way_ns nor rtt_ns: there is no latency to plot",
        ),
        (
            b"hello world\nthis is text\n".to_vec(),
            "t.csv: line 1: not an rtprobe CSV: the header has no \"seq\" column (the line reads \"hello world\"); pass a CSV written by rtprobe --out",
        ),
        (
            b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec(),
            "t.csv: line 1: this is a PNG image, not an rtprobe CSV: pass the per-probe CSV written with --out",
        ),
        (
            b"\x1f\x8b\x08\0".to_vec(),
            "t.csv: line 1: gzip-compressed: decompress it first (gunzip -k FILE) and plot the .csv",
        ),
        (
            format!("{META_PREFIX}{{\"size\": 64,\n{header_line}\n0,0,64\n").into_bytes(),
            "t.csv: line 1: the run metadata (# rtprobe-meta:) is not valid JSON at character 28: EOF while parsing a value",
        ),
        (
            format!("{META_PREFIX}{{\"size\": \"big\"}}\n{header_line}\n").into_bytes(),
            "t.csv: line 1: the run metadata (# rtprobe-meta:) is not valid JSON at character 30: invalid type: string \"big\", expected u32",
        ),
        (
            format!("{META_PREFIX}{{}}\n").into_bytes(),
            "t.csv: line 2: no CSV header after the run metadata: the run wrote nothing else (it stopped before the first probe?)",
        ),
        (
            format!("{META_PREFIX}{{}}\n{header_line}\n").into_bytes(),
            "t.csv: line 3: no probe rows after the header: nothing to plot (did the run send any probe?)",
        ),
        (
            b"{\"sent\": 10}\n".to_vec(),
            "t.csv: line 1: this is JSON (the --json summary?), not an rtprobe CSV: pass the per-probe CSV written with --out",
        ),
    ]
}

/// Malformed cells and rows (`good` is a valid file, `tail` the empty
/// cells after `lost`) and the message of each.
fn cell_cases(good: &str, tail: &str) -> Vec<(Vec<u8>, &'static str)> {
    vec![
        (
            b"seq,one_way_ns\n\xff\xfe,\x00\n".to_vec(),
            "t.csv: line 2, column 1 (seq): expected a sequence number (integer >= 0), found \"\u{fffd}\u{fffd}\"",
        ),
        (
            good.replace(",50000,", ",5e4,").into_bytes(),
            "t.csv: line 3, column 9 (one_way_ns): expected a latency in nanoseconds, found \"5e4\"",
        ),
        (
            good.replace(",90000,", ",fast,").into_bytes(),
            "t.csv: line 3, column 10 (rtt_ns): expected a latency in nanoseconds, found \"fast\"",
        ),
        (
            good.replacen(",sw,0,", ",sw,maybe,", 1).into_bytes(),
            "t.csv: line 3, column 15 (lost): expected 0 or 1 (lost), found \"maybe\"",
        ),
        (
            format!("{good}1,0,64,1,1,1,1,1,1,1,sw,sw,sw,sw,{tail}").into_bytes(),
            "t.csv: line 4, column 15 (lost): the last line is cut short (expected 0 or 1 (lost), found an empty cell); the run was probably stopped while writing: pass --ignore-truncated to skip that line",
        ),
        (
            b"seq,flow,one_way_ns\n0,300,5\n".to_vec(),
            "t.csv: line 2, column 2 (flow): expected a flow id 0-255, found \"300\"",
        ),
        (
            b"seq,one_way_ns,seq\n0,1,0\n".to_vec(),
            "t.csv: line 1, column 3 (seq): the header names this column twice",
        ),
        (
            b"seq,sched_ns,one_way_ns\n0,,5\n1,2,3\n".to_vec(),
            "t.csv: line 2, column 2 (sched_ns): expected a time in nanoseconds, found an empty cell",
        ),
        (
            b"seq,one_way_ns\n99999999999999999999,1\n1,2\n".to_vec(),
            "t.csv: line 2, column 1 (seq): expected a sequence number (integer >= 0), found \"99999999999999999999\"",
        ),
        (
            b"seq,one_way_ns\n-1,1\n1,2\n".to_vec(),
            "t.csv: line 2, column 1 (seq): expected a sequence number (integer >= 0), found \"-1\"",
        ),
    ]
}

/// Each malformed case and the exact one-line message it gives.
#[test]
fn malformed_inputs_name_file_line_and_column() {
    let good = csv_text(true, &[row(0, Some(50_000), Some(90_000))]);
    let header_line = HEADER.join(",");
    let n = HEADER.len();
    // The empty cells after `lost` in a full row.
    let tail = ",".repeat(n - 15);
    let ends_early =
        format!("t.csv: line 4, column 4 (sched_ns): the row ends early: 3 of {n} columns");
    let too_long = format!(
        "t.csv: line 4, column {}: the row has {} columns but the header has {n}",
        n + 1,
        n + 1
    );
    let cut_short = format!(
        "t.csv: line 4, column 6 (tx_ns): the last line is cut short (the row ends early: 5 of {n} columns); the run was probably stopped while writing: pass --ignore-truncated to skip that line"
    );
    let mut cases = file_cases(&header_line);
    cases.extend(cell_cases(&good, &tail));
    let computed: [(Vec<u8>, &str); 3] = [
        (
            format!("{good}1,0,64\n2,0,64,1,1,1,1,1,1,1,sw,sw,sw,sw,0{tail}\n").into_bytes(),
            &ends_early,
        ),
        (
            format!("{good}1,0,64,1,1,1,1,1,1,1,sw,sw,sw,sw,0{tail},extra\n").into_bytes(),
            &too_long,
        ),
        (format!("{good}1,0,64,1000,10").into_bytes(), &cut_short),
    ];
    cases.extend(computed);
    for (input, want) in cases {
        let got = read_err(&input);
        assert_eq!(got, want, "input {:?}", String::from_utf8_lossy(&input));
        assert!(!got.contains('\n'));
    }
}

#[test]
fn truncated_last_line_can_be_skipped() {
    let good = csv_text(true, &[row(0, Some(50_000), Some(90_000))]);
    let text = format!("{good}1,0,64,1000,10");
    let opts = ReadOptions {
        allow_truncated: true,
        ..Default::default()
    };
    let run = read_csv("t.csv", text.as_bytes(), &opts).unwrap();
    assert_eq!((run.rows, run.skipped_truncated_line), (1, Some(4)));
    // The same short row in the middle is corruption, not truncation.
    let text = format!(
        "{good}1,0,64,1000,10\n{}",
        &good[good.find("0,0,64").unwrap()..]
    );
    let e = read_csv("t.csv", text.as_bytes(), &opts).unwrap_err();
    assert_eq!(e.line, Some(4));
    // A complete last row without newline is fine.
    let text = good.trim_end().to_string();
    assert_eq!(read(text.as_bytes()).unwrap().rows, 1);
}

#[test]
fn file_level_errors() {
    let dir = tempfile::tempdir().unwrap();
    let o = ReadOptions::default();
    let e = read_csv_file(&dir.path().join("nope.csv"), &o).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("nope.csv: no such file: check the path"),
        "{e}"
    );
    let e = read_csv_file(dir.path(), &o).unwrap_err().to_string();
    assert!(e.contains("is a directory, not a CSV file"), "{e}");
}

#[test]
fn integers() {
    assert_eq!(parse_i64(b" -12 "), Some(-12));
    assert_eq!(parse_i64(b"+7"), Some(7));
    assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
    assert_eq!(parse_i64(b"9223372036854775807"), Some(i64::MAX));
    assert_eq!(parse_i64(b"9223372036854775808"), None);
    assert_eq!(parse_i64(b"-"), None);
    assert_eq!(parse_i64(b"1.5"), None);
    assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
    assert_eq!(parse_u64(b"-1"), None);
}

pub(crate) mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn check(bytes: &[u8]) {
        for allow_truncated in [false, true] {
            let opts = ReadOptions {
                allow_truncated,
                stages: allow_truncated,
                ..Default::default()
            };
            match read_csv("f.csv", bytes, &opts) {
                Ok(run) => {
                    let n: u64 = run.flows.iter().map(|f| f.rows).sum();
                    assert_eq!(n, run.rows);
                    // Whatever numbers got through, the statistics
                    // behind the figures must cope with them.
                    for f in &run.flows {
                        for s in [&f.one_way, &f.rtt].into_iter().flatten() {
                            exercise_stats(s);
                        }
                        for d in f.stages.iter().flat_map(|st| st.iter()) {
                            let _ = crate::export::plot::stats::box_stats_of(&d.clone().finish());
                        }
                    }
                }
                Err(e) => assert!(!e.to_string().contains('\n')),
            }
        }
    }

    /// Runs every statistic a figure uses over a parsed series.
    pub(crate) fn exercise_stats(s: &Series) {
        use crate::export::plot::stats;
        let cols = s.time.finish();
        assert_eq!(cols.iter().map(|c| c.n).sum::<u64>(), s.dist.n());
        for c in cols.iter().filter(|c| c.n > 0) {
            assert!(c.min <= c.p50 && c.p50 <= c.p99 && c.p99 <= c.max, "{c:?}");
        }
        // The exact path and the histogram path over the same samples.
        for limit in [usize::MAX, 0] {
            let mut d = Dist::new(limit);
            for v in samples(&s.dist) {
                d.record(v);
            }
            let v = d.finish();
            assert_eq!(v.len(), s.dist.n());
            if let Some(b) = stats::box_stats_of(&v) {
                assert!(b.outliers().len() as u64 <= b.outlier_count());
                assert!(b.lower_whisker <= b.upper_whisker);
            }
            let p = stats::percentile_curve_of(&v, 5);
            assert!(p.windows(2).all(|w| w[0].1 <= w[1].1));
            for log in [false, true] {
                let c = stats::cdf_points_of(&v, 5, log);
                assert_eq!(c.is_empty(), v.is_empty());
                assert!(c.last().is_none_or(|p| p.fraction == 1.0));
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            check(&bytes);
        }

        /// Rows the writer produces, with any numbers at all, read back
        /// exactly and survive the statistics.
        #[test]
        fn writer_rows_round_trip(
            rows in proptest::collection::vec(
                (any::<i64>(), any::<Option<i64>>(), any::<Option<i64>>(), any::<u8>(), any::<bool>()),
                1..40),
        ) {
            let recs: Vec<ProbeRecord> = rows
                .iter()
                .enumerate()
                .map(|(i, &(sched_ns, one_way_ns, rtt_ns, flow, lost))| ProbeRecord {
                    seq: i as u64,
                    flow: flow % 3,
                    sched_ns,
                    one_way_ns,
                    rtt_ns,
                    lost,
                    ..Default::default()
                })
                .collect();
            let text = csv_text(true, &recs);
            let run = read(text.as_bytes()).unwrap();
            prop_assert_eq!(run.rows, recs.len() as u64);
            for f in &run.flows {
                let mine: Vec<&ProbeRecord> = recs.iter().filter(|r| r.flow == f.flow).collect();
                let want: Vec<i64> = mine.iter().filter_map(|r| r.one_way_ns).collect();
                let mut want = want;
                want.sort_unstable();
                prop_assert_eq!(&values(f.one_way.as_ref().unwrap()), &want);
                let on_time = f.one_way.as_ref().unwrap().time.finish().iter().map(|c| c.n).sum::<u64>();
                prop_assert_eq!(on_time, want.len() as u64);
                prop_assert_eq!(f.lost, mine.iter().filter(|r| r.lost).count() as u64);
                for s in [&f.one_way, &f.rtt].into_iter().flatten() {
                    exercise_stats(s);
                }
            }
        }

        /// Near-valid files: a real header and rows with cells swapped
        /// for arbitrary short strings, then cut at a random byte.
        #[test]
        fn mangled_csv_never_panics(
            cells in proptest::collection::vec(
                proptest::collection::vec("[-0-9a-z,\"\n#]{0,6}", 15), 0..6),
            meta in any::<bool>(),
            cut in any::<proptest::sample::Index>(),
        ) {
            let mut s = String::new();
            if meta {
                s.push_str(META_PREFIX);
                s.push_str("{\"size\":64}\n");
            }
            s.push_str(&HEADER.join(","));
            s.push('\n');
            for r in &cells {
                s.push_str(&r.join(","));
                s.push('\n');
            }
            let bytes = s.as_bytes();
            check(&bytes[..cut.index(bytes.len() + 1)]);
        }
    }
}
