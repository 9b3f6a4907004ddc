//! `rtprobe plot CSV..`: checks the flags, draws the figures and prints the
//! path of each one.

use std::{path::PathBuf, process::ExitCode};

use anyhow::{Result, bail};

use crate::{
    cli::{MetricChoice, PlotArgs},
    export::plot::{
        Dim, FigureKind, ImageFormat, Metric, PlotOptions, Scale, default_prefix, dist,
    },
};

pub(super) fn command(args: &PlotArgs) -> Result<ExitCode> {
    for p in crate::export::plot::plot(&args.options()?)? {
        println!("{}", p.display());
    }
    Ok(ExitCode::SUCCESS)
}

impl PlotArgs {
    /// The plot module's options from the command line; checks what can be
    /// checked without touching files. (Public for the plot tests.)
    pub fn options(&self) -> Result<PlotOptions> {
        options(self)
    }
}

fn options(a: &PlotArgs) -> Result<PlotOptions> {
    if a.csv.is_empty() {
        bail!("no CSV file given: rtprobe plot FILE.csv [FILE.csv ...]");
    }
    if !a.label.is_empty() && a.label.len() != a.csv.len() {
        bail!(
            "--label given {} time(s) for {} CSV file(s): give one --label per CSV, in the same order",
            a.label.len(),
            a.csv.len()
        );
    }
    let (group_by, split_by) = grouping(a)?;
    let (metrics, metric_required) = match a.metric {
        None => (vec![Metric::OneWay, Metric::Rtt], false),
        Some(MetricChoice::Both) => (vec![Metric::OneWay, Metric::Rtt], true),
        Some(MetricChoice::OneWay) => (vec![Metric::OneWay], true),
        Some(MetricChoice::Rtt) => (vec![Metric::Rtt], true),
    };
    let (scale, y_min_ns, y_max_ns) = latency_axis(a)?;
    Ok(PlotOptions {
        inputs: a.csv.clone(),
        labels: a.label.clone(),
        out_dir: out_dir(a),
        prefix: prefix(a)?,
        metrics,
        metric_required,
        kinds: unique(if a.kind.is_empty() {
            &FigureKind::DEFAULT[..]
        } else {
            &a.kind[..]
        }),
        kinds_given: !a.kind.is_empty(),
        group_by,
        split_by,
        auto_split: a.split_by.is_none(),
        scale,
        formats: unique::<ImageFormat>(&a.format),
        size_px: a.figure_size,
        y_min_ns,
        y_max_ns,
        title: a.title.clone(),
        ignore_truncated: a.ignore_truncated,
        exact_limit: dist::EXACT_LIMIT,
    })
}

/// `--group-by` and `--split-by` (`none`: no split).
fn grouping(a: &PlotArgs) -> Result<(Option<Dim>, Option<Dim>)> {
    let group_by = a
        .group_by
        .as_deref()
        .map(|s| Dim::parse("--group-by", s))
        .transpose()?;
    let split_by = match a.split_by.as_deref() {
        Some(s) if s.trim().eq_ignore_ascii_case("none") => None,
        Some(s) => Some(Dim::parse("--split-by", s)?),
        None => None,
    };
    if group_by.is_some() && group_by == split_by {
        bail!(
            "--group-by and --split-by name the same key: split by another one, or drop --split-by"
        );
    }
    Ok((group_by, split_by))
}

/// The latency axis: its scale and the ends given (ns).
fn latency_axis(a: &PlotArgs) -> Result<(Scale, Option<f64>, Option<f64>)> {
    let y_min_ns = a.y_min.map(|d| d.as_nanos() as f64);
    let y_max_ns = a.y_max.map(|d| d.as_nanos() as f64);
    if let (Some(lo), Some(hi)) = (y_min_ns, y_max_ns)
        && lo >= hi
    {
        bail!("--y-min must be below --y-max");
    }
    if a.log && y_min_ns == Some(0.0) {
        bail!("--log needs a positive --y-min, e.g. --y-min 1us");
    }
    if a.log && a.linear {
        bail!("--log and --linear contradict each other: give one of them");
    }
    let scale = if a.log {
        Scale::Log
    } else if a.linear || y_min_ns == Some(0.0) {
        // An axis from 0 is a linear axis.
        Scale::Linear
    } else {
        Scale::Auto
    };
    Ok((scale, y_min_ns, y_max_ns))
}

/// `--prefix`, a bare file name, or one made from the inputs' names.
fn prefix(a: &PlotArgs) -> Result<String> {
    match &a.prefix {
        Some(p) => {
            if p.is_empty() || p.contains('/') || p == "." || p == ".." {
                bail!(
                    "--prefix {p:?} must be a file name without '/': put the directory in --out-dir"
                );
            }
            Ok(p.clone())
        }
        None => Ok(default_prefix(&a.csv)),
    }
}

/// `--out-dir`, else the first CSV's directory.
fn out_dir(a: &PlotArgs) -> PathBuf {
    match &a.out_dir {
        Some(d) => d.clone(),
        None => match a.csv[0].parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        },
    }
}

/// The values in their first order, each once.
fn unique<T: PartialEq + Copy>(given: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for v in given {
        if !out.contains(v) {
            out.push(*v);
        }
    }
    out
}
