//! Scenario files: `rtprobe run configs/FILE.toml` runs a matrix of probe
//! runs (sizes x intervals x XDP modes x knob sets), each cell with its
//! own CSV and JSON in one output folder, then writes `report.md`.
//!
//! ```toml
//! name = "bql"                          # default: the file name
//! description = "Study 2.1: BQL limit_max 3000 under TCP load"
//! output = "results/bql"                # default: results/NAME
//!
//! [probe]                               # what every cell sends
//! sizes = [64, 200, 1472]               # UDP payload bytes
//! intervals = ["1ms", "10ms", "100ms"]
//! count = 1000                          # or duration = "30s"
//! xdp_mode = "off"                      # or xdp_modes = ["off", "skb"]
//! tos = "0xC0"
//! port = 5061
//! flows = ["port=5062,tos=0,size=1472"]  # more probe flows at once (CLI --flow)
//! busy_poll = true                      # any probe command option, in snake_case
//!
//! [knobs]                               # common to every set
//! link_rate = "100mbit"
//! load = ["tcp:100%"]
//!
//! [set.baseline]                        # first set = the baseline (red)
//!
//! [set.bql-3000]                        # each further set is compared to it
//! bql_limit_max = 3000
//! ```
//!
//! The tables are the option model's specs ([`crate::spec`]): `[probe]`
//! takes every option of [`RunSpec`] plus the matrix keys, `[knobs]` and
//! `[set.NAME]` a [`KnobSpec`] each, merged `[knobs]` < set < command line.
//! Every cell goes through the command line's validator.
//!
//! Everything is validated before anything is touched: syntax, unknown
//! keys, units and cross-field rules (errors name the file, line, column
//! and key), then what the kernel must have (qdiscs unless the set says
//! `missing = "skip"`, congestion controls, stress-ng), checked in a
//! scratch namespace. Executing a cell is behind [`CellRunner`], so the
//! matrix and report logic is tested with a fake runner; figures are
//! behind [`FigureMaker`].

pub use crate::spec::{
    FlowSpec,
    plan::{DEFAULT_COUNT, MAX_PAYLOAD_1500, RunOptions},
};

use std::{
    collections::BTreeMap,
    fmt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Deserializer, Serialize, de};
use serde_json::{Map, Value};

use crate::{
    ebpf::XdpMode,
    model::units,
    spec::{
        self, KnobSpec, OutputSpec, RunSpec, SpecError,
        located::{key_span, line_col, located, located_toml_error},
    },
    stats::Summary,
    tune::{Knobs, MissingPolicy, StressTool},
};

/// Most cells a scenario may have (sizes x intervals x XDP modes x sets).
/// Each cell is a validated plan kept in memory and a probe run of its
/// own; the shipped studies have at most a few hundred. Counted before
/// any cell is built, so an oversized matrix costs nothing.
pub(crate) const MAX_CELLS: u64 = 10_000;

// ---------------------------------------------------------------- file --

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    name: Option<String>,
    description: Option<String>,
    output: Option<PathBuf>,
    #[serde(default)]
    probe: ProbeSection,
    #[serde(default)]
    knobs: KnobSpec,
    #[serde(default)]
    set: Sets,
}

/// `[set.NAME]` tables in the order the file has them (toml keeps the
/// order with its `preserve_order` feature; a map visitor sees it).
#[derive(Debug, Default)]
struct Sets(Vec<(String, KnobSpec)>);

impl<'de> Deserialize<'de> for Sets {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = Sets;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("tables [set.NAME] of knobs")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut m: A) -> Result<Sets, A::Error> {
                let mut v = Vec::new();
                while let Some((k, knobs)) = m.next_entry::<String, KnobSpec>()? {
                    v.push((k, knobs));
                }
                Ok(Sets(v))
            }
        }
        d.deserialize_map(V)
    }
}

/// `[probe]`: every option of [`RunSpec`] (the probe command's flags in
/// snake_case), plus the matrix: `sizes`, `intervals`, `xdp_modes` (one
/// cell per combination) instead of `size`, `interval`, `xdp_mode`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ProbeSection {
    sizes: Option<Vec<usize>>,
    intervals: Option<Vec<Humane>>,
    xdp_modes: Option<Vec<XdpMode>>,
    #[serde(flatten)]
    run: RunSpec,
    /// Every key (serde gives flattened maps all of them): those no spec
    /// knows are refused, with their line.
    #[serde(flatten)]
    unknown: BTreeMap<String, de::IgnoredAny>,
}

/// A duration written as "1ms", "1.5ms", "30s".
#[derive(Debug, Clone, Copy, PartialEq)]
struct Humane(Duration);

impl<'de> Deserialize<'de> for Humane {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        units::humane_duration::deserialize(d).map(Humane)
    }
}

/// Options given on the command line of `rtprobe run`, over the file's.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub run: RunSpec,
    pub knobs: KnobSpec,
}

// ----------------------------------------------------------- validated --

/// The matrix's axes: one cell per size x interval x XDP mode x knob set.
#[derive(Debug, Clone, PartialEq)]
pub struct Axes {
    pub sizes: Vec<usize>,
    pub intervals: Vec<Duration>,
    pub xdp_modes: Vec<XdpMode>,
}

/// A named knob set, merged over the file's `[knobs]`.
#[derive(Debug, Clone, PartialEq)]
pub struct KnobSet {
    pub name: String,
    pub knobs: Knobs,
}

/// A validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub description: Option<String>,
    /// Where results go unless --out-dir says otherwise.
    pub output: PathBuf,
    pub axes: Axes,
    /// The file's `[probe]` options under the command line's, as every
    /// cell starts from them (the axes then set size, interval and mode).
    pub spec: RunSpec,
    /// In file order; the first is the baseline.
    pub sets: Vec<KnobSet>,
    /// The file's text and name, for error locations and the output copy.
    pub source: String,
    pub path: PathBuf,
    /// Every cell's validated plan, in run order (see [`Scenario::cells`]).
    plans: Vec<CellPlan>,
}

/// One cell's place in the matrix and its validated plan.
#[derive(Debug, Clone)]
struct CellPlan {
    set: String,
    run: RunOptions,
}

/// One cell of the matrix: its place, and the plan it runs.
#[derive(Debug, Clone)]
pub struct Cell {
    /// 0-based position in the run order.
    pub index: usize,
    pub total: usize,
    /// File stem of this cell's outputs, e.g. `s64-i1ms-off-bql-3000`.
    pub id: String,
    /// Knob set name.
    pub set: String,
    /// Index of (xdp mode, set) among the variants; 0 is the baseline.
    pub variant: usize,
    /// What the cell runs: the plan the one validator made from the file's
    /// specs (and the command line's), with this cell's output files
    /// (`out`, `json`, `queue_csv`, `label`) and its knobs with the probe
    /// context set (`Knobs::set_probe`).
    pub run: RunOptions,
}

impl Cell {
    /// Legend / RunMeta label: "bql-3000" or "bql-3000 (xdp skb)".
    pub fn label(&self) -> &str {
        self.run.label.as_deref().unwrap_or(&self.set)
    }

    /// The cell's probe CSV.
    pub fn csv(&self) -> &Path {
        &self.run.out
    }

    /// The cell's JSON summary, next to its CSV.
    pub fn json(&self) -> PathBuf {
        self.run
            .json
            .clone()
            .unwrap_or_else(|| self.run.out.with_extension("json"))
    }

    /// Rough wall time of the cell, for the progress bar's ETA.
    pub fn estimate(&self) -> Duration {
        let p = &self.run.probe;
        let probing = match (p.count, p.duration) {
            (_, Some(d)) => d,
            (Some(n), None) => p.interval * n.min(u32::MAX as u64) as u32,
            (None, None) => Duration::ZERO,
        };
        let knobs = &self.run.knobs;
        let warmup = if knobs.loads().is_empty() {
            Duration::ZERO
        } else {
            knobs
                .load_warmup
                .unwrap_or(crate::tune::DEFAULT_LOAD_WARMUP)
        };
        probing + warmup + p.timeout + Duration::from_secs(1)
    }
}

/// File stem of a cell's outputs: `s64-i1ms-off-bql-3000`.
fn cell_id(size: usize, interval: Duration, mode: XdpMode, set: &str) -> String {
    format!(
        "s{size}-i{}-{}-{set}",
        units::fmt_duration(interval),
        mode.as_str()
    )
}

/// What the real runner hands back for a cell.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct CellResult {
    /// The run's summary; its report holds `load` and `skipped` as
    /// `Applied::stop_load()` returned them.
    pub summary: Summary,
    /// `Applied::metadata()`: what the knobs applied.
    pub knobs: Map<String, Value>,
}

/// One cell as the report sees it.
pub(crate) struct ReportRow<'a> {
    pub cell: &'a Cell,
    /// The cell's result, or why it failed.
    pub result: Result<&'a CellResult, &'a str>,
    /// Comparison figures against the baseline (paths under the output dir).
    pub figures: Vec<std::path::PathBuf>,
    /// p50/p99 against the baseline with confidence intervals, in words
    /// (`export::compare`), for variants whose CSVs could be compared.
    pub vs_baseline: Option<String>,
}

/// Executes one cell: build the testbed, attach XDP, apply the knobs, probe,
/// write `cell.csv` and `cell.json`, restore.
pub(crate) trait CellRunner {
    fn run_cell(&mut self, cell: &Cell) -> Result<CellResult>;
}

/// Draws the comparison of one cell against the baseline of its group;
/// returns the files, which the report links (relative to the output dir).
pub(crate) trait FigureMaker {
    fn compare(&mut self, out_dir: &Path, baseline: &Cell, other: &Cell) -> Result<Vec<PathBuf>>;
}

/// What the system must provide, asked without touching the user's setup.
pub trait SystemCheck {
    /// Kinds (and "u32") the kernel lacks among `kinds`.
    fn missing_qdiscs(&mut self, kinds: &[&'static str]) -> Result<Vec<String>>;
    fn congestion_controls(&mut self) -> Result<Vec<String>>;
    fn has_stress_ng(&mut self) -> bool;
}

/// The real checks, through the kernel layer: qdiscs in a scratch
/// namespace, /proc for congestion controls; PATH for stress-ng.
pub(crate) struct KernelCheck(pub crate::sys::SysRef);

impl SystemCheck for KernelCheck {
    fn missing_qdiscs(&mut self, kinds: &[&'static str]) -> Result<Vec<String>> {
        self.0.missing_qdisc_kinds(kinds)
    }

    fn congestion_controls(&mut self) -> Result<Vec<String>> {
        crate::tune::load::available_cc(self.0.as_ref())
    }

    fn has_stress_ng(&mut self) -> bool {
        crate::tune::stress::stress_ng_path().is_some()
    }
}

// ------------------------------------------------------ error locations --

/// One line for a toml parse/deserialize error: file, line, column, key.
fn toml_error(file: &Path, text: &str, e: &toml::de::Error) -> anyhow::Error {
    if let Some(located) = probe_key_error(file, text) {
        return located;
    }
    located_toml_error(file, text, e)
}

/// `[probe]` is read through serde's `flatten` (one spec per concept in
/// one table), which loses the position of a bad value. Reading each of its
/// entries alone finds the one that fails, with its line and key.
fn probe_key_error(file: &Path, text: &str) -> Option<anyhow::Error> {
    use toml::de::{DeTable, DeValue};
    let doc = DeTable::parse(text).ok()?;
    let (_, probe) = doc.get_ref().iter().find(|(k, _)| k.get_ref() == "probe")?;
    let DeValue::Table(t) = probe.get_ref() else {
        return None;
    };
    for (k, v) in t.iter() {
        let entry = text.get(k.span().start..v.span().end)?;
        if let Err(e) = toml::from_str::<ScenarioFile>(&format!("[probe]\n{entry}\n")) {
            let (l, c) = line_col(text, k.span().start);
            let msg = e.message().trim().replace('\n', " ");
            return Some(anyhow!(
                "{}:{l}:{c}: probe.{}: {msg}",
                file.display(),
                k.get_ref()
            ));
        }
    }
    None
}

// ------------------------------------------------------------- parsing --

/// Refuses a matrix of more than [`MAX_CELLS`] cells, from the lengths of
/// its axes alone (checked products: no length can wrap the count).
fn check_cell_count(path: &Path, axes: [(usize, &str); 4]) -> Result<()> {
    let cells = axes
        .iter()
        .try_fold(1u64, |n, &(len, _)| n.checked_mul(len as u64));
    if cells.is_some_and(|n| n <= MAX_CELLS) {
        return Ok(());
    }
    let count = cells.map_or_else(|| "more than 2^64".to_string(), |n| n.to_string());
    let product = axes
        .iter()
        .map(|(len, what)| format!("{len} {what}"))
        .collect::<Vec<_>>()
        .join(" x ");
    bail!(
        "{}: the matrix has {count} cells ({product}), over the limit of {MAX_CELLS}: \
         shorten the lists or split the scenario into several files",
        path.display()
    )
}

/// The file's tables, read with serde; a bench-forward sweep given here is
/// named as such.
fn read_file(path: &Path, text: &str) -> Result<ScenarioFile> {
    toml::from_str(text).map_err(|e| {
        if crate::spec::bench_forward::BenchForwardArgs::parse(path, text).is_ok() {
            anyhow!(
                "{} is a bench-forward sweep, not a scenario: run `sudo rtprobe \
                 bench-forward --config {}`",
                path.display(),
                path.display()
            )
        } else {
            toml_error(path, text, &e)
        }
    })
}

/// Whether `name` can name files: letters, digits, '-', '_' or '.'.
fn names_a_file(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// The matrix's axes (the file's lists or single values, the command
/// line's value replacing a list) and the `[probe]` spec under the command
/// line's, which every cell starts from.
fn axes(
    p: ProbeSection,
    over: &Overrides,
    loc: &dyn Fn(&[&str], &dyn fmt::Display) -> anyhow::Error,
) -> Result<(Axes, RunSpec)> {
    let one_of = |list: &'static str, one: &'static str| {
        loc(&["probe", list], &format!("give {one} or {list}, not both"))
    };
    let sizes = match (p.sizes, p.run.probe.size) {
        (Some(_), Some(_)) => return Err(one_of("sizes", "size")),
        (Some(v), None) => v,
        (None, s) => vec![s.unwrap_or(spec::plan::DEFAULT_SIZE)],
    };
    let intervals = match (p.intervals, p.run.probe.interval) {
        (Some(_), Some(_)) => return Err(one_of("intervals", "interval")),
        (Some(v), None) => v.into_iter().map(|h| h.0).collect(),
        (None, i) => vec![i.unwrap_or(spec::plan::DEFAULT_INTERVAL)],
    };
    let xdp_modes = match (p.xdp_modes, p.run.xdp.xdp_mode) {
        (Some(_), Some(_)) => return Err(one_of("xdp_modes", "xdp_mode")),
        (Some(v), None) => v,
        // The file's default is the baseline, not the CLI's auto.
        (None, m) => vec![m.unwrap_or(XdpMode::Off)],
    };
    for (list, empty) in [
        ("sizes", sizes.is_empty()),
        ("intervals", intervals.is_empty()),
        ("xdp_modes", xdp_modes.is_empty()),
    ] {
        if empty {
            return Err(loc(&["probe", list], &"give at least one"));
        }
    }
    // The command line's size/interval/mode replace the file's lists.
    let axes = Axes {
        sizes: over.run.probe.size.map_or(sizes, |s| vec![s]),
        intervals: over.run.probe.interval.map_or(intervals, |i| vec![i]),
        xdp_modes: over.run.xdp.xdp_mode.map_or(xdp_modes, |m| vec![m]),
    };
    Ok((axes, p.run.overridden_by(&over.run)?))
}

/// A `[set.NAME]` table: its own knobs, and those over `[knobs]` and under
/// the command line's, which its cells run with.
struct SetSpec<'a> {
    name: String,
    own: &'a KnobSpec,
    merged: KnobSpec,
}

/// Every set's knobs merged `[knobs]` < set < command line; set names must
/// name files and differ in more than case.
fn merge_sets<'a>(
    common: &KnobSpec,
    raw: &'a [(String, KnobSpec)],
    over: &KnobSpec,
    loc: &dyn Fn(&[&str], &dyn fmt::Display) -> anyhow::Error,
) -> Result<Vec<SetSpec<'a>>> {
    let mut sets: Vec<SetSpec<'a>> = Vec::new();
    for (name, own) in raw {
        if !names_a_file(name) {
            return Err(loc(
                &["set", name],
                &"set names name files: use letters, digits, '-', '_' or '.'",
            ));
        }
        let merged = spec::merge(&spec::merge(common, own)?, over)?;
        sets.push(SetSpec {
            name: name.clone(),
            own,
            merged,
        });
    }
    let mut seen = std::collections::HashSet::new();
    for s in &sets {
        if !seen.insert(s.name.to_ascii_lowercase()) {
            return Err(loc(&["set", &s.name], &"two sets differ only in case"));
        }
    }
    Ok(sets)
}

/// Every cell through the one validator, in run order: size, then
/// interval, then XDP mode, then set.
fn plan_cells(
    axes: &Axes,
    spec: &RunSpec,
    sets: &[SetSpec<'_>],
    blame: &Blame<'_>,
) -> Result<Vec<CellPlan>> {
    let mut plans = Vec::new();
    for &size in &axes.sizes {
        for &interval in &axes.intervals {
            for &mode in &axes.xdp_modes {
                for set in sets {
                    let mut cell = spec.clone();
                    cell.probe.size = Some(size);
                    cell.probe.interval = Some(interval);
                    cell.xdp.xdp_mode = Some(mode);
                    let run = spec::plan::validate(&cell, &set.merged, &OutputSpec::default())
                        .and_then(runs_to_an_end)
                        .map_err(|e| {
                            blame.error(e, set, &cell_id(size, interval, mode, &set.name))
                        })?;
                    plans.push(CellPlan {
                        set: set.name.clone(),
                        run,
                    });
                }
            }
        }
    }
    Ok(plans)
}

/// A scenario's cell must end for the next to start.
fn runs_to_an_end(p: RunOptions) -> Result<RunOptions, SpecError> {
    if p.continuous.forever {
        return Err(SpecError::new(
            "forever",
            "would never end the first cell: give each cell a count or a duration (probe \
             until stopped is for single runs)",
        ));
    }
    Ok(p)
}

impl Scenario {
    /// Reads and validates a scenario file (no system access).
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_with(path, &Overrides::default())
    }

    /// Reads a scenario file with the command line's options over it.
    pub fn load_with(path: &Path, over: &Overrides) -> Result<Self> {
        let text = crate::input::read_text(path, "scenario file", crate::input::MAX_CONFIG_BYTES)?;
        Self::parse_with(path, &text, over)
    }

    /// Parses and validates `text` (named `path` in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Self> {
        Self::parse_with(path, text, &Overrides::default())
    }

    /// Parses `text`, lays the command line's `over` over it and validates
    /// every cell with the one validator ([`spec::plan::validate`]), so a
    /// cell that cannot run is refused here, naming the key and line (or
    /// the flag) and the cell, before anything is built.
    pub fn parse_with(path: &Path, text: &str, over: &Overrides) -> Result<Self> {
        let f = read_file(path, text)?;
        let loc = |p: &[&str], m: &dyn fmt::Display| located(path, text, p, m);
        // serde hands every key of [probe] to the catch-all; the specs' own
        // keys are not unknown.
        let known = spec::keys_of::<RunSpec>();
        if let Some(k) = f.probe.unknown.keys().find(|k| !known.contains(k)) {
            return Err(loc(
                &["probe", k],
                &format!(
                    "unknown field `{k}`: [probe] takes the probe command's options in \
                     snake_case (see `rtprobe --help`) and sizes, intervals, xdp_modes"
                ),
            ));
        }
        let name = match f.name {
            Some(n) => n,
            None => path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "scenario".into()),
        };
        if !names_a_file(&name) {
            return Err(loc(
                &["name"],
                &"use letters, digits, '-', '_' or '.' (it names files)",
            ));
        }
        let (axes, spec) = axes(f.probe, over, &loc)?;
        let raw_sets = if f.set.0.is_empty() {
            // No sets: one run of the common knobs.
            vec![("default".to_string(), KnobSpec::default())]
        } else {
            f.set.0
        };
        check_cell_count(
            path,
            [
                (axes.sizes.len(), "sizes"),
                (axes.intervals.len(), "intervals"),
                (axes.xdp_modes.len(), "XDP modes"),
                (raw_sets.len(), "sets"),
            ],
        )?;
        let sets = merge_sets(&f.knobs, &raw_sets, &over.knobs, &loc)?;
        let blame = Blame {
            path,
            text,
            over,
            sizes: key_span(text, &["probe", "sizes"]).is_some(),
            intervals: key_span(text, &["probe", "intervals"]).is_some(),
            xdp_modes: key_span(text, &["probe", "xdp_modes"]).is_some(),
        };
        let plans = plan_cells(&axes, &spec, &sets, &blame)?;
        if plans.is_empty() {
            bail!("{}: the matrix is empty", path.display());
        }
        let sets = sets
            .iter()
            .map(|s| KnobSet {
                name: s.name.clone(),
                knobs: plans
                    .iter()
                    .find(|c| c.set == s.name)
                    .map(|c| c.run.knobs.clone())
                    .unwrap_or_default(),
            })
            .collect();
        Ok(Scenario {
            output: f.output.unwrap_or_else(|| Path::new("results").join(&name)),
            name,
            description: f.description,
            axes,
            spec,
            sets,
            source: text.to_string(),
            path: path.to_path_buf(),
            plans,
        })
    }

    /// What every cell shares but its size, interval, XDP mode and knobs:
    /// the first cell's plan.
    pub fn common(&self) -> &RunOptions {
        // parse_with refuses an empty matrix, and retain_sets keeps the plans.
        &self.plans[0].run
    }

    /// What the kernel must have, checked before anything is touched:
    /// qdiscs (unless the set skips missing ones), congestion controls,
    /// stress-ng. Errors name the file, line and key.
    pub fn check_system(&self, sys: &mut dyn SystemCheck) -> Result<Vec<String>> {
        let mut notes = Vec::new();
        let mut cc: Option<Vec<String>> = None;
        for s in &self.sets {
            let where_ = |key: &str| -> Vec<String> {
                if self.set_has_key(&s.name, key) {
                    vec!["set".into(), s.name.clone(), key.into()]
                } else {
                    vec!["knobs".into(), key.into()]
                }
            };
            let loc = |key: &str, m: &dyn fmt::Display| {
                let p = where_(key);
                let p: Vec<&str> = p.iter().map(String::as_str).collect();
                located(&self.path, &self.source, &p, m)
            };
            if let Some(q) = &s.knobs.qdisc {
                let missing = sys.missing_qdiscs(&q.requirements())?;
                if !missing.is_empty() {
                    let what = format!(
                        "qdisc {} needs {}, which this kernel lacks",
                        q.kind(),
                        missing.join(", ")
                    );
                    match s.knobs.missing() {
                        MissingPolicy::Fail => {
                            return Err(loc(
                                "qdisc",
                                &format!(
                                    "{what}: pick another qdisc, load the module, or set \
                                     missing = \"skip\" (or run with --missing skip) to run \
                                     this set without it"
                                ),
                            ));
                        }
                        MissingPolicy::Skip => {
                            notes.push(format!("set {}: {what}; it will be skipped", s.name))
                        }
                    }
                }
            }
            for l in s.knobs.loads() {
                if let Some(c) = l.cc() {
                    if cc.is_none() {
                        cc = Some(sys.congestion_controls()?);
                    }
                    let avail = cc.as_deref().unwrap_or_default();
                    if let Err(m) = crate::tune::load::check_cc(c, avail) {
                        return Err(loc("load", &m));
                    }
                }
            }
            if s.knobs.stress_tool == Some(StressTool::StressNg) && !sys.has_stress_ng() {
                return Err(loc(
                    "stress_tool",
                    &"stress-ng is not installed: apt-get install stress-ng, or use the built-in stress",
                ));
            }
        }
        Ok(notes)
    }

    fn set_has_key(&self, set: &str, key: &str) -> bool {
        key_span(&self.source, &["set", set, key]).is_some()
    }

    /// (xdp mode, set) pairs in run order; the first is the baseline.
    pub fn variants(&self) -> Vec<(XdpMode, &KnobSet)> {
        let mut v = Vec::new();
        for m in &self.axes.xdp_modes {
            for s in &self.sets {
                v.push((*m, s));
            }
        }
        v
    }

    /// Every cell, in run order: size, then interval, then variant, so a
    /// (size, interval) group's comparisons are adjacent. Each is its
    /// validated plan with the cell's own output files in `out_dir`.
    pub fn cells(&self, out_dir: &Path) -> Vec<Cell> {
        let multi_mode = self.axes.xdp_modes.len() > 1;
        let kept: Vec<&CellPlan> = self
            .plans
            .iter()
            .filter(|c| self.sets.iter().any(|s| s.name == c.set))
            .collect();
        let total = kept.len();
        let per_group = self.axes.xdp_modes.len() * self.sets.len();
        let mut cells = Vec::with_capacity(total);
        for (i, c) in kept.into_iter().enumerate() {
            let set = c.set.clone();
            let run = &c.run;
            let id = cell_id(run.probe.size, run.probe.interval, run.xdp_mode, &set);
            let label = if multi_mode {
                format!("{set} (xdp {})", run.xdp_mode.as_str())
            } else {
                set.clone()
            };
            // Each cell writes its own HDR log next to its CSV.
            let mut continuous = run.continuous.clone();
            if continuous.hdr_log.is_some() {
                continuous.hdr_log = Some(out_dir.join(format!("{id}.hlog")));
            }
            let run = RunOptions {
                out: out_dir.join(format!("{id}.csv")),
                json: Some(out_dir.join(format!("{id}.json"))),
                label: Some(label),
                quiet: true,
                queue_csv: run
                    .knobs
                    .queue_sample
                    .map(|_| out_dir.join(format!("{id}-queue.csv"))),
                continuous,
                ..run.clone()
            };
            cells.push(Cell {
                index: i,
                total,
                set,
                variant: i % per_group.max(1),
                run,
                id,
            });
        }
        cells
    }

    /// Keeps only the named sets (CLI --set); unknown names are an error.
    pub fn retain_sets(&mut self, names: &[String]) -> Result<()> {
        if names.is_empty() {
            return Ok(());
        }
        for n in names {
            if !self.sets.iter().any(|s| &s.name == n) {
                bail!(
                    "{} has no set {n:?}: it has {}",
                    self.path.display(),
                    self.sets
                        .iter()
                        .map(|s| s.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
        self.sets.retain(|s| names.contains(&s.name));
        Ok(())
    }
}

/// Whether `spec` sets `key` (as opposed to leaving it to a lower level).
fn has_key<T: Serialize>(spec: &T, key: &str) -> bool {
    match serde_json::to_value(spec) {
        Ok(Value::Object(m)) => m.get(key).is_some_and(|v| !v.is_null()),
        _ => false,
    }
}

/// Whether `key` is a knob (`[knobs]`, `[set.NAME]`) rather than a probe option.
fn is_knob_key(key: &str) -> bool {
    spec::keys_of::<KnobSpec>().iter().any(|k| k == key)
}

/// Where a cell's validation error points: the flag when the command
/// line set the option, else the key in the file (in the set, in
/// `[knobs]`, or in `[probe]` as the file spelled the matrix keys) and the
/// cell.
struct Blame<'a> {
    path: &'a Path,
    text: &'a str,
    over: &'a Overrides,
    sizes: bool,
    intervals: bool,
    xdp_modes: bool,
}

impl Blame<'_> {
    fn error(&self, e: SpecError, set: &SetSpec<'_>, cell: &str) -> anyhow::Error {
        if has_key(&self.over.knobs, e.key) || has_key(&self.over.run, e.key) {
            return anyhow!("{} (on the command line)", e.for_cli());
        }
        let p: Vec<&str> = if is_knob_key(e.key) {
            if has_key(set.own, e.key) {
                vec!["set", &set.name, e.key]
            } else {
                vec!["knobs", e.key]
            }
        } else {
            vec!["probe", self.key(e.key)]
        };
        located(
            self.path,
            self.text,
            &p,
            format!("{} (cell {cell})", e.message),
        )
    }

    fn key(&self, key: &'static str) -> &'static str {
        match key {
            "size" if self.sizes => "sizes",
            "interval" if self.intervals => "intervals",
            "xdp_mode" if self.xdp_modes => "xdp_modes",
            k => k,
        }
    }
}

// ------------------------------------------------------------- running --

/// Progress: cell i/n, elapsed, remaining (from the cells' estimates,
/// corrected by how long the finished cells really took).
pub trait Progress {
    fn start_cell(&mut self, cell: &Cell);
    fn end_cell(&mut self, cell: &Cell, ok: bool);
    fn finish(&mut self);
}

/// indicatif bar on stderr (hidden when stderr is not a terminal).
pub(crate) struct Bar {
    bar: indicatif::ProgressBar,
}

impl Bar {
    pub fn new(cells: &[Cell], quiet: bool) -> Self {
        let total_ms: u64 = cells.iter().map(|c| c.estimate().as_millis() as u64).sum();
        let bar = if quiet {
            indicatif::ProgressBar::hidden()
        } else {
            indicatif::ProgressBar::new(total_ms.max(1))
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "[{elapsed_precise}] {bar:30.cyan/blue} {msg} (about {eta} left)",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(500));
        Self { bar }
    }
}

impl Progress for Bar {
    fn start_cell(&mut self, cell: &Cell) {
        self.bar.set_message(format!(
            "cell {}/{} {}",
            cell.index + 1,
            cell.total,
            cell.id
        ));
    }

    fn end_cell(&mut self, cell: &Cell, ok: bool) {
        if !ok {
            self.bar
                .println(format!("cell {} failed (see report.md)", cell.id));
        }
        self.bar.inc(cell.estimate().as_millis() as u64);
    }

    fn finish(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Outcome of a whole scenario run.
#[derive(Debug)]
pub(crate) struct ScenarioOutcome {
    pub report: PathBuf,
    pub cells: usize,
    pub failed: usize,
}

/// Runs every cell through `runner`, writes `results.json` after each cell
/// and `report.md` at the end (also when cells failed).
pub(crate) fn run_scenario(
    sc: &Scenario,
    out_dir: &Path,
    runner: &mut dyn CellRunner,
    figures: Option<&mut dyn FigureMaker>,
    progress: &mut dyn Progress,
) -> Result<ScenarioOutcome> {
    std::fs::create_dir_all(out_dir).with_context(|| {
        format!(
            "cannot create the output folder {}: check the path and permissions",
            out_dir.display()
        )
    })?;
    // The scenario as run, next to its results.
    crate::export::atomic::write(&out_dir.join("scenario.toml"), sc.source.as_bytes())?;
    let cells = sc.cells(out_dir);
    let started = Instant::now();
    let mut results: Vec<Result<CellResult, String>> = Vec::with_capacity(cells.len());
    for cell in &cells {
        progress.start_cell(cell);
        let r = runner
            .run_cell(cell)
            .map_err(|e| format!("{e:#}").replace('\n', " "));
        progress.end_cell(cell, r.is_ok());
        results.push(r);
        write_results_json(out_dir, sc, &cells, &results)?;
    }
    progress.finish();

    // Figures: each cell against the baseline of its (size, interval) group.
    let mut figs: Vec<Vec<PathBuf>> = vec![Vec::new(); cells.len()];
    let mut fig_errors = Vec::new();
    if let Some(fm) = figures {
        for (i, c) in cells.iter().enumerate() {
            if c.variant == 0 || results[i].is_err() {
                continue;
            }
            let base = i - c.variant;
            if results[base].is_err() {
                continue;
            }
            match fm.compare(out_dir, &cells[base], c) {
                Ok(f) => figs[i] = f,
                Err(e) => fig_errors.push(format!("{}: {e:#}", c.id)),
            }
        }
    }
    let verdicts = baseline_verdicts(&cells, &results);
    let rows: Vec<ReportRow<'_>> = cells
        .iter()
        .zip(&results)
        .zip(figs)
        .zip(verdicts)
        .map(|(((cell, r), figures), vs_baseline)| ReportRow {
            cell,
            result: r.as_ref().map_err(String::as_str),
            figures,
            vs_baseline,
        })
        .collect();
    let text = report::render(&report::ReportInput {
        scenario: sc,
        out_dir,
        rows: &rows,
        elapsed: started.elapsed(),
        figure_errors: &fig_errors,
    });
    let report_path = out_dir.join("report.md");
    crate::export::atomic::write(&report_path, text.as_bytes())?;
    let failed = results.iter().filter(|r| r.is_err()).count();
    Ok(ScenarioOutcome {
        report: report_path,
        cells: cells.len(),
        failed,
    })
}

/// Each variant's p50 and p99 against its group's baseline with 95 %
/// bootstrap intervals, from the cells' CSVs as `rtprobe compare` reads
/// them. A cell whose CSV cannot be read gets none (and a warning).
fn baseline_verdicts(
    cells: &[Cell],
    results: &[Result<CellResult, String>],
) -> Vec<Option<String>> {
    use crate::export::compare;
    let settings = compare::Settings::default();
    cells
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let base = i.checked_sub(c.variant)?;
            if c.variant == 0 || results[i].is_err() || results[base].is_err() {
                return None;
            }
            match compare::compare(cells[base].csv(), &[c.csv().to_path_buf()], &settings) {
                Ok(cmp) => cmp.runs.first().map(|r| {
                    r.percentiles
                        .iter()
                        .take(2)
                        .map(|p| p.verdict.as_str())
                        .collect::<Vec<_>>()
                        .join("<br>")
                }),
                Err(e) => {
                    log::warn!(
                        "{}: no confidence interval against the baseline: {e:#}",
                        c.id
                    );
                    None
                }
            }
        })
        .collect()
}

fn write_results_json(
    out_dir: &Path,
    sc: &Scenario,
    cells: &[Cell],
    results: &[Result<CellResult, String>],
) -> Result<()> {
    let rows: Vec<Value> = cells
        .iter()
        .zip(results)
        .map(|(c, r)| {
            let mut m = Map::new();
            m.insert("cell".into(), Value::String(c.id.clone()));
            m.insert("set".into(), Value::String(c.set.clone()));
            m.insert("probe".into(), Value::Object(cell_probe_json(sc, &c.run)));
            m.insert(
                "knobs_requested".into(),
                Value::String(c.run.knobs.describe()),
            );
            match r {
                Ok(res) => {
                    m.insert(
                        "summary".into(),
                        serde_json::to_value(&res.summary).unwrap_or(Value::Null),
                    );
                    m.insert("knobs".into(), Value::Object(res.knobs.clone()));
                }
                Err(e) => {
                    m.insert("error".into(), Value::String(e.clone()));
                }
            }
            Value::Object(m)
        })
        .collect();
    let doc = serde_json::json!({
        "scenario": sc.name,
        "probe": matrix_json(sc),
        "cells": rows,
    });
    Ok(crate::export::json::write_value(
        &out_dir.join("results.json"),
        &doc,
    )?)
}

/// results.json's `probe` of the scenario: the axes and what the cells
/// share.
fn matrix_json(sc: &Scenario) -> Map<String, Value> {
    let a = &sc.axes;
    let mut m = shared_probe_json(sc, sc.common());
    m.insert("sizes".into(), serde_json::json!(a.sizes));
    m.insert(
        "intervals".into(),
        serde_json::json!(
            a.intervals
                .iter()
                .map(|d| units::fmt_duration(*d))
                .collect::<Vec<_>>()
        ),
    );
    m.insert("xdp_modes".into(), serde_json::json!(a.xdp_modes));
    m
}

/// results.json's `probe` of one cell: its size, interval and XDP mode and
/// what the cells share.
fn cell_probe_json(sc: &Scenario, run: &RunOptions) -> Map<String, Value> {
    let mut m = shared_probe_json(sc, run);
    m.insert("size".into(), serde_json::json!(run.probe.size));
    m.insert(
        "interval".into(),
        serde_json::json!(units::fmt_duration(run.probe.interval)),
    );
    m.insert("xdp_mode".into(), serde_json::json!(run.xdp_mode));
    m
}

fn shared_probe_json(sc: &Scenario, run: &RunOptions) -> Map<String, Value> {
    let p = &run.probe;
    let fields = serde_json::json!({
        "count": p.count,
        "duration": p.duration.map(units::fmt_duration),
        "xdp_action": run.xdp_action,
        "tos": p.tos,
        "port": p.port,
        "timestamps": p.timestamps,
        "timeout": units::fmt_duration(p.timeout),
        "tx_if": run.tx_if,
        "rx_if": run.rx_if,
        // As the file (or --flow) gives them; unset fields follow the cell.
        "flows": sc.spec.flows.flows.clone().unwrap_or_default(),
    });
    match fields {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// What `--check` prints: the matrix and the knob sets.
pub fn plan(sc: &Scenario, cells: &[Cell], out_dir: &Path, notes: &[String]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "scenario {} ({}): OK", sc.name, sc.path.display());
    if let Some(d) = &sc.description {
        let _ = writeln!(s, "  {d}");
    }
    let est: Duration = cells.iter().map(Cell::estimate).sum();
    let _ = writeln!(
        s,
        "  {} cells = {} sizes x {} intervals x {} xdp modes x {} sets, about {} in all",
        cells.len(),
        sc.axes.sizes.len(),
        sc.axes.intervals.len(),
        sc.axes.xdp_modes.len(),
        sc.sets.len(),
        humantime::format_duration(Duration::from_secs(est.as_secs()))
    );
    let _ = writeln!(s, "  output: {}", out_dir.display());
    for (i, set) in sc.sets.iter().enumerate() {
        let _ = writeln!(
            s,
            "  set {}{}: {}",
            set.name,
            if i == 0 { " (baseline)" } else { "" },
            set.knobs.describe()
        );
    }
    for n in notes {
        let _ = writeln!(s, "  note: {n}");
    }
    s
}

pub(crate) mod fetch_study;
pub(crate) mod report;

#[cfg(test)]
mod tests;
