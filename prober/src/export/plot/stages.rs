//! The stages figure: one box per stage of the timestamp chain and run.

use std::collections::BTreeMap;

use anyhow::Result;

use super::{
    FigureKind, Metric, Output, PlotOptions, Scale,
    axis::ValueAxis,
    dist,
    draw::{BoxFigure, BoxItem, Figure},
    run_data,
    runs::{Key, Run, title},
    stats::{self, BoxStats},
};
use crate::stats::chain::Stage;

/// The stages kind: one figure per split and group, one box per stage and
/// run. Runs from CSVs without stage columns are named in a note (or, if no
/// run has them, the figure is skipped with the reason).
pub(super) fn stage_figures(runs: &mut [Run], opts: &PlotOptions, out: &mut Output) -> Result<()> {
    let old: Vec<usize> = (0..runs.len())
        .filter(|&i| !runs[i].has_stage_columns)
        .collect();
    if old.len() == runs.len() {
        no_run_has_stages(runs, opts, out);
        return Ok(());
    }
    for &i in &old {
        // Said once per file, whatever its flows.
        if opts.kinds_given && (i == 0 || runs[i - 1].file != runs[i].file) {
            let what = if runs[i].from_hdr_log {
                "no stage histograms (an HdrHistogram log tags them path, sender_queue, ...)"
            } else {
                "no stage columns (written before rtprobe recorded the stamp chain)"
            };
            log::warn!("{} has {what}: left out of the stages figure", runs[i].name);
        }
    }
    let sums: Vec<Option<Vec<Option<StageSum>>>> = runs
        .iter_mut()
        .map(|r| r.stages.take().map(|st| summarize_stages(*st)))
        .collect();
    let mut splits: BTreeMap<(Option<Key>, Option<Key>), Vec<usize>> = BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        if sums[i].is_some() {
            splits
                .entry((r.split.clone(), r.group.clone()))
                .or_default()
                .push(i);
        }
    }
    let figs = StageFigures {
        runs,
        sums: &sums,
        old: &old,
        opts,
    };
    for ((split, group), sel) in &splits {
        figs.draw(split.as_ref(), group.as_ref(), sel, out)?;
    }
    Ok(())
}

/// Says why there is no stages figure when no input has stage values:
/// the error when nothing else was drawn, else a warning (only when the
/// kind was asked for).
fn no_run_has_stages(runs: &[Run], opts: &PlotOptions, out: &mut Output) {
    let why = format!(
        "{} {} no stage {}: \
         the other kinds (box, cdf, time, percentiles) still work",
        runs.first().map_or("", |r| r.name.as_str()),
        if runs.len() > 1 {
            "and the others have"
        } else {
            "has"
        },
        if runs.iter().all(|r| r.from_hdr_log) {
            "histograms (an HdrHistogram log tags them path, sender_queue, ...)"
        } else {
            "columns (written before rtprobe recorded the stamp chain)"
        }
    );
    if opts.kinds_given {
        // One line: the error when nothing else was drawn, else a warning.
        if out.written.is_empty() {
            out.skipped.push(why);
        } else {
            log::warn!("no stages figure: {why}");
        }
    }
}

/// One stage of one run, its samples gone.
struct StageSum {
    b: BoxStats,
    outliers: Vec<i64>,
    nonpositive: u64,
    min_positive: Option<i64>,
}

/// Each stage of one run reduced to its box (`None`: no value).
fn summarize_stages(stages: [dist::Dist; run_data::STAGES]) -> Vec<Option<StageSum>> {
    stages
        .into_iter()
        .map(|d| {
            let v = d.finish();
            let b = stats::box_stats_of(&v)?;
            Some(StageSum {
                outliers: b.outliers(),
                min_positive: v.min_positive(),
                nonpositive: v.count_at_or_below(0.0),
                b,
            })
        })
        .collect()
}

/// What every stages figure draws from.
struct StageFigures<'a> {
    runs: &'a [Run],
    /// Per run, per stage in [`Stage::ALL`] order.
    sums: &'a [Option<Vec<Option<StageSum>>>],
    /// Runs whose input has no stage values.
    old: &'a [usize],
    opts: &'a PlotOptions,
}

impl StageFigures<'_> {
    fn stage(&self, i: usize, k: usize) -> Option<&StageSum> {
        self.sums[i].as_ref().and_then(|v| v[k].as_ref())
    }

    /// The stages figure of one split and group (`sel`: its runs).
    fn draw(
        &self,
        split: Option<&Key>,
        group: Option<&Key>,
        sel: &[usize],
        out: &mut Output,
    ) -> Result<()> {
        let (runs, opts) = (self.runs, self.opts);
        // Stages outside the metric asked for stay out: --metric one-way
        // shows the sender's stages and the path.
        let shown_metric = |s: Stage| match opts.metrics.as_slice() {
            [Metric::OneWay] => matches!(
                s,
                Stage::Stack | Stage::SenderQueue | Stage::Driver | Stage::Path
            ),
            _ => true,
        };
        let shown: Vec<usize> = (0..Stage::ALL.len())
            .filter(|&k| {
                shown_metric(Stage::ALL[k]) && sel.iter().any(|&i| self.stage(i, k).is_some())
            })
            .collect();
        if shown.is_empty() {
            let why = anyhow::anyhow!(
                "no stage values in {}: every stage column is empty",
                sel.iter()
                    .map(|&i| runs[i].name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if opts.kinds_given {
                out.skipped("stages figure", why);
            } else {
                log::info!("no stages figure: {why}");
            }
            return Ok(());
        }
        let Some(axis) = self.axis(sel, &shown) else {
            out.skipped(
                "stages figure",
                anyhow::anyhow!("--log needs positive stage times, and none is above 0 ns"),
            );
            return Ok(());
        };
        let axis = axis?;
        let mut colors: Vec<usize> = sel.iter().map(|&i| runs[i].color).collect();
        colors.sort_unstable();
        colors.dedup();
        let (boxes, nonpositive) = self.boxes(sel, &shown, &colors);
        let mut legend: Vec<(String, usize)> = Vec::new();
        for &i in sel {
            if !legend.iter().any(|(_, c)| *c == runs[i].color) {
                legend.push((runs[i].label.clone(), runs[i].color));
            }
        }
        legend.sort_by_key(|(_, c)| *c);
        let notes = self.notes(split, group, axis.log && nonpositive > 0, nonpositive);
        let sel_runs: Vec<&Run> = sel.iter().map(|&i| &runs[i]).collect();
        let fig = BoxFigure {
            title: title(&sel_runs, "Time per stage", opts),
            x_desc: "Stage of the timestamp chain".into(),
            y_desc: axis.describe("Time in stage"),
            axis,
            categories: shown
                .iter()
                .map(|&k| Stage::ALL[k].label().to_string())
                .collect(),
            slots: colors.len(),
            boxes,
            legend,
            notes,
        };
        out.save(&Figure::Box(fig), None, split, group, FigureKind::Stages)
    }

    /// The time axis of the shown stages of the selected runs; `None` when
    /// a log axis has no positive value to start from.
    fn axis(&self, sel: &[usize], shown: &[usize]) -> Option<Result<ValueAxis>> {
        let opts = self.opts;
        let all = || {
            sel.iter()
                .flat_map(|&i| shown.iter().filter_map(move |&k| self.stage(i, k)))
        };
        let hi = all().map(|s| s.b.max).max();
        // Queueing of 10 ms next to a 5 µs path: log when the stages'
        // medians are that far apart.
        let medians = all().map(|s| s.b.median).filter(|m| *m > 0.0);
        let min_median = medians.clone().min_by(f64::total_cmp);
        let max_median = medians.max_by(f64::total_cmp);
        let min_positive = all().filter_map(|s| s.min_positive).min();
        let any_nonpositive = all().any(|s| s.nonpositive > 0);
        // Log when the stages are orders of magnitude apart, or when a
        // tail dwarfs even the slowest stage's body (a 1.5 ms path outlier
        // over 5 µs stages), as on the other figures.
        let log = (opts.scale.log_for(min_median, max_median)
            || opts.scale.log_for(max_median, hi.map(|h| h as f64)))
            && (opts.scale == Scale::Log || !any_nonpositive);
        let lo = if log {
            min_positive
        } else {
            all().map(|s| s.b.min).min()
        };
        let (lo, hi) = (lo?, hi?);
        Some(ValueAxis::fit(
            lo as f64,
            hi as f64,
            log,
            opts.y_min_ns,
            opts.y_max_ns,
        ))
    }

    /// One box per shown stage and run, side by side per colour; also the
    /// count of stage times at or below 0 ns.
    fn boxes(&self, sel: &[usize], shown: &[usize], colors: &[usize]) -> (Vec<BoxItem>, u64) {
        let runs = self.runs;
        let mut boxes = Vec::new();
        let mut nonpositive = 0;
        for (cat, &k) in shown.iter().enumerate() {
            for &i in sel {
                let Some(StageSum {
                    b,
                    outliers,
                    nonpositive: np,
                    ..
                }) = self.stage(i, k)
                else {
                    continue;
                };
                nonpositive += np;
                boxes.push(BoxItem {
                    category: cat,
                    slot: colors.iter().position(|c| *c == runs[i].color).unwrap_or(0),
                    color: runs[i].color,
                    q1: b.q1,
                    median: b.median,
                    q3: b.q3,
                    lower_whisker: b.lower_whisker,
                    upper_whisker: b.upper_whisker,
                    outliers: outliers.clone(),
                });
            }
        }
        (boxes, nonpositive)
    }

    /// Notes under the figure: values a log axis hides, and the runs of
    /// this split and group that have no stage values.
    fn notes(
        &self,
        split: Option<&Key>,
        group: Option<&Key>,
        hidden: bool,
        nonpositive: u64,
    ) -> Vec<String> {
        let runs = self.runs;
        let mut notes = Vec::new();
        if hidden {
            notes.push(format!(
                "{nonpositive} stage times ≤ 0 ns not shown on the log axis"
            ));
        }
        let old_here: Vec<&str> = self
            .old
            .iter()
            .filter(|&&i| runs[i].split.as_ref() == split && runs[i].group.as_ref() == group)
            .map(|&i| runs[i].label.as_str())
            .collect();
        if !old_here.is_empty() {
            notes.push(format!(
                "not shown, no stage columns (CSV from before the stamp chain): {}",
                old_here.join(", ")
            ));
        }
        notes
    }
}
