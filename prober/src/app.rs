//! Command dispatch: `main()` -> `run()` -> one-line error and exit code.

use std::{
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicU8, Ordering},
    },
};

use anyhow::{Context, Result, bail};
use clap::Parser;

use crate::{
    cli::{Cli, Command, ProbeArgs, RunArgs},
    probe::STOP_NOW,
};

pub fn main_entry() -> ExitCode {
    crate::heap::limit_arenas();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    init_logging(cli.verbose);
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(verbose: u8) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or(level))
        .format_timestamp(None)
        .try_init();
    // -vv also shows the eBPF programs' own log of their rare paths.
    crate::ebpf::klog::enable(verbose >= 2);
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Some(Command::Plot(args)) => crate::cli::plot_command(&args).map(|()| ExitCode::SUCCESS),
        Some(Command::BenchForward(args)) => bench_forward_command(&args),
        Some(Command::Testbed(args)) => {
            crate::testbed::require_root()?;
            with_signals(true, move |stop| {
                crate::bench::hold::hold(&args, crate::sys::linux(), &stop)
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Run(args)) => run_scenario_command(args),
        Some(Command::Cleanup(args)) => {
            crate::testbed::record::cleanup_command(&args, crate::sys::linux().as_ref())
        }
        Some(Command::Reflect(args)) => crate::probe::reflect::command(&args),
        Some(Command::Compare(args)) => compare_command(&args),
        Some(Command::Completions(args)) => {
            use std::io::Write;
            let script = crate::docs::completions(args.shell);
            match std::io::stdout().lock().write_all(&script) {
                // `rtprobe completions bash | head` is no error.
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    Err(e).context("cannot write the completion script to stdout")
                }
                _ => Ok(ExitCode::SUCCESS),
            }
        }
        Some(Command::Man(args)) => {
            for page in crate::docs::write_man_pages(&args.out_dir)? {
                println!("{}", page.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        None => probe_command(&cli.probe),
    }
}

/// Installs SIGINT/SIGTERM/SIGHUP handling on a tokio runtime: the first
/// signal stops sending and lets probes in flight land, the second stops at
/// once. Either way the run ends through its normal path, so the CSV is
/// complete and the testbed is torn down.
pub(crate) fn with_signals<T: Send + 'static>(
    quiet: bool,
    f: impl FnOnce(Arc<AtomicU8>) -> Result<T> + Send + 'static,
) -> Result<T> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("start the tokio runtime")?;
    let stop = Arc::new(AtomicU8::new(0));
    rt.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sighup = signal(SignalKind::hangup())?;
        let s = stop.clone();
        let watcher = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = sigint.recv() => {}
                    _ = sigterm.recv() => {}
                    _ = sighup.recv() => {}
                }
                let prev = s.fetch_add(1, Ordering::SeqCst);
                if prev == 0 {
                    if !quiet {
                        eprintln!("\nrtprobe: stopping; waiting for probes in flight (signal again to stop at once)");
                    }
                } else {
                    s.store(STOP_NOW, Ordering::SeqCst);
                }
            }
        });
        let r = tokio::task::spawn_blocking(move || f(stop)).await.context("run thread")?;
        watcher.abort();
        r
    })
}

fn bench_forward_command(args: &crate::cli::BenchForwardArgs) -> Result<ExitCode> {
    use crate::bench::forward;
    let merged = args.with_config_file()?;
    let plan = forward::Plan::from_args(&merged).with_context(|| match &args.config {
        Some(f) => format!("{} with the command line over it", f.display()),
        None => "bench-forward".into(),
    })?;
    crate::testbed::require_root()?;
    // Before the run, not after minutes of it.
    if let Some(dir) = plan.json.as_deref().and_then(|j| j.parent())
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).with_context(|| {
            format!("cannot create {} for --json: check the path", dir.display())
        })?;
    }
    let quiet = plan.quiet;
    let p = plan.clone();
    let report = with_signals(quiet, move |stop| {
        if !quiet {
            println!("{}", forward::table_header());
        }
        let mut bounce_header = !quiet;
        forward::run(
            &p,
            crate::sys::linux(),
            &stop,
            |step| {
                if !quiet {
                    println!("{}", forward::format_step(step));
                }
            },
            |b| {
                if std::mem::take(&mut bounce_header) {
                    println!("{}", crate::bench::bounce::table_header());
                }
                if !quiet {
                    println!("{}", crate::bench::bounce::format_step(b));
                }
            },
        )
    })?;
    print!("{}", forward::format_report(&report));
    if let Some(j) = &plan.json {
        crate::export::json::write_value(j, &report)?;
        println!("  wrote {}", j.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn compare_command(a: &crate::cli::CompareArgs) -> Result<ExitCode> {
    use crate::export::compare;
    let settings = compare::Settings {
        metric: a.metric,
        resamples: a.resamples as usize,
        sample_cap: a.sample as usize,
        seed: a.seed,
        ..compare::Settings::default()
    };
    let c = compare::compare(&a.base, &a.others, &settings)?;
    print!("{}", compare::render(&c));
    if let Some(j) = &a.json {
        crate::export::json::write_value(j, &c)?;
        println!("\n  wrote {}", j.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn run_scenario_command(args: crate::cli::RunArgs) -> Result<ExitCode> {
    if args.check {
        run_command(&args, None, None)?;
        return Ok(ExitCode::SUCCESS);
    }
    let quiet = args.quiet;
    with_signals(quiet, move |stop| {
        let mut runner = crate::runner::ProbeCellRunner {
            sys: crate::sys::linux(),
            stop: &stop,
        };
        let mut figures = crate::runner::PlotFigures;
        run_command(&args, Some(&mut runner), Some(&mut figures))?;
        Ok(if stop.load(Ordering::SeqCst) != 0 {
            ExitCode::from(130)
        } else {
            ExitCode::SUCCESS
        })
    })
}

/// The probe run's progress: a bar for a fixed count, a spinner otherwise;
/// the message carries the counts and the latest interval's p50/p99.
fn progress_bar(opts: &crate::spec::RunOptions) -> indicatif::ProgressBar {
    if opts.quiet {
        return indicatif::ProgressBar::hidden();
    }
    let (bar, template) = match opts.probe.count {
        Some(n) => (
            indicatif::ProgressBar::new(n),
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} probes (eta {eta})  {msg}",
        ),
        None => (
            indicatif::ProgressBar::new_spinner(),
            "{spinner} [{elapsed_precise}] {msg}",
        ),
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(250));
    bar
}

fn probe_command(args: &ProbeArgs) -> Result<ExitCode> {
    let opts = match run_options(args) {
        Ok(o) => o,
        // A usage error, as clap's own: status 2.
        Err(e) => {
            eprintln!("Error: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    // A remote target needs no testbed, so no root (knobs say if they do).
    if opts.remote.target.is_none() {
        crate::testbed::require_root()?;
    }
    // Every option is checked before --metrics-listen binds its port.
    crate::runner::check(&opts)?;
    let quiet = opts.quiet;
    let outcome = with_signals(quiet, move |stop| {
        let bar = progress_bar(&opts);
        let (lines, shown) = (bar.clone(), bar.clone());
        let mut live = crate::export::live::Live::new(
            &opts.continuous,
            // Interval lines go to stdout even with --quiet (they were asked
            // for), above the progress bar.
            Box::new(move |line| lines.suspend(|| println!("{line}"))),
            Box::new(move |p| {
                shown.set_position(p.counts.sent);
                shown.set_message(p.message());
            }),
        )?;
        if let Some(url) = live.metrics_url() {
            eprintln!("rtprobe: serving metrics at {url}");
        }
        let r = crate::runner::execute(&opts, crate::sys::linux(), &stop, &mut live);
        bar.finish_and_clear();
        r.map(|o| (o, opts))
    })?;
    let (o, opts) = outcome;
    print!(
        "{}",
        crate::export::text::format_summary(&o.summary, &o.meta)
    );
    match opts.continuous.rotation {
        Some(r) => println!(
            "  wrote {} rows to {} and its rotated files (by {}, the last {} kept as {}.1 ..)",
            o.rows,
            opts.out.display(),
            r.when,
            r.keep,
            opts.out.display()
        ),
        None => println!("  wrote {} rows to {}", o.rows, opts.out.display()),
    }
    // Written even when the CSV failed: on a full disk the atomic write
    // leaves the earlier file or none, and the error below names both.
    let json =
        opts.json.as_ref().and_then(
            |j| match crate::export::json::write_summary(j, &o.summary) {
                Ok(()) => {
                    println!("  wrote summary to {}", j.display());
                    None
                }
                Err(e) => Some(e),
            },
        );
    if let Some(failed) = crate::runner::failed_outputs(o.output_error.as_deref(), json.as_ref()) {
        let how = if o.output_error.is_some() {
            "the run stopped at the first failure; "
        } else {
            ""
        };
        eprintln!(
            "Error: {failed} ({how}the summary above covers all {} probes sent)",
            o.summary.sent
        );
        return Ok(ExitCode::FAILURE);
    }
    // 130 = interrupted, as shells report SIGINT; the data is complete.
    Ok(if o.interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// The probe command's plan: the one validator over its flags, then the
/// output files; an error names the flag.
fn run_options(args: &ProbeArgs) -> Result<crate::spec::RunOptions> {
    let to_cli = |e: crate::spec::SpecError| anyhow::anyhow!("{}", e.for_cli());
    let opts = crate::spec::plan::validate(&args.run, &args.knobs, &args.output).map_err(to_cli)?;
    crate::spec::plan::check_output_paths(&opts).map_err(to_cli)?;
    Ok(opts)
}

/// `rtprobe run FILE.toml` (the command line over the file). `runner` is the probe engine's cell runner
/// (testbed + XDP + probe), `figures` the plot module's; without a runner
/// only `--check` works.
fn run_command(
    args: &RunArgs,
    runner: Option<&mut dyn crate::config::CellRunner>,
    figures: Option<&mut dyn crate::config::FigureMaker>,
) -> Result<()> {
    let over = crate::config::Overrides {
        run: args.run.clone(),
        knobs: args.knobs.clone(),
    };
    let mut sc = crate::config::Scenario::load_with(&args.config, &over)?;
    sc.retain_sets(&args.sets)?;
    let is_root = nix::unistd::geteuid().is_root();
    let notes = if is_root {
        sc.check_system(&mut crate::config::KernelCheck(crate::sys::linux()))?
    } else if args.check {
        vec!["kernel support (qdiscs) not checked: that needs root".to_string()]
    } else {
        return Err(crate::error::Error::NotRoot.into());
    };
    let out_dir = args.out_dir.clone().unwrap_or_else(|| sc.output.clone());
    let cells = sc.cells(&out_dir);
    if args.check {
        print!("{}", crate::config::plan(&sc, &cells, &out_dir, &notes));
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
    let mut bar = crate::config::Bar::new(&cells, args.quiet);
    let out = crate::config::run_scenario(&sc, &out_dir, runner, figures, &mut bar)?;
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
