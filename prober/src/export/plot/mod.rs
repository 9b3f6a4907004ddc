//! `rtprobe plot`: boxplots, CDFs, time series, percentile distributions and
//! per-stage boxplots from rtprobe CSVs, in the study's style (baseline red,
//! optimisation blue, one box per group and run on a shared axis), as SVG or
//! PNG. Pure: files in, files out.
//!
//! The flow: [`read`] streams each CSV into per-flow latency vectors (one
//! *run* per file and flow; the stage columns too when the stages figure is
//! asked for) -> runs get a label, a colour and their group keys (size /
//! interval / XDP mode, from the run metadata or the data) -> per metric,
//! each run is reduced to a small summary ([`stats`]: box statistics, every
//! outlier, a thinned CDF, time series and percentile curve) and its raw
//! samples are dropped -> summaries are laid out into figures with axes
//! ([`axis`]: log by default where a tail dwarfs the body) and titles ->
//! [`draw`] renders them with plotters.
//!
//! Figures are regenerated from saved CSVs with the binary alone, e.g.
//! `rtprobe plot xdp-off.csv xdp-native.csv --out-dir docs/figures --prefix example`;
//! `docs/figures/regenerate.sh` reruns the probe first (the README examples).

pub mod axis;
pub mod bench;
pub mod dist;
pub mod draw;
pub mod hdrlog;
pub mod read;
pub mod stats;

use std::{
    collections::{BTreeMap, HashSet},
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result, bail};
use clap::ValueEnum;

use self::{
    axis::{ValueAxis, format_count, format_duration_ns},
    draw::{
        BoxFigure, BoxItem, CdfCurve, CdfFigure, Figure, PercentileCurve, PercentileFigure,
        TimeColumn, TimeFigure, TimeLine,
    },
    read::{CsvRun, ReadOptions, Series, Want, XSource},
    stats::{BoxStats, CdfPoint},
};
use crate::{model::run::RunMeta, stats::chain::Stage};

/// Which latency to draw (`--metric`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MetricChoice {
    /// Receiver RX - sender TX timestamp (one_way_ns).
    #[value(name = "one-way")]
    OneWay,
    /// Echo RX - sender TX timestamp (rtt_ns).
    Rtt,
    /// One figure set per metric.
    Both,
}

/// One latency metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    OneWay,
    Rtt,
}

impl Metric {
    fn index(self) -> usize {
        self as usize
    }

    /// File name part.
    pub fn slug(self) -> &'static str {
        match self {
            Metric::OneWay => "one-way",
            Metric::Rtt => "rtt",
        }
    }

    /// Title and axis name.
    pub fn name(self) -> &'static str {
        match self {
            Metric::OneWay => "One-way latency",
            Metric::Rtt => "Round-trip time",
        }
    }

    pub fn column(self) -> &'static str {
        match self {
            Metric::OneWay => "one_way_ns",
            Metric::Rtt => "rtt_ns",
        }
    }
}

/// Which figures to draw (`--kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FigureKind {
    /// Boxplot, whiskers at 1.5 IQR, every outlier (`*-box`).
    Box,
    /// Empirical CDF (`*-cdf`).
    Cdf,
    /// Latency per probe over time, lost probes marked (`*-time`).
    Time,
    /// Latency by percentile on a log(1/(1-p)) axis, 50 % to 99.99 % and
    /// beyond, HdrHistogram style: the tail at a glance (`*-percentiles`).
    Percentiles,
    /// Time per stage of the timestamp chain (stack, sender queue, driver,
    /// path, receiver, reflector, return), one box per stage and run
    /// (`*-stages`; CSVs written since rtprobe records the chain).
    Stages,
}

impl FigureKind {
    fn slug(self) -> &'static str {
        match self {
            FigureKind::Box => "box",
            FigureKind::Cdf => "cdf",
            FigureKind::Time => "time",
            FigureKind::Percentiles => "percentiles",
            FigureKind::Stages => "stages",
        }
    }

    /// What `--kind` draws when not given; stages only for CSVs that have
    /// the stage columns.
    pub const DEFAULT: [FigureKind; 5] = [
        FigureKind::Box,
        FigureKind::Cdf,
        FigureKind::Time,
        FigureKind::Percentiles,
        FigureKind::Stages,
    ];
}

/// Latency axis scale (`--log`, `--linear`, else chosen per figure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Log where the spread needs it: the largest value is more than
    /// [`AUTO_LOG_RATIO`] times the median (for stages: the largest stage
    /// median that many times the smallest, or the largest value that
    /// many times the largest median), and no value is <= 0.
    Auto,
    Log,
    Linear,
}

/// Above this ratio of largest to typical value a linear axis squashes the
/// body into a line at the bottom: a 5 µs body under a 1.5 ms outlier.
pub const AUTO_LOG_RATIO: f64 = 20.0;

impl Scale {
    /// Whether an axis over positive values from `typical_ns` to `max_ns`
    /// is logarithmic.
    fn log_for(self, typical_ns: Option<f64>, max_ns: Option<f64>) -> bool {
        match self {
            Scale::Log => true,
            Scale::Linear => false,
            Scale::Auto => match (typical_ns, max_ns) {
                (Some(t), Some(m)) if t > 0.0 => m / t > AUTO_LOG_RATIO,
                _ => false,
            },
        }
    }
}

/// Output image format (`--format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ImageFormat {
    /// Scalable vector graphics, text kept as text.
    Svg,
    /// Bitmap through plotters' bitmap backend.
    Png,
}

impl ImageFormat {
    fn ext(self) -> &'static str {
        match self {
            ImageFormat::Svg => "svg",
            ImageFormat::Png => "png",
        }
    }
}

/// A run property figures can be grouped or split by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    Size,
    Interval,
    Mode,
}

impl Dim {
    /// Parses `--group-by` / `--split-by` values; one-line error naming the flag.
    pub fn parse(flag: &str, s: &str) -> Result<Dim> {
        match s.trim().to_ascii_lowercase().as_str() {
            "size" | "packet-size" => Ok(Dim::Size),
            "interval" => Ok(Dim::Interval),
            "mode" | "xdp-mode" | "xdp" => Ok(Dim::Mode),
            _ => bail!("unknown {flag} {s:?}: use size, interval or mode"),
        }
    }

    fn axis_name(self) -> &'static str {
        match self {
            Dim::Size => "Probe size (UDP payload)",
            Dim::Interval => "Probe interval",
            Dim::Mode => "XDP mode",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Dim::Size => "probe size",
            Dim::Interval => "probe interval",
            Dim::Mode => "XDP mode",
        }
    }
}

/// `WIDTHxHEIGHT` in pixels (clap value parser for `--figure-size`).
pub fn parse_figure_size(s: &str) -> std::result::Result<(u32, u32), String> {
    let bad =
        || format!("invalid figure size {s:?}: expected WIDTHxHEIGHT in pixels, e.g. 1000x600");
    let (w, h) = s.trim().split_once(['x', 'X']).ok_or_else(bad)?;
    let w: u32 = w.trim().parse().map_err(|_| bad())?;
    let h: u32 = h.trim().parse().map_err(|_| bad())?;
    if !(200..=20_000).contains(&w) || !(150..=20_000).contains(&h) {
        return Err(format!(
            "figure size {w}x{h} is out of range: width 200-20000, height 150-20000 pixels"
        ));
    }
    Ok((w, h))
}

/// A latency bound such as `0`, `20us`, `1.5ms` (clap value parser for
/// `--y-min` / `--y-max`).
pub fn parse_latency(s: &str) -> std::result::Result<Duration, String> {
    if s.trim().trim_start_matches('0').is_empty() {
        return Ok(Duration::ZERO);
    }
    crate::model::units::parse_duration(s)
}

/// Validated `rtprobe plot` options.
#[derive(Debug, Clone)]
pub struct PlotOptions {
    pub inputs: Vec<PathBuf>,
    /// Empty, or one label per input.
    pub labels: Vec<String>,
    pub out_dir: PathBuf,
    /// File name prefix of every figure.
    pub prefix: String,
    pub metrics: Vec<Metric>,
    /// The metrics were asked for explicitly: a CSV without one is an error.
    pub metric_required: bool,
    pub kinds: Vec<FigureKind>,
    /// `--kind` was given: a kind that cannot be drawn is reported.
    pub kinds_given: bool,
    pub group_by: Option<Dim>,
    pub split_by: Option<Dim>,
    /// No `--split-by` given: with `--group-by`, split by whichever of size
    /// and interval varies (the study's one figure per packet size).
    pub auto_split: bool,
    pub scale: Scale,
    pub formats: Vec<ImageFormat>,
    pub size_px: (u32, u32),
    pub y_min_ns: Option<f64>,
    pub y_max_ns: Option<f64>,
    pub title: Option<String>,
    pub ignore_truncated: bool,
    /// Samples per series kept exactly before it moves into an HDR
    /// histogram ([`dist::EXACT_LIMIT`]; `usize::MAX` keeps every sample,
    /// memory then grows with the run: the benchmark's peer).
    pub exact_limit: usize,
}

impl PlotOptions {
    /// The defaults of `rtprobe plot CSV... --out-dir DIR`: both metrics
    /// where present, every figure kind, SVG at 1000x600, log axes where
    /// the spread needs them. Callers change the fields they need:
    /// `PlotOptions { formats: vec![ImageFormat::Png], ..PlotOptions::new(csvs, dir) }`.
    pub fn new(inputs: Vec<PathBuf>, out_dir: PathBuf) -> PlotOptions {
        PlotOptions {
            prefix: default_prefix(&inputs),
            inputs,
            labels: Vec::new(),
            out_dir,
            metrics: vec![Metric::OneWay, Metric::Rtt],
            metric_required: false,
            kinds: FigureKind::DEFAULT.to_vec(),
            kinds_given: false,
            group_by: None,
            split_by: None,
            auto_split: true,
            scale: Scale::Auto,
            formats: vec![ImageFormat::Svg],
            size_px: (1000, 600),
            y_min_ns: None,
            y_max_ns: None,
            title: None,
            ignore_truncated: false,
            exact_limit: dist::EXACT_LIMIT,
        }
    }
}

/// `out.csv` -> `out`; two or three files -> `a-vs-b`; more -> `compare`.
pub fn default_prefix(inputs: &[PathBuf]) -> String {
    let stems: Vec<String> = inputs.iter().map(|p| stem(p)).collect();
    match stems.len() {
        1 => stems[0].clone(),
        2 | 3 => stems.join("-vs-"),
        _ => "compare".into(),
    }
}

fn stem(p: &Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "plot".into())
}

/// Reads the CSVs, draws every requested figure, returns their paths.
pub fn plot(opts: &PlotOptions) -> Result<Vec<PathBuf>> {
    for p in &opts.inputs {
        read::check_input(p)?;
    }
    let reports = opts.inputs.iter().filter(|p| is_bench_report(p)).count();
    if reports == opts.inputs.len() {
        return bench::plot(opts);
    }
    if reports > 0 {
        bail!(
            "a bench-forward JSON report and probe CSVs were given together: plot the report on \
             its own (rtprobe plot FILE.json)"
        );
    }
    prepare_out_dir(&opts.out_dir)?;

    let want = |m: Metric| {
        if !opts.metrics.contains(&m) {
            Want::Skip
        } else if opts.metric_required {
            Want::Required
        } else {
            Want::IfPresent
        }
    };
    let ropts = ReadOptions {
        one_way: want(Metric::OneWay),
        rtt: want(Metric::Rtt),
        allow_truncated: opts.ignore_truncated,
        stages: opts.kinds.contains(&FigureKind::Stages),
        exact_limit: opts.exact_limit,
        // About two per pixel: after the last regrid at least half are used.
        columns: 2 * opts.size_px.0 as usize,
    };
    let mut csvs = Vec::with_capacity(opts.inputs.len());
    for p in &opts.inputs {
        let csv = read::read_input_file(p, &ropts)?;
        if let Some(line) = csv.skipped_truncated_line {
            log::warn!("{}: skipped the cut-short last line {line}", csv.name);
        }
        csvs.push(csv);
    }
    let mut runs = build_runs(csvs, opts)?;
    let time_axis = if runs.iter().all(|r| r.x_source != XSource::Seq) {
        TimeAxis::Seconds
    } else {
        TimeAxis::ProbeNumber
    };
    for r in runs.iter_mut() {
        // One mark per column with a loss: closer marks share a pixel.
        let marks: Vec<i64> = r
            .lost_x
            .finish()
            .into_iter()
            .filter(|c| c.lost > 0)
            .map(|c| c.lost_x)
            .collect();
        r.lost_marks = marks
            .into_iter()
            .filter_map(|x| time_coord(r, time_axis, x))
            .collect();
    }

    let mut out = Output {
        opts,
        written: Vec::new(),
        names: HashSet::new(),
        skipped: Vec::new(),
    };
    for &metric in &opts.metrics {
        let m = metric.index();
        let have: Vec<usize> = (0..runs.len())
            .filter(|&i| runs[i].series[m].is_some())
            .collect();
        if have.is_empty() {
            // Not asked for explicitly (else the reader failed): older or
            // one-metric CSVs simply lack it.
            log::info!(
                "no CSV has a {} column: no {} figures",
                metric.column(),
                metric.name()
            );
            continue;
        }
        for r in runs.iter().filter(|r| r.series[m].is_none()) {
            log::warn!(
                "{} has no {} column: left out of the {} figures",
                r.name,
                metric.column(),
                metric.name()
            );
        }
        let sums: Vec<Option<Summary>> = runs
            .iter_mut()
            .map(|r| {
                let s = r.series[m].take()?;
                Some(summarize(s, r, opts, time_axis))
            })
            .collect();
        let ctx = FigureCtx {
            metric,
            runs: &runs,
            sums: &sums,
            opts,
            time_axis,
        };
        let mut splits: BTreeMap<Option<Key>, Vec<usize>> = BTreeMap::new();
        for &i in &have {
            splits.entry(runs[i].split.clone()).or_default().push(i);
        }
        for (split, sel) in &splits {
            if opts.kinds.contains(&FigureKind::Box) {
                match ctx.box_figure(sel) {
                    Ok(fig) => out.save(
                        &Figure::Box(fig),
                        Some(metric),
                        split.as_ref(),
                        None,
                        FigureKind::Box,
                    )?,
                    Err(e) => out.skipped("boxplot", e),
                }
            }
            let mut groups: BTreeMap<Option<Key>, Vec<usize>> = BTreeMap::new();
            for &i in sel {
                groups.entry(runs[i].group.clone()).or_default().push(i);
            }
            for (group, gsel) in &groups {
                if opts.kinds.contains(&FigureKind::Cdf) {
                    match ctx.cdf_figure(gsel) {
                        Ok(fig) => out.save(
                            &Figure::Cdf(fig),
                            Some(metric),
                            split.as_ref(),
                            group.as_ref(),
                            FigureKind::Cdf,
                        )?,
                        Err(e) => out.skipped("CDF", e),
                    }
                }
                if opts.kinds.contains(&FigureKind::Time) {
                    match ctx.time_figure(gsel) {
                        Ok(fig) => out.save(
                            &Figure::Time(fig),
                            Some(metric),
                            split.as_ref(),
                            group.as_ref(),
                            FigureKind::Time,
                        )?,
                        Err(e) => out.skipped("time series", e),
                    }
                }
                if opts.kinds.contains(&FigureKind::Percentiles) {
                    match ctx.percentile_figure(gsel) {
                        Ok(fig) => out.save(
                            &Figure::Percentiles(fig),
                            Some(metric),
                            split.as_ref(),
                            group.as_ref(),
                            FigureKind::Percentiles,
                        )?,
                        Err(e) => out.skipped("percentile figure", e),
                    }
                }
            }
        }
    }
    if opts.kinds.contains(&FigureKind::Stages) {
        stage_figures(&mut runs, opts, &mut out)?;
    }
    if out.written.is_empty() {
        if let Some(why) = out.skipped.first() {
            bail!("nothing to plot: {why}");
        }
        bail!(
            "nothing to plot: no run has a latency sample for {} (every probe lost or without timestamps?)",
            opts.metrics
                .iter()
                .map(|m| m.column())
                .collect::<Vec<_>>()
                .join(" or ")
        );
    }
    Ok(out.written)
}

/// Creates the output directory and proves it writable before any work.
/// Whether a file is a `bench-forward --json` report (only a file that
/// starts with `{` is read whole: CSVs and logs are told at once).
fn is_bench_report(path: &Path) -> bool {
    use std::io::Read;
    let Ok(mut f) = fs::File::open(path) else {
        return false;
    };
    let mut first = [0u8; 1];
    if f.read(&mut first).map_or(true, |n| n == 0) || first[0] != b'{' {
        return false;
    }
    crate::input::read_capped(
        path,
        "bench-forward JSON report",
        crate::input::MAX_REPORT_BYTES,
    )
    .is_ok_and(|text| bench::sniff(&text))
}

fn prepare_out_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| {
        format!(
            "cannot create --out-dir {}: pick a directory you can write to",
            dir.display()
        )
    })?;
    if !dir.is_dir() {
        bail!("--out-dir {} is not a directory", dir.display());
    }
    let probe = dir.join(format!(".rtprobe-plot-{}.tmp", std::process::id()));
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|_| fs::remove_file(&probe))
        .with_context(|| {
            format!(
                "cannot write in --out-dir {}: pick a directory you can write to",
                dir.display()
            )
        })
}

struct Output<'a> {
    opts: &'a PlotOptions,
    written: Vec<PathBuf>,
    names: HashSet<PathBuf>,
    /// Why figures were left out (the first one explains an empty result).
    skipped: Vec<String>,
}

impl Output<'_> {
    fn skipped(&mut self, what: &str, e: anyhow::Error) {
        log::warn!("no {what}: {e:#}");
        self.skipped.push(format!("{e:#}"));
    }

    fn save(
        &mut self,
        fig: &Figure,
        metric: Option<Metric>,
        split: Option<&Key>,
        group: Option<&Key>,
        kind: FigureKind,
    ) -> Result<()> {
        let mut name = self.opts.prefix.clone();
        if let Some(m) = metric {
            name.push('-');
            name.push_str(m.slug());
        }
        for k in [split, group].into_iter().flatten() {
            name.push('-');
            // Keys can come from metadata text: keep them one file name.
            name.extend(k.slug.chars().map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                    c
                } else {
                    '_'
                }
            }));
        }
        name.push('-');
        name.push_str(kind.slug());
        for &format in &self.opts.formats {
            let path = self.opts.out_dir.join(format!("{name}.{}", format.ext()));
            if !self.names.insert(path.clone()) {
                bail!(
                    "two figures would both be written to {}: give the runs distinct sizes/intervals/modes or use --prefix per call",
                    path.display()
                );
            }
            draw::save(fig, &path, format, self.opts.size_px)?;
            self.written.push(path);
        }
        Ok(())
    }
}

/// What the time series' x axis shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimeAxis {
    /// Seconds since the run's first probe (every CSV has a time column).
    Seconds,
    /// Probe sequence number (some CSV has none).
    ProbeNumber,
}

/// A run property value: orders groups on the axis and names files.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    rank: (u8, u64),
    text: String,
    slug: String,
}

/// One flow of one CSV, the unit that gets a label, colour and box.
struct Run {
    /// Index of the CSV in the inputs (for --label).
    file: usize,
    name: String,
    stem: String,
    flow: u8,
    multi_flow: bool,
    meta: Option<RunMeta>,
    x_source: XSource,
    /// x of the file's first probe: time series start at 0.
    x_origin: i64,
    interval_ns: Option<u64>,
    size: Option<u32>,
    mode: Option<(String, bool)>,
    ts: Option<&'static str>,
    rows: u64,
    lost: u64,
    /// Read from an HDR log: losses unknown.
    from_hdr_log: bool,
    lost_x: dist::TimeGrid,
    lost_marks: Vec<f64>,
    series: [Option<Series>; 2],
    /// Stage distributions per [`Stage::ALL`], if read.
    stages: Option<Box<[dist::Dist; read::STAGES]>>,
    has_stage_columns: bool,
    label: String,
    user_label: bool,
    color: usize,
    split: Option<Key>,
    group: Option<Key>,
}

impl Run {
    /// Changes during the run the metadata records, as (x, what): the
    /// competing load coming on (it runs until after the last probe).
    fn phases(&self) -> Vec<(i64, String)> {
        let Some(load) = self.meta.as_ref().and_then(|m| m.knobs.get("load")) else {
            return Vec::new();
        };
        let Some(started) = load.get("started_ns").and_then(|v| v.as_i64()) else {
            return Vec::new();
        };
        let specs: Vec<&str> = load
            .get("specs")
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|s| s.as_str()).collect())
            .unwrap_or_default();
        let what = if specs.is_empty() {
            "load on".to_string()
        } else {
            format!("load on: {}", specs.join(" + "))
        };
        vec![(started, what)]
    }

    fn key(&self, d: Dim) -> Option<Key> {
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
    fn describe(&self) -> Vec<String> {
        [Dim::Mode, Dim::Size, Dim::Interval]
            .into_iter()
            .filter_map(|d| self.key(d).map(|k| k.text))
            .collect()
    }
}

fn build_runs(csvs: Vec<CsvRun>, opts: &PlotOptions) -> Result<Vec<Run>> {
    let mut runs = Vec::new();
    for (file, csv) in csvs.into_iter().enumerate() {
        let multi_flow = csv.flows.len() > 1;
        let x_origin = csv
            .flows
            .iter()
            .filter_map(|f| f.first_x[0])
            .min()
            .unwrap_or(0);
        let stem = stem(Path::new(&csv.name));
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
            let mode = meta.as_ref().and_then(|m| {
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
                (!mode.is_empty())
                    .then(|| (mode.to_string(), m.xdp_action == "pass" && mode != "off"))
            });
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
    }
    let resolved;
    let opts = if opts.auto_split && opts.split_by.is_none() && opts.group_by.is_some() {
        // The study's figures: grouped by interval, one figure per size.
        let split = [Dim::Size, Dim::Interval]
            .into_iter()
            .filter(|d| Some(*d) != opts.group_by)
            .find(|d| runs.iter().all(|r| r.key(*d).is_some()) && distinct_keys(&runs, *d) > 1);
        if let Some(d) = split {
            log::info!(
                "one figure per {} (--split-by none to draw them together)",
                d.noun()
            );
        }
        resolved = PlotOptions {
            split_by: split,
            ..opts.clone()
        };
        &resolved
    } else {
        opts
    };
    for (flag, dim) in [("--group-by", opts.group_by), ("--split-by", opts.split_by)] {
        let Some(d) = dim else { continue };
        for r in &runs {
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
    for r in runs.iter_mut() {
        r.split = opts.split_by.and_then(|d| r.key(d));
        r.group = opts.group_by.and_then(|d| r.key(d));
    }
    assign_labels(&mut runs, opts)?;
    // Colours follow labels in order of first appearance: the first run is
    // red, the second blue, and a label keeps its colour in every figure.
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
    Ok(runs)
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
        let meta_label = r
            .meta
            .as_ref()
            .and_then(|m| m.label.clone())
            .filter(|l| !l.trim().is_empty());
        let (mut label, user) = if let Some(l) = opts.labels.get(r.file) {
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
        };
        if r.multi_flow {
            label.push_str(&format!(" flow {}", r.flow));
        }
        r.label = label;
        r.user_label = user;
    }
    // A label must name one run per figure: per split, and per group when
    // grouped (then equal labels across groups are the same series).
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

/// Fine enough that the thinned CDF is indistinguishable from the full one
/// at figure resolution, coarse enough that 1 M samples stay ~100 KB of SVG.
const CDF_RESOLUTION: usize = 800;

/// Points per percentile curve: smooth at figure width.
const PERCENTILE_POINTS: usize = 600;

/// What a figure needs of one run and metric; the raw samples are gone.
struct Summary {
    n: u64,
    /// Every sample known exactly (else from an HDR histogram).
    exact: bool,
    missing: u64,
    stats: Option<BoxStats>,
    outliers: Vec<i64>,
    cdf: Vec<CdfPoint>,
    time: Vec<TimeColumn>,
    min: Option<i64>,
    max: Option<i64>,
    min_positive: Option<i64>,
    median: Option<f64>,
    /// (log10(1/(1-p)), latency ns) from p = 0 to the last percentile the
    /// samples resolve (1 - 1/n).
    percentiles: Vec<(f64, f64)>,
    nonpositive: u64,
    /// Samples outside a user-fixed latency range.
    outside: u64,
}

fn time_coord(r: &Run, axis: TimeAxis, x: i64) -> Option<f64> {
    let rel = x as i128 - r.x_origin as i128;
    match (axis, r.x_source) {
        (TimeAxis::Seconds, _) => Some(rel as f64 / 1e9),
        (TimeAxis::ProbeNumber, XSource::Seq) => Some(x as f64),
        // A time-stamped run next to one without times: probe number from
        // the schedule.
        (TimeAxis::ProbeNumber, _) => r.interval_ns.map(|i| rel as f64 / i as f64),
    }
}

fn summarize(s: Series, r: &Run, opts: &PlotOptions, time_axis: TimeAxis) -> Summary {
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

struct FigureCtx<'a> {
    metric: Metric,
    runs: &'a [Run],
    sums: &'a [Option<Summary>],
    opts: &'a PlotOptions,
    time_axis: TimeAxis,
}

impl FigureCtx<'_> {
    fn sum(&self, i: usize) -> &Summary {
        self.sums[i]
            .as_ref()
            .expect("only runs with the metric are selected")
    }

    /// A latency axis covering every sample of the selected runs; log
    /// when asked, or (by default) when the largest sample is more than
    /// [`AUTO_LOG_RATIO`] times the lowest median.
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

/// `what`, then what the runs have in common: size, interval, XDP mode,
/// timestamp source, probe count (or `--title`).
fn title(runs: &[&Run], what: &str, opts: &PlotOptions) -> String {
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

    fn box_figure(&self, sel: &[usize]) -> Result<BoxFigure> {
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

    fn cdf_figure(&self, sel: &[usize]) -> Result<CdfFigure> {
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

    fn time_figure(&self, sel: &[usize]) -> Result<TimeFigure> {
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
    fn percentile_figure(&self, sel: &[usize]) -> Result<PercentileFigure> {
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

/// The stages kind: one figure per split and group, one box per stage and
/// run. Runs from CSVs without stage columns are named in a note (or, if no
/// run has them, the figure is skipped with the reason).
fn stage_figures(runs: &mut [Run], opts: &PlotOptions, out: &mut Output) -> Result<()> {
    let old: Vec<usize> = (0..runs.len())
        .filter(|&i| !runs[i].has_stage_columns)
        .collect();
    if old.len() == runs.len() {
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
    // Stages outside the metric asked for stay out: --metric one-way
    // shows the sender's stages and the path.
    let shown_metric = |s: Stage| match opts.metrics.as_slice() {
        [Metric::OneWay] => matches!(
            s,
            Stage::Stack | Stage::SenderQueue | Stage::Driver | Stage::Path
        ),
        _ => true,
    };
    /// One stage of one run, its samples gone.
    struct StageSum {
        b: BoxStats,
        outliers: Vec<i64>,
        nonpositive: u64,
        min_positive: Option<i64>,
    }
    let mut sums: Vec<Option<Vec<Option<StageSum>>>> = Vec::new();
    for r in runs.iter_mut() {
        sums.push(r.stages.take().map(|st| {
            let st: [dist::Dist; read::STAGES] = *st;
            st.into_iter()
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
        }));
    }
    let mut splits: BTreeMap<(Option<Key>, Option<Key>), Vec<usize>> = BTreeMap::new();
    for (i, r) in runs.iter().enumerate() {
        if sums[i].is_some() {
            splits
                .entry((r.split.clone(), r.group.clone()))
                .or_default()
                .push(i);
        }
    }
    for ((split, group), sel) in &splits {
        let stage = |i: usize, k: usize| sums[i].as_ref().and_then(|v| v[k].as_ref());
        let shown: Vec<usize> = (0..Stage::ALL.len())
            .filter(|&k| shown_metric(Stage::ALL[k]) && sel.iter().any(|&i| stage(i, k).is_some()))
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
            continue;
        }
        let all = || {
            sel.iter()
                .flat_map(|&i| shown.iter().filter_map(move |&k| stage(i, k)))
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
        let (Some(lo), Some(hi)) = (lo, hi) else {
            out.skipped(
                "stages figure",
                anyhow::anyhow!("--log needs positive stage times, and none is above 0 ns"),
            );
            continue;
        };
        let axis = ValueAxis::fit(lo as f64, hi as f64, log, opts.y_min_ns, opts.y_max_ns)?;
        let mut colors: Vec<usize> = sel.iter().map(|&i| runs[i].color).collect();
        colors.sort_unstable();
        colors.dedup();
        let mut boxes = Vec::new();
        let mut nonpositive = 0;
        for (cat, &k) in shown.iter().enumerate() {
            for &i in sel {
                let Some(StageSum {
                    b,
                    outliers,
                    nonpositive: np,
                    ..
                }) = stage(i, k)
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
        let mut legend: Vec<(String, usize)> = Vec::new();
        for &i in sel {
            if !legend.iter().any(|(_, c)| *c == runs[i].color) {
                legend.push((runs[i].label.clone(), runs[i].color));
            }
        }
        legend.sort_by_key(|(_, c)| *c);
        let mut notes = Vec::new();
        if axis.log && nonpositive > 0 {
            notes.push(format!(
                "{nonpositive} stage times ≤ 0 ns not shown on the log axis"
            ));
        }
        let old_here: Vec<&str> = old
            .iter()
            .filter(|&&i| runs[i].split == *split && runs[i].group == *group)
            .map(|&i| runs[i].label.as_str())
            .collect();
        if !old_here.is_empty() {
            notes.push(format!(
                "not shown, no stage columns (CSV from before the stamp chain): {}",
                old_here.join(", ")
            ));
        }
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
        out.save(
            &Figure::Box(fig),
            None,
            split.as_ref(),
            group.as_ref(),
            FigureKind::Stages,
        )?;
    }
    Ok(())
}
