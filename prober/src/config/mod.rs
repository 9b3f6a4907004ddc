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
//! Everything is validated before anything is touched: syntax, unknown
//! keys, units and cross-field rules (errors name the file, line, column
//! and key), then what the kernel must have (qdiscs unless the set says
//! `missing = "skip"`, congestion controls, stress-ng), checked in a
//! scratch namespace. Executing a cell is behind [`CellRunner`], so the
//! matrix and report logic is tested with a fake runner; figures are
//! behind [`FigureMaker`].

mod options;

pub use options::{DEFAULT_COUNT, FlowSpec, MAX_PAYLOAD_1500, RunOptions};

use std::{
    fmt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Deserializer, Serialize, de};
use serde_json::{Map, Value};

use crate::{
    cli::{RunArgs, TimestampArg, XdpActionArg, XdpModeArg},
    export::report::{self, ReportRow},
    stats::Summary,
    tune::{Knobs, MissingPolicy, StressTool, units},
};

/// Largest UDP payload that fits a 1500-byte MTU (the veth testbed's).
pub const MAX_PROBE_SIZE: usize = 1472;

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
    knobs: Knobs,
    #[serde(default)]
    set: Sets,
}

/// `[set.NAME]` tables in the order the file has them (toml keeps the
/// order with its `preserve_order` feature; a map visitor sees it).
#[derive(Debug, Default)]
struct Sets(Vec<(String, Knobs)>);

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
                while let Some((k, knobs)) = m.next_entry::<String, Knobs>()? {
                    v.push((k, knobs));
                }
                Ok(Sets(v))
            }
        }
        d.deserialize_map(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ProbeSection {
    sizes: Vec<usize>,
    intervals: Vec<Humane>,
    xdp_mode: Option<XdpModeArg>,
    xdp_modes: Option<Vec<XdpModeArg>>,
    count: Option<u64>,
    duration: Option<Humane>,
    xdp_action: XdpActionArg,
    tos: Tos,
    port: u16,
    timestamps: TimestampArg,
    timeout: Humane,
    tx_if: Option<String>,
    rx_if: Option<String>,
    /// Extra probe flows, each written as the CLI's `--flow` value.
    #[serde(deserialize_with = "de_flows")]
    flows: Vec<FlowSpec>,
}

fn de_flows<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<FlowSpec>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|f| FlowSpec::parse(f).map_err(de::Error::custom))
        .collect()
}

impl Default for ProbeSection {
    fn default() -> Self {
        Self {
            sizes: vec![64],
            intervals: vec![Humane(Duration::from_millis(1))],
            xdp_mode: None,
            xdp_modes: None,
            count: None,
            duration: None,
            xdp_action: XdpActionArg::Redirect,
            tos: Tos(0),
            port: 5061,
            timestamps: TimestampArg::Auto,
            timeout: Humane(Duration::from_secs(1)),
            tx_if: None,
            rx_if: None,
            flows: Vec::new(),
        }
    }
}

/// A duration written as "1ms", "1.5ms", "30s".
#[derive(Debug, Clone, Copy, PartialEq)]
struct Humane(Duration);

impl<'de> Deserialize<'de> for Humane {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        units::humane_duration::deserialize(d).map(Humane)
    }
}

/// TOS as 192 or "0xC0".
#[derive(Debug, Clone, Copy, PartialEq)]
struct Tos(u8);

impl<'de> Deserialize<'de> for Tos {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl de::Visitor<'_> for V {
            type Value = Tos;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a TOS byte: 192 or \"0xC0\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Tos, E> {
                u8::try_from(v)
                    .map(Tos)
                    .map_err(|_| E::custom(format!("TOS {v} is out of range 0..255")))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Tos, E> {
                self.visit_i64(v.min(i64::MAX as u64) as i64)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Tos, E> {
                crate::cli::parse_u8_maybe_hex(v)
                    .map(Tos)
                    .map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

// ----------------------------------------------------------- validated --

/// The probe options shared by the matrix (sizes/intervals/modes vary).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeMatrix {
    pub sizes: Vec<usize>,
    #[serde(serialize_with = "ser_durations")]
    pub intervals: Vec<Duration>,
    pub xdp_modes: Vec<XdpModeArg>,
    pub count: Option<u64>,
    #[serde(serialize_with = "ser_opt_duration")]
    pub duration: Option<Duration>,
    pub xdp_action: XdpActionArg,
    pub tos: u8,
    pub port: u16,
    pub timestamps: TimestampArg,
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
    pub xdp_mode: XdpModeArg,
    pub xdp_action: XdpActionArg,
    pub tos: u8,
    pub port: u16,
    pub timestamps: TimestampArg,
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

/// The real checks: qdiscs in a scratch namespace, /proc for congestion
/// controls, PATH for stress-ng.
pub struct KernelCheck;

impl SystemCheck for KernelCheck {
    fn missing_qdiscs(&mut self, kinds: &[&'static str]) -> Result<Vec<String>> {
        crate::tune::qdisc::missing_kinds(kinds)
    }

    fn congestion_controls(&mut self) -> Result<Vec<String>> {
        crate::tune::load::available_cc()
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

// ------------------------------------------------------------- parsing --

impl Scenario {
    /// Reads and validates a scenario file (no system access).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read scenario {}: check the path", path.display()))?;
        Self::parse(path, &text)
    }

    /// Parses and validates `text` (named `path` in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Self> {
        let f: ScenarioFile = toml::from_str(text).map_err(|e| toml_error(path, text, &e))?;
        let loc = |p: &[&str], m: &dyn fmt::Display| located(path, text, p, m);
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
        if p.sizes.is_empty() {
            return Err(loc(&["probe", "sizes"], &"give at least one size"));
        }
        for s in &p.sizes {
            if !(16..=MAX_PROBE_SIZE).contains(s) {
                return Err(loc(
                    &["probe", "sizes"],
                    &format!("size {s} out of range: 16 to {MAX_PROBE_SIZE} bytes of UDP payload"),
                ));
            }
        }
        if p.intervals.is_empty() {
            return Err(loc(&["probe", "intervals"], &"give at least one interval"));
        }
        if let Some(i) = p.intervals.iter().find(|i| i.0 < Duration::from_micros(10)) {
            return Err(loc(
                &["probe", "intervals"],
                &format!("interval {} is below 10us", units::fmt_duration(i.0)),
            ));
        }
        let xdp_modes = match (p.xdp_mode, p.xdp_modes) {
            (Some(_), Some(_)) => {
                return Err(loc(
                    &["probe", "xdp_modes"],
                    &"give xdp_mode or xdp_modes, not both",
                ));
            }
            (Some(m), None) => vec![m],
            (None, Some(v)) if v.is_empty() => {
                return Err(loc(&["probe", "xdp_modes"], &"give at least one mode"));
            }
            (None, Some(v)) => v,
            (None, None) => vec![XdpModeArg::Off],
        };
        let (count, duration) = match (p.count, p.duration) {
            (Some(_), Some(_)) => {
                return Err(loc(
                    &["probe", "duration"],
                    &"give count or duration, not both",
                ));
            }
            (Some(0), None) => return Err(loc(&["probe", "count"], &"count must be at least 1")),
            (c, d) if c.is_none() && d.is_none() => (Some(1000), None),
            (c, d) => (c, d.map(|d| d.0)),
        };
        if p.tx_if.is_some() != p.rx_if.is_some() {
            return Err(loc(
                &["probe", "tx_if"],
                &"NIC-pair mode needs both tx_if and rx_if",
            ));
        }
        let nic_pair = p.tx_if.is_some();
        let probe = ProbeMatrix {
            sizes: p.sizes,
            intervals: p.intervals.iter().map(|i| i.0).collect(),
            xdp_modes,
            count,
            duration,
            xdp_action: p.xdp_action,
            tos: p.tos.0,
            port: p.port,
            timestamps: p.timestamps,
            timeout: p.timeout.0,
            tx_if: p.tx_if,
            rx_if: p.rx_if,
            flows: p.flows,
        };
        if probe.port == 0 {
            return Err(loc(&["probe", "port"], &"port must be 1 to 65535"));
        }
        if probe.flows.len() > 8 {
            return Err(loc(&["probe", "flows"], &"at most 8 extra flows"));
        }
        let mut ports = vec![probe.port];
        for f in &probe.flows {
            if ports.contains(&f.port) {
                return Err(loc(
                    &["probe", "flows"],
                    &format!(
                        "port {} is already used by another flow: give each flow its own port",
                        f.port
                    ),
                ));
            }
            ports.push(f.port);
            if let Some(s) = f.size
                && !(16..=MAX_PROBE_SIZE).contains(&s)
            {
                return Err(loc(
                    &["probe", "flows"],
                    &format!(
                        "flow port={}: size {s} out of range 16 to {MAX_PROBE_SIZE}",
                        f.port
                    ),
                ));
            }
        }

        let mut sets = Vec::new();
        let raw_sets = if f.set.0.is_empty() {
            // No sets: one run of the common knobs.
            vec![("default".to_string(), Knobs::default())]
        } else {
            f.set.0
        };
        for (set_name, k) in raw_sets {
            if set_name.is_empty()
                || !set_name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(loc(
                    &["set", &set_name],
                    &"set names name files: use letters, digits, '-', '_' or '.'",
                ));
            }
            let mut merged = k.merged_over(&f.knobs);
            merged.set_probe(probe.port, probe.sizes[0], probe.intervals[0]);
            if let Err(e) = merged.validate_with_probe() {
                // Blame the set's key if it has it, else the common one.
                let in_set = k_has(&k, e.key);
                let p: Vec<&str> = if in_set {
                    vec!["set", &set_name, e.key]
                } else {
                    vec!["knobs", e.key]
                };
                return Err(loc(&p, &e.message));
            }
            let key_of = |key: &'static str| -> Vec<String> {
                if k_has(&k, key) {
                    vec!["set".into(), set_name.clone(), key.into()]
                } else {
                    vec!["knobs".into(), key.into()]
                }
            };
            let blame = |key: &'static str, m: &dyn fmt::Display| {
                let p = key_of(key);
                let p: Vec<&str> = p.iter().map(String::as_str).collect();
                loc(&p, m)
            };
            if nic_pair && merged.bottleneck() == crate::tune::Bottleneck::Router {
                return Err(blame(
                    "bottleneck",
                    &"NIC-pair mode has no router: use bottleneck = \"sender\"",
                ));
            }
            let shapes = merged.link_rate.is_some() || merged.qdisc.is_some();
            if shapes
                && merged.bottleneck() == crate::tune::Bottleneck::Router
                && probe.xdp_action == XdpActionArg::Redirect
                && probe.xdp_modes.iter().any(|m| *m != XdpModeArg::Off)
            {
                return Err(blame(
                    "bottleneck",
                    &"XDP_REDIRECT transmits past the router's qdisc, so shaping/qdisc at the \
                      router would not act: use xdp_mode = \"off\", xdp_action = \"pass\", or \
                      bottleneck = \"sender\"",
                ));
            }
            if !nic_pair
                && merged.link_rate.is_none()
                && let Some(l) = merged.loads().iter().find(|l| l.needs_link_rate())
            {
                return Err(blame(
                    "load",
                    &format!(
                        "load {l} is a share of the link, but a veth has no rate: set \
                             link_rate (shaping) or give a rate such as tcp:50mbit"
                    ),
                ));
            }
            if merged.queue_sample.is_some() && merged.link_rate.is_none() && merged.qdisc.is_none()
            {
                return Err(blame(
                    "queue_sample",
                    &"there is no queue to sample: shape the link or set a qdisc",
                ));
            }
            sets.push(KnobSet {
                name: set_name,
                knobs: merged,
            });
        }
        let mut seen = std::collections::HashSet::new();
        for s in &sets {
            if !seen.insert(s.name.to_ascii_lowercase()) {
                return Err(loc(&["set", &s.name], &"two sets differ only in case"));
            }
        }
        Ok(Scenario {
            output: f.output.unwrap_or_else(|| Path::new("results").join(&name)),
            name,
            description: f.description,
            probe,
            sets,
            source: text.to_string(),
            path: path.to_path_buf(),
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
    pub fn variants(&self) -> Vec<(XdpModeArg, &KnobSet)> {
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
        let variants = self.variants();
        let multi_mode = self.probe.xdp_modes.len() > 1;
        let total = self.probe.sizes.len() * self.probe.intervals.len() * variants.len();
        let mut cells = Vec::with_capacity(total);
        for &size in &self.probe.sizes {
            for &interval in &self.probe.intervals {
                for (vi, (mode, set)) in variants.iter().enumerate() {
                    let mode_s = xdp_mode_name(*mode);
                    let id = format!(
                        "s{size}-i{}-{mode_s}-{}",
                        units::fmt_duration(interval),
                        set.name
                    );
                    let mut knobs = set.knobs.clone();
                    knobs.set_probe(self.probe.port, size, interval);
                    let label = if multi_mode {
                        format!("{} (xdp {mode_s})", set.name)
                    } else {
                        set.name.clone()
                    };
                    cells.push(Cell {
                        index: cells.len(),
                        total,
                        set: set.name.clone(),
                        variant: vi,
                        probe: ProbeOptions {
                            size,
                            interval,
                            count: self.probe.count,
                            duration: self.probe.duration,
                            xdp_mode: *mode,
                            xdp_action: self.probe.xdp_action,
                            tos: self.probe.tos,
                            port: self.probe.port,
                            timestamps: self.probe.timestamps,
                            timeout: self.probe.timeout,
                            tx_if: self.probe.tx_if.clone(),
                            rx_if: self.probe.rx_if.clone(),
                            flows: self.probe.flows.clone(),
                        },
                        queue_csv: knobs
                            .queue_sample
                            .map(|_| out_dir.join(format!("{id}-queue.csv"))),
                        knobs,
                        label,
                        csv: out_dir.join(format!("{id}.csv")),
                        json: out_dir.join(format!("{id}.json")),
                        id,
                    });
                }
            }
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

fn xdp_mode_name(m: XdpModeArg) -> &'static str {
    match m {
        XdpModeArg::Off => "off",
        XdpModeArg::Skb => "skb",
        XdpModeArg::Native => "native",
        XdpModeArg::Auto => "auto",
    }
}

/// Whether the set's own table sets `key` (as opposed to inheriting it).
fn k_has(k: &Knobs, key: &str) -> bool {
    match serde_json::to_value(k) {
        Ok(Value::Object(m)) => m.get(key).is_some_and(|v| !v.is_null()),
        _ => false,
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
    std::fs::write(out_dir.join("scenario.toml"), &sc.source)
        .with_context(|| format!("write {}", out_dir.join("scenario.toml").display()))?;
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
    std::fs::write(&report_path, text)
        .with_context(|| format!("write {}", report_path.display()))?;
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
    let p = out_dir.join("results.json");
    std::fs::write(&p, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("write {}", p.display()))
}

/// `rtprobe run FILE.toml`. `runner` is the probe engine's cell runner
/// (testbed + XDP + probe), `figures` the plot module's; without a runner
/// only `--check` works.
pub fn run_command(
    args: &RunArgs,
    runner: Option<&mut dyn CellRunner>,
    figures: Option<&mut dyn FigureMaker>,
) -> Result<()> {
    let mut sc = Scenario::load(&args.config)?;
    sc.retain_sets(&args.sets)?;
    if let Some(m) = args.missing {
        for s in &mut sc.sets {
            s.knobs.missing = Some(m);
        }
    }
    let is_root = nix::unistd::geteuid().is_root();
    let notes = if is_root {
        sc.check_system(&mut KernelCheck)?
    } else if args.check {
        vec!["kernel support (qdiscs) not checked: that needs root".to_string()]
    } else {
        return Err(crate::error::Error::NotRoot.into());
    };
    let out_dir = args.out_dir.clone().unwrap_or_else(|| sc.output.clone());
    let cells = sc.cells(&out_dir);
    if args.check {
        print!("{}", plan(&sc, &cells, &out_dir, &notes));
        return Ok(());
    }
    for n in &notes {
        eprintln!("note: {n}");
    }
    let Some(runner) = runner else {
        bail!(
            "this build of rtprobe cannot run scenario cells yet (the probe engine is not \
             linked in); `rtprobe run --check {}` validates the file",
            args.config.display()
        );
    };
    let mut bar = Bar::new(&cells, args.quiet);
    let out = run_scenario(&sc, &out_dir, runner, figures, &mut bar)?;
    println!("{} cells, report: {}", out.cells, out.report.display());
    if out.failed > 0 {
        bail!(
            "{} of {} cells failed; see {}",
            out.failed,
            out.cells,
            out.report.display()
        );
    }
    Ok(())
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

#[cfg(test)]
mod tests;
