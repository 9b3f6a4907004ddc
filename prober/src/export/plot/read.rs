//! Streaming reader for rtprobe's per-probe CSV (see `export::csv`).
//!
//! It keeps only what a figure needs, in memory that does not grow with the
//! file: per flow and metric a [`Dist`] (exact samples up to
//! [`dist::EXACT_LIMIT`], then an HDR histogram) and a [`TimeGrid`] (the
//! time series decimated to pixel columns as it streams in, x from the send
//! schedule or the sequence number), plus a grid of lost probes. Rows are
//! parsed one at a time from a reused `csv::ByteRecord`: no per-row
//! allocation, time linear in the rows.
//!
//! The optional first line `# rtprobe-meta: {json}` carries the run
//! metadata; CSVs from older runs (or other tools writing the same columns)
//! have none. Other lines starting with `#` are comments. The header must
//! name `seq` and at least one of `one_way_ns` / `rtt_ns`; every other
//! column is optional and unknown columns are ignored (newer files).
//!
//! Any malformed input is a [`ReadError`] naming the file, line and column,
//! never a panic: the reader takes arbitrary bytes from any [`Read`], which
//! is what the fuzz target (`fuzz/fuzz_targets/csv_reader.rs`) and the
//! proptest below feed it.

use std::{
    fmt,
    fs::File,
    io::{self, BufRead, BufReader, Read},
    path::Path,
};

use super::dist::{self, Dist, TimeGrid};
use crate::{export::csv::META_PREFIX, model::run::RunMeta, stats::chain::Stage};

/// How many stages the chain splits into.
pub const STAGES: usize = Stage::ALL.len();

/// The CSV column of a stage: `path` -> `path_ns`.
pub fn stage_column(s: Stage) -> String {
    format!("{}_ns", s.key())
}

/// Whether the reader keeps a metric column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// Do not read it (saves memory when the figure does not need it).
    Skip,
    /// Read it if the header has it.
    IfPresent,
    /// Read it; a header without it is an error.
    Required,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOptions {
    pub one_way: Want,
    pub rtt: Want,
    /// Drop a cut-short last line (run killed mid-write) instead of failing.
    pub allow_truncated: bool,
    /// Keep the per-probe stage columns (`stack_ns` .. `return_ns`) if the
    /// header has them; off, they cost nothing.
    pub stages: bool,
    /// Samples per series kept exactly before the series moves into an
    /// HDR histogram (`usize::MAX`: always exact, memory grows with the
    /// file).
    pub exact_limit: usize,
    /// Columns of each time series grid (about twice the figure's width
    /// in pixels: after the last regrid at least half are in use).
    pub columns: usize,
}

impl Default for ReadOptions {
    fn default() -> Self {
        Self {
            one_way: Want::IfPresent,
            rtt: Want::IfPresent,
            allow_truncated: false,
            stages: false,
            exact_limit: dist::EXACT_LIMIT,
            columns: 2000,
        }
    }
}

/// Where the x position of each probe (for time series and lost marks)
/// comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XSource {
    /// `sched_ns`: when the pacer meant to send it (CLOCK_REALTIME ns).
    SchedNs,
    /// `send_ns`: user-space clock just before sendmsg (older files).
    SendNs,
    /// `seq`: the probe's sequence number (no time column).
    Seq,
}

/// One metric of one flow: its distribution and its time series.
#[derive(Debug, Clone)]
pub struct Series {
    pub dist: Dist,
    pub time: TimeGrid,
    /// Rows with an empty cell that were not lost (e.g. a timestamp the
    /// kernel never delivered, or an echo that did not come back).
    pub missing: u64,
}

/// How many rows named each timestamp source (`ts_source` column).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TsCounts {
    pub hw: u64,
    pub sw: u64,
    pub mixed: u64,
    pub other: u64,
}

impl TsCounts {
    /// "sw", "hw", "hw+sw" (several sources in one run) or `None`.
    pub fn describe(&self) -> Option<&'static str> {
        match (self.hw > 0, self.sw > 0, self.mixed > 0) {
            (false, false, false) => None,
            (true, false, false) => Some("hw"),
            (false, true, false) => Some("sw"),
            (false, false, true) => Some("mixed hw/sw"),
            _ => Some("hw+sw"),
        }
    }
}

impl Series {
    pub fn new(opts: &ReadOptions) -> Series {
        Series {
            dist: Dist::new(opts.exact_limit),
            time: TimeGrid::new(opts.columns),
            missing: 0,
        }
    }
}

/// The probes of one flow (a CSV usually holds one flow, id 0).
#[derive(Debug, Clone)]
pub struct FlowData {
    pub flow: u8,
    pub rows: u64,
    pub lost: u64,
    /// Where the lost probes were (counted per column).
    pub lost_x: TimeGrid,
    pub one_way: Option<Series>,
    pub rtt: Option<Series>,
    /// Probe size if every row with a `size` cell agrees.
    pub size: Option<u32>,
    pub sizes_vary: bool,
    /// x of the first two rows: their difference is the probe interval
    /// when x is a time (files without metadata).
    pub first_x: [Option<i64>; 2],
    pub ts: TsCounts,
    /// Per stage in [`Stage::ALL`] order, every value present (read only
    /// with [`ReadOptions::stages`] and a header that has the columns).
    pub stages: Option<Box<[Dist; STAGES]>>,
}

impl FlowData {
    /// Interval between the first two probes, if x is a time.
    pub fn inferred_interval_ns(&self, src: XSource) -> Option<u64> {
        match (src, self.first_x) {
            (XSource::Seq, _) => None,
            (_, [Some(a), Some(b)]) => u64::try_from(b.checked_sub(a)?).ok().filter(|d| *d > 0),
            _ => None,
        }
    }
}

/// Everything read from one CSV (or HdrHistogram interval log).
#[derive(Debug, Clone)]
pub struct CsvRun {
    /// The name errors and labels use (the path as given).
    pub name: String,
    pub meta: Option<RunMeta>,
    pub x_source: XSource,
    /// One entry per flow id seen, in increasing flow id.
    pub flows: Vec<FlowData>,
    pub rows: u64,
    /// Line number of a cut-short last line that was skipped.
    pub skipped_truncated_line: Option<u64>,
    /// The header has the stage columns (written since rtprobe records the
    /// timestamp chain), whether or not they were read.
    pub has_stage_columns: bool,
    /// Read from an HdrHistogram interval log: latencies only, no probe
    /// rows, so nothing is known about losses.
    pub from_hdr_log: bool,
}

/// A CSV column an error points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnRef {
    /// 1-based field number in the row.
    pub index: usize,
    /// Header name, if the header has that many columns.
    pub name: Option<String>,
}

/// Malformed or unreadable input, with the place to look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    pub file: String,
    /// 1-based line number, `None` for errors about the file as a whole.
    pub line: Option<u64>,
    pub column: Option<ColumnRef>,
    pub message: String,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The error is printed as one line whatever the input held.
        write!(f, "{}", one_line(&self.file))?;
        match (self.line, &self.column) {
            (None, _) => {}
            (Some(l), None) => write!(f, ": line {l}")?,
            (Some(l), Some(c)) => {
                write!(f, ": line {l}, column {}", c.index)?;
                if let Some(n) = &c.name {
                    write!(f, " ({})", one_line(n))?;
                }
            }
        }
        write!(f, ": {}", one_line(&self.message))
    }
}

impl std::error::Error for ReadError {}

fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Checks that `path` is a readable file before any reading starts, so a
/// typo in the last of several paths fails at once.
pub fn check_input(path: &Path) -> Result<(), ReadError> {
    open(path).map(drop)
}

/// Opens and reads one CSV file.
pub fn read_csv_file(path: &Path, opts: &ReadOptions) -> Result<CsvRun, ReadError> {
    let file = open(path)?;
    read_csv(&path.display().to_string(), file, opts)
}

/// Opens and reads one input: an HdrHistogram interval log if its first
/// lines say so (whatever its name), else an rtprobe CSV.
pub fn read_input_file(path: &Path, opts: &ReadOptions) -> Result<CsvRun, ReadError> {
    let mut file = open(path)?;
    let name = path.display().to_string();
    let mut head = Vec::with_capacity(4096);
    (&mut file)
        .take(4096)
        .read_to_end(&mut head)
        .map_err(|e| ReadError {
            file: name.clone(),
            line: Some(1),
            column: None,
            message: format!("read failed: {e}"),
        })?;
    let is_log = super::hdrlog::sniff(&head);
    let input = io::Cursor::new(head).chain(file);
    if is_log {
        super::hdrlog::read_hdr_log(&name, input, opts)
    } else {
        read_csv(&name, input, opts)
    }
}

fn open(path: &Path) -> Result<File, ReadError> {
    let name = path.display().to_string();
    let whole = |message: String| ReadError {
        file: name.clone(),
        line: None,
        column: None,
        message,
    };
    if path.is_dir() {
        return Err(whole(format!(
            "is a directory, not a CSV file: pass the CSV files in it, e.g. {}/*.csv",
            name.trim_end_matches('/')
        )));
    }
    File::open(path).map_err(|e| {
        whole(match e.kind() {
            io::ErrorKind::NotFound => "no such file: check the path".to_string(),
            io::ErrorKind::PermissionDenied => {
                "permission denied: make the file readable or run as its owner".to_string()
            }
            _ => format!("cannot open: {e}"),
        })
    })
}

/// The longest first line looked at for run metadata.
const MAX_META_LINE: u64 = 64 * 1024;

/// Reads an rtprobe CSV from any byte source. `name` is used in errors.
pub fn read_csv<R: Read>(name: &str, input: R, opts: &ReadOptions) -> Result<CsvRun, ReadError> {
    let err = |line: Option<u64>, column: Option<ColumnRef>, message: String| ReadError {
        file: name.to_string(),
        line,
        column,
        message,
    };
    let io_err = |line: Option<u64>, e: io::Error| err(line, None, format!("read failed: {e}"));

    // A file without newlines must not become one record in memory.
    let input = crate::input::LineCapped::new(input, crate::input::MAX_CSV_LINE_BYTES);
    let mut buf = BufReader::with_capacity(64 * 1024, LastByte::new(input));
    let mut first = Vec::new();
    (&mut buf)
        .take(MAX_META_LINE)
        .read_until(b'\n', &mut first)
        .map_err(|e| io_err(Some(1), e))?;
    if first.is_empty() {
        return Err(err(
            Some(1),
            None,
            "the file is empty: expected a CSV written by rtprobe (header seq,...,one_way_ns,rtt_ns,...)"
                .into(),
        ));
    }
    if let Some(kind) = sniff_foreign(&first) {
        return Err(err(Some(1), None, kind));
    }
    let body = strip_bom(&first);
    let meta_tag = META_PREFIX.trim_end();
    let (meta, line_offset, replay) = if body.starts_with(meta_tag.as_bytes()) {
        if !first.ends_with(b"\n") && first.len() as u64 >= MAX_META_LINE {
            return Err(err(
                Some(1),
                None,
                "the run metadata line is longer than 64 KiB: this is not a CSV rtprobe wrote"
                    .into(),
            ));
        }
        let json = trim_eol(&body[meta_tag.len()..]);
        let meta = serde_json::from_slice::<RunMeta>(json).map_err(|e| {
            let msg = e.to_string();
            // serde_json appends " at line L column C"; say it in CSV terms.
            let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
            err(
                Some(1),
                None,
                format!(
                    "the run metadata ({meta_tag}) is not valid JSON at character {}: {msg}",
                    meta_tag.len() + e.column()
                ),
            )
        })?;
        (Some(meta), 1u64, Vec::new())
    } else {
        (None, 0u64, first)
    };

    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        // Row lengths are checked here, to tell a cut-short last line apart.
        .flexible(true)
        .comment(Some(b'#'))
        .from_reader(io::Cursor::new(replay).chain(buf));

    let mut header = csv::ByteRecord::new();
    let got = rdr
        .read_byte_record(&mut header)
        .map_err(|e| io_err(Some(line_offset + 1), csv_io(e)))?;
    if !got {
        let msg = if meta.is_some() {
            "no CSV header after the run metadata: the run wrote nothing else (it stopped before the first probe?)"
        } else {
            "the file has no CSV lines: expected a CSV written by rtprobe (header seq,...,one_way_ns,rtt_ns,...)"
        };
        return Err(err(Some(line_offset + 1), None, msg.into()));
    }
    let header_line = header.position().map_or(1, |p| p.line()) + line_offset;
    let cols = Columns::from_header(&header, opts)
        .map_err(|(column, message)| err(Some(header_line), column, message))?;
    let names: Vec<String> = header
        .iter()
        .map(|f| String::from_utf8_lossy(f).trim().to_string())
        .collect();
    let col_ref = |i: usize| ColumnRef {
        index: i + 1,
        name: names.get(i).cloned(),
    };

    let mut run = CsvRun {
        name: name.to_string(),
        meta,
        x_source: cols.x_source,
        flows: Vec::new(),
        rows: 0,
        skipped_truncated_line: None,
        has_stage_columns: cols.has_stages,
        from_hdr_log: false,
    };
    // flow id -> index in run.flows
    let mut flow_slot = [u16::MAX; 256];
    let mut rec = csv::ByteRecord::new();
    let mut last_line = header_line;
    loop {
        let more = rdr
            .read_byte_record(&mut rec)
            .map_err(|e| io_err(Some(last_line + 1), csv_io(e)))?;
        if !more {
            break;
        }
        let line = rec.position().map_or(last_line + 1, |p| p.line()) + line_offset;
        last_line = line;
        if let Err((column, message)) = parse_row(&rec, &cols, opts, &mut run, &mut flow_slot) {
            let row_err = err(Some(line), column.map(col_ref), message);
            // A bad row that is the last one and lacks its newline is a
            // write cut short (run killed, disk full), not a corrupt file.
            let mut next = csv::ByteRecord::new();
            let is_last = matches!(rdr.read_byte_record(&mut next), Ok(false));
            let unterminated = !matches!(
                rdr.get_ref().get_ref().1.get_ref().last,
                Some(b'\n' | b'\r')
            );
            if is_last && unterminated {
                if opts.allow_truncated {
                    run.skipped_truncated_line = Some(line);
                    break;
                }
                return Err(ReadError {
                    message: format!(
                        "the last line is cut short ({}); the run was probably stopped while writing: \
                         pass --ignore-truncated to skip that line",
                        row_err.message
                    ),
                    ..row_err
                });
            }
            return Err(row_err);
        }
    }
    if run.rows == 0 {
        let msg = if run.skipped_truncated_line.is_some() {
            "no complete probe row after the header: nothing to plot"
        } else {
            "no probe rows after the header: nothing to plot (did the run send any probe?)"
        };
        return Err(err(Some(last_line + 1), None, msg.into()));
    }
    run.flows.sort_by_key(|f| f.flow);
    Ok(run)
}

fn csv_io(e: csv::Error) -> io::Error {
    match e.into_kind() {
        csv::ErrorKind::Io(e) => e,
        other => io::Error::other(format!("{other:?}")),
    }
}

/// Remembers the last byte read, so a cut-short last line (no trailing
/// newline) can be told apart from a corrupt row in the middle.
struct LastByte<R> {
    inner: R,
    last: Option<u8>,
}

impl<R> LastByte<R> {
    fn new(inner: R) -> Self {
        Self { inner, last: None }
    }
}

impl<R: Read> Read for LastByte<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 {
            self.last = Some(buf[n - 1]);
        }
        Ok(n)
    }
}

fn strip_bom(b: &[u8]) -> &[u8] {
    b.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(b)
}

fn trim_eol(b: &[u8]) -> &[u8] {
    let mut b = b;
    while let [rest @ .., b'\n' | b'\r'] = b {
        b = rest;
    }
    b
}

/// Recognises files people pass by mistake, from their first bytes.
fn sniff_foreign(first: &[u8]) -> Option<String> {
    let what = if first.starts_with(b"\x89PNG") {
        "a PNG image"
    } else if first.starts_with(b"\x1f\x8b") {
        return Some(
            "gzip-compressed: decompress it first (gunzip -k FILE) and plot the .csv".into(),
        );
    } else if first.starts_with(b"\x28\xb5\x2f\xfd") {
        return Some(
            "zstd-compressed: decompress it first (zstd -d FILE) and plot the .csv".into(),
        );
    } else if first.starts_with(b"%PDF") {
        "a PDF document"
    } else if first.starts_with(b"\x7fELF") {
        "an executable (ELF)"
    } else if first.starts_with(b"<?xml") || first.starts_with(b"<svg") {
        "an SVG/XML file (a figure?)"
    } else if first.starts_with(b"{") || first.starts_with(b"[") {
        "JSON (the --json summary?)"
    } else if first.contains(&0) {
        "binary data"
    } else if let Err(e) = std::str::from_utf8(first)
        // error_len() is None for a character cut by the 64 KiB limit.
        && e.error_len().is_some()
    {
        let at = e.valid_up_to();
        return Some(format!(
            "not UTF-8 (byte 0x{:02x} at offset {at}): rtprobe writes UTF-8; convert the file \
             (e.g. iconv -f latin1 -t utf-8) or pass the CSV rtprobe wrote",
            first[at]
        ));
    } else {
        return None;
    };
    Some(format!(
        "this is {what}, not an rtprobe CSV: pass the per-probe CSV written with --out"
    ))
}

/// Column indices resolved from the header.
struct Columns {
    seq: usize,
    flow: Option<usize>,
    size: Option<usize>,
    x: Option<usize>,
    x_source: XSource,
    one_way: Option<usize>,
    rtt: Option<usize>,
    ts_source: Option<usize>,
    lost: Option<usize>,
    /// Stage columns to read, in [`Stage::ALL`] order (none unless asked).
    stages: [Option<usize>; STAGES],
    read_stages: bool,
    has_stages: bool,
    count: usize,
}

type FieldError = (Option<usize>, String);

impl Columns {
    fn from_header(
        header: &csv::ByteRecord,
        opts: &ReadOptions,
    ) -> Result<Columns, (Option<ColumnRef>, String)> {
        const KNOWN: [&str; 9] = [
            "seq",
            "flow",
            "size",
            "sched_ns",
            "send_ns",
            "one_way_ns",
            "rtt_ns",
            "ts_source",
            "lost",
        ];
        let mut idx: [Option<usize>; 9] = [None; 9];
        let stage_names = Stage::ALL.map(stage_column);
        let mut stages: [Option<usize>; STAGES] = [None; STAGES];
        for (i, raw) in header.iter().enumerate() {
            let name = trim_ascii(raw);
            if let Some(k) = stage_names.iter().position(|n| n.as_bytes() == name) {
                stages[k].get_or_insert(i);
                continue;
            }
            if let Some(k) = KNOWN.iter().position(|n| n.as_bytes() == name) {
                if idx[k].is_some() {
                    return Err((
                        Some(ColumnRef {
                            index: i + 1,
                            name: Some(KNOWN[k].into()),
                        }),
                        "the header names this column twice".into(),
                    ));
                }
                idx[k] = Some(i);
            }
        }
        let [seq, flow, size, sched, send, one_way, rtt, ts_source, lost] = idx;
        let Some(seq) = seq else {
            let line: Vec<&[u8]> = header.iter().collect();
            let preview = quote(&line.join(&b","[..]), 60);
            return Err((
                None,
                format!(
                    "not an rtprobe CSV: the header has no \"seq\" column (the line reads {preview}); \
                     pass a CSV written by rtprobe --out"
                ),
            ));
        };
        if one_way.is_none() && rtt.is_none() {
            return Err((
                None,
                "the header has neither one_way_ns nor rtt_ns: there is no latency to plot".into(),
            ));
        }
        let pick = |want: Want, col: Option<usize>, name: &str, other: &str| match (want, col) {
            (Want::Skip, _) => Ok(None),
            (Want::IfPresent, c) => Ok(c),
            (Want::Required, Some(c)) => Ok(Some(c)),
            (Want::Required, None) => Err((
                None,
                format!(
                    "this file has no {name} column: plot the other metric with --metric {other}"
                ),
            )),
        };
        let one_way = pick(opts.one_way, one_way, "one_way_ns", "rtt")?;
        let rtt = pick(opts.rtt, rtt, "rtt_ns", "one-way")?;
        if one_way.is_none() && rtt.is_none() {
            let missing = if opts.one_way == Want::Skip {
                "rtt_ns"
            } else {
                "one_way_ns"
            };
            return Err((
                None,
                format!("this file has no {missing} column: nothing to plot for that metric"),
            ));
        }
        let (x, x_source) = match (sched, send) {
            (Some(c), _) => (Some(c), XSource::SchedNs),
            (None, Some(c)) => (Some(c), XSource::SendNs),
            (None, None) => (None, XSource::Seq),
        };
        Ok(Columns {
            seq,
            flow,
            size,
            x,
            x_source,
            one_way,
            rtt,
            ts_source,
            lost,
            has_stages: stages.iter().any(Option::is_some),
            read_stages: opts.stages && stages.iter().any(Option::is_some),
            stages: if opts.stages { stages } else { [None; STAGES] },
            count: header.len(),
        })
    }
}

fn parse_row(
    rec: &csv::ByteRecord,
    cols: &Columns,
    opts: &ReadOptions,
    run: &mut CsvRun,
    flow_slot: &mut [u16; 256],
) -> Result<(), FieldError> {
    if rec.len() != cols.count {
        return Err(if rec.len() < cols.count {
            (
                Some(rec.len()),
                format!(
                    "the row ends early: {} of {} columns",
                    rec.len(),
                    cols.count
                ),
            )
        } else {
            (
                Some(cols.count),
                format!(
                    "the row has {} columns but the header has {}",
                    rec.len(),
                    cols.count
                ),
            )
        });
    }
    let field = |i: usize| rec.get(i).unwrap_or(b"");
    let seq = parse_u64(field(cols.seq)).ok_or_else(|| {
        (
            Some(cols.seq),
            format!(
                "expected a sequence number (integer >= 0), found {}",
                quote(field(cols.seq), 40)
            ),
        )
    })?;
    let flow = match cols.flow {
        None => 0u8,
        Some(c) => {
            let f = field(c);
            if trim_ascii(f).is_empty() {
                0
            } else {
                parse_u64(f)
                    .and_then(|v| u8::try_from(v).ok())
                    .ok_or_else(|| {
                        (
                            Some(c),
                            format!("expected a flow id 0-255, found {}", quote(f, 40)),
                        )
                    })?
            }
        }
    };
    let x = match cols.x {
        Some(c) => parse_i64(field(c)).ok_or_else(|| {
            (
                Some(c),
                format!(
                    "expected a time in nanoseconds, found {}",
                    quote(field(c), 40)
                ),
            )
        })?,
        None => i64::try_from(seq).map_err(|_| {
            (
                Some(cols.seq),
                format!("sequence number {seq} is too large"),
            )
        })?,
    };
    let size = match cols.size {
        None => None,
        Some(c) => opt_field(field(c), c, "a size in bytes", |b| {
            parse_u64(b).and_then(|v| u32::try_from(v).ok())
        })?,
    };
    let lost = match cols.lost {
        None => None,
        Some(c) => match trim_ascii(field(c)) {
            b"0" => Some(false),
            b"1" => Some(true),
            other => {
                return Err((
                    Some(c),
                    format!("expected 0 or 1 (lost), found {}", quote(other, 40)),
                ));
            }
        },
    };
    let latency = |c: Option<usize>| -> Result<Option<i64>, FieldError> {
        match c {
            None => Ok(None),
            Some(c) => opt_field(field(c), c, "a latency in nanoseconds", parse_i64),
        }
    };
    let one_way = latency(cols.one_way)?;
    let rtt = latency(cols.rtt)?;
    let mut stage_values = [None; STAGES];
    if cols.read_stages {
        for (v, c) in stage_values.iter_mut().zip(cols.stages) {
            if let Some(c) = c {
                *v = opt_field(field(c), c, "a duration in nanoseconds", parse_i64)?;
            }
        }
    }

    // Everything parsed: only now touch the accumulators, so a bad row
    // (e.g. a skipped truncated line) leaves no half-recorded probe behind.
    let slot = &mut flow_slot[flow as usize];
    if *slot == u16::MAX {
        *slot = run.flows.len() as u16;
        run.flows.push(FlowData {
            flow,
            rows: 0,
            lost: 0,
            lost_x: TimeGrid::new(opts.columns),
            one_way: cols.one_way.map(|_| Series::new(opts)),
            rtt: cols.rtt.map(|_| Series::new(opts)),
            size: None,
            sizes_vary: false,
            first_x: [None; 2],
            ts: TsCounts::default(),
            stages: cols
                .read_stages
                .then(|| Box::new(std::array::from_fn(|_| Dist::new(opts.exact_limit)))),
        });
    }
    let fd = &mut run.flows[*slot as usize];
    run.rows += 1;
    fd.rows += 1;
    match fd.first_x {
        [None, _] => fd.first_x[0] = Some(x),
        [Some(_), None] => fd.first_x[1] = Some(x),
        _ => {}
    }
    if let Some(s) = size {
        match fd.size {
            None if !fd.sizes_vary => fd.size = Some(s),
            Some(prev) if prev != s => {
                fd.size = None;
                fd.sizes_vary = true;
            }
            _ => {}
        }
    }
    if let Some(c) = cols.ts_source {
        match trim_ascii(field(c)) {
            b"hw" => fd.ts.hw += 1,
            b"sw" => fd.ts.sw += 1,
            b"mixed" => fd.ts.mixed += 1,
            b"" => {}
            _ => fd.ts.other += 1,
        }
    }
    // Without a lost column, a probe with no latency at all was lost.
    let lost = lost.unwrap_or(one_way.is_none() && rtt.is_none());
    if lost {
        fd.lost += 1;
        fd.lost_x.record_lost(x);
    }
    if let Some(st) = &mut fd.stages {
        for (d, v) in st.iter_mut().zip(stage_values) {
            if let Some(v) = v {
                d.record(v);
            }
        }
    }
    for (series, v) in [(&mut fd.one_way, one_way), (&mut fd.rtt, rtt)] {
        if let Some(s) = series {
            match v {
                Some(v) => {
                    s.dist.record(v);
                    s.time.record(x, v);
                }
                None if !lost => s.missing += 1,
                None => {}
            }
        }
    }
    Ok(())
}

/// An optional cell: empty means "not available".
fn opt_field<T>(
    raw: &[u8],
    col: usize,
    what: &str,
    parse: impl Fn(&[u8]) -> Option<T>,
) -> Result<Option<T>, FieldError> {
    if trim_ascii(raw).is_empty() {
        return Ok(None);
    }
    parse(raw).map(Some).ok_or_else(|| {
        (
            Some(col),
            format!("expected {what}, found {}", quote(raw, 40)),
        )
    })
}

fn trim_ascii(b: &[u8]) -> &[u8] {
    b.trim_ascii()
}

/// Decimal integer with optional sign; `None` on anything else or overflow.
pub fn parse_i64(raw: &[u8]) -> Option<i64> {
    let b = trim_ascii(raw);
    let (neg, digits) = match b {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, b),
    };
    if digits.is_empty() {
        return None;
    }
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        // Accumulate negatively so i64::MIN parses too.
        v = v.checked_mul(10)?.checked_sub((d - b'0') as i64)?;
    }
    if neg { Some(v) } else { v.checked_neg() }
}

fn parse_u64(raw: &[u8]) -> Option<u64> {
    let b = trim_ascii(raw);
    let digits = b.strip_prefix(b"+").unwrap_or(b);
    if digits.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add((d - b'0') as u64)?;
    }
    Some(v)
}

/// A cell as shown in errors: quoted, escaped, at most `max` characters.
fn quote(raw: &[u8], max: usize) -> String {
    if raw.is_empty() {
        return "an empty cell".into();
    }
    let s = String::from_utf8_lossy(raw);
    let mut out: String = s.chars().take(max).collect();
    if s.chars().count() > max {
        out.push('…');
    }
    format!("\"{}\"", out.escape_debug())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::{
        export::csv::{HEADER, format_row},
        model::record::{ProbeRecord, TsSource},
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
        let cases: Vec<(Vec<u8>, &str)> = vec![
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
                b"seq,one_way_ns\n\xff\xfe,\x00\n".to_vec(),
                "t.csv: line 2, column 1 (seq): expected a sequence number (integer >= 0), found \"\u{fffd}\u{fffd}\"",
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
                format!("{good}1,0,64\n2,0,64,1,1,1,1,1,1,1,sw,sw,sw,sw,0{tail}\n").into_bytes(),
                &ends_early,
            ),
            (
                format!("{good}1,0,64,1,1,1,1,1,1,1,sw,sw,sw,sw,0{tail},extra\n").into_bytes(),
                &too_long,
            ),
            (format!("{good}1,0,64,1000,10").into_bytes(), &cut_short),
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
            (
                b"{\"sent\": 10}\n".to_vec(),
                "t.csv: line 1: this is JSON (the --json summary?), not an rtprobe CSV: pass the per-probe CSV written with --out",
            ),
        ];
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
                                let _ =
                                    crate::export::plot::stats::box_stats_of(&d.clone().finish());
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
}
