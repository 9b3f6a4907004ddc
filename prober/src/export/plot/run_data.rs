//! What the input readers produce and take: per run and flow, each
//! metric's distribution and time series ([`CsvRun`], [`FlowData`],
//! [`Series`]), the options a reader takes ([`ReadOptions`]) and the
//! error it returns ([`ReadError`]). Both readers, the CSV one
//! ([`super::read`]) and the HdrHistogram interval log one
//! ([`super::hdrlog_read`]), fill these types and the figures read them,
//! so neither reader depends on the other.

use std::fmt;

use super::dist::{self, Dist, TimeGrid};
use crate::{model::meta::RunMeta, stats::chain::Stage};

/// How many stages the chain splits into.
pub(crate) const STAGES: usize = Stage::ALL.len();

/// The CSV column of a stage: `path` -> `path_ns`.
pub(crate) fn stage_column(s: Stage) -> String {
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
pub(crate) enum XSource {
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
    pub(crate) missing: u64,
}

/// How many rows named each timestamp source (`ts_source` column).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TsCounts {
    pub(crate) hw: u64,
    pub(crate) sw: u64,
    pub(crate) mixed: u64,
    pub(crate) other: u64,
}

impl TsCounts {
    /// "sw", "hw", "hw+sw" (several sources in one run) or `None`.
    pub(crate) fn describe(&self) -> Option<&'static str> {
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
    pub(crate) fn new(opts: &ReadOptions) -> Series {
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
    pub(crate) flow: u8,
    pub rows: u64,
    pub(crate) lost: u64,
    /// Where the lost probes were (counted per column).
    pub(crate) lost_x: TimeGrid,
    pub one_way: Option<Series>,
    pub rtt: Option<Series>,
    /// Probe size if every row with a `size` cell agrees.
    pub(crate) size: Option<u32>,
    pub(crate) sizes_vary: bool,
    /// x of the first two rows: their difference is the probe interval
    /// when x is a time (files without metadata).
    pub(crate) first_x: [Option<i64>; 2],
    pub(crate) ts: TsCounts,
    /// Per stage in [`Stage::ALL`] order, every value present (read only
    /// with [`ReadOptions::stages`] and a header that has the columns).
    pub(crate) stages: Option<Box<[Dist; STAGES]>>,
}

impl FlowData {
    /// Interval between the first two probes, if x is a time.
    pub(crate) fn inferred_interval_ns(&self, src: XSource) -> Option<u64> {
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
    pub(crate) name: String,
    pub(crate) meta: Option<RunMeta>,
    pub(crate) x_source: XSource,
    /// One entry per flow id seen, in increasing flow id.
    pub flows: Vec<FlowData>,
    pub rows: u64,
    /// Line number of a cut-short last line that was skipped.
    pub(crate) skipped_truncated_line: Option<u64>,
    /// The header has the stage columns (written since rtprobe records the
    /// timestamp chain), whether or not they were read.
    pub(crate) has_stage_columns: bool,
    /// Read from an HdrHistogram interval log: latencies only, no probe
    /// rows, so nothing is known about losses.
    pub(crate) from_hdr_log: bool,
}

/// A CSV column an error points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ColumnRef {
    /// 1-based field number in the row.
    pub(crate) index: usize,
    /// Header name, if the header has that many columns.
    pub(crate) name: Option<String>,
}

/// Malformed or unreadable input, with the place to look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    pub(crate) file: String,
    /// 1-based line number, `None` for errors about the file as a whole.
    pub(crate) line: Option<u64>,
    pub(crate) column: Option<ColumnRef>,
    pub(crate) message: String,
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
