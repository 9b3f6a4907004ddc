//! Drawing with plotters: boxplots, CDFs, time series and percentile
//! distributions as SVG (text as
//! `<text>` elements) or PNG (plotters' bitmap backend, text rasterised with
//! the DejaVu Sans font embedded in the binary).
//!
//! The figures arrive fully computed (see `figures.rs`): this file only maps
//! numbers to pixels, so it holds no statistics. Each figure keeps its SVG
//! small whatever the input size: time series and CDFs come pre-thinned,
//! and outliers that would land on the same pixel row are drawn once
//! (every distinct outlier position is still drawn).

use std::{path::Path, sync::Once};

use anyhow::{Result, anyhow};
use plotters::{
    coord::{
        Shift,
        ranged1d::{DefaultFormatting, KeyPointHint},
    },
    element::DashedPathElement,
    prelude::*,
};

use super::{
    ImageFormat,
    axis::{ValueAxis, format_number, nice_ticks},
    stats::CdfPoint,
};

/// DejaVu Sans 2.37 (Bitstream Vera license, see
/// prober/assets/fonts/DejaVuSans-LICENSE.txt). plotters' ab_glyph text
/// backend has no font of its own, and shipping one keeps rtprobe a single
/// file that renders the same everywhere.
static FONT: &[u8] = include_bytes!("../../../assets/fonts/DejaVuSans.ttf");
pub(super) const FAMILY: &str = "sans-serif";

pub(super) fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are a font we ship; failing to parse them is a build
        // defect the tests catch, so ignoring the error cannot hide a user
        // problem.
        let _ = plotters::style::register_font(FAMILY, FontStyle::Normal, FONT);
    });
}

/// Run colours: the study's baseline red, then its optimisation blue, then
/// a fixed palette (matplotlib's tab10 order without red and blue).
const PALETTE: [RGBColor; 10] = [
    RGBColor(0xd6, 0x27, 0x28), // red
    RGBColor(0x1f, 0x77, 0xb4), // blue
    RGBColor(0x2c, 0xa0, 0x2c), // green
    RGBColor(0xff, 0x7f, 0x0e), // orange
    RGBColor(0x94, 0x67, 0xbd), // purple
    RGBColor(0x8c, 0x56, 0x4b), // brown
    RGBColor(0xe3, 0x77, 0xc2), // pink
    RGBColor(0x7f, 0x7f, 0x7f), // grey
    RGBColor(0xbc, 0xbd, 0x22), // olive
    RGBColor(0x17, 0xbe, 0xcf), // cyan
];

/// Colour of the run with colour index `i` (cycles after ten runs).
pub(crate) fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// The SVG/hex spelling of a run colour, e.g. "#D62728" (what tests grep).
pub fn color_hex(i: usize) -> String {
    let c = color(i);
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// Opacity of a box's fill; nothing else in a figure uses it, which lets
/// tests count boxes in the SVG.
pub const BOX_FILL_OPACITY: f64 = 0.25;

/// One box of a boxplot, in nanoseconds.
#[derive(Debug, Clone)]
pub(crate) struct BoxItem {
    pub(crate) category: usize,
    pub(crate) slot: usize,
    pub(crate) color: usize,
    pub(crate) q1: f64,
    pub(crate) median: f64,
    pub(crate) q3: f64,
    pub(crate) lower_whisker: i64,
    pub(crate) upper_whisker: i64,
    /// Every outlier, sorted.
    pub(crate) outliers: Vec<i64>,
}

#[derive(Debug, Clone)]
pub(crate) struct BoxFigure {
    pub(crate) title: String,
    pub(crate) x_desc: String,
    pub(crate) y_desc: String,
    pub(crate) axis: ValueAxis,
    /// Names along the x axis (groups, or runs when not grouped).
    pub(crate) categories: Vec<String>,
    /// Boxes side by side per category.
    pub(crate) slots: usize,
    pub(crate) boxes: Vec<BoxItem>,
    /// (label, colour index); empty: no legend.
    pub(crate) legend: Vec<(String, usize)>,
    pub(crate) notes: Vec<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct CdfCurve {
    pub(crate) label: String,
    pub(crate) color: usize,
    pub(crate) points: Vec<CdfPoint>,
}

#[derive(Debug, Clone)]
pub(crate) struct CdfFigure {
    pub(crate) title: String,
    pub(crate) x_desc: String,
    pub(crate) axis: ValueAxis,
    pub(crate) curves: Vec<CdfCurve>,
    pub(crate) notes: Vec<String>,
}

/// One pixel column of a time series (or one probe, where the run is
/// short enough for a column each), latencies in ns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TimeColumn {
    /// On the time axis.
    pub(crate) x: f64,
    pub(crate) n: u64,
    pub(crate) min: i64,
    pub(crate) p50: i64,
    pub(crate) p99: i64,
    pub(crate) max: i64,
}

#[derive(Debug, Clone)]
pub(crate) struct TimeLine {
    pub(crate) label: String,
    pub(crate) color: usize,
    /// In x order.
    pub(crate) columns: Vec<TimeColumn>,
    /// x of lost probes (one per column that lost any).
    pub(crate) lost: Vec<f64>,
}

/// Columns holding this many samples (median over the line) get a p99
/// line: with fewer, a column's p99 is its maximum.
pub(crate) const P99_LINE_MIN_SAMPLES: u64 = 100;

/// Opacity of the min-max band of a time series.
pub(crate) const BAND_OPACITY: f64 = 0.2;

#[derive(Debug, Clone)]
pub(crate) struct TimeFigure {
    pub(crate) title: String,
    pub(crate) x_desc: String,
    pub(crate) y_desc: String,
    pub(crate) x_range: (f64, f64),
    pub(crate) axis: ValueAxis,
    pub(crate) lines: Vec<TimeLine>,
    /// (x, what): a change during the run (the load coming on), drawn as
    /// a dashed line with its name, shaded from there on.
    pub(crate) phases: Vec<(f64, String)>,
    pub(crate) notes: Vec<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct PercentileCurve {
    pub(crate) label: String,
    pub(crate) color: usize,
    /// (log10(1 / (1 - p)), latency ns), in x order.
    pub(crate) points: Vec<(f64, f64)>,
}

#[derive(Debug, Clone)]
pub(crate) struct PercentileFigure {
    pub(crate) title: String,
    pub(crate) y_desc: String,
    pub(crate) axis: ValueAxis,
    /// Right end of the percentile axis, as log10(1 / (1 - p)).
    pub(crate) x_max: f64,
    pub(crate) curves: Vec<PercentileCurve>,
    pub(crate) notes: Vec<String>,
}

#[derive(Debug, Clone)]
pub(crate) enum Figure {
    Box(BoxFigure),
    Cdf(CdfFigure),
    Time(TimeFigure),
    Percentiles(PercentileFigure),
}

/// Ticks of the percentile axis: (log10(1 / (1 - p)), label).
pub(crate) fn percentile_ticks(x_max: f64) -> Vec<(f64, String)> {
    let mut t = vec![(0.0, "0 %".to_string()), (2f64.log10(), "50 %".to_string())];
    for decade in 1..=9usize {
        if decade as f64 > x_max + 1e-9 {
            break;
        }
        // 90 %, 99 %, 99.9 %, 99.99 %, ...
        let text = match decade {
            1 => "90 %".to_string(),
            2 => "99 %".to_string(),
            d => format!("99.{} %", "9".repeat(d - 2)),
        };
        t.push((decade as f64, text));
    }
    t
}

/// A linear axis whose grid lines and labels sit exactly at the given
/// positions (category centres, 1-2-5 ticks, log decades): plotters'
/// `WithKeyPoints` cannot take a label formatter, this can.
#[derive(Debug, Clone)]
pub(super) struct Ticked {
    lo: f64,
    hi: f64,
    ticks: Vec<f64>,
}

impl Ticked {
    pub(super) fn new(lo: f64, hi: f64, ticks: Vec<f64>) -> Self {
        Self { lo, hi, ticks }
    }
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let span = self.hi - self.lo;
        if span <= 0.0 {
            return (limit.0 + limit.1) / 2;
        }
        let f = (v - self.lo) / span;
        // `as` saturates: far off-axis values land far outside the area.
        limit.0 + ((limit.1 - limit.0) as f64 * f).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.lo..self.hi
    }
}

type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Draws `fig` into `path` as SVG or PNG of `size` pixels.
pub(crate) fn save(fig: &Figure, path: &Path, format: ImageFormat, size: (u32, u32)) -> Result<()> {
    register_font();
    let fail = |e: String| anyhow!("cannot write {}: {e}", path.display());
    match format {
        ImageFormat::Svg => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            draw_on(fig, &root).map_err(|e| fail(e.to_string()))?;
            root.present().map_err(|e| fail(e.to_string()))
        }
        ImageFormat::Png => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            draw_on(fig, &root).map_err(|e| fail(e.to_string()))?;
            root.present().map_err(|e| fail(e.to_string()))
        }
    }
}

fn draw_on<DB: DrawingBackend>(fig: &Figure, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
    root.fill(&WHITE)?;
    match fig {
        Figure::Box(f) => draw_box(f, root),
        Figure::Cdf(f) => draw_cdf(f, root),
        Figure::Time(f) => draw_time(f, root),
        Figure::Percentiles(f) => draw_percentiles(f, root),
    }
}

/// A caption size that keeps long titles inside the figure.
fn caption_style(title: &str, width_px: u32) -> TextStyle<'static> {
    let chars = title.chars().count().max(1) as f64;
    // DejaVu Sans averages about 0.55 em per character.
    let fit = width_px as f64 * 0.95 / (0.55 * chars);
    (FAMILY, fit.clamp(11.0, 20.0)).into_font().color(&BLACK)
}

pub(super) fn font(size: f64) -> TextStyle<'static> {
    (FAMILY, size).into_font().color(&BLACK)
}

/// Notes (clipped samples, dropped values) in small text at the bottom left.
fn draw_notes<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    notes: &[String],
) -> DrawResult<DB> {
    let (_, h) = root.dim_in_pixel();
    for (i, n) in notes.iter().rev().enumerate() {
        root.draw(&Text::new(
            n.clone(),
            (8, h as i32 - 16 - 15 * i as i32),
            font(12.0).color(&RGBColor(0x55, 0x55, 0x55)),
        ))?;
    }
    Ok(())
}

fn bottom_room(notes: &[String]) -> u32 {
    50 + 15 * notes.len() as u32
}

/// The latency axis with room on top for a legend of `entries` lines, so
/// the legend never hides data.
fn legend_headroom(axis: &ValueAxis, entries: usize, height_px: u32, notes: usize) -> ValueAxis {
    if entries == 0 {
        return axis.clone();
    }
    // Caption, label area and margins take about 130 px; each legend line
    // about 20 px plus the box border.
    let plot_h = (height_px as f64 - 130.0 - 15.0 * notes as f64).max(50.0);
    axis.with_headroom((entries as f64 * 20.0 + 16.0) / plot_h)
}

/// One box with its whiskers, median and outliers (one mark per pixel
/// row); `slot_w` is a box's share of its category, `quantum` the plot
/// units of one pixel row.
fn draw_one_box<DB: DrawingBackend>(
    chart: &mut ChartContext<'_, DB, Cartesian2d<Ticked, Ticked>>,
    b: &BoxItem,
    slot_w: f64,
    axis: &ValueAxis,
    quantum: f64,
) -> DrawResult<DB> {
    let c = color(b.color);
    let cx = b.category as f64 - 0.4 + slot_w * (b.slot as f64 + 0.5);
    let half = (slot_w * 0.35).min(0.18);
    let y = |ns: f64| axis.coord_clamped(ns);
    let (q1, q3, med) = (y(b.q1), y(b.q3), y(b.median));
    let (wl, wh) = (y(b.lower_whisker as f64), y(b.upper_whisker as f64));
    chart.draw_series([
        Rectangle::new(
            [(cx - half, q3), (cx + half, q1)],
            c.mix(BOX_FILL_OPACITY).filled(),
        ),
        Rectangle::new([(cx - half, q3), (cx + half, q1)], c.stroke_width(1)),
    ])?;
    let stroke = c.stroke_width(1);
    chart.draw_series([
        PathElement::new(vec![(cx, q3), (cx, wh)], stroke),
        PathElement::new(vec![(cx, q1), (cx, wl)], stroke),
        PathElement::new(vec![(cx - half / 2.0, wh), (cx + half / 2.0, wh)], stroke),
        PathElement::new(vec![(cx - half / 2.0, wl), (cx + half / 2.0, wl)], stroke),
        PathElement::new(vec![(cx - half, med), (cx + half, med)], c.stroke_width(3)),
    ])?;
    let mut last_row = i64::MIN;
    let mut marks = Vec::new();
    for &o in &b.outliers {
        let Some(oc) = axis.coord(o as f64) else {
            continue;
        };
        let row = ((oc - axis.lo) / quantum).floor() as i64;
        if row != last_row {
            last_row = row;
            marks.push(Circle::new((cx, oc), 3, c.stroke_width(1)));
        }
    }
    chart.draw_series(marks)?;
    Ok(())
}

fn draw_box<DB: DrawingBackend>(f: &BoxFigure, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
    let (w, h) = root.dim_in_pixel();
    let n_cat = f.categories.len().max(1);
    let centres: Vec<f64> = (0..n_cat).map(|i| i as f64).collect();
    let axis = &legend_headroom(&f.axis, f.legend.len(), h, f.notes.len());
    let mut chart = ChartBuilder::on(root)
        .caption(&f.title, caption_style(&f.title, w))
        .margin(15)
        .margin_bottom(5 + 15 * f.notes.len() as u32)
        .x_label_area_size(bottom_room(&[]))
        .y_label_area_size(75)
        .build_cartesian_2d(
            Ticked::new(-0.5, n_cat as f64 - 0.5, centres),
            Ticked::new(axis.lo, axis.hi, axis.ticks()),
        )?;
    let cats = &f.categories;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc(f.x_desc.as_str())
        .y_desc(f.y_desc.as_str())
        .x_label_formatter(&|x: &f64| {
            let i = x.round();
            if i >= 0.0 && (i as usize) < cats.len() {
                cats[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y: &f64| axis.format_tick(*y))
        .label_style(font(14.0))
        .axis_desc_style(font(16.0))
        .draw()?;

    let (_, plot_h) = chart.plotting_area().dim_in_pixel();
    // Plot units per pixel row: outliers closer than this share a pixel.
    let quantum = (axis.hi - axis.lo) / plot_h.max(1) as f64;
    let slots = f.slots.max(1) as f64;
    let slot_w = 0.8 / slots;
    for b in &f.boxes {
        draw_one_box(&mut chart, b, slot_w, axis, quantum)?;
    }
    for (label, ci) in &f.legend {
        let c = color(*ci);
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
            .label(label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled()));
    }
    if !f.legend.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.5))
            .label_font(font(14.0))
            .draw()?;
    }
    draw_notes(root, &f.notes)
}

fn draw_cdf<DB: DrawingBackend>(f: &CdfFigure, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
    let (w, _) = root.dim_in_pixel();
    let axis = &f.axis;
    let y_ticks: Vec<f64> = (0..=10).map(|i| i as f64 / 10.0).collect();
    let mut chart = ChartBuilder::on(root)
        .caption(&f.title, caption_style(&f.title, w))
        .margin(15)
        .margin_bottom(5 + 15 * f.notes.len() as u32)
        .x_label_area_size(bottom_room(&[]))
        .y_label_area_size(75)
        .build_cartesian_2d(
            Ticked::new(axis.lo, axis.hi, axis.ticks()),
            Ticked::new(0.0, 1.0, y_ticks),
        )?;
    chart
        .configure_mesh()
        .x_desc(f.x_desc.as_str())
        .y_desc("Fraction of probes at or below")
        .x_label_formatter(&|x: &f64| axis.format_tick(*x))
        .y_label_formatter(&|y: &f64| format_number(*y))
        .label_style(font(14.0))
        .axis_desc_style(font(16.0))
        .draw()?;
    for curve in &f.curves {
        let c = color(curve.color);
        // A staircase: flat at the previous fraction up to each value, then
        // up to the new fraction; zero left of the minimum, one right of the
        // maximum.
        let mut path = Vec::with_capacity(curve.points.len() * 2 + 2);
        let mut prev = 0.0;
        path.push((axis.lo, 0.0));
        for p in &curve.points {
            let x = axis.coord_clamped(p.value_ns as f64);
            path.push((x, prev));
            path.push((x, p.fraction));
            prev = p.fraction;
        }
        path.push((axis.hi, prev));
        chart
            .draw_series(std::iter::once(PathElement::new(path, c.stroke_width(2))))?
            .label(curve.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.5))
        .label_font(font(14.0))
        .draw()?;
    draw_notes(root, &f.notes)
}

fn draw_time<DB: DrawingBackend>(f: &TimeFigure, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
    let (w, h) = root.dim_in_pixel();
    let any_lost = f.lines.iter().any(|l| !l.lost.is_empty());
    let any_band = f.lines.iter().any(|l| l.columns.iter().any(|k| k.n > 1));
    let entries = f.lines.len() + any_lost as usize + 2 * any_band as usize;
    let axis = &legend_headroom(&f.axis, entries, h, f.notes.len());
    let (x_lo, x_hi) = f.x_range;
    let x_ticks = nice_ticks(x_lo, x_hi, 10);
    let mut chart = ChartBuilder::on(root)
        .caption(&f.title, caption_style(&f.title, w))
        .margin(15)
        .margin_bottom(5 + 15 * f.notes.len() as u32)
        .x_label_area_size(bottom_room(&[]))
        .y_label_area_size(75)
        .build_cartesian_2d(
            Ticked::new(x_lo, x_hi, x_ticks),
            Ticked::new(axis.lo, axis.hi, axis.ticks()),
        )?;
    chart
        .configure_mesh()
        .x_desc(f.x_desc.as_str())
        .y_desc(f.y_desc.as_str())
        .x_label_formatter(&|x: &f64| format_number(*x))
        .y_label_formatter(&|y: &f64| axis.format_tick(*y))
        .label_style(font(14.0))
        .axis_desc_style(font(16.0))
        .draw()?;
    draw_phases(&mut chart, &f.phases, axis, x_hi)?;
    // Lost probes: crosses along the bottom edge, in the axis padding
    // below the lowest sample, where no latency is drawn.
    let lost_y = axis.lo + (f.axis.hi - f.axis.lo) * 0.015;
    let mut any_p99 = false;
    for line in &f.lines {
        any_p99 |= draw_time_line(&mut chart, line, axis, lost_y)?;
    }
    time_legend_keys(&mut chart, any_band, any_p99, any_lost)?;
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.5))
        .label_font(font(14.0))
        .draw()?;
    draw_notes(root, &f.notes)
}

/// The time series' chart: seconds (or probe numbers) by latency.
type TimeChart<'a, DB> = ChartContext<'a, DB, Cartesian2d<Ticked, Ticked>>;

/// Grey used for what is not a run: phases and the legend's keys.
const PHASE_GREY: RGBColor = RGBColor(0x55, 0x55, 0x55);

/// Each phase of the run (e.g. the competing load coming on): a shaded
/// span from its start to the right edge, a dashed line and its name.
fn draw_phases<DB: DrawingBackend>(
    chart: &mut TimeChart<'_, DB>,
    phases: &[(f64, String)],
    axis: &ValueAxis,
    x_hi: f64,
) -> DrawResult<DB> {
    let grey = PHASE_GREY;
    for (k, (x, what)) in phases.iter().enumerate() {
        chart.draw_series(std::iter::once(Rectangle::new(
            [(*x, axis.lo), (x_hi, axis.hi)],
            grey.mix(0.06).filled(),
        )))?;
        chart.draw_series(std::iter::once(DashedPathElement::new(
            vec![(*x, axis.lo), (*x, axis.hi)],
            6,
            4,
            grey.stroke_width(1),
        )))?;
        // Names stacked from the top left of the line, below the legend's
        // row when the line is far right.
        let row = axis.hi - (axis.hi - axis.lo) * (0.04 + 0.05 * k as f64);
        chart.draw_series(std::iter::once(Text::new(
            format!(" {what}"),
            (*x, row),
            font(12.0).color(&grey),
        )))?;
    }
    Ok(())
}

/// One run's time series with its lost probes; returns whether it drew a
/// p99 line (its legend key is drawn once, for every run).
fn draw_time_line<DB: DrawingBackend>(
    chart: &mut TimeChart<'_, DB>,
    line: &TimeLine,
    axis: &ValueAxis,
    lost_y: f64,
) -> Result<bool, DrawingAreaErrorKind<DB::ErrorType>> {
    let y = |v: i64| axis.coord_clamped(v as f64);
    let c = color(line.color);
    let cols = &line.columns;
    // Several probes per column: a band from each column's min to its
    // max (spikes stay visible), the median on it, and the p99 where
    // columns hold enough probes for one.
    let binned = cols.iter().any(|k| k.n > 1);
    let mut p99 = false;
    if binned {
        let mut band: Vec<(f64, f64)> = cols.iter().map(|k| (k.x, y(k.max))).collect();
        band.extend(cols.iter().rev().map(|k| (k.x, y(k.min))));
        chart.draw_series(std::iter::once(Polygon::new(
            band,
            c.mix(BAND_OPACITY).filled(),
        )))?;
        // Columns with one probe draw no area: their extremes as a line.
        chart.draw_series(std::iter::once(PathElement::new(
            cols.iter().map(|k| (k.x, y(k.max))).collect::<Vec<_>>(),
            c.mix(0.35).stroke_width(1),
        )))?;
        let mut ns: Vec<u64> = cols.iter().map(|k| k.n).collect();
        ns.sort_unstable();
        if ns[ns.len() / 2] >= P99_LINE_MIN_SAMPLES {
            p99 = true;
            chart.draw_series(std::iter::once(DashedPathElement::new(
                cols.iter().map(|k| (k.x, y(k.p99))).collect::<Vec<_>>(),
                4,
                3,
                c.stroke_width(1),
            )))?;
        }
    }
    let pts: Vec<(f64, f64)> = cols.iter().map(|k| (k.x, y(k.p50))).collect();
    let sparse = !binned && pts.len() <= 300;
    chart
        .draw_series(std::iter::once(PathElement::new(
            pts.clone(),
            c.stroke_width(if binned { 2 } else { 1 }),
        )))?
        .label(line.label.as_str())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
    if sparse {
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 2, c.filled())))?;
    }
    if !line.lost.is_empty() {
        chart.draw_series(
            line.lost
                .iter()
                .map(|&x| Cross::new((x, lost_y), 4, c.stroke_width(1))),
        )?;
    }
    Ok(p99)
}

/// Legend keys for what every run may draw: the band, the p99 line and
/// the lost-probe cross.
fn time_legend_keys<DB: DrawingBackend>(
    chart: &mut TimeChart<'_, DB>,
    any_band: bool,
    any_p99: bool,
    any_lost: bool,
) -> DrawResult<DB> {
    let grey = PHASE_GREY;
    if any_band {
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
            .label("median per column, band min–max")
            .legend(move |(x, y)| {
                Rectangle::new(
                    [(x, y - 6), (x + 18, y + 6)],
                    grey.mix(BAND_OPACITY * 2.0).filled(),
                )
            });
    }
    if any_p99 {
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
            .label("p99 per column (dashed)")
            .legend(move |(x, y)| {
                DashedPathElement::new(vec![(x, y), (x + 18, y)], 4, 3, grey.stroke_width(1))
            });
    }
    if any_lost {
        chart
            .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
            .label("lost probe")
            .legend(|(x, y)| Cross::new((x + 9, y), 4, BLACK.stroke_width(1)));
    }
    Ok(())
}

fn draw_percentiles<DB: DrawingBackend>(
    f: &PercentileFigure,
    root: &DrawingArea<DB, Shift>,
) -> DrawResult<DB> {
    let (w, h) = root.dim_in_pixel();
    let axis = &legend_headroom(&f.axis, f.curves.len(), h, f.notes.len());
    let ticks = percentile_ticks(f.x_max);
    let x_hi = f.x_max * 1.02;
    let mut chart = ChartBuilder::on(root)
        .caption(&f.title, caption_style(&f.title, w))
        .margin(15)
        .margin_bottom(5 + 15 * f.notes.len() as u32)
        .x_label_area_size(bottom_room(&[]))
        .y_label_area_size(75)
        .build_cartesian_2d(
            Ticked::new(0.0, x_hi, ticks.iter().map(|t| t.0).collect()),
            Ticked::new(axis.lo, axis.hi, axis.ticks()),
        )?;
    chart
        .configure_mesh()
        .x_desc("Percentile (log scale of 1 / (1 - p))")
        .y_desc(f.y_desc.as_str())
        .x_label_formatter(&|x: &f64| {
            ticks
                .iter()
                .find(|t| (t.0 - x).abs() < 1e-9)
                .map_or_else(String::new, |t| t.1.clone())
        })
        .y_label_formatter(&|y: &f64| axis.format_tick(*y))
        .label_style(font(14.0))
        .axis_desc_style(font(16.0))
        .draw()?;
    for curve in &f.curves {
        let c = color(curve.color);
        let path: Vec<(f64, f64)> = curve
            .points
            .iter()
            .map(|&(x, v)| (x, axis.coord_clamped(v)))
            .collect();
        chart
            .draw_series(std::iter::once(PathElement::new(path, c.stroke_width(2))))?
            .label(curve.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.5))
        .label_font(font(14.0))
        .draw()?;
    draw_notes(root, &f.notes)
}
