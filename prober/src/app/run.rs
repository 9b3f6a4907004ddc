//! `rtprobe run FILE.toml`: a scenario's cells (sizes x intervals x knob
//! sets), each one probe run, then report.md and the comparison figures;
//! `--check` validates and prints the matrix.

use std::{
    path::PathBuf,
    process::ExitCode,
    sync::atomic::{AtomicU8, Ordering},
};

use anyhow::{Result, bail};

use crate::{
    cli::RunArgs,
    export::live::Live,
    scenario::{Cell, CellResult, CellRunner, FigureMaker, Scenario},
    signals::with_signals,
};

pub(super) fn command(args: RunArgs) -> Result<ExitCode> {
    let (sc, cells, out_dir, notes) = load(&args)?;
    if args.check {
        print!("{}", crate::scenario::plan(&sc, &cells, &out_dir, &notes));
        return Ok(ExitCode::SUCCESS);
    }
    for n in &notes {
        eprintln!("note: {n}");
    }
    with_signals(args.quiet, move |stop| {
        let mut bar = crate::scenario::Bar::new(&cells, args.quiet);
        let out = crate::scenario::run_scenario(
            &sc,
            &out_dir,
            &mut ProbeCellRunner {
                sys: crate::sys::linux(),
                stop: &stop,
            },
            Some(&mut PlotFigures),
            &mut bar,
        )?;
        println!("{} cells, report: {}", out.cells, out.report.display());
        if out.failed > 0 {
            bail!(
                "{} of {} cells failed; see {}",
                out.failed,
                out.cells,
                out.report.display()
            );
        }
        Ok(if stop.load(Ordering::SeqCst) != 0 {
            ExitCode::from(130)
        } else {
            ExitCode::SUCCESS
        })
    })
}

/// The scenario file with the command line over it, its cells, the output
/// folder, and notes on what was not checked. Without root only `--check`
/// goes on (without the kernel's support checked).
fn load(args: &RunArgs) -> Result<(Scenario, Vec<Cell>, PathBuf, Vec<String>)> {
    let over = crate::scenario::Overrides {
        run: args.run.clone(),
        knobs: args.knobs.clone().into(),
    };
    let mut sc = Scenario::load_with(&args.config, &over)?;
    sc.retain_sets(&args.sets)?;
    let is_root = nix::unistd::geteuid().is_root();
    let notes = if is_root {
        sc.check_system(&mut crate::scenario::KernelCheck(crate::sys::linux()))?
    } else if args.check {
        vec!["kernel support (qdiscs) not checked: that needs root".to_string()]
    } else {
        return Err(crate::error::Error::NotRoot.into());
    };
    let out_dir = args.out_dir.clone().unwrap_or_else(|| sc.output.clone());
    let cells = sc.cells(&out_dir);
    Ok((sc, cells, out_dir, notes))
}

/// Runs scenario cells: each cell is one probe run ([`crate::run::execute`]).
struct ProbeCellRunner<'a> {
    sys: crate::sys::SysRef,
    stop: &'a AtomicU8,
}

impl CellRunner for ProbeCellRunner<'_> {
    fn run_cell(&mut self, cell: &Cell) -> Result<CellResult> {
        if self.stop.load(Ordering::SeqCst) != 0 {
            bail!("not run: the scenario was interrupted");
        }
        // The plan the scenario's validator made for this cell.
        let opts = &cell.run;
        // The cell's live outputs: metrics (served while it runs), HDR log
        // and CSV rotation as the scenario asks; no lines, no bar of its own.
        // Before the metrics server binds: a rejected cell leaves no port.
        let checked = crate::run::check(opts)?;
        let mut live = Live::new(&opts.continuous, Box::new(|_| {}), Box::new(|_| {}))?;
        let out = crate::run::execute(opts, checked, self.sys.clone(), self.stop, &mut live, None)?;
        let json = crate::export::json::write_summary(&cell.json(), &out.summary).err();
        if let Some(e) = crate::run::failed_outputs(out.output_error.as_deref(), json.as_ref()) {
            bail!("{e} (the summary covers every probe sent)");
        }
        if out.interrupted {
            bail!(
                "interrupted after {} probes (kept in {})",
                out.summary.sent,
                cell.csv().display()
            );
        }
        Ok(CellResult {
            summary: out.summary,
            knobs: out.meta.knobs,
        })
    }
}

/// Draws each scenario comparison (baseline red, variant blue) with the
/// plot module, as `rtprobe plot BASE OTHER --label .. --label .. --metric
/// both` would.
struct PlotFigures;

impl FigureMaker for PlotFigures {
    fn compare(
        &mut self,
        out_dir: &std::path::Path,
        baseline: &Cell,
        other: &Cell,
    ) -> Result<Vec<std::path::PathBuf>> {
        use crate::export::plot::{self, Metric, PlotOptions};
        let opts = PlotOptions {
            prefix: other.id.clone(),
            labels: vec![baseline.label().to_string(), other.label().to_string()],
            metrics: vec![Metric::OneWay, Metric::Rtt],
            metric_required: true,
            ..PlotOptions::new(
                vec![baseline.csv().to_path_buf(), other.csv().to_path_buf()],
                out_dir.to_path_buf(),
            )
        };
        let files = plot::plot(&opts)?;
        Ok(files
            .into_iter()
            .map(|f| {
                f.strip_prefix(out_dir)
                    .map(|p| p.to_path_buf())
                    .unwrap_or(f)
            })
            .collect())
    }
}
