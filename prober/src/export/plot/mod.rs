//! `rtprobe plot`: boxplots, CDFs, time series, percentile distributions and
//! per-stage boxplots from rtprobe CSVs, in the study's style (baseline red,
//! optimisation blue, one box per group and run on a shared axis), as SVG or
//! PNG. Pure: files in, files out.
//!
//! The flow: [`read`] streams each CSV (or, through [`hdrlog_read`], an
//! HdrHistogram interval log) into per-flow latency distributions and time
//! series ([`run_data`]; one *run* per file and flow; the stage columns too
//! when the stages figure is asked for) -> runs get a label, a colour and
//! their group keys (`runs`: size / interval / XDP mode, from the run
//! metadata or the data) -> per metric, each run is reduced to a small
//! summary ([`stats`]: box statistics, every outlier, a thinned CDF, time
//! series and percentile curve) and its raw samples are dropped ->
//! summaries are laid out into figures with axes ([`axis`]: log by default
//! where a tail dwarfs the body) and titles (`figures`, and `stages` for
//! the per-stage boxes) -> [`draw`] renders them with plotters. A
//! bench-forward JSON report goes to [`forward`] instead, and an
//! `rtprobe flows` CSV (one row per sampled TCP send) to [`passive`]: its
//! flows' p50 per stage as stacked bars (`PREFIX-flows-stages`) and each
//! stage over time (`PREFIX-flows-time`).
//!
//! Figures are regenerated from saved CSVs with the binary alone, e.g.
//! `rtprobe plot xdp-off.csv xdp-native.csv --out-dir docs/figures --prefix example`;
//! `docs/figures/regenerate.sh` reruns the probe first (the README examples).

pub(crate) mod axis;
pub mod dist;
pub mod draw;
mod figures;
pub(crate) mod forward;
pub(crate) mod hdrlog_read;
pub(crate) mod passive;
pub mod read;
pub mod run_data;
mod runs;
mod stages;
pub mod stats;

use std::{
    collections::{BTreeMap, HashSet},
    fs,
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context, Result, bail};

use self::{
    draw::Figure,
    figures::{FigureCtx, Summary, summarize},
    run_data::{ReadOptions, Want, XSource},
    runs::{Key, TimeAxis, build_runs, time_coord},
    stages::stage_figures,
};

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
    pub(crate) fn slug(self) -> &'static str {
        match self {
            Metric::OneWay => "one-way",
            Metric::Rtt => "rtt",
        }
    }

    /// Title and axis name.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Metric::OneWay => "One-way latency",
            Metric::Rtt => "Round-trip time",
        }
    }

    pub(crate) fn column(self) -> &'static str {
        match self {
            Metric::OneWay => "one_way_ns",
            Metric::Rtt => "rtt_ns",
        }
    }
}

/// Which figures to draw (`--kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    pub(crate) const DEFAULT: [FigureKind; 5] = [
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
pub(crate) const AUTO_LOG_RATIO: f64 = 20.0;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    pub(crate) fn parse(flag: &str, s: &str) -> Result<Dim> {
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

/// `WIDTHxHEIGHT` in pixels (the value parser of `--figure-size`).
pub(crate) fn parse_figure_size(s: &str) -> std::result::Result<(u32, u32), String> {
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

/// A latency bound such as `0`, `20us`, `1.5ms` (the value parser of
/// `--y-min` / `--y-max`).
pub(crate) fn parse_latency(s: &str) -> std::result::Result<Duration, String> {
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
pub(crate) fn default_prefix(inputs: &[PathBuf]) -> String {
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
    let flows = opts
        .inputs
        .iter()
        .filter(|p| passive::is_flows_csv(p))
        .count();
    if flows == opts.inputs.len() {
        return passive::plot(opts);
    }
    if flows > 0 {
        bail!(
            "an `rtprobe flows` CSV was given with other inputs (probe CSVs, logs or reports): \
             plot them apart (rtprobe plot FLOWS.csv)"
        );
    }
    let reports = opts.inputs.iter().filter(|p| is_bench_report(p)).count();
    if reports == opts.inputs.len() {
        return forward::plot(opts);
    }
    if reports > 0 {
        bail!(
            "a bench-forward JSON report and probe CSVs were given together: plot the report on \
             its own (rtprobe plot FILE.json)"
        );
    }
    prepare_out_dir(&opts.out_dir)?;

    let ropts = read_options(opts);
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
        place_lost_marks(r, time_axis);
    }

    let mut out = Output {
        opts,
        written: Vec::new(),
        names: HashSet::new(),
        skipped: Vec::new(),
    };
    for &metric in &opts.metrics {
        metric_figures(&mut runs, metric, time_axis, &mut out)?;
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

/// What the readers keep: only the metrics and columns the figures asked
/// for need memory.
fn read_options(opts: &PlotOptions) -> ReadOptions {
    let want = |m: Metric| {
        if !opts.metrics.contains(&m) {
            Want::Skip
        } else if opts.metric_required {
            Want::Required
        } else {
            Want::IfPresent
        }
    };
    ReadOptions {
        one_way: want(Metric::OneWay),
        rtt: want(Metric::Rtt),
        allow_truncated: opts.ignore_truncated,
        stages: opts.kinds.contains(&FigureKind::Stages),
        exact_limit: opts.exact_limit,
        // About two per pixel: after the last regrid at least half are used.
        columns: 2 * opts.size_px.0 as usize,
    }
}

/// Where the run's lost probes are marked on the time axis.
fn place_lost_marks(r: &mut runs::Run, time_axis: TimeAxis) {
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

/// Every figure of one metric: the runs that have it are summarised (their
/// samples dropped), then drawn per split and group.
fn metric_figures(
    runs: &mut [runs::Run],
    metric: Metric,
    time_axis: TimeAxis,
    out: &mut Output,
) -> Result<()> {
    let opts = out.opts;
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
        return Ok(());
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
        runs: &*runs,
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
            group_figures(&ctx, split.as_ref(), group.as_ref(), gsel, out)?;
        }
    }
    Ok(())
}

/// The figures drawn per group (one curve per run): CDF, time series and
/// percentiles, each as asked.
fn group_figures(
    ctx: &FigureCtx,
    split: Option<&Key>,
    group: Option<&Key>,
    sel: &[usize],
    out: &mut Output,
) -> Result<()> {
    let kinds = &ctx.opts.kinds;
    let metric = Some(ctx.metric);
    if kinds.contains(&FigureKind::Cdf) {
        match ctx.cdf_figure(sel) {
            Ok(fig) => out.save(&Figure::Cdf(fig), metric, split, group, FigureKind::Cdf)?,
            Err(e) => out.skipped("CDF", e),
        }
    }
    if kinds.contains(&FigureKind::Time) {
        match ctx.time_figure(sel) {
            Ok(fig) => out.save(&Figure::Time(fig), metric, split, group, FigureKind::Time)?,
            Err(e) => out.skipped("time series", e),
        }
    }
    if kinds.contains(&FigureKind::Percentiles) {
        match ctx.percentile_figure(sel) {
            Ok(fig) => out.save(
                &Figure::Percentiles(fig),
                metric,
                split,
                group,
                FigureKind::Percentiles,
            )?,
            Err(e) => out.skipped("percentile figure", e),
        }
    }
    Ok(())
}

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
    .is_ok_and(|text| forward::sniff(&text))
}

/// Creates the output directory and proves it writable before any work.
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
