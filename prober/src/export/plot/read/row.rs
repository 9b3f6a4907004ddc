//! One CSV row at a time: the header resolved into column indices
//! ([`Columns`]), each row's cells parsed and checked, and a valid row
//! recorded into its flow. Errors are a column and a message; the caller
//! adds the file and line.

use super::super::{
    dist::{Dist, TimeGrid},
    run_data::{
        ColumnRef, CsvRun, FlowData, ReadOptions, STAGES, Series, TsCounts, Want, XSource,
        stage_column,
    },
};
use crate::stats::chain::Stage;

/// Column indices resolved from the header.
pub(super) struct Columns {
    seq: usize,
    flow: Option<usize>,
    size: Option<usize>,
    x: Option<usize>,
    pub(super) x_source: XSource,
    one_way: Option<usize>,
    rtt: Option<usize>,
    ts_source: Option<usize>,
    lost: Option<usize>,
    /// Stage columns to read, in [`Stage::ALL`] order (none unless asked).
    stages: [Option<usize>; STAGES],
    read_stages: bool,
    pub(super) has_stages: bool,
    count: usize,
}

pub(super) type FieldError = (Option<usize>, String);

/// What a header lacks or has twice: the column, when one is to blame.
type HeaderError = (Option<ColumnRef>, String);

/// The columns [`Columns::from_header`] looks for besides the stages, in
/// the order of its index array.
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

impl Columns {
    pub(super) fn from_header(
        header: &csv::ByteRecord,
        opts: &ReadOptions,
    ) -> Result<Columns, HeaderError> {
        let (idx, stages) = locate(header)?;
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
        let (one_way, rtt) = latency_columns(opts, one_way, rtt)?;
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

/// Where [`locate`] found each [`KNOWN`] column and each stage column.
type Located = ([Option<usize>; 9], [Option<usize>; STAGES]);

/// The index of each [`KNOWN`] column and each stage column in `header`
/// (the first of a stage named twice); a known column named twice is an
/// error.
fn locate(header: &csv::ByteRecord) -> Result<Located, HeaderError> {
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
    Ok((idx, stages))
}

/// The latency columns to read, as `opts` wants them: at least one.
fn latency_columns(
    opts: &ReadOptions,
    one_way: Option<usize>,
    rtt: Option<usize>,
) -> Result<(Option<usize>, Option<usize>), HeaderError> {
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
            format!("this file has no {name} column: plot the other metric with --metric {other}"),
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
    Ok((one_way, rtt))
}

/// One probe row's cells, parsed and checked.
struct Row<'a> {
    flow: u8,
    /// Where the probe goes on the x axis (see [`XSource`]).
    x: i64,
    size: Option<u32>,
    /// The `lost` cell, if the file has the column.
    lost: Option<bool>,
    one_way: Option<i64>,
    rtt: Option<i64>,
    stages: [Option<i64>; STAGES],
    ts_source: Option<&'a [u8]>,
}

/// Parses one row and, only if every cell is valid, records it in `run`,
/// so a bad row (e.g. a skipped truncated line) leaves no half-recorded
/// probe behind.
pub(super) fn parse_row(
    rec: &csv::ByteRecord,
    cols: &Columns,
    opts: &ReadOptions,
    run: &mut CsvRun,
    flow_slot: &mut [u16; 256],
) -> Result<(), FieldError> {
    let row = parse_cells(rec, cols)?;
    let slot = &mut flow_slot[row.flow as usize];
    if *slot == u16::MAX {
        *slot = run.flows.len() as u16;
        run.flows.push(new_flow(row.flow, cols, opts));
    }
    run.rows += 1;
    record_row(&mut run.flows[*slot as usize], &row);
    Ok(())
}

fn check_row_length(rec: &csv::ByteRecord, cols: &Columns) -> Result<(), FieldError> {
    if rec.len() < cols.count {
        Err((
            Some(rec.len()),
            format!(
                "the row ends early: {} of {} columns",
                rec.len(),
                cols.count
            ),
        ))
    } else if rec.len() > cols.count {
        Err((
            Some(cols.count),
            format!(
                "the row has {} columns but the header has {}",
                rec.len(),
                cols.count
            ),
        ))
    } else {
        Ok(())
    }
}

/// The cells of one row, each checked; the first bad one is the error.
fn parse_cells<'a>(rec: &'a csv::ByteRecord, cols: &Columns) -> Result<Row<'a>, FieldError> {
    check_row_length(rec, cols)?;
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
        Some(c) => parse_flow(field(c), c)?,
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
        Some(c) => Some(parse_lost(field(c), c)?),
    };
    let latency = |c: Option<usize>| -> Result<Option<i64>, FieldError> {
        match c {
            None => Ok(None),
            Some(c) => opt_field(field(c), c, "a latency in nanoseconds", parse_i64),
        }
    };
    let one_way = latency(cols.one_way)?;
    let rtt = latency(cols.rtt)?;
    let mut stages = [None; STAGES];
    if cols.read_stages {
        for (v, c) in stages.iter_mut().zip(cols.stages) {
            if let Some(c) = c {
                *v = opt_field(field(c), c, "a duration in nanoseconds", parse_i64)?;
            }
        }
    }
    Ok(Row {
        flow,
        x,
        size,
        lost,
        one_way,
        rtt,
        stages,
        ts_source: cols.ts_source.map(field),
    })
}

/// A flow id cell: empty is flow 0.
fn parse_flow(f: &[u8], c: usize) -> Result<u8, FieldError> {
    if trim_ascii(f).is_empty() {
        return Ok(0);
    }
    parse_u64(f)
        .and_then(|v| u8::try_from(v).ok())
        .ok_or_else(|| {
            (
                Some(c),
                format!("expected a flow id 0-255, found {}", quote(f, 40)),
            )
        })
}

fn parse_lost(f: &[u8], c: usize) -> Result<bool, FieldError> {
    match trim_ascii(f) {
        b"0" => Ok(false),
        b"1" => Ok(true),
        other => Err((
            Some(c),
            format!("expected 0 or 1 (lost), found {}", quote(other, 40)),
        )),
    }
}

/// A flow seen for the first time: empty series for the columns read.
fn new_flow(flow: u8, cols: &Columns, opts: &ReadOptions) -> FlowData {
    FlowData {
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
    }
}

/// Adds one valid row to its flow.
fn record_row(fd: &mut FlowData, row: &Row) {
    let x = row.x;
    fd.rows += 1;
    match fd.first_x {
        [None, _] => fd.first_x[0] = Some(x),
        [Some(_), None] => fd.first_x[1] = Some(x),
        _ => {}
    }
    if let Some(s) = row.size {
        match fd.size {
            None if !fd.sizes_vary => fd.size = Some(s),
            Some(prev) if prev != s => {
                fd.size = None;
                fd.sizes_vary = true;
            }
            _ => {}
        }
    }
    if let Some(ts) = row.ts_source {
        match trim_ascii(ts) {
            b"hw" => fd.ts.hw += 1,
            b"sw" => fd.ts.sw += 1,
            b"mixed" => fd.ts.mixed += 1,
            b"" => {}
            _ => fd.ts.other += 1,
        }
    }
    // Without a lost column, a probe with no latency at all was lost.
    let lost = row
        .lost
        .unwrap_or(row.one_way.is_none() && row.rtt.is_none());
    if lost {
        fd.lost += 1;
        fd.lost_x.record_lost(x);
    }
    if let Some(st) = &mut fd.stages {
        for (d, v) in st.iter_mut().zip(row.stages) {
            if let Some(v) = v {
                d.record(v);
            }
        }
    }
    for (series, v) in [(&mut fd.one_way, row.one_way), (&mut fd.rtt, row.rtt)] {
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
pub(super) fn parse_i64(raw: &[u8]) -> Option<i64> {
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

pub(super) fn parse_u64(raw: &[u8]) -> Option<u64> {
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
pub(super) fn quote(raw: &[u8], max: usize) -> String {
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
