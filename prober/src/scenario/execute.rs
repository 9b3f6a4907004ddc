//! Running a scenario: every cell through a [`CellRunner`], progress on
//! stderr, each variant compared with its group's baseline, then
//! `results.json` (after every cell) and `report.md`.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::{Cell, Scenario, markdown, results_json::write_results_json};
use crate::{model::knobs::AppliedKnobs, stats::Summary};

/// What the real runner hands back for a cell.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct CellResult {
    /// The run's summary; its report holds `load` and `skipped` as
    /// `Applied::stop_load()` returned them.
    pub(crate) summary: Summary,
    /// `Applied::metadata()`: what the knobs applied.
    pub(crate) knobs: AppliedKnobs,
}

/// One cell as the report sees it.
pub(crate) struct ReportRow<'a> {
    pub(crate) cell: &'a Cell,
    /// The cell's result, or why it failed.
    pub(crate) result: Result<&'a CellResult, &'a str>,
    /// Comparison figures against the baseline (paths under the output dir).
    pub(crate) figures: Vec<std::path::PathBuf>,
    /// p50/p99 against the baseline with confidence intervals, in words
    /// (`export::compare`), for variants whose CSVs could be compared.
    pub(crate) vs_baseline: Option<String>,
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

/// Progress: cell i/n, elapsed, remaining (from the cells' estimates,
/// corrected by how long the finished cells really took).
pub(crate) trait Progress {
    fn start_cell(&mut self, cell: &Cell);
    fn end_cell(&mut self, cell: &Cell, ok: bool);
    fn finish(&mut self);
}

/// indicatif bar on stderr (hidden when stderr is not a terminal).
pub(crate) struct Bar {
    bar: indicatif::ProgressBar,
}

impl Bar {
    pub(crate) fn new(cells: &[Cell], quiet: bool) -> Self {
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
    pub(crate) report: PathBuf,
    pub(crate) cells: usize,
    pub(crate) failed: usize,
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
    let text = markdown::render(&markdown::ReportInput {
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
