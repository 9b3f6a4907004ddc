//! Reader for HdrHistogram interval logs (the format of HdrHistogram's
//! `HistogramLogWriter`, and of `rtprobe --hdr-log`): one histogram per
//! interval, V2 or V2-deflate, base64 on a line
//! `[Tag=TAG,]START,LENGTH,MAX,HISTogram`, after optional `#[StartTime: ..]`
//! and `#[BaseTime: ..]` lines and a column legend.
//!
//! Histogram values are read as nanoseconds, rtprobe's unit. The tag names
//! what was measured: `one-way` and `rtt` (rtprobe's headline latencies),
//! or a stage of the timestamp chain (`path`, `sender_queue`, ...);
//! untagged histograms (other tools' default) count as the one-way latency
//! unless only the RTT is asked for. A comment line `#rtprobe-meta: {json}`
//! (or `# rtprobe-meta: {json}`) carries the run metadata as in the CSV.
//!
//! The log streams through line by line: each interval's histogram is
//! decoded, added to the run's distribution and to its time series (an
//! interval is one point in time, its samples spread by their values) and
//! dropped, so memory stays flat however long the log.

use std::{
    io::{BufRead, BufReader, Read},
    time::Duration,
};

use base64::Engine;
use hdrhistogram::{
    Histogram,
    serialization::{
        Deserializer,
        interval_log::{IntervalLogHistogram, IntervalLogIterator, LogEntry},
    },
};

use super::{
    dist::{Dist, TimeGrid},
    run_data::{CsvRun, FlowData, ReadError, ReadOptions, Series, TsCounts, Want, XSource},
};
use crate::{export::csv::META_PREFIX, model::meta::RunMeta, stats::chain::Stage};

/// Whether the first bytes of a file are an HdrHistogram interval log
/// rather than a CSV: its `#[...]` header lines, its column legend, or a
/// `Tag=` / timestamped histogram line, among the first lines.
pub(crate) fn sniff(head: &[u8]) -> bool {
    head.split(|&b| b == b'\n').take(32).any(|line| {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        line.starts_with(b"#[StartTime: ")
            || line.starts_with(b"#[BaseTime: ")
            || line.starts_with(b"#[Histogram log format version")
            || line.starts_with(b"\"StartTimestamp\",\"Interval_Length\"")
            || line.starts_with(b"Tag=")
            || is_interval_line(line)
    })
}

/// `START,LENGTH,MAX,HIST...`: fractional seconds (HdrHistogram writes
/// `%.3f`) and a number before the histogram.
fn is_interval_line(line: &[u8]) -> bool {
    let mut fields = line.splitn(4, |&b| b == b',');
    let numeric = |f: &[u8]| {
        !f.is_empty()
            && f.iter()
                .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'))
    };
    let seconds = |f: Option<&[u8]>| f.is_some_and(|f| numeric(f) && f.contains(&b'.'));
    seconds(fields.next())
        && seconds(fields.next())
        && fields.next().is_some_and(numeric)
        && fields.next().is_some_and(|h| h.starts_with(b"HIST"))
}

/// Where an interval's histogram goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    OneWay,
    Rtt,
    Stage(usize),
}

fn target(tag: Option<&str>, opts: &ReadOptions) -> Option<Target> {
    let Some(tag) = tag else {
        return Some(if opts.one_way == Want::Skip && opts.rtt != Want::Skip {
            Target::Rtt
        } else {
            Target::OneWay
        });
    };
    let t = tag.trim().to_ascii_lowercase().replace('_', "-");
    match t.as_str() {
        "one-way" | "oneway" | "one-way-ns" | "owd" => return Some(Target::OneWay),
        "rtt" | "rtt-ns" | "round-trip" => return Some(Target::Rtt),
        _ => {}
    }
    Stage::ALL
        .iter()
        .position(|s| s.key().replace('_', "-") == t.trim_end_matches("-ns"))
        .map(Target::Stage)
}

/// The longest line taken (a histogram of a wide range, base64).
const MAX_LINE: u64 = 16 * 1024 * 1024;

/// Reads an interval log from any byte source. `name` is used in errors.
pub(crate) fn read_hdr_log<R: Read>(
    name: &str,
    input: R,
    opts: &ReadOptions,
) -> Result<CsvRun, ReadError> {
    let err = |line: Option<u64>, message: String| log_error(name, line, message);
    let mut rdr = BufReader::with_capacity(64 * 1024, input);
    let mut log = LogContents::new(opts);
    let mut buf = Vec::new();
    let mut line_no = 0u64;
    let mut decoder = Deserializer::new();
    let mut skipped = None;
    while let Some(whole) =
        next_line(&mut rdr, &mut buf, &mut line_no).map_err(|(line, m)| err(Some(line), m))?
    {
        match read_line(&buf, &mut log, &mut decoder) {
            Ok(()) => {}
            // A line without its newline is the last one, cut short by a
            // run stopped while writing (or a full disk before rtprobe
            // wrote whole lines only): skipped as the CSV reader skips one.
            Err(_) if !whole && opts.allow_truncated => skipped = Some(line_no),
            Err(m) if !whole => {
                return Err(err(
                    Some(line_no),
                    format!(
                        "the last line is cut short ({m}); the run was probably stopped while \
                         writing: pass --ignore-truncated to skip that line"
                    ),
                ));
            }
            Err(m) => return Err(err(Some(line_no), m)),
        }
    }
    let mut run = log.finish(name)?;
    run.skipped_truncated_line = skipped;
    Ok(run)
}

/// Takes one line of the log into `log`.
fn read_line(
    buf: &[u8],
    log: &mut LogContents<'_>,
    decoder: &mut Deserializer,
) -> Result<(), String> {
    let text = buf.trim_ascii();
    if text.is_empty() || text.starts_with(b"\"StartTimestamp\"") {
        return Ok(());
    }
    if let Some(comment) = text.strip_prefix(b"#") {
        match comment_line(comment)? {
            Comment::Meta(m) => {
                log.meta = Some(*m);
                return Ok(());
            }
            Comment::Times => {}
            Comment::Other => return Ok(()),
        }
    }
    let h = match IntervalLogIterator::new(buf).next() {
        Some(Ok(LogEntry::StartTime(t))) => {
            log.start_time = Some(t);
            return Ok(());
        }
        Some(Ok(LogEntry::BaseTime(t))) => {
            log.base_time = Some(t);
            return Ok(());
        }
        Some(Ok(LogEntry::Interval(h))) => h,
        _ => return Err(not_an_interval_line(text)),
    };
    log.add(&h, decoder)
}

fn log_error(name: &str, line: Option<u64>, message: String) -> ReadError {
    ReadError {
        file: name.to_string(),
        line,
        column: None,
        message,
    }
}

/// Reads the next line into `buf` (with its `\n`, added if the file ends
/// without one) and counts it: `Some(true)` for a whole line, `Some(false)`
/// for a last line without its newline, `None` at the end of the input.
/// Errors carry the line they are about.
fn next_line<R: Read>(
    rdr: &mut BufReader<R>,
    buf: &mut Vec<u8>,
    line_no: &mut u64,
) -> Result<Option<bool>, (u64, String)> {
    buf.clear();
    let got = rdr
        .take(MAX_LINE)
        .read_until(b'\n', buf)
        .map_err(|e| (*line_no + 1, format!("read failed: {e}")))?;
    if got == 0 {
        return Ok(None);
    }
    *line_no += 1;
    if buf.ends_with(b"\n") {
        return Ok(Some(true));
    }
    if buf.len() as u64 >= MAX_LINE {
        return Err((
            *line_no,
            "the line is longer than 16 MiB: not an HdrHistogram log line".into(),
        ));
    }
    buf.push(b'\n');
    Ok(Some(false))
}

/// What a `#` line of the log is.
enum Comment {
    /// rtprobe's run metadata.
    Meta(Box<RunMeta>),
    /// `#[StartTime: ...]` or `#[BaseTime: ...]`: the interval log parser
    /// reads it.
    Times,
    /// Any other comment.
    Other,
}

/// Tells what a comment (the text after `#`) is.
fn comment_line(comment: &[u8]) -> Result<Comment, String> {
    let c = comment.trim_ascii_start();
    let tag = META_PREFIX.trim_start_matches('#').trim();
    if let Some(json) = c.strip_prefix(tag.as_bytes()) {
        let m = serde_json::from_slice::<RunMeta>(json.trim_ascii())
            .map_err(|e| format!("the run metadata ({tag}) is not valid JSON: {e}"))?;
        return Ok(Comment::Meta(Box::new(m)));
    }
    if c.starts_with(b"[StartTime: ") || c.starts_with(b"[BaseTime: ") {
        Ok(Comment::Times)
    } else {
        Ok(Comment::Other)
    }
}

fn not_an_interval_line(text: &[u8]) -> String {
    let shown: String = String::from_utf8_lossy(text).chars().take(40).collect();
    format!(
        "not an HdrHistogram interval line (expected [Tag=T,]START,LENGTH,MAX,HIST...; the line reads {:?})",
        shown
    )
}

/// What the log has told so far, interval by interval: one flow's
/// distributions and time series, and what is needed to place and check
/// them.
struct LogContents<'a> {
    opts: &'a ReadOptions,
    flow: FlowData,
    meta: Option<RunMeta>,
    base_time: Option<Duration>,
    start_time: Option<Duration>,
    ignored_tags: Vec<String>,
    /// Intervals recorded into a latency series.
    intervals: u64,
    /// Samples per latency metric (one-way, RTT).
    counts: [u64; 2],
    /// A stage histogram was seen (whether or not stages were read).
    any_stage: bool,
}

impl<'a> LogContents<'a> {
    fn new(opts: &'a ReadOptions) -> Self {
        LogContents {
            opts,
            flow: FlowData {
                flow: 0,
                rows: 0,
                lost: 0,
                lost_x: TimeGrid::new(opts.columns),
                one_way: None,
                rtt: None,
                size: None,
                sizes_vary: false,
                first_x: [None; 2],
                ts: TsCounts::default(),
                stages: None,
            },
            meta: None,
            base_time: None,
            start_time: None,
            ignored_tags: Vec::new(),
            intervals: 0,
            counts: [0; 2],
            any_stage: false,
        }
    }

    /// Decodes one interval's histogram and records it where its tag says
    /// (an unknown tag is noted, a metric not asked for skipped).
    fn add(&mut self, h: &IntervalLogHistogram, decoder: &mut Deserializer) -> Result<(), String> {
        let tag = h.tag().map(|t| t.as_str().to_string());
        let Some(target) = target(tag.as_deref(), self.opts) else {
            let t = tag.unwrap_or_default();
            if !self.ignored_tags.contains(&t) {
                self.ignored_tags.push(t);
            }
            return Ok(());
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(h.encoded_histogram().trim())
            .map_err(|e| format!("the histogram is not valid base64: {e}"))?;
        let hist: Histogram<u64> = decoder.deserialize(&mut &bytes[..]).map_err(|e| {
            format!("the histogram does not decode (V2 / V2-deflate expected): {e}")
        })?;
        let x = self.mid_ns(h);
        self.record(target, &hist, x);
        Ok(())
    }

    /// The middle of an interval in ns. Interval timestamps are offsets
    /// from BaseTime, or, with only a StartTime, offsets when they are far
    /// below it (the Java reader's rule), else seconds since the epoch.
    fn mid_ns(&self, h: &IntervalLogHistogram) -> i64 {
        let start = h.start_timestamp();
        let base = match (self.base_time, self.start_time) {
            (Some(b), _) => b,
            (None, Some(s)) if start + Duration::from_secs(365 * 86_400) < s => s,
            _ => Duration::ZERO,
        };
        let mid = base.saturating_add(start).saturating_add(h.duration() / 2);
        i64::try_from(mid.as_nanos()).unwrap_or(i64::MAX)
    }

    fn record(&mut self, target: Target, hist: &Histogram<u64>, x: i64) {
        let opts = self.opts;
        let series = match target {
            Target::OneWay => {
                if opts.one_way == Want::Skip {
                    return;
                }
                self.counts[0] += hist.len();
                self.flow.one_way.get_or_insert_with(|| Series::new(opts))
            }
            Target::Rtt => {
                if opts.rtt == Want::Skip {
                    return;
                }
                self.counts[1] += hist.len();
                self.flow.rtt.get_or_insert_with(|| Series::new(opts))
            }
            Target::Stage(k) => {
                self.any_stage = true;
                if opts.stages {
                    let st = self.flow.stages.get_or_insert_with(|| {
                        Box::new(std::array::from_fn(|_| Dist::new(opts.exact_limit)))
                    });
                    for b in hist.iter_recorded() {
                        st[k].record_n(value(b.value_iterated_to()), b.count_at_value());
                    }
                }
                return;
            }
        };
        self.intervals += 1;
        match self.flow.first_x {
            [None, _] => self.flow.first_x[0] = Some(x),
            _ => self.flow.first_x[0] = self.flow.first_x[0].map(|f| f.min(x)),
        }
        for b in hist.iter_recorded() {
            let (v, c) = (value(b.value_iterated_to()), b.count_at_value());
            series.dist.record_n(v, c);
            series.time.record_n(x, v, c);
        }
    }

    /// The run, once the log is read: an error if a required metric or
    /// every usable histogram is missing.
    fn finish(mut self, name: &str) -> Result<CsvRun, ReadError> {
        let opts = self.opts;
        for t in &self.ignored_tags {
            log::warn!(
                "{name}: histograms tagged {t:?} ignored (rtprobe reads one-way, rtt and the stage names)"
            );
        }
        for (want, got, what, tag) in [
            (
                opts.one_way,
                self.flow.one_way.is_some(),
                "one-way",
                "one-way (or untagged)",
            ),
            (opts.rtt, self.flow.rtt.is_some(), "rtt", "rtt"),
        ] {
            if want == Want::Required && !got {
                return Err(log_error(
                    name,
                    None,
                    format!(
                        "this log has no {what} histograms (tag {tag}): plot the other metric with --metric"
                    ),
                ));
            }
        }
        if self.intervals == 0 {
            return Err(log_error(
                name,
                None,
                if self.ignored_tags.is_empty() {
                    "no interval histograms in the log: nothing to plot".to_string()
                } else {
                    format!(
                        "no histogram with a tag rtprobe reads (one-way, rtt, or none); the log has {}",
                        self.ignored_tags.join(", ")
                    )
                },
            ));
        }
        self.flow.rows = self.counts[0].max(self.counts[1]);
        Ok(CsvRun {
            name: name.to_string(),
            meta: self.meta,
            x_source: XSource::SendNs,
            rows: self.flow.rows,
            flows: vec![self.flow],
            skipped_truncated_line: None,
            has_stage_columns: self.any_stage,
            from_hdr_log: true,
        })
    }
}

/// A histogram value as a latency in ns.
fn value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use hdrhistogram::serialization::{V2DeflateSerializer, V2Serializer, interval_log};

    use super::*;
    use crate::export::plot::read::tests::samples;

    /// A log as HdrHistogram's writer makes it: `intervals` one-second
    /// intervals tagged one-way and rtt, interval i holding 1000 samples
    /// of 50 µs + i µs and one of 2 ms; V2-deflate (or plain V2).
    fn write_log(intervals: u64, deflate: bool, untagged: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let base = SystemTime::UNIX_EPOCH + Duration::from_secs(1_763_771_234);
        let mut v2 = V2Serializer::new();
        let mut v2d = V2DeflateSerializer::new();
        let hist = |i: u64, scale: u64| {
            let mut h = Histogram::<u64>::new(3).unwrap();
            h.record_n((50_000 + i * 1_000) * scale, 1000).unwrap();
            h.record(2_000_000 * scale).unwrap();
            h
        };
        macro_rules! body {
            ($ser:expr) => {{
                let mut w = interval_log::IntervalLogWriterBuilder::new()
                    .add_comment("written by rtprobe's tests")
                    .with_start_time(base)
                    .with_base_time(base)
                    .with_max_value_divisor(1e6)
                    .begin_log_with(&mut out, $ser)
                    .unwrap();
                for i in 0..intervals {
                    let start = Duration::from_secs(i);
                    let len = Duration::from_secs(1);
                    if untagged {
                        w.write_histogram(&hist(i, 1), start, len, None).unwrap();
                    } else {
                        w.write_histogram(
                            &hist(i, 1),
                            start,
                            len,
                            interval_log::Tag::new("one-way"),
                        )
                        .unwrap();
                        w.write_histogram(&hist(i, 2), start, len, interval_log::Tag::new("rtt"))
                            .unwrap();
                        w.write_histogram(
                            &hist(i, 1),
                            start,
                            len,
                            interval_log::Tag::new("gc-pause"),
                        )
                        .unwrap();
                    }
                }
            }};
        }
        if deflate {
            body!(&mut v2d)
        } else {
            body!(&mut v2)
        }
        out
    }

    fn read(bytes: &[u8]) -> Result<CsvRun, ReadError> {
        read_hdr_log("t.hlog", bytes, &ReadOptions::default())
    }

    #[test]
    fn reads_what_the_writer_writes() {
        for deflate in [true, false] {
            let log = write_log(5, deflate, false);
            assert!(sniff(&log), "{}", String::from_utf8_lossy(&log));
            let run = read(&log).unwrap();
            assert!(run.from_hdr_log);
            let f = &run.flows[0];
            // Both tags, the unknown one ignored; 5 x 1001 samples each.
            let (ow, rtt) = (f.one_way.as_ref().unwrap(), f.rtt.as_ref().unwrap());
            assert_eq!((ow.dist.n(), rtt.dist.n(), f.rows), (5005, 5005, 5005));
            let v = samples(&ow.dist);
            let near = |x: i64, want: i64| (x - want).abs() <= want / 1000;
            assert_eq!(v.iter().filter(|&&x| near(x, 2_000_000)).count(), 5);
            // Values come back as the writer's histogram holds them (its
            // highest equivalent value, within 0.1 %).
            for i in 0..5 {
                let want = 50_000 + i * 1_000;
                let n = v.iter().filter(|&&x| near(x, want)).count();
                assert_eq!(n, 1000, "interval {i}");
            }
            // One time series column per interval, at its middle.
            let cols = ow.time.finish();
            assert_eq!(cols.len(), 5);
            let base_ns = 1_763_771_234_000_000_000i64;
            assert_eq!(cols[0].x, base_ns + 500_000_000);
            assert_eq!(cols[4].x, base_ns + 4_500_000_000);
            assert!(cols.iter().all(|c| c.n == 1001 && c.max >= 2_000_000));
            assert!(near(cols[2].p50, 52_000), "{:?}", cols[2]);
            assert_eq!(f.first_x[0], Some(base_ns + 500_000_000));
        }
    }

    #[test]
    fn untagged_histograms_are_one_way_unless_only_rtt_is_asked() {
        let log = write_log(3, true, true);
        let run = read(&log).unwrap();
        assert_eq!(run.flows[0].one_way.as_ref().unwrap().dist.n(), 3003);
        assert!(run.flows[0].rtt.is_none());
        let opts = ReadOptions {
            one_way: Want::Skip,
            rtt: Want::Required,
            ..Default::default()
        };
        let run = read_hdr_log("t.hlog", &log[..], &opts).unwrap();
        assert_eq!(run.flows[0].rtt.as_ref().unwrap().dist.n(), 3003);
        let opts = ReadOptions {
            rtt: Want::Required,
            ..Default::default()
        };
        let log = b"Tag=gc,0.0,1.0,1.0,HISTFAAAABx4nJNpmSzMwMDAxgABTAwQwAhjAAAmOwIc\n";
        let e = read_hdr_log("t.hlog", &log[..], &opts)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "t.hlog: this log has no rtt histograms (tag rtt): plot the other metric with --metric"
        );
    }

    #[test]
    fn sniffs_logs_not_csvs() {
        assert!(sniff(b"#[StartTime: 1.000 (seconds since epoch)]\n"));
        assert!(sniff(b"\"StartTimestamp\",\"Interval_Length\",\"Interval_Max\",\"Interval_Compressed_Histogram\"\n"));
        assert!(sniff(b"0.127,1.007,2.769,HISTFAAAAB"));
        assert!(!sniff(
            b"# rtprobe-meta: {}\nseq,flow,size,sched_ns\n0,0,64,1\n"
        ));
        assert!(!sniff(b"seq,one_way_ns\n0,1,2,HIST\n"));
        assert!(!sniff(b""));
    }

    #[test]
    fn a_cut_short_last_line_is_skipped_when_asked() {
        let whole = write_log(3, true, false);
        // Cut in the middle of the last rtt histogram, as a full disk did.
        let text = String::from_utf8(whole.clone()).unwrap();
        let last_rtt = text.rfind("Tag=rtt,").unwrap();
        let line_end = last_rtt + text[last_rtt..].find('\n').unwrap();
        let cut = &whole[..line_end - 20];
        let whole = &whole[..=line_end];
        let e = read(cut).unwrap_err().to_string();
        assert!(
            e.contains("the last line is cut short") && e.contains("--ignore-truncated"),
            "{e}"
        );
        let opts = ReadOptions {
            allow_truncated: true,
            ..ReadOptions::default()
        };
        let run = read_hdr_log("t.hlog", cut, &opts).unwrap();
        let lines = whole.iter().filter(|&&b| b == b'\n').count() as u64;
        assert_eq!(run.skipped_truncated_line, Some(lines));
        let all = read(whole).unwrap();
        assert_eq!(all.skipped_truncated_line, None);
        let rtt_n = |r: &CsvRun| r.flows[0].rtt.as_ref().map_or(0, |h| h.dist.n());
        assert_eq!(
            rtt_n(&run) + 1001,
            rtt_n(&all),
            "every whole interval is read"
        );
    }

    #[test]
    fn malformed_logs_are_one_line_errors_with_the_line() {
        let good = write_log(1, true, false);
        let text = String::from_utf8(good).unwrap();
        let cases: Vec<(String, &str)> = vec![
            (
                "#[BaseTime: 0.000 (seconds since epoch)]\nTag=rtt,0.0,1.0,1.0,HIST!!!!\n".into(),
                "t.hlog: line 2: the histogram is not valid base64: Invalid symbol 33, offset 4.",
            ),
            (
                "#[BaseTime: 0.000 (seconds since epoch)]\nTag=rtt,0.0,1.0,1.0,AAAAAAAA\n".into(),
                "t.hlog: line 2: the histogram does not decode (V2 / V2-deflate expected): The cookie (first 4 bytes) did not match that for any supported format",
            ),
            (
                format!("{text}hello world\n"),
                "t.hlog: line 8: not an HdrHistogram interval line (expected [Tag=T,]START,LENGTH,MAX,HIST...; the line reads \"hello world\")",
            ),
            (
                "#[BaseTime: 0.000 (seconds since epoch)]\n".into(),
                "t.hlog: no interval histograms in the log: nothing to plot",
            ),
        ];
        for (input, want) in cases {
            let got = read(input.as_bytes()).unwrap_err().to_string();
            assert_eq!(got, want, "{input:?}");
        }
    }

    mod fuzz {
        use proptest::prelude::*;

        use super::*;

        fn check(bytes: &[u8]) {
            let opts = ReadOptions {
                stages: true,
                exact_limit: 50,
                ..Default::default()
            };
            match read_hdr_log("f.hlog", bytes, &opts) {
                Ok(run) => {
                    for s in [&run.flows[0].one_way, &run.flows[0].rtt]
                        .into_iter()
                        .flatten()
                    {
                        crate::export::plot::read::tests::fuzz::exercise_stats(s);
                    }
                }
                Err(e) => assert!(!e.to_string().contains('\n'), "{e}"),
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
                check(&bytes);
            }

            /// A real log with one byte changed and cut anywhere.
            #[test]
            fn mangled_logs_never_panic(
                at in any::<proptest::sample::Index>(),
                byte in any::<u8>(),
                cut in any::<proptest::sample::Index>(),
            ) {
                let mut log = write_log(2, true, false);
                let i = at.index(log.len());
                log[i] = byte;
                let end = cut.index(log.len() + 1);
                check(&log[..end]);
            }
        }
    }
}
