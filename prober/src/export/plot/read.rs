//! Streaming reader for rtprobe's per-probe CSV (see `export::csv`).
//!
//! It keeps only what a figure needs, in memory that does not grow with the
//! file: per flow and metric a [`Dist`] (exact samples up to
//! [`super::dist::EXACT_LIMIT`], then an HDR histogram) and a [`TimeGrid`] (the
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
//! proptest in `read/tests.rs` feed it.

use std::{
    fs::File,
    io::{self, BufRead, BufReader, Read},
    path::Path,
};

use self::row::{Columns, parse_row};
use super::{
    hdrlog_read,
    run_data::{ColumnRef, CsvRun, ReadError, ReadOptions},
};
use crate::{export::csv::META_PREFIX, input::LineCapped, model::meta::RunMeta};

/// Checks that `path` is a readable file before any reading starts, so a
/// typo in the last of several paths fails at once.
pub(crate) fn check_input(path: &Path) -> Result<(), ReadError> {
    open(path).map(drop)
}

/// Opens and reads one CSV file.
#[cfg(test)]
pub(crate) fn read_csv_file(path: &Path, opts: &ReadOptions) -> Result<CsvRun, ReadError> {
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
    let is_log = hdrlog_read::sniff(&head);
    let input = io::Cursor::new(head).chain(file);
    if is_log {
        hdrlog_read::read_hdr_log(&name, input, opts)
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
    // A file without newlines must not become one record in memory.
    let input = crate::input::LineCapped::new(input, crate::input::MAX_CSV_LINE_BYTES);
    let mut buf = BufReader::with_capacity(64 * 1024, LastByte::new(input));
    let (meta, line_offset, replay) = read_meta_line(name, &mut buf)?;

    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        // Row lengths are checked here, to tell a cut-short last line apart.
        .flexible(true)
        .comment(Some(b'#'))
        .from_reader(io::Cursor::new(replay).chain(buf));
    let header = read_header(name, &mut rdr, meta.is_some(), line_offset, opts)?;

    let mut run = CsvRun {
        name: name.to_string(),
        meta,
        x_source: header.cols.x_source,
        flows: Vec::new(),
        rows: 0,
        skipped_truncated_line: None,
        has_stage_columns: header.cols.has_stages,
        from_hdr_log: false,
    };
    let last_line = read_rows(name, &mut rdr, &header, line_offset, opts, &mut run)?;
    if run.rows == 0 {
        let msg = if run.skipped_truncated_line.is_some() {
            "no complete probe row after the header: nothing to plot"
        } else {
            "no probe rows after the header: nothing to plot (did the run send any probe?)"
        };
        return Err(csv_error(name, Some(last_line + 1), None, msg.into()));
    }
    run.flows.sort_by_key(|f| f.flow);
    Ok(run)
}

/// The bytes the CSV parser reads: the first line again (when it was not
/// the metadata), then the rest of the input.
type CsvSource<R> = io::Chain<io::Cursor<Vec<u8>>, BufReader<LastByte<LineCapped<R>>>>;

fn csv_error(
    name: &str,
    line: Option<u64>,
    column: Option<ColumnRef>,
    message: String,
) -> ReadError {
    ReadError {
        file: name.to_string(),
        line,
        column,
        message,
    }
}

fn read_failed(name: &str, line: Option<u64>, e: io::Error) -> ReadError {
    csv_error(name, line, None, format!("read failed: {e}"))
}

/// Reads the first line: the run metadata (`# rtprobe-meta: {json}`) if it
/// is that, else an input of another kind is refused with what it is.
/// Returns the metadata, the lines it took (0 or 1) and the bytes the CSV
/// parser must read again (the first line when it is not the metadata).
fn read_meta_line<B: BufRead>(
    name: &str,
    buf: &mut B,
) -> Result<(Option<RunMeta>, u64, Vec<u8>), ReadError> {
    let err = |message: String| csv_error(name, Some(1), None, message);
    let mut first = Vec::new();
    buf.take(MAX_META_LINE)
        .read_until(b'\n', &mut first)
        .map_err(|e| read_failed(name, Some(1), e))?;
    if first.is_empty() {
        return Err(err(
            "the file is empty: expected a CSV written by rtprobe (header seq,...,one_way_ns,rtt_ns,...)"
                .into(),
        ));
    }
    if let Some(kind) = sniff_foreign(&first) {
        return Err(err(kind));
    }
    let body = strip_bom(&first);
    let meta_tag = META_PREFIX.trim_end();
    if !body.starts_with(meta_tag.as_bytes()) {
        return Ok((None, 0, first));
    }
    if !first.ends_with(b"\n") && first.len() as u64 >= MAX_META_LINE {
        return Err(err(
            "the run metadata line is longer than 64 KiB: this is not a CSV rtprobe wrote".into(),
        ));
    }
    let json = trim_eol(&body[meta_tag.len()..]);
    let meta = serde_json::from_slice::<RunMeta>(json).map_err(|e| {
        let msg = e.to_string();
        // serde_json appends " at line L column C"; say it in CSV terms.
        let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
        err(format!(
            "the run metadata ({meta_tag}) is not valid JSON at character {}: {msg}",
            meta_tag.len() + e.column()
        ))
    })?;
    Ok((Some(meta), 1, Vec::new()))
}

/// The CSV header: which column holds what, where it is, and the names
/// errors quote.
struct Header {
    cols: Columns,
    /// Line number of the header in the file.
    line: u64,
    names: Vec<String>,
}

impl Header {
    fn column(&self, i: usize) -> ColumnRef {
        ColumnRef {
            index: i + 1,
            name: self.names.get(i).cloned(),
        }
    }
}

fn read_header<R: Read>(
    name: &str,
    rdr: &mut csv::Reader<CsvSource<R>>,
    has_meta: bool,
    line_offset: u64,
    opts: &ReadOptions,
) -> Result<Header, ReadError> {
    let mut header = csv::ByteRecord::new();
    let got = rdr
        .read_byte_record(&mut header)
        .map_err(|e| read_failed(name, Some(line_offset + 1), csv_io(e)))?;
    if !got {
        let msg = if has_meta {
            "no CSV header after the run metadata: the run wrote nothing else (it stopped before the first probe?)"
        } else {
            "the file has no CSV lines: expected a CSV written by rtprobe (header seq,...,one_way_ns,rtt_ns,...)"
        };
        return Err(csv_error(name, Some(line_offset + 1), None, msg.into()));
    }
    let line = header.position().map_or(1, |p| p.line()) + line_offset;
    let cols = Columns::from_header(&header, opts)
        .map_err(|(column, message)| csv_error(name, Some(line), column, message))?;
    let names = header
        .iter()
        .map(|f| String::from_utf8_lossy(f).trim().to_string())
        .collect();
    Ok(Header { cols, line, names })
}

/// Reads the probe rows into `run`; returns the number of the last line
/// read. A bad row is an error, unless it is a cut-short last line and
/// `--ignore-truncated` says to skip it.
fn read_rows<R: Read>(
    name: &str,
    rdr: &mut csv::Reader<CsvSource<R>>,
    header: &Header,
    line_offset: u64,
    opts: &ReadOptions,
    run: &mut CsvRun,
) -> Result<u64, ReadError> {
    // flow id -> index in run.flows
    let mut flow_slot = [u16::MAX; 256];
    let mut rec = csv::ByteRecord::new();
    let mut last_line = header.line;
    loop {
        let more = rdr
            .read_byte_record(&mut rec)
            .map_err(|e| read_failed(name, Some(last_line + 1), csv_io(e)))?;
        if !more {
            return Ok(last_line);
        }
        let line = rec.position().map_or(last_line + 1, |p| p.line()) + line_offset;
        last_line = line;
        let Err((column, message)) = parse_row(&rec, &header.cols, opts, run, &mut flow_slot)
        else {
            continue;
        };
        let row_err = csv_error(name, Some(line), column.map(|c| header.column(c)), message);
        if !is_cut_short_last_line(rdr) {
            return Err(row_err);
        }
        if opts.allow_truncated {
            run.skipped_truncated_line = Some(line);
            return Ok(last_line);
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
}

/// Whether the row just read is the last one and lacks its newline: a
/// write cut short (run killed, disk full), not a corrupt file.
fn is_cut_short_last_line<R: Read>(rdr: &mut csv::Reader<CsvSource<R>>) -> bool {
    let mut next = csv::ByteRecord::new();
    let is_last = matches!(rdr.read_byte_record(&mut next), Ok(false));
    let unterminated = !matches!(
        rdr.get_ref().get_ref().1.get_ref().last,
        Some(b'\n' | b'\r')
    );
    is_last && unterminated
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

mod row;
#[cfg(test)]
pub(crate) mod tests;
