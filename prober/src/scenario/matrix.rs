//! From a read scenario file to the validated matrix: the axes, each knob
//! set merged `[knobs]` < set < command line, and every cell through the
//! one validator, its errors pointed at the flag or at the file's key.

use std::{fmt, path::Path};

use anyhow::{Result, anyhow, bail};
use serde::Serialize;
use serde_json::Value;

use super::{
    Axes, CellPlan, KnobSet, MAX_CELLS, Overrides, RunOptions, Scenario, cell_id,
    file::{ProbeSection, read_file},
};
use crate::{
    ebpf::XdpMode,
    options::{
        self, KnobSpec, OutputSpec, RunSpec, SpecError,
        located::{key_span, located},
    },
};

/// Refuses a matrix of more than [`MAX_CELLS`] cells, from the lengths of
/// its axes alone (checked products: no length can wrap the count).
pub(super) fn check_cell_count(path: &Path, axes: [(usize, &str); 4]) -> Result<()> {
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
        (None, s) => vec![s.unwrap_or(options::plan::DEFAULT_SIZE)],
    };
    let intervals = match (p.intervals, p.run.probe.interval) {
        (Some(_), Some(_)) => return Err(one_of("intervals", "interval")),
        (Some(v), None) => v.into_iter().map(|h| h.0).collect(),
        (None, i) => vec![i.unwrap_or(options::plan::DEFAULT_INTERVAL)],
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
        let merged = options::merge(&options::merge(common, own)?, over)?;
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
                    let run = options::plan::validate(&cell, &set.merged, &OutputSpec::default())
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
    /// Parses `text`, lays the command line's `over` over it and validates
    /// every cell with the one validator ([`options::plan::validate`]), so a
    /// cell that cannot run is refused here, naming the key and line (or
    /// the flag) and the cell, before anything is built.
    pub(crate) fn parse_with(path: &Path, text: &str, over: &Overrides) -> Result<Self> {
        let f = read_file(path, text)?;
        let loc = |p: &[&str], m: &dyn fmt::Display| located(path, text, p, m);
        // serde hands every key of [probe] to the catch-all; the specs' own
        // keys are not unknown.
        let known = options::keys_of::<RunSpec>();
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
    options::keys_of::<KnobSpec>().iter().any(|k| k == key)
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
