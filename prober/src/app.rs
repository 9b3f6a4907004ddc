//! Command dispatch: `main()` -> `run()` -> one-line error and exit code.

use std::{
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicU8, Ordering},
    },
};

use anyhow::{Context, Result};
use clap::Parser;

use crate::{
    cli::{Cli, Command, ProbeArgs},
    config::RunOptions,
    probe::STOP_NOW,
};

pub fn main_entry() -> ExitCode {
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
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Some(Command::Plot(args)) => crate::export::plot::run(&args).map(|()| ExitCode::SUCCESS),
        Some(Command::BenchForward(args)) => bench_forward_command(&args),
        Some(Command::Testbed(args)) => {
            crate::testbed::require_root()?;
            with_signals(true, move |stop| crate::bench::hold::hold(&args, &stop))?;
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Run(args)) => run_scenario_command(args),
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
    let plan = forward::Plan::from_args(args)?;
    crate::testbed::require_root()?;
    let quiet = plan.quiet;
    let p = plan.clone();
    let report = with_signals(quiet, move |stop| {
        if !quiet {
            println!("{}", forward::table_header());
        }
        forward::run(&p, &stop, |step| {
            if !quiet {
                println!("{}", forward::format_step(step));
            }
        })
    })?;
    print!("{}", forward::format_report(&report));
    if let Some(j) = &plan.json {
        std::fs::write(j, serde_json::to_string_pretty(&report)? + "\n")
            .with_context(|| format!("cannot write {}", j.display()))?;
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
        std::fs::write(j, serde_json::to_string_pretty(&c)? + "\n").with_context(|| {
            format!(
                "cannot write {}: check that its directory exists",
                j.display()
            )
        })?;
        println!("\n  wrote {}", j.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn run_scenario_command(args: crate::cli::RunArgs) -> Result<ExitCode> {
    if args.check {
        crate::config::run_command(&args, None, None)?;
        return Ok(ExitCode::SUCCESS);
    }
    let quiet = args.quiet;
    with_signals(quiet, move |stop| {
        let mut runner = crate::runner::ProbeCellRunner { stop: &stop };
        let mut figures = crate::runner::PlotFigures;
        crate::config::run_command(&args, Some(&mut runner), Some(&mut figures))?;
        Ok(if stop.load(Ordering::SeqCst) != 0 {
            ExitCode::from(130)
        } else {
            ExitCode::SUCCESS
        })
    })
}

fn probe_command(args: &ProbeArgs) -> Result<ExitCode> {
    let opts = RunOptions::from_args(args)?;
    // A remote target needs no testbed, so no root (knobs say if they do).
    if args.remote.target.is_none() {
        crate::testbed::require_root()?;
    }
    let remote = args.remote.clone();
    let quiet = opts.quiet;
    let outcome = with_signals(quiet, move |stop| {
        let total = opts.probe.count;
        let bar = if quiet {
            indicatif::ProgressBar::hidden()
        } else {
            let b = match total {
                Some(n) => indicatif::ProgressBar::new(n),
                None => indicatif::ProgressBar::new_spinner(),
            };
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} probes (eta {eta})",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        };
        let r = crate::runner::execute_with(&opts, &remote, &stop, |sent| bar.set_position(sent));
        bar.finish_and_clear();
        r.map(|o| (o, opts))
    })?;
    let (o, opts) = outcome;
    print!(
        "{}",
        crate::export::text::format_summary(&o.summary, &o.meta)
    );
    println!("  wrote {} rows to {}", o.rows, opts.out.display());
    if let Some(j) = &opts.json {
        crate::export::json::write_summary(j, &o.summary)?;
        println!("  wrote summary to {}", j.display());
    }
    // 130 = interrupted, as shells report SIGINT; the data is complete.
    Ok(if o.interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}
