//! `rtprobe plot FLOWS.csv` of an `rtprobe flows` CSV (one row per sampled
//! TCP send, header [`SENDS_CSV_HEADER`]; a flow is one socket cookie),
//! drawn as two figures:
//!
//! - `PREFIX-flows-stages`: where each flow's sends spend their time: one
//!   horizontal stacked bar per flow (the [`TOP_FLOWS`] most sampled),
//!   labelled `comm local -> remote (N sends)`, its segments the p50 of
//!   each stage (stack, sender queue, NIC, round trip) in µs; a stage the
//!   flow never reported is simply absent;
//! - `PREFIX-flows-time`: each stage over time, every flow's sends as
//!   points, x in seconds since the first sample, y in µs on a log axis:
//!   a queue building up shows as a rising cloud.
//!
//! Several flows CSVs are read together, as one run: one set of figures,
//! their flows side by side (time_ns is CLOCK_REALTIME, so the runs share
//! a clock; a cookie seen in two files counts as one flow).
//!
//! Memory does not grow with the file: each CSV is streamed twice, rows
//! capped in length ([`LineCapped`]). The first pass feeds the stage
//! histograms of `stats::passive` (the same p50s `rtprobe flows` prints;
//! at most [`MAX_FLOWS`] flows itemized) and finds the time and value
//! ranges; the second keeps one point per stage and 2x2-pixel cell. Rows
//! of given-up sends count (samples, notes) with their stages empty. A
//! malformed row is a [`ReadError`] naming the file, line and column.

use std::{
    collections::HashSet,
    fs::File,
    io::{BufReader, Read},
    path::{Path, PathBuf},
    str::FromStr,
};

use anyhow::{Result, anyhow, bail};
use plotters::{coord::Shift, prelude::*};

use super::{
    ImageFormat, PlotOptions,
    axis::{Unit, ValueAxis, format_count, format_number, nice_ticks},
    draw::{FAMILY, Ticked, color, font, register_font},
    run_data::{ColumnRef, ReadError},
};
use crate::{
    export::passive::SENDS_CSV_HEADER,
    input::{LineCapped, MAX_CSV_LINE_BYTES},
    model::passive::SampledSend,
    stats::passive::{FlowSummary, PassiveStats},
};

/// Flows drawn as bars: the most sampled.
pub(crate) const TOP_FLOWS: usize = 10;
/// Flows itemized while reading (the first seen); the sends of others
/// still count in the totals and the time figure.
pub(crate) const MAX_FLOWS: usize = 4096;

/// The stages in the order of a send ([`SampledSend::stages`]): legend
/// name and colour index (no red: that is the study's baseline).
const STAGES: [(&str, usize); 4] = [
    ("stack", 1),
    ("sender queue", 3),
    ("NIC", 2),
    ("round trip", 4),
];

/// Whether a file's first bytes are a flows CSV: its first line is
/// exactly [`SENDS_CSV_HEADER`].
pub(crate) fn sniff(head: &[u8]) -> bool {
    let first = head.split(|&b| b == b'\n').next().unwrap_or_default();
    first.strip_suffix(b"\r").unwrap_or(first) == SENDS_CSV_HEADER.as_bytes()
}

/// Whether the file at `path` is a flows CSV (reads its first line only).
pub(crate) fn is_flows_csv(path: &Path) -> bool {
    let Ok(f) = File::open(path) else {
        return false;
    };
    let mut head = Vec::new();
    f.take(SENDS_CSV_HEADER.len() as u64 + 2)
        .read_to_end(&mut head)
        .is_ok()
        && sniff(&head)
}

/// Cells of a row.
const COLUMNS: usize = 14;

type CellError = (usize, String);

fn column_ref(i: usize) -> ColumnRef {
    ColumnRef {
        index: i + 1,
        name: SENDS_CSV_HEADER.split(',').nth(i).map(str::to_string),
    }
}

fn cell(rec: &csv::ByteRecord, i: usize) -> Result<&str, CellError> {
    let b = rec.get(i).unwrap_or_default();
    std::str::from_utf8(b)
        .map(str::trim)
        .map_err(|_| (i, "not UTF-8 text".to_string()))
}

fn num<T: FromStr>(rec: &csv::ByteRecord, i: usize, what: &str) -> Result<T, CellError> {
    let s = cell(rec, i)?;
    s.parse().map_err(|_| (i, format!("{s:?} is not {what}")))
}

/// A stage cell: empty where the stage was not seen.
fn stage(rec: &csv::ByteRecord, i: usize) -> Result<Option<u64>, CellError> {
    if cell(rec, i)?.is_empty() {
        return Ok(None);
    }
    num(rec, i, "a time in ns (or empty)").map(Some)
}

fn flag(rec: &csv::ByteRecord, i: usize) -> Result<bool, CellError> {
    match cell(rec, i)? {
        "0" => Ok(false),
        "1" => Ok(true),
        s => Err((i, format!("{s:?} is not 0 or 1"))),
    }
}

/// One row as the send it records; the error names the column (0-based).
fn parse_send(rec: &csv::ByteRecord) -> Result<SampledSend, CellError> {
    if rec.len() != COLUMNS {
        let at = rec.len().min(COLUMNS);
        return Err((
            at,
            format!(
                "{} cells where the header has {COLUMNS}: a cut-short or edited row",
                rec.len()
            ),
        ));
    }
    let addr = "a socket address (10.0.0.1:40000, [fd00::2]:5201)";
    Ok(SampledSend {
        time_ns: num(rec, 0, "a time in ns")?,
        cookie: num(rec, 1, "a socket cookie (a whole number)")?,
        pid: num(rec, 2, "a process id")?,
        comm: cell(rec, 3)?.to_string(),
        cgroup_id: num(rec, 4, "a cgroup id")?,
        local: num(rec, 5, addr)?,
        remote: num(rec, 6, addr)?,
        bytes: num(rec, 7, "a byte count")?,
        stack_ns: stage(rec, 8)?,
        sender_queue_ns: stage(rec, 9)?,
        nic_ns: stage(rec, 10)?,
        round_trip_ns: stage(rec, 11)?,
        given_up: flag(rec, 12)?,
        retransmitted: flag(rec, 13)?,
    })
}

/// Streams the rows of a flows CSV from `input` (`name` in errors) into
/// `each`; returns how many there were. The first line must be the
/// header; a flows CSV without rows is an error.
pub(crate) fn read_sends<R: Read>(
    name: &str,
    input: R,
    mut each: impl FnMut(SampledSend),
) -> Result<u64, ReadError> {
    let err = |line: u64, column: Option<usize>, message: String| ReadError {
        file: name.to_string(),
        line: Some(line),
        column: column.map(column_ref),
        message,
    };
    let input = BufReader::with_capacity(64 * 1024, LineCapped::new(input, MAX_CSV_LINE_BYTES));
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(input);
    let mut rec = csv::ByteRecord::new();
    let got = rdr
        .read_byte_record(&mut rec)
        .map_err(|e| err(1, None, format!("read failed: {e}")))?;
    if !got
        || !rec
            .iter()
            .eq(SENDS_CSV_HEADER.split(',').map(str::as_bytes))
    {
        return Err(err(
            1,
            None,
            format!("not an `rtprobe flows` CSV: the first line must be {SENDS_CSV_HEADER}"),
        ));
    }
    let (mut rows, mut last_line) = (0u64, 1u64);
    loop {
        let more = rdr
            .read_byte_record(&mut rec)
            .map_err(|e| err(last_line + 1, None, format!("read failed: {e}")))?;
        if !more {
            break;
        }
        let line = rec.position().map_or(last_line + 1, |p| p.line());
        last_line = line;
        let send = parse_send(&rec).map_err(|(c, m)| err(line, Some(c), m))?;
        each(send);
        rows += 1;
    }
    if rows == 0 {
        return Err(err(
            last_line + 1,
            None,
            "no sampled send after the header: nothing to plot (did `rtprobe flows` sample a send?)"
                .into(),
        ));
    }
    Ok(rows)
}

/// Streams every input in turn.
fn read_inputs(opts: &PlotOptions, mut each: impl FnMut(SampledSend)) -> Result<u64> {
    let mut rows = 0;
    for p in &opts.inputs {
        let file = File::open(p).map_err(|e| anyhow!("cannot read {}: {e}", p.display()))?;
        rows += read_sends(&p.display().to_string(), file, &mut each)?;
    }
    Ok(rows)
}

/// What the first pass keeps.
pub(crate) struct FlowsData {
    pub(crate) stats: PassiveStats,
    pub(crate) rows: u64,
    pub(crate) given_up: u64,
    /// First and last send time, CLOCK_REALTIME ns.
    pub(crate) time_ns: Option<(i64, i64)>,
    /// Least and greatest stage time of any send, ns (at least 1).
    pub(crate) stage_ns: Option<(u64, u64)>,
}

impl FlowsData {
    pub(crate) fn new() -> Self {
        Self {
            stats: PassiveStats::new(MAX_FLOWS),
            rows: 0,
            given_up: 0,
            time_ns: None,
            stage_ns: None,
        }
    }

    pub(crate) fn record(&mut self, s: &SampledSend) {
        self.stats.record(s);
        self.rows += 1;
        self.given_up += u64::from(s.given_up);
        let t = s.time_ns;
        self.time_ns = Some(self.time_ns.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
        for v in s.stages().into_iter().flatten() {
            let v = v.max(1);
            self.stage_ns = Some(self.stage_ns.map_or((v, v), |(a, b)| (a.min(v), b.max(v))));
        }
    }
}

/// One bar of the stages figure: a flow's label and each stage's p50, ns.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct FlowBar {
    /// `comm local -> remote`.
    pub(crate) flow: String,
    /// The flow and its sample count.
    pub(crate) label: String,
    pub(crate) samples: u64,
    pub(crate) p50_ns: [Option<u64>; 4],
}

/// The bars of the [`TOP_FLOWS`] most sampled flows (`flows` comes most
/// sampled first, as [`PassiveStats::flows`] gives them).
pub(crate) fn bars(flows: &[FlowSummary]) -> Vec<FlowBar> {
    flows
        .iter()
        .take(TOP_FLOWS)
        .map(|f| {
            let s = &f.stages;
            let comm = if f.comm.is_empty() { "?" } else { &f.comm };
            let flow = format!("{comm} {} -> {}", f.local, f.remote);
            FlowBar {
                label: format!("{flow} ({} sends)", format_count(s.samples)),
                flow,
                samples: s.samples,
                p50_ns: [&s.stack, &s.sender_queue, &s.nic, &s.round_trip].map(|l| l.p50),
            }
        })
        .collect()
}

/// The stages figure, laid out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StagesFig {
    pub(crate) title: String,
    pub(crate) bars: Vec<FlowBar>,
    /// Right end of the µs axis.
    pub(crate) x_max_us: f64,
    pub(crate) notes: Vec<String>,
}

fn stages_fig(d: &FlowsData, opts: &PlotOptions) -> StagesFig {
    let flows = d.stats.flows();
    let bars = bars(&flows);
    let widest = bars
        .iter()
        .map(|b| b.p50_ns.iter().flatten().sum::<u64>())
        .max()
        .unwrap_or(0);
    let mut notes = vec![format!(
        "{} sampled sends of {} flow(s) from {}; segments: each stage's p50 over the flow's sends that reported it",
        format_count(d.rows),
        flows.len() + d.stats.flows_left_out(),
        inputs_named(opts)
    )];
    if flows.len() > bars.len() {
        notes.push(format!(
            "the {} most sampled of {} itemized flows shown",
            bars.len(),
            flows.len()
        ));
    }
    if d.stats.flows_left_out() > 0 {
        notes.push(format!(
            "{} flow(s) beyond the first {MAX_FLOWS} not itemized (their sends are in the time figure)",
            d.stats.flows_left_out()
        ));
    }
    if d.given_up > 0 {
        notes.push(given_up_note(d));
    }
    StagesFig {
        title: opts
            .title
            .clone()
            .unwrap_or_else(|| "Where each flow's sends spend their time (p50 per stage)".into()),
        bars,
        x_max_us: (widest as f64 / 1e3 * 1.05).max(1e-3),
        notes,
    }
}

fn given_up_note(d: &FlowsData) -> String {
    format!(
        "{} send(s) given up (no ACK in time): counted, without stages",
        format_count(d.given_up)
    )
}

fn inputs_named(opts: &PlotOptions) -> String {
    match opts.inputs.as_slice() {
        [one] => one.display().to_string(),
        many => format!("{} files", many.len()),
    }
}

/// The time figure, laid out: points in (seconds, axis coordinate).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TimeFig {
    pub(crate) title: String,
    pub(crate) x_max_s: f64,
    pub(crate) axis: ValueAxis,
    pub(crate) points: [Vec<(f64, f64)>; 4],
    pub(crate) notes: Vec<String>,
}

/// A log µs axis over `[lo_ns, hi_ns]` (both >= 1), with a little room.
pub(crate) fn us_log_axis(lo_ns: u64, hi_ns: u64) -> ValueAxis {
    let (lo, hi) = ((lo_ns as f64 / 1e3).log10(), (hi_ns as f64 / 1e3).log10());
    let pad = ((hi - lo) * 0.05).max(0.1);
    ValueAxis {
        unit: Unit::Us,
        log: true,
        lo: lo - pad,
        hi: hi + pad,
        fixed_hi: false,
    }
}

/// Points on a grid of cells: one per stage and occupied cell.
struct PointGrid {
    t0: i64,
    span_ns: f64,
    cols: u32,
    rows: u32,
    axis: ValueAxis,
    cells: [HashSet<(u32, u32)>; 4],
}

impl PointGrid {
    fn record(&mut self, s: &SampledSend) {
        let fx = if self.span_ns > 0.0 {
            (s.time_ns - self.t0) as f64 / self.span_ns
        } else {
            0.5
        };
        let col = ((fx * self.cols as f64) as u32).min(self.cols - 1);
        let a = &self.axis;
        for (cells, v) in self.cells.iter_mut().zip(s.stages()) {
            let Some(c) = v.and_then(|v| a.coord(v.max(1) as f64)) else {
                continue;
            };
            let fy = (c - a.lo) / (a.hi - a.lo);
            cells.insert((col, ((fy * self.rows as f64) as u32).min(self.rows - 1)));
        }
    }

    /// Cell centres in (seconds, axis coordinate), sorted.
    fn points(&self) -> [Vec<(f64, f64)>; 4] {
        let a = &self.axis;
        self.cells.each_ref().map(|cells| {
            let mut v: Vec<(u32, u32)> = cells.iter().copied().collect();
            v.sort_unstable();
            v.into_iter()
                .map(|(c, r)| {
                    let fx = (c as f64 + 0.5) / self.cols as f64;
                    let fy = (r as f64 + 0.5) / self.rows as f64;
                    (fx * self.span_ns / 1e9, a.lo + fy * (a.hi - a.lo))
                })
                .collect()
        })
    }
}

/// The second pass: the points of every send.
fn time_fig(d: &FlowsData, opts: &PlotOptions) -> Result<TimeFig> {
    let (Some((t0, t1)), Some((lo, hi))) = (d.time_ns, d.stage_ns) else {
        bail!("no stage times to draw");
    };
    let mut grid = PointGrid {
        t0,
        span_ns: (t1 - t0) as f64,
        cols: (opts.size_px.0 / 2).max(1),
        rows: (opts.size_px.1 / 2).max(1),
        axis: us_log_axis(lo, hi),
        cells: Default::default(),
    };
    read_inputs(opts, |s| grid.record(&s))?;
    let mut notes = vec![format!(
        "{} sampled sends, every flow; one point per stage where sends overlap within 2 px",
        format_count(d.rows)
    )];
    if d.given_up > 0 {
        notes.push(given_up_note(d));
    }
    Ok(TimeFig {
        title: opts
            .title
            .clone()
            .unwrap_or_else(|| "Each stage of the sampled sends over time".into()),
        x_max_s: grid.span_ns / 1e9,
        points: grid.points(),
        axis: grid.axis,
        notes,
    })
}

/// Draws `rtprobe flows` CSVs given to `rtprobe plot` (all of them
/// together): `PREFIX-flows-stages` and `PREFIX-flows-time` in each
/// format asked for; returns their paths.
pub(crate) fn plot(opts: &PlotOptions) -> Result<Vec<PathBuf>> {
    let mut data = FlowsData::new();
    read_inputs(opts, |s| data.record(&s))?;
    if data.stage_ns.is_none() {
        bail!(
            "nothing to plot: none of the {} sampled send(s) has a stage time (every send given up?)",
            data.rows
        );
    }
    super::prepare_out_dir(&opts.out_dir)?;
    let figs = [
        (Fig::Stages(stages_fig(&data, opts)), "flows-stages"),
        (Fig::Time(time_fig(&data, opts)?), "flows-time"),
    ];
    let mut written = Vec::new();
    for (fig, slug) in &figs {
        for &format in &opts.formats {
            let path = opts
                .out_dir
                .join(format!("{}-{slug}.{}", opts.prefix, format.ext()));
            save(fig, &path, format, opts.size_px)?;
            written.push(path);
        }
    }
    Ok(written)
}

/// A figure of this module.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fig {
    Stages(StagesFig),
    Time(TimeFig),
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

fn save(fig: &Fig, path: &Path, format: ImageFormat, size: (u32, u32)) -> Result<()> {
    register_font();
    let fail = |e: String| anyhow!("cannot write {}: {e}", path.display());
    match format {
        ImageFormat::Svg => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            draw_fig(fig, &root).map_err(|e| fail(e.to_string()))?;
            root.present().map_err(|e| fail(e.to_string()))
        }
        ImageFormat::Png => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            draw_fig(fig, &root).map_err(|e| fail(e.to_string()))?;
            root.present().map_err(|e| fail(e.to_string()))
        }
    }
}

/// The figure as an SVG document in memory (for tests).
#[cfg(test)]
pub(crate) fn to_svg_string(fig: &Fig, size: (u32, u32)) -> Result<String> {
    register_font();
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        draw_fig(fig, &root).map_err(|e| anyhow!("cannot draw: {e}"))?;
        root.present().map_err(|e| anyhow!("cannot draw: {e}"))?;
    }
    Ok(out)
}

/// Title on top, the stages' legend under it, notes at the bottom, the
/// chart between: the legend never covers data.
fn draw_fig<DB: DrawingBackend>(fig: &Fig, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    let (title, notes) = match fig {
        Fig::Stages(f) => (&f.title, &f.notes),
        Fig::Time(f) => (&f.title, &f.notes),
    };
    let (_, h) = root.dim_in_pixel();
    let area = root.titled(title, (FAMILY, 20.0).into_font().color(&BLACK))?;
    let (legend, rest) = area.split_vertically(28);
    draw_legend(&legend)?;
    let notes_px = 8 + 16 * notes.len() as u32;
    let (chart, foot) = rest.split_vertically(h.saturating_sub(58 + notes_px).max(100));
    for (i, n) in notes.iter().enumerate() {
        foot.draw(&Text::new(
            n.clone(),
            (10, 4 + 16 * i as i32),
            font(12.0).color(&RGBColor(0x44, 0x44, 0x44)),
        ))?;
    }
    match fig {
        Fig::Stages(f) => draw_stages(f, &chart),
        Fig::Time(f) => draw_time(f, &chart),
    }
}

/// The four stages in a row, centred.
fn draw_legend<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
    let (w, _) = area.dim_in_pixel();
    let style = font(13.0);
    let widths: Vec<i32> = STAGES
        .iter()
        .map(|(name, _)| {
            area.estimate_text_size(name, &style)
                .map_or(80, |(tw, _)| tw as i32)
                + 40
        })
        .collect();
    let mut x = (w as i32 - widths.iter().sum::<i32>()) / 2;
    for ((name, ci), width) in STAGES.iter().zip(&widths) {
        area.draw(&Rectangle::new([(x, 8), (x + 14, 22)], color(*ci).filled()))?;
        area.draw(&Text::new(name.to_string(), (x + 20, 8), style.clone()))?;
        x += width;
    }
    Ok(())
}

/// `text` with its middle cut to `keep` characters, a "…" in their place
/// (the process name and the remote port stay readable).
pub(crate) fn shorten(text: &str, keep: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= keep {
        return text.to_string();
    }
    let head = keep.div_ceil(2);
    let tail = keep - head;
    let mut s: String = chars[..head].iter().collect();
    s.push('…');
    s.extend(&chars[chars.len() - tail..]);
    s
}

/// A bar's label cut to fit `max_px`: the flow is shortened in the
/// middle, the sample count kept whole.
fn fit_label<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    b: &FlowBar,
    style: &TextStyle,
    max_px: u32,
) -> String {
    let width = |s: &str| area.estimate_text_size(s, style).map_or(0, |(w, _)| w);
    if width(&b.label) <= max_px {
        return b.label.clone();
    }
    let count = format!(" ({} sends)", format_count(b.samples));
    let mut keep = b.flow.chars().count();
    loop {
        let s = format!("{}{count}", shorten(&b.flow, keep));
        if keep <= 8 || width(&s) <= max_px {
            return s;
        }
        keep -= 1;
    }
}

fn draw_stages<DB: DrawingBackend>(f: &StagesFig, area: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
    let (w, _) = area.dim_in_pixel();
    let style = font(12.0);
    let max_label = w * 45 / 100;
    let labels: Vec<String> = f
        .bars
        .iter()
        .map(|b| fit_label(area, b, &style, max_label))
        .collect();
    let label_px = labels
        .iter()
        .filter_map(|l| area.estimate_text_size(l, &style).ok())
        .map(|(lw, _)| lw)
        .max()
        .unwrap_or(0);
    let n = f.bars.len().max(1);
    let x_ticks = nice_ticks(0.0, f.x_max_us, 8);
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .margin_right(25)
        .x_label_area_size(45)
        .y_label_area_size(label_px + 15)
        .build_cartesian_2d(
            Ticked::new(0.0, f.x_max_us, x_ticks),
            Ticked::new(-0.5, n as f64 - 0.5, (0..n).map(|i| i as f64).collect()),
        )?;
    // The most sampled flow on top.
    let label_at = |y: &f64| {
        let i = n as f64 - 1.0 - y.round();
        labels.get(i as usize).cloned().unwrap_or_default()
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("p50 per stage, stacked (µs)")
        .x_label_formatter(&|x: &f64| format_number(*x))
        .y_label_formatter(&label_at)
        .label_style(style.clone())
        .axis_desc_style(font(13.0))
        .draw()?;
    // Each bar's numbers above it, where a row has room for a line of text.
    let row_px = chart.plotting_area().dim_in_pixel().1 / n as u32;
    let (lo, hi) = if row_px >= 36 {
        (-0.32, 0.18)
    } else {
        (-0.35, 0.35)
    };
    for (i, b) in f.bars.iter().enumerate() {
        let y = (n - 1 - i) as f64;
        let mut x = 0.0;
        for (p50, (_, ci)) in b.p50_ns.iter().zip(STAGES) {
            let Some(ns) = p50 else { continue };
            let end = x + *ns as f64 / 1e3;
            chart.draw_series([
                Rectangle::new([(x, y + lo), (end, y + hi)], color(ci).filled()),
                Rectangle::new([(x, y + lo), (end, y + hi)], WHITE.stroke_width(1)),
            ])?;
            x = end;
        }
        if row_px >= 36 {
            chart.draw_series(std::iter::once(Text::new(
                breakdown(b),
                (f.x_max_us * 0.004, y + 0.47),
                font(11.0).color(&RGBColor(0x33, 0x33, 0x33)),
            )))?;
        }
    }
    Ok(())
}

/// A bar's p50s in words: "stack 8.1, sender queue 2, round trip 120 µs".
pub(crate) fn breakdown(b: &FlowBar) -> String {
    let parts: Vec<String> = b
        .p50_ns
        .iter()
        .zip(STAGES)
        .filter_map(|(p, (name, _))| {
            Some(format!(
                "{name} {}",
                format_number(p.as_ref().copied()? as f64 / 1e3)
            ))
        })
        .collect();
    if parts.is_empty() {
        "no stage reported".into()
    } else {
        format!("p50 {} µs", parts.join(", "))
    }
}

fn draw_time<DB: DrawingBackend>(f: &TimeFig, area: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
    let pad = (f.x_max_s * 0.02).max(0.05);
    let x_ticks = nice_ticks(0.0, f.x_max_s.max(0.1), 10);
    let axis = &f.axis;
    let mut chart = ChartBuilder::on(area)
        .margin(10)
        .margin_right(25)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(
            Ticked::new(-pad, f.x_max_s + pad, x_ticks),
            Ticked::new(axis.lo, axis.hi, axis.ticks()),
        )?;
    chart
        .configure_mesh()
        .x_desc("Seconds since the first sample")
        .y_desc("Stage time (µs, log scale)")
        .x_label_formatter(&|x: &f64| format_number(*x))
        .y_label_formatter(&|y: &f64| axis.format_tick(*y))
        .label_style(font(13.0))
        .axis_desc_style(font(13.0))
        .draw()?;
    for (points, (_, ci)) in f.points.iter().zip(STAGES) {
        let c = color(ci).mix(0.7);
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 2, c.filled())))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
