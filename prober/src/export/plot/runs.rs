//! Runs: one flow of one input file, with what is known about it (size,
//! interval, XDP mode, timestamps), its label, colour and the keys that
//! place it in a figure (split) and on its axis (group).

use std::{collections::BTreeMap, path::Path};

use anyhow::{Result, bail};

use super::{
    Dim, PlotOptions,
    axis::{format_count, format_duration_ns},
    dist,
    run_data::{self, CsvRun, Series, XSource},
    stem,
};
use crate::model::meta::RunMeta;

/// What the time series' x axis shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TimeAxis {
    /// Seconds since the run's first probe (every CSV has a time column).
    Seconds,
    /// Probe sequence number (some CSV has none).
    ProbeNumber,
}

/// A run property value: orders groups on the axis and names files.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    pub(super) rank: (u8, u64),
    pub(super) text: String,
    pub(super) slug: String,
}

/// One flow of one CSV, the unit that gets a label, colour and box.
pub(super) struct Run {
    /// Index of the CSV in the inputs (for --label).
    pub(super) file: usize,
    pub(super) name: String,
    pub(super) stem: String,
    pub(super) flow: u8,
    pub(super) multi_flow: bool,
    pub(super) meta: Option<RunMeta>,
    pub(super) x_source: XSource,
    /// x of the file's first probe: time series start at 0.
    pub(super) x_origin: i64,
    pub(super) interval_ns: Option<u64>,
    pub(super) size: Option<u32>,
    pub(super) mode: Option<(String, bool)>,
    pub(super) ts: Option<&'static str>,
    pub(super) rows: u64,
    pub(super) lost: u64,
    /// Read from an HDR log: losses unknown.
    pub(super) from_hdr_log: bool,
    pub(super) lost_x: dist::TimeGrid,
    pub(super) lost_marks: Vec<f64>,
    pub(super) series: [Option<Series>; 2],
    /// Stage distributions per [`Stage::ALL`], if read.
    pub(super) stages: Option<Box<[dist::Dist; run_data::STAGES]>>,
    pub(super) has_stage_columns: bool,
    pub(super) label: String,
    pub(super) user_label: bool,
    pub(super) color: usize,
    pub(super) split: Option<Key>,
    pub(super) group: Option<Key>,
}

impl Run {
    /// Changes during the run the metadata records, as (x, what): the
    /// competing load coming on (it runs until after the last probe).
    pub(super) fn phases(&self) -> Vec<(i64, String)> {
        let Some(load) = self.meta.as_ref().and_then(|m| m.knobs.load.as_ref()) else {
            return Vec::new();
        };
        let started = load.started_ns;
        let specs = &load.specs;
        let what = if specs.is_empty() {
            "load on".to_string()
        } else {
            format!("load on: {}", specs.join(" + "))
        };
        vec![(started, what)]
    }

    pub(super) fn key(&self, d: Dim) -> Option<Key> {
        match d {
            Dim::Size => self.size.map(|s| Key {
                rank: (0, s as u64),
                text: format!("{s} B"),
                slug: format!("{s}B"),
            }),
            Dim::Interval => self.interval_ns.map(|ns| {
                let text = format_duration_ns(ns as f64);
                Key {
                    rank: (0, ns),
                    slug: text.replace(' ', "").replace('µ', "u"),
                    text,
                }
            }),
            Dim::Mode => self.mode.as_ref().map(|(mode, pass)| {
                // The study's order: baseline first, then the XDP variants.
                let rank = match mode.as_str() {
                    "off" => 0,
                    "skb" => 1,
                    "native" => 2,
                    "auto" => 3,
                    _ => 4,
                };
                let suffix = if *pass { " pass" } else { "" };
                Key {
                    rank: (rank, *pass as u64),
                    text: format!("XDP {mode}{suffix}"),
                    slug: format!("{mode}{}", suffix.replace(' ', "-")),
                }
            }),
        }
    }

    /// Everything known about the run, for a lone run's legend.
    pub(super) fn describe(&self) -> Vec<String> {
        [Dim::Mode, Dim::Size, Dim::Interval]
            .into_iter()
            .filter_map(|d| self.key(d).map(|k| k.text))
            .collect()
    }
}

/// Where x (a send time or sequence number) of run `r` lands on the time axis.
pub(super) fn time_coord(r: &Run, axis: TimeAxis, x: i64) -> Option<f64> {
    let rel = x as i128 - r.x_origin as i128;
    match (axis, r.x_source) {
        (TimeAxis::Seconds, _) => Some(rel as f64 / 1e9),
        (TimeAxis::ProbeNumber, XSource::Seq) => Some(x as f64),
        // A time-stamped run next to one without times: probe number from
        // the schedule.
        (TimeAxis::ProbeNumber, _) => r.interval_ns.map(|i| rel as f64 / i as f64),
    }
}

/// The runs of every input, labelled, coloured and keyed for the figures.
pub(super) fn build_runs(csvs: Vec<CsvRun>, opts: &PlotOptions) -> Result<Vec<Run>> {
    let mut runs = Vec::new();
    for (file, csv) in csvs.into_iter().enumerate() {
        runs.extend(runs_of_file(file, csv));
    }
    let resolved = auto_split(&runs, opts);
    let opts = resolved.as_ref().unwrap_or(opts);
    check_keys_known(&runs, opts)?;
    for r in runs.iter_mut() {
        r.split = opts.split_by.and_then(|d| r.key(d));
        r.group = opts.group_by.and_then(|d| r.key(d));
    }
    assign_labels(&mut runs, opts)?;
    assign_colors(&mut runs);
    Ok(runs)
}

/// One run per flow of an input file, with what its metadata and rows
/// say about it; no label, colour or keys yet.
fn runs_of_file(file: usize, csv: CsvRun) -> Vec<Run> {
    let multi_flow = csv.flows.len() > 1;
    let x_origin = csv
        .flows
        .iter()
        .filter_map(|f| f.first_x[0])
        .min()
        .unwrap_or(0);
    let stem = stem(Path::new(&csv.name));
    let mut runs = Vec::with_capacity(csv.flows.len());
    for f in csv.flows {
        let meta = csv.meta.clone();
        let interval_ns = meta
            .as_ref()
            .map(|m| m.interval_ns)
            .filter(|&i| i > 0)
            .or_else(|| f.inferred_interval_ns(csv.x_source));
        // The size column is per flow; metadata has the run's size.
        let size = f
            .size
            .or_else(|| meta.as_ref().map(|m| m.size).filter(|&s| s > 0));
        let mode = meta.as_ref().and_then(xdp_mode);
        let ts = f.ts.describe().or_else(|| {
            meta.as_ref()
                .and_then(|m| match m.timestamps_requested.as_str() {
                    "software" => Some("sw"),
                    "hardware" => Some("hw"),
                    _ => None,
                })
        });
        runs.push(Run {
            file,
            name: csv.name.clone(),
            stem: stem.clone(),
            flow: f.flow,
            multi_flow,
            meta,
            x_source: csv.x_source,
            x_origin,
            interval_ns,
            size,
            mode,
            ts,
            rows: f.rows,
            lost: f.lost,
            from_hdr_log: csv.from_hdr_log,
            lost_x: f.lost_x,
            lost_marks: Vec::new(),
            series: [f.one_way, f.rtt],
            stages: f.stages,
            has_stage_columns: csv.has_stage_columns,
            label: String::new(),
            user_label: false,
            color: 0,
            split: None,
            group: None,
        });
    }
    runs
}

/// The XDP mode the run's router had, and whether its action was pass.
fn xdp_mode(m: &RunMeta) -> Option<(String, bool)> {
    // A --target run crosses no router of rtprobe's: no XDP mode.
    if m.testbed == "remote" {
        return None;
    }
    let mode = if m.xdp_mode_attached.is_empty() {
        &m.xdp_mode_requested
    } else {
        &m.xdp_mode_attached
    };
    // Nothing attached ("none") is the kernel-forwarding
    // baseline the study calls XDP off.
    let mode = if mode == "none" { "off" } else { mode.as_str() };
    (!mode.is_empty()).then(|| (mode.to_string(), m.xdp_action == "pass" && mode != "off"))
}

/// The options with `--split-by` chosen, when grouped runs differ in size
/// or interval and no split was given; `None` keeps the options as given.
fn auto_split(runs: &[Run], opts: &PlotOptions) -> Option<PlotOptions> {
    if !(opts.auto_split && opts.split_by.is_none() && opts.group_by.is_some()) {
        return None;
    }
    // The study's figures: grouped by interval, one figure per size.
    let split = [Dim::Size, Dim::Interval]
        .into_iter()
        .filter(|d| Some(*d) != opts.group_by)
        .find(|d| runs.iter().all(|r| r.key(*d).is_some()) && distinct_keys(runs, *d) > 1);
    if let Some(d) = split {
        log::info!(
            "one figure per {} (--split-by none to draw them together)",
            d.noun()
        );
    }
    Some(PlotOptions {
        split_by: split,
        ..opts.clone()
    })
}

/// `--group-by` and `--split-by` need every run's value of their property.
fn check_keys_known(runs: &[Run], opts: &PlotOptions) -> Result<()> {
    for (flag, dim) in [("--group-by", opts.group_by), ("--split-by", opts.split_by)] {
        let Some(d) = dim else { continue };
        for r in runs {
            if r.key(d).is_none() {
                let why = if r.meta.is_none() {
                    "it has no run metadata line (# rtprobe-meta:)"
                } else {
                    "its metadata and rows do not say"
                };
                bail!(
                    "{flag} {}: the {} of {} is unknown ({why}); use --label to tell runs apart instead",
                    match d {
                        Dim::Size => "size",
                        Dim::Interval => "interval",
                        Dim::Mode => "mode",
                    },
                    d.noun(),
                    r.name
                );
            }
        }
    }
    Ok(())
}

/// Colours follow labels in order of first appearance: the first run is
/// red, the second blue, and a label keeps its colour in every figure.
fn assign_colors(runs: &mut [Run]) {
    let mut order: Vec<String> = Vec::new();
    for r in runs.iter_mut() {
        r.color = match order.iter().position(|l| *l == r.label) {
            Some(i) => i,
            None => {
                order.push(r.label.clone());
                order.len() - 1
            }
        };
    }
}

/// How many different values of `d` the runs have (unknown counts as one).
fn distinct_keys(runs: &[Run], d: Dim) -> usize {
    let mut seen: Vec<Option<Key>> = Vec::new();
    for r in runs {
        let k = r.key(d);
        if !seen.contains(&k) {
            seen.push(k);
        }
    }
    seen.len()
}

fn assign_labels(runs: &mut [Run], opts: &PlotOptions) -> Result<()> {
    let skip = [opts.group_by, opts.split_by];
    // Properties that tell runs apart (and are not already the axis or the
    // figure): a derived label names those.
    let varying: Vec<Dim> = [Dim::Mode, Dim::Size, Dim::Interval]
        .into_iter()
        .filter(|d| !skip.contains(&Some(*d)))
        .filter(|d| distinct_keys(runs, *d) > 1)
        .collect();
    let lone = runs.len() == 1;
    for r in runs.iter_mut() {
        let (mut label, user) = label_of(r, opts, &varying, lone);
        if r.multi_flow {
            label.push_str(&format!(" flow {}", r.flow));
        }
        r.label = label;
        r.user_label = user;
    }
    make_labels_unique(runs, opts)
}

/// A run's label and whether the user gave it: `--label`, else the run's
/// own (its meta line), else derived from the `varying` properties.
fn label_of(r: &Run, opts: &PlotOptions, varying: &[Dim], lone: bool) -> (String, bool) {
    let meta_label = r
        .meta
        .as_ref()
        .and_then(|m| m.label.clone())
        .filter(|l| !l.trim().is_empty());
    if let Some(l) = opts.labels.get(r.file) {
        (l.clone(), true)
    } else if let Some(l) = meta_label {
        (l, false)
    } else {
        let parts: Vec<String> = varying
            .iter()
            .map(|d| {
                r.key(*d)
                    .map_or_else(|| format!("{} ?", d.noun()), |k| k.text)
            })
            .collect();
        let parts = if parts.is_empty() && lone {
            r.describe()
        } else {
            parts
        };
        if parts.is_empty() {
            (r.stem.clone(), false)
        } else {
            (parts.join(", "), false)
        }
    }
}

/// A label must name one run per figure: per split, and per group when
/// grouped (then equal labels across groups are the same series). Derived
/// labels that clash get the file's name, then the run's position; two
/// equal `--label`s are an error.
fn make_labels_unique(runs: &mut [Run], opts: &PlotOptions) -> Result<()> {
    let scope = |r: &Run| {
        (
            r.split.clone(),
            if opts.group_by.is_some() {
                r.group.clone()
            } else {
                None
            },
        )
    };
    for pass in 0..2 {
        let mut seen: BTreeMap<(Option<Key>, Option<Key>, String), usize> = BTreeMap::new();
        let mut clash = Vec::new();
        for (i, r) in runs.iter().enumerate() {
            let (s, g) = scope(r);
            if let Some(&j) = seen.get(&(s.clone(), g.clone(), r.label.clone())) {
                clash.push((j, i));
            } else {
                seen.insert((s, g, r.label.clone()), i);
            }
        }
        if clash.is_empty() {
            return Ok(());
        }
        for (j, i) in clash {
            if runs[i].user_label && runs[j].user_label && runs[i].label == runs[j].label {
                let where_ = if opts.group_by.is_some() {
                    " in the same group"
                } else {
                    ""
                };
                bail!(
                    "--label {:?} names both {} and {}{where_}: give each CSV its own label",
                    runs[i].label,
                    runs[j].name,
                    runs[i].name
                );
            }
            // Derived labels: tell them apart by file, then by position.
            let tail = if pass == 0 {
                format!(" ({})", runs[i].stem)
            } else {
                format!(" #{}", i + 1)
            };
            runs[i].label.push_str(&tail);
            if pass == 0 && !runs[j].label.ends_with(&format!(" ({})", runs[j].stem)) {
                let t = format!(" ({})", runs[j].stem);
                runs[j].label.push_str(&t);
            }
        }
    }
    Ok(())
}

/// `what`, then what the runs have in common: size, interval, XDP mode,
/// timestamp source, probe count (or `--title`).
pub(super) fn title(runs: &[&Run], what: &str, opts: &PlotOptions) -> String {
    if let Some(t) = &opts.title {
        return format!("{what} — {t}");
    }
    let common = |d: Dim| -> Option<Key> {
        let k = runs.first()?.key(d)?;
        runs.iter()
            .all(|r| r.key(d).as_ref() == Some(&k))
            .then_some(k)
    };
    let mut parts = Vec::new();
    match (common(Dim::Size), common(Dim::Interval)) {
        (Some(s), Some(i)) => parts.push(format!("{} probes every {}", s.text, i.text)),
        (Some(s), None) => parts.push(format!("{} probes", s.text)),
        (None, Some(i)) => parts.push(format!("probes every {}", i.text)),
        (None, None) => {}
    }
    if let Some(m) = common(Dim::Mode) {
        parts.push(m.text);
    }
    if let Some(ts) = runs.first().and_then(|r| r.ts)
        && runs.iter().all(|r| r.ts == Some(ts))
    {
        parts.push(format!("{ts} timestamps"));
    }
    let rows = runs.first().map_or(0, |r| r.rows);
    if runs.iter().all(|r| r.rows == rows) {
        let n = format_count(rows);
        if runs.len() == 1 && runs[0].from_hdr_log {
            parts.push(format!("{n} samples (HdrHistogram log)"));
        } else if runs.len() == 1 {
            parts.push(format!("{n} probes ({} lost)", format_count(runs[0].lost)));
        } else {
            parts.push(format!("{n} probes each"));
        }
    }
    if parts.is_empty() {
        what.to_string()
    } else {
        format!("{what} — {}", parts.join(", "))
    }
}
