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
//! The tables are the option model's specs ([`crate::options`]): `[probe]`
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
//!
//! Where the steps live: `file` reads the TOML, `matrix` turns it into
//! validated cells, `check` asks the kernel what the sets need and prints
//! the plan, `execute` runs the cells, `results_json` and `markdown`
//! (`report.md`) write what they found (`fetch_study` is the fetch-load
//! section of the report).

mod check;
mod execute;
pub(crate) mod fetch_study;
mod file;
pub(crate) mod markdown;
mod matrix;
mod results_json;

pub(crate) use check::KernelCheck;
pub use check::{SystemCheck, plan};
#[cfg(test)]
pub(crate) use execute::Progress;
pub(crate) use execute::{Bar, CellResult, CellRunner, FigureMaker, ReportRow, run_scenario};

pub(crate) use crate::options::plan::RunOptions;

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Result, bail};

use crate::{
    ebpf::XdpMode,
    model::units,
    options::{KnobSpec, RunSpec},
    tune::Knobs,
};

/// Most cells a scenario may have (sizes x intervals x XDP modes x sets).
/// Each cell is a validated plan kept in memory and a probe run of its
/// own; the shipped studies have at most a few hundred. Counted before
/// any cell is built, so an oversized matrix costs nothing.
pub(crate) const MAX_CELLS: u64 = 10_000;

/// Options given on the command line of `rtprobe run`, over the file's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Overrides {
    pub(crate) run: RunSpec,
    pub(crate) knobs: KnobSpec,
}

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
    pub(crate) name: String,
    pub(crate) knobs: Knobs,
}

/// A validated scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub(crate) name: String,
    pub(crate) description: Option<String>,
    /// Where results go unless --out-dir says otherwise.
    pub(crate) output: PathBuf,
    pub axes: Axes,
    /// The file's `[probe]` options under the command line's, as every
    /// cell starts from them (the axes then set size, interval and mode).
    pub(crate) spec: RunSpec,
    /// In file order; the first is the baseline.
    pub sets: Vec<KnobSet>,
    /// The file's text and name, for error locations and the output copy.
    pub(crate) source: String,
    pub(crate) path: PathBuf,
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
    pub(crate) index: usize,
    pub(crate) total: usize,
    /// File stem of this cell's outputs, e.g. `s64-i1ms-off-bql-3000`.
    pub(crate) id: String,
    /// Knob set name.
    pub(crate) set: String,
    /// Index of (xdp mode, set) among the variants; 0 is the baseline.
    pub(crate) variant: usize,
    /// What the cell runs: the plan the one validator made from the file's
    /// specs (and the command line's), with this cell's output files
    /// (`out`, `json`, `queue_csv`, `label`) and its knobs with the probe
    /// context set (`Knobs::set_probe`).
    pub(crate) run: RunOptions,
}

impl Cell {
    /// Legend / RunMeta label: "bql-3000" or "bql-3000 (xdp skb)".
    pub(crate) fn label(&self) -> &str {
        self.run.label.as_deref().unwrap_or(&self.set)
    }

    /// The cell's probe CSV.
    pub(crate) fn csv(&self) -> &Path {
        &self.run.out
    }

    /// The cell's JSON summary, next to its CSV.
    pub(crate) fn json(&self) -> PathBuf {
        self.run
            .json
            .clone()
            .unwrap_or_else(|| self.run.out.with_extension("json"))
    }

    /// Rough wall time of the cell, for the progress bar's ETA.
    pub(crate) fn estimate(&self) -> Duration {
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

impl Scenario {
    /// Reads and validates a scenario file (no system access).
    #[cfg(test)]
    pub(crate) fn load(path: &Path) -> Result<Self> {
        Self::load_with(path, &Overrides::default())
    }

    /// Reads a scenario file with the command line's options over it.
    pub(crate) fn load_with(path: &Path, over: &Overrides) -> Result<Self> {
        let text = crate::input::read_text(path, "scenario file", crate::input::MAX_CONFIG_BYTES)?;
        Self::parse_with(path, &text, over)
    }

    /// Parses and validates `text` (named `path` in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Self> {
        Self::parse_with(path, text, &Overrides::default())
    }

    /// What every cell shares but its size, interval, XDP mode and knobs:
    /// the first cell's plan.
    pub(crate) fn common(&self) -> &RunOptions {
        // parse_with refuses an empty matrix, and retain_sets keeps the plans.
        &self.plans[0].run
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
    pub(crate) fn retain_sets(&mut self, names: &[String]) -> Result<()> {
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

#[cfg(test)]
mod execute_tests;
#[cfg(test)]
mod tests;
