//! The latency figures of one metric: each run reduced to a [`Summary`]
//! (its samples dropped), then laid out as a boxplot, CDF, time series or
//! percentile figure with axis, legend and notes.

use anyhow::{Result, bail};

use super::{
    Metric, PlotOptions, Scale,
    axis::{ValueAxis, format_count},
    dist,
    draw::{
        BoxFigure, BoxItem, CdfCurve, CdfFigure, PercentileCurve, PercentileFigure, TimeColumn,
        TimeFigure, TimeLine,
    },
    run_data::Series,
    runs::{Key, Run, TimeAxis, time_coord, title},
    stats::{self, BoxStats, CdfPoint},
};

/// Fine enough that the thinned CDF is indistinguishable from the full one
/// at figure resolution, coarse enough that 1 M samples stay ~100 KB of SVG.
const CDF_RESOLUTION: usize = 800;

/// Points per percentile curve: smooth at figure width.
const PERCENTILE_POINTS: usize = 600;

/// What a figure needs of one run and metric; the raw samples are gone.
pub(super) struct Summary {
    pub(super) n: u64,
    /// Every sample known exactly (else from an HDR histogram).
    pub(super) exact: bool,
    pub(super) missing: u64,
    pub(super) stats: Option<BoxStats>,
    pub(super) outliers: Vec<i64>,
    pub(super) cdf: Vec<CdfPoint>,
    pub(super) time: Vec<TimeColumn>,
    pub(super) min: Option<i64>,
    pub(super) max: Option<i64>,
    pub(super) min_positive: Option<i64>,
    pub(super) median: Option<f64>,
    /// (log10(1/(1-p)), latency ns) from p = 0 to the last percentile the
    /// samples resolve (1 - 1/n).
    pub(super) percentiles: Vec<(f64, f64)>,
    pub(super) nonpositive: u64,
    /// Samples outside a user-fixed latency range.
    pub(super) outside: u64,
}

pub(super) fn summarize(s: Series, r: &Run, opts: &PlotOptions, time_axis: TimeAxis) -> Summary {
    let Series {
        dist,
        time,
        missing,
    } = s;
    let time = time
        .finish()
        .into_iter()
        .filter(|c| c.n > 0)
        .filter_map(|c| {
            Some(TimeColumn {
                x: time_coord(r, time_axis, c.x)?,
                n: c.n,
                min: c.min,
                p50: c.p50,
                p99: c.p99,
                max: c.max,
            })
        })
        .collect();
    let exact = dist.is_exact();
    let v = dist.finish();
    let stats = stats::box_stats_of(&v);
    let outliers = stats.as_ref().map_or_else(Vec::new, BoxStats::outliers);
    let nonpositive = v.count_at_or_below(0.0);
    let below = opts.y_min_ns.map_or(0, |lo| v.count_below(lo));
    let above = opts
        .y_max_ns
        .map_or(0, |hi| v.len() - v.count_at_or_below(hi));
    let median = stats.as_ref().map(|b| b.median);
    let max = v.max();
    let log = opts.scale.log_for(median, max.map(|m| m as f64));
    Summary {
        n: v.len(),
        exact,
        missing,
        stats,
        outliers,
        cdf: stats::cdf_points_of(&v, CDF_RESOLUTION, log),
        percentiles: stats::percentile_curve_of(&v, PERCENTILE_POINTS),
        time,
        min: v.min(),
        max,
        min_positive: v.min_positive(),
        median,
        nonpositive,
        outside: below + above,
    }
}

pub(super) struct FigureCtx<'a> {
    pub(super) metric: Metric,
    pub(super) runs: &'a [Run],
    pub(super) sums: &'a [Option<Summary>],
    pub(super) opts: &'a PlotOptions,
    pub(super) time_axis: TimeAxis,
}

impl FigureCtx<'_> {
    fn sum(&self, i: usize) -> &Summary {
        self.sums[i]
            .as_ref()
            .expect("only runs with the metric are selected")
    }

    /// A latency axis covering every sample of the selected runs; log
    /// when asked, or (by default) when the largest sample is more than
    /// [`super::AUTO_LOG_RATIO`] times the lowest median.
    fn axis(&self, sel: &[usize]) -> Result<ValueAxis> {
        let hi = sel.iter().filter_map(|&i| self.sum(i).max).max();
        let typical = sel
            .iter()
            .filter_map(|&i| self.sum(i).median)
            .min_by(f64::total_cmp);
        let min_positive = sel.iter().filter_map(|&i| self.sum(i).min_positive).min();
        // Never hide samples on a log axis nobody asked for.
        let nonpositive = sel.iter().any(|&i| self.sum(i).nonpositive > 0);
        let log = self.opts.scale.log_for(typical, hi.map(|h| h as f64))
            && (self.opts.scale == Scale::Log || !nonpositive);
        let lo = if log {
            min_positive
        } else {
            sel.iter().filter_map(|&i| self.sum(i).min).min()
        };
        let (Some(lo), Some(hi)) = (lo, hi) else {
            if sel.iter().any(|&i| self.sum(i).n > 0) {
                bail!("--log needs positive latencies, and no sample is above 0 ns");
            }
            bail!("no {} samples in {}", self.metric.column(), self.names(sel));
        };
        ValueAxis::fit(
            lo as f64,
            hi as f64,
            log,
            self.opts.y_min_ns,
            self.opts.y_max_ns,
        )
    }

    fn names(&self, sel: &[usize]) -> String {
        let mut v: Vec<&str> = sel.iter().map(|&i| self.runs[i].name.as_str()).collect();
        v.dedup();
        v.join(", ")
    }

    /// "Round-trip time — 64 B probes every 1 ms, XDP native, sw timestamps, 2000 probes".
    fn title(&self, sel: &[usize]) -> String {
        let runs: Vec<&Run> = sel.iter().map(|&i| &self.runs[i]).collect();
        title(&runs, self.metric.name(), self.opts)
    }
}

impl FigureCtx<'_> {
    /// Legend text of a run in figures with one entry per run.
    fn legend_label(&self, sel: &[usize], i: usize) -> String {
        let r = &self.runs[i];
        let same_rows = sel.iter().all(|&j| self.runs[j].rows == r.rows);
        if same_rows || sel.len() == 1 {
            r.label.clone()
        } else {
            format!("{} (n={})", r.label, format_count(r.rows))
        }
    }

    fn notes(&self, sel: &[usize], log: bool, clipped: bool, time_figure: bool) -> Vec<String> {
        let mut notes = Vec::new();
        let col = self.metric.column();
        let nonpos: u64 = sel.iter().map(|&i| self.sum(i).nonpositive).sum();
        if log && nonpos > 0 {
            notes.push(format!("{nonpos} samples ≤ 0 ns not shown on the log axis"));
        }
        let outside: u64 = sel.iter().map(|&i| self.sum(i).outside).sum();
        if outside > 0 {
            let what = if clipped {
                "cut at the axis ends"
            } else {
                "not shown"
            };
            notes.push(format!("{outside} samples outside the latency axis {what}"));
        }
        for &i in sel {
            let (r, s) = (&self.runs[i], self.sum(i));
            if s.n == 0 {
                notes.push(format!("{}: no {col} samples", r.label));
            } else if time_figure && s.time.is_empty() {
                notes.push(format!(
                    "{}: not drawn: its CSV has times but no interval to number its probes",
                    r.label
                ));
            } else if s.missing > 0 {
                notes.push(format!(
                    "{}: {} probes not lost but without {col} (timestamp missing)",
                    r.label, s.missing
                ));
            }
        }
        let binned: Vec<&Run> = sel
            .iter()
            .filter(|&&i| !self.sum(i).exact)
            .map(|&i| &self.runs[i])
            .collect();
        if !binned.is_empty() {
            let why = if binned.iter().all(|r| r.from_hdr_log) {
                "read from an HdrHistogram log".to_string()
            } else {
                format!(
                    "over {} samples per run",
                    format_count(dist::EXACT_LIMIT as u64)
                )
            };
            let whose = if binned.len() == sel.len() {
                String::new()
            } else {
                format!(
                    " ({})",
                    binned
                        .iter()
                        .map(|r| r.label.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            notes.push(format!(
                "quantiles from an HDR histogram, {} significant digits{whose}: {why}",
                dist::HDR_SIGFIG
            ));
        }
        const MAX_NOTES: usize = 4;
        if notes.len() > MAX_NOTES {
            let more = notes.len() - (MAX_NOTES - 1);
            notes.truncate(MAX_NOTES - 1);
            notes.push(format!("… and {more} more notes"));
        }
        notes
    }

    pub(super) fn box_figure(&self, sel: &[usize]) -> Result<BoxFigure> {
        let axis = self.axis(sel)?;
        let runs = self.runs;
        let (categories, slots, place): (Vec<String>, usize, Vec<(usize, usize)>) =
            if self.opts.group_by.is_some() {
                let mut groups: Vec<&Key> =
                    sel.iter().filter_map(|&i| runs[i].group.as_ref()).collect();
                groups.sort();
                groups.dedup();
                // Slots follow colour order, so a series sits at the same
                // place in every group.
                let mut colors: Vec<usize> = sel.iter().map(|&i| runs[i].color).collect();
                colors.sort_unstable();
                colors.dedup();
                let place = sel
                    .iter()
                    .map(|&i| {
                        let g = groups
                            .iter()
                            .position(|k| Some(*k) == runs[i].group.as_ref())
                            .unwrap_or(0);
                        let s = colors.iter().position(|c| *c == runs[i].color).unwrap_or(0);
                        (g, s)
                    })
                    .collect();
                (
                    groups.iter().map(|k| k.text.clone()).collect(),
                    colors.len(),
                    place,
                )
            } else {
                let cats = sel.iter().map(|&i| runs[i].label.clone()).collect();
                (cats, 1, (0..sel.len()).map(|k| (k, 0)).collect())
            };
        let mut boxes = Vec::new();
        for (&i, &(category, slot)) in sel.iter().zip(&place) {
            let s = self.sum(i);
            let Some(b) = &s.stats else { continue };
            boxes.push(BoxItem {
                category,
                slot,
                color: runs[i].color,
                q1: b.q1,
                median: b.median,
                q3: b.q3,
                lower_whisker: b.lower_whisker,
                upper_whisker: b.upper_whisker,
                outliers: s.outliers.clone(),
            });
        }
        let mut legend: Vec<(String, usize)> = Vec::new();
        for &i in sel {
            let r = &runs[i];
            if !legend.iter().any(|(_, c)| *c == r.color) {
                let label = if self.opts.group_by.is_some() {
                    r.label.clone()
                } else {
                    self.legend_label(sel, i)
                };
                legend.push((label, r.color));
            }
        }
        legend.sort_by_key(|(_, c)| *c);
        let notes = self.notes(sel, axis.log, true, false);
        Ok(BoxFigure {
            title: self.title(sel),
            x_desc: self
                .opts
                .group_by
                .map_or("Run", |d| d.axis_name())
                .to_string(),
            y_desc: axis.describe(self.metric.name()),
            axis,
            categories,
            slots,
            boxes,
            legend,
            notes,
        })
    }

    pub(super) fn cdf_figure(&self, sel: &[usize]) -> Result<CdfFigure> {
        let axis = self.axis(sel)?;
        let curves = sel
            .iter()
            .filter(|&&i| self.sum(i).n > 0)
            .map(|&i| CdfCurve {
                label: self.legend_label(sel, i),
                color: self.runs[i].color,
                points: self.sum(i).cdf.clone(),
            })
            .collect();
        let notes = self.notes(sel, axis.log, false, false);
        Ok(CdfFigure {
            title: self.title(sel),
            x_desc: axis.describe(self.metric.name()),
            axis,
            curves,
            notes,
        })
    }

    pub(super) fn time_figure(&self, sel: &[usize]) -> Result<TimeFigure> {
        let axis = self.axis(sel)?;
        let mut lines = Vec::new();
        let (mut x_lo, mut x_hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for &i in sel {
            let r = &self.runs[i];
            let s = self.sum(i);
            for x in s
                .time
                .iter()
                .map(|c| c.x)
                .chain(r.lost_marks.iter().copied())
            {
                x_lo = x_lo.min(x);
                x_hi = x_hi.max(x);
            }
            let mut label = self.legend_label(sel, i);
            if r.lost > 0 {
                label.push_str(&format!(", {} lost", format_count(r.lost)));
            }
            lines.push(TimeLine {
                label,
                color: r.color,
                columns: s.time.clone(),
                lost: r.lost_marks.clone(),
            });
        }
        if !(x_lo.is_finite() && x_hi.is_finite()) {
            bail!("no probes to draw over time in {}", self.names(sel));
        }
        let mut phases: Vec<(f64, String)> = Vec::new();
        for &i in sel {
            let r = &self.runs[i];
            for (x, what) in r.phases() {
                let Some(x) = time_coord(r, self.time_axis, x) else {
                    continue;
                };
                if !phases
                    .iter()
                    .any(|(px, w)| *w == what && (px - x).abs() < 1e-3)
                {
                    // The load starts before the first probe (its warm-up):
                    // the axis reaches back to show it.
                    x_lo = x_lo.min(x);
                    phases.push((x, what));
                }
            }
        }
        if x_hi <= x_lo {
            x_hi = x_lo + 1.0;
        }
        let notes = self.notes(sel, axis.log, false, true);
        Ok(TimeFigure {
            title: self.title(sel),
            x_desc: match self.time_axis {
                // An HDR log's points are its intervals' middles.
                TimeAxis::Seconds if sel.iter().all(|&i| self.runs[i].from_hdr_log) => {
                    "Time since the middle of the first interval (s)".into()
                }
                TimeAxis::Seconds => "Time since the first probe (s)".into(),
                TimeAxis::ProbeNumber => "Probe number".into(),
            },
            y_desc: axis.describe(self.metric.name()),
            x_range: (x_lo, x_hi),
            axis,
            lines,
            phases,
            notes,
        })
    }
}

impl FigureCtx<'_> {
    pub(super) fn percentile_figure(&self, sel: &[usize]) -> Result<PercentileFigure> {
        let axis = self.axis(sel)?;
        let curves: Vec<PercentileCurve> = sel
            .iter()
            .filter(|&&i| !self.sum(i).percentiles.is_empty())
            .map(|&i| PercentileCurve {
                label: self.legend_label(sel, i),
                color: self.runs[i].color,
                points: self.sum(i).percentiles.clone(),
            })
            .collect();
        // Up to the deepest percentile any run resolves, and at least 99 %.
        let x_max = curves
            .iter()
            .filter_map(|c| c.points.last().map(|p| p.0))
            .fold(2.0, f64::max);
        let notes = self.notes(sel, axis.log, false, false);
        Ok(PercentileFigure {
            title: self.title(sel),
            y_desc: axis.describe(self.metric.name()),
            axis,
            x_max,
            curves,
            notes,
        })
    }
}
