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
    ebpf::{XdpAction, XdpMode},
    model::units,
    probe::TimestampSource,
    spec::{self, KnobSpec, OutputSpec, RunSpec, SpecError},
    stats::Summary,
    tune::{Knobs, MissingPolicy, StressTool},
};

/// Largest UDP payload that fits a 1500-byte MTU (the veth testbed's).
pub const MAX_PROBE_SIZE: usize = MAX_PAYLOAD_1500;

/// Most cells a scenario may have (sizes x intervals x XDP modes x sets).
/// Each cell is a validated plan kept in memory and a probe run of its
/// own; the shipped studies have at most a few hundred. Counted before
/// any cell is built, so an oversized matrix costs nothing.
pub const MAX_CELLS: u64 = 10_000;

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

/// The probe options shared by the matrix (sizes/intervals/modes vary).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeMatrix {
    pub sizes: Vec<usize>,
    #[serde(serialize_with = "ser_durations")]
    pub intervals: Vec<Duration>,
    pub xdp_modes: Vec<XdpMode>,
    pub count: Option<u64>,
    #[serde(serialize_with = "ser_opt_duration")]
    pub duration: Option<Duration>,
    pub xdp_action: XdpAction,
    pub tos: u8,
    pub port: u16,
    pub timestamps: TimestampSource,
    #[serde(serialize_with = "ser_duration")]
    pub timeout: Duration,
    pub tx_if: Option<String>,
    pub rx_if: Option<String>,
    /// Extra probe flows (flow ids 1..), as `--flow` gives them.
    pub flows: Vec<FlowSpec>,
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&units::fmt_duration(*d))
}

fn ser_opt_duration<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_str(&units::fmt_duration(*d)),
        None => s.serialize_none(),
    }
}

fn ser_durations<S: serde::Serializer>(d: &[Duration], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(d.iter().map(|d| units::fmt_duration(*d)))
}

/// One probe run's options: what the probe engine needs for a cell.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeOptions {
    /// UDP payload bytes.
    pub size: usize,
    #[serde(serialize_with = "ser_duration")]
    pub interval: Duration,
    /// Exactly one of count and duration is set.
    pub count: Option<u64>,
    #[serde(serialize_with = "ser_opt_duration")]
    pub duration: Option<Duration>,
    pub xdp_mode: XdpMode,
    pub xdp_action: XdpAction,
    pub tos: u8,
    pub port: u16,
    pub timestamps: TimestampSource,
    #[serde(serialize_with = "ser_duration")]
    pub timeout: Duration,
    /// NIC-pair mode when both are set.
    pub tx_if: Option<String>,
    pub rx_if: Option<String>,
    /// Extra probe flows; unset fields follow this cell's size and interval.
    pub flows: Vec<FlowSpec>,
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
    pub probe: ProbeMatrix,
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

/// Everything one cell of the matrix needs.
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
    pub probe: ProbeOptions,
    /// Merged knobs with the probe context set (`Knobs::set_probe`).
    pub knobs: Knobs,
    /// What the cell runs: the plan the one validator made from the file's
    /// specs (and the command line's), with this cell's output files.
    pub run: RunOptions,
    /// Legend / RunMeta label: "bql-3000" or "bql-3000 (xdp skb)".
    pub label: String,
    pub csv: PathBuf,
    pub json: PathBuf,
    /// Set when the knobs ask for queue sampling (`queue_sample`).
    pub queue_csv: Option<PathBuf>,
}

impl Cell {
    /// Rough wall time of the cell, for the progress bar's ETA.
    pub fn estimate(&self) -> Duration {
        let probing = match (self.probe.count, self.probe.duration) {
            (_, Some(d)) => d,
            (Some(n), None) => self.probe.interval * n.min(u32::MAX as u64) as u32,
            (None, None) => Duration::ZERO,
        };
        let warmup = if self.knobs.loads().is_empty() {
            Duration::ZERO
        } else {
            self.knobs
                .load_warmup
                .unwrap_or(crate::tune::DEFAULT_LOAD_WARMUP)
        };
        probing + warmup + self.probe.timeout + Duration::from_secs(1)
    }
}

/// What the real runner hands back for a cell.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CellResult {
    /// The run's summary; `extra` holds `load` (tune::LoadReport) and
    /// `skipped` as `Applied::stop_load()` returned them.
    pub summary: Summary,
    /// `Applied::metadata()`: what the knobs applied.
    pub knobs: Map<String, Value>,
}

/// Executes one cell: build the testbed, attach XDP, apply the knobs, probe,
/// write `cell.csv` and `cell.json`, restore.
pub trait CellRunner {
    fn run_cell(&mut self, cell: &Cell) -> Result<CellResult>;
}

/// Draws the comparison of one cell against the baseline of its group;
/// returns the files, which the report links (relative to the output dir).
pub trait FigureMaker {
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
pub struct KernelCheck(pub crate::sys::SysRef);

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

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, col)
}

/// Dotted key path of the innermost entry around `offset`, and its key's span.
fn key_at(text: &str, offset: usize) -> Option<(String, std::ops::Range<usize>)> {
    use toml::de::{DeTable, DeValue};
    fn walk(
        t: &DeTable<'_>,
        prefix: &str,
        offset: usize,
        best: &mut Option<(String, std::ops::Range<usize>)>,
    ) {
        for (k, v) in t.iter() {
            let path = if prefix.is_empty() {
                k.get_ref().to_string()
            } else {
                format!("{prefix}.{}", k.get_ref())
            };
            let (ks, vs) = (k.span(), v.span());
            if let DeValue::Table(inner) = v.get_ref() {
                walk(inner, &path, offset, best);
            }
            let inside = ks.start <= offset && offset <= vs.end.max(ks.end);
            if inside && best.as_ref().is_none_or(|(_, s)| ks.start >= s.start) {
                *best = Some((path, ks));
            }
        }
    }
    let doc = DeTable::parse(text).ok()?;
    let mut best = None;
    walk(doc.get_ref(), "", offset, &mut best);
    best
}

/// Span of a dotted key path (e.g. "set.bql.qdisc").
fn key_span(text: &str, path: &[&str]) -> Option<std::ops::Range<usize>> {
    use toml::de::{DeTable, DeValue};
    let doc = DeTable::parse(text).ok()?;
    let mut t = doc.get_ref();
    for (i, p) in path.iter().enumerate() {
        let (k, v) = t.iter().find(|(k, _)| k.get_ref() == p)?;
        if i + 1 == path.len() {
            return Some(k.span());
        }
        match v.get_ref() {
            DeValue::Table(inner) => t = inner,
            _ => return Some(k.span()),
        }
    }
    None
}

/// "FILE:LINE:COL: key: message" for a problem at `path` in the file.
fn located(file: &Path, text: &str, path: &[&str], msg: impl fmt::Display) -> anyhow::Error {
    let key = path.join(".");
    match key_span(text, path) {
        Some(s) => {
            let (l, c) = line_col(text, s.start);
            anyhow!("{}:{l}:{c}: {key}: {msg}", file.display())
        }
        None => anyhow!("{}: {key}: {msg}", file.display()),
    }
}

/// One line for a toml parse/deserialize error: file, line, column, key.
fn toml_error(file: &Path, text: &str, e: &toml::de::Error) -> anyhow::Error {
    if let Some(located) = probe_key_error(file, text) {
        return located;
    }
    located_toml_error(file, text, e)
}

/// "FILE:LINE:COL: key: message" for any TOML file read with serde (the
/// bench-forward sweep files too): the error's span, and the key around it.
pub(crate) fn located_toml_error(file: &Path, text: &str, e: &toml::de::Error) -> anyhow::Error {
    let msg = e.message().trim().replace('\n', " ");
    match e.span() {
        Some(s) => {
            let (l, c) = line_col(text, s.start);
            match key_at(text, s.start) {
                Some((key, _)) => anyhow!("{}:{l}:{c}: {key}: {msg}", file.display()),
                None => anyhow!("{}:{l}:{c}: {msg}", file.display()),
            }
        }
        None => anyhow!("{}: {msg}", file.display()),
    }
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
    /// the flag), before anything is built.
    pub fn parse_with(path: &Path, text: &str, over: &Overrides) -> Result<Self> {
        let f: ScenarioFile = toml::from_str(text).map_err(|e| {
            if crate::spec::bench::BenchForwardArgs::parse(path, text).is_ok() {
                anyhow!(
                    "{} is a bench-forward sweep, not a scenario: run `sudo rtprobe \
                     bench-forward --config {}`",
                    path.display(),
                    path.display()
                )
            } else {
                toml_error(path, text, &e)
            }
        })?;
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
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(loc(
                &["name"],
                &"use letters, digits, '-', '_' or '.' (it names files)",
            ));
        }
        let p = f.probe;
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
        let sizes = over.run.probe.size.map_or(sizes, |s| vec![s]);
        let intervals = over.run.probe.interval.map_or(intervals, |i| vec![i]);
        let xdp_modes = over.run.xdp.xdp_mode.map_or(xdp_modes, |m| vec![m]);
        let run = p.run.overridden_by(&over.run)?;

        let raw_sets = if f.set.0.is_empty() {
            // No sets: one run of the common knobs.
            vec![("default".to_string(), KnobSpec::default())]
        } else {
            f.set.0
        };
        check_cell_count(
            path,
            [
                (sizes.len(), "sizes"),
                (intervals.len(), "intervals"),
                (xdp_modes.len(), "XDP modes"),
                (raw_sets.len(), "sets"),
            ],
        )?;
        let mut merged_sets = Vec::new();
        for (set_name, k) in &raw_sets {
            if set_name.is_empty()
                || !set_name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(loc(
                    &["set", set_name],
                    &"set names name files: use letters, digits, '-', '_' or '.'",
                ));
            }
            let merged = spec::merge(&spec::merge(&f.knobs, k)?, &over.knobs)?;
            merged_sets.push((set_name.clone(), k, merged));
        }
        let mut seen = std::collections::HashSet::new();
        for (n, _, _) in &merged_sets {
            if !seen.insert(n.to_ascii_lowercase()) {
                return Err(loc(&["set", n], &"two sets differ only in case"));
            }
        }

        // Every cell through the one validator, in run order.
        let blame = |e: SpecError, set: &str, own: &KnobSpec, sizes_key: &Blame| -> anyhow::Error {
            if has_key(&over.knobs, e.key) || has_key(&over.run, e.key) {
                return anyhow!("{} (on the command line)", e.for_cli());
            }
            let p: Vec<&str> = if is_knob_key(e.key) {
                if has_key(own, e.key) {
                    vec!["set", set, e.key]
                } else {
                    vec!["knobs", e.key]
                }
            } else {
                vec!["probe", sizes_key.key(e.key)]
            };
            loc(&p, &e.message)
        };
        let lists = Blame {
            sizes: key_span(text, &["probe", "sizes"]).is_some(),
            intervals: key_span(text, &["probe", "intervals"]).is_some(),
            xdp_modes: key_span(text, &["probe", "xdp_modes"]).is_some(),
        };
        let mut plans = Vec::new();
        for &size in &sizes {
            for &interval in &intervals {
                for &mode in &xdp_modes {
                    for (set_name, own, knobs) in &merged_sets {
                        let mut cell = run.clone();
                        cell.probe.size = Some(size);
                        cell.probe.interval = Some(interval);
                        cell.xdp.xdp_mode = Some(mode);
                        let plan = spec::plan::validate(&cell, knobs, &OutputSpec::default())
                            .and_then(|p| {
                                if p.continuous.forever {
                                    return Err(SpecError::new(
                                        "forever",
                                        "would never end the first cell: give each cell a count \
                                         or a duration (probe until stopped is for single runs)",
                                    ));
                                }
                                Ok(p)
                            })
                            .map_err(|e| blame(e, set_name, own, &lists))?;
                        plans.push(CellPlan {
                            set: set_name.clone(),
                            run: plan,
                        });
                    }
                }
            }
        }
        let Some(first) = plans.first().map(|c| &c.run) else {
            bail!("{}: the matrix is empty", path.display());
        };
        let sets = merged_sets
            .iter()
            .map(|(n, _, _)| KnobSet {
                name: n.clone(),
                knobs: plans
                    .iter()
                    .find(|c| &c.set == n)
                    .map(|c| c.run.knobs.clone())
                    .unwrap_or_default(),
            })
            .collect();
        let probe = ProbeMatrix {
            sizes,
            intervals,
            xdp_modes,
            count: first.probe.count,
            duration: first.probe.duration,
            xdp_action: first.xdp_action,
            tos: first.probe.tos,
            port: first.probe.port,
            timestamps: first.probe.timestamps,
            timeout: first.probe.timeout,
            tx_if: first.tx_if.clone(),
            rx_if: first.rx_if.clone(),
            flows: run.flows.flows.clone().unwrap_or_default(),
        };
        Ok(Scenario {
            output: f.output.unwrap_or_else(|| Path::new("results").join(&name)),
            name,
            description: f.description,
            probe,
            sets,
            source: text.to_string(),
            path: path.to_path_buf(),
            plans,
        })
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
        for m in &self.probe.xdp_modes {
            for s in &self.sets {
                v.push((*m, s));
            }
        }
        v
    }

    /// Every cell, in run order: size, then interval, then variant, so a
    /// (size, interval) group's comparisons are adjacent.
    pub fn cells(&self, out_dir: &Path) -> Vec<Cell> {
        let multi_mode = self.probe.xdp_modes.len() > 1;
        let kept: Vec<&CellPlan> = self
            .plans
            .iter()
            .filter(|c| self.sets.iter().any(|s| s.name == c.set))
            .collect();
        let total = kept.len();
        let per_group = self.probe.xdp_modes.len() * self.sets.len();
        let mut cells = Vec::with_capacity(total);
        for (i, c) in kept.into_iter().enumerate() {
            let set = c.set.clone();
            let run = &c.run;
            let mode_s = run.xdp_mode.as_str();
            let id = format!(
                "s{}-i{}-{mode_s}-{set}",
                run.probe.size,
                units::fmt_duration(run.probe.interval),
            );
            let label = if multi_mode {
                format!("{set} (xdp {mode_s})")
            } else {
                set.clone()
            };
            let csv = out_dir.join(format!("{id}.csv"));
            let json = out_dir.join(format!("{id}.json"));
            let queue_csv = run
                .knobs
                .queue_sample
                .map(|_| out_dir.join(format!("{id}-queue.csv")));
            // Each cell writes its own HDR log next to its CSV.
            let mut continuous = run.continuous.clone();
            if continuous.hdr_log.is_some() {
                continuous.hdr_log = Some(out_dir.join(format!("{id}.hlog")));
            }
            let run = RunOptions {
                out: csv.clone(),
                json: Some(json.clone()),
                label: Some(label.clone()),
                quiet: true,
                queue_csv: queue_csv.clone(),
                continuous,
                ..run.clone()
            };
            cells.push(Cell {
                index: i,
                total,
                set,
                variant: i % per_group.max(1),
                probe: ProbeOptions {
                    size: run.probe.size,
                    interval: run.probe.interval,
                    count: run.probe.count,
                    duration: run.probe.duration,
                    xdp_mode: run.xdp_mode,
                    xdp_action: run.xdp_action,
                    tos: run.probe.tos,
                    port: run.probe.port,
                    timestamps: run.probe.timestamps,
                    timeout: run.probe.timeout,
                    tx_if: run.tx_if.clone(),
                    rx_if: run.rx_if.clone(),
                    flows: self.probe.flows.clone(),
                },
                queue_csv,
                knobs: run.knobs.clone(),
                run,
                label,
                csv,
                json,
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

/// Which spelling of the matrix keys the file used, to point at it.
struct Blame {
    sizes: bool,
    intervals: bool,
    xdp_modes: bool,
}

impl Blame {
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
pub struct Bar {
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
pub struct RunOutcome {
    pub out_dir: PathBuf,
    pub report: PathBuf,
    pub cells: usize,
    pub failed: usize,
}

/// Runs every cell through `runner`, writes `results.json` after each cell
/// and `report.md` at the end (also when cells failed).
pub fn run_scenario(
    sc: &Scenario,
    out_dir: &Path,
    runner: &mut dyn CellRunner,
    figures: Option<&mut dyn FigureMaker>,
    progress: &mut dyn Progress,
) -> Result<RunOutcome> {
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
    Ok(RunOutcome {
        out_dir: out_dir.to_path_buf(),
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
            match compare::compare(&cells[base].csv, std::slice::from_ref(&c.csv), &settings) {
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
            m.insert(
                "probe".into(),
                serde_json::to_value(&c.probe).unwrap_or(Value::Null),
            );
            m.insert("knobs_requested".into(), Value::String(c.knobs.describe()));
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
        "probe": sc.probe,
        "cells": rows,
    });
    Ok(crate::export::json::write_value(
        &out_dir.join("results.json"),
        &doc,
    )?)
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
        sc.probe.sizes.len(),
        sc.probe.intervals.len(),
        sc.probe.xdp_modes.len(),
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

pub mod fetch_study;
pub mod report;

use report::ReportRow;

#[cfg(test)]
mod tests;
