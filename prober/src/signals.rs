//! Ctrl-C and friends for a command that runs on a tokio runtime: the
//! stop levels of [`crate::probe::STOP_SENDING`] and
//! [`crate::probe::STOP_NOW`], set from SIGINT, SIGTERM and SIGHUP.

use std::sync::{
    Arc,
    atomic::{AtomicU8, AtomicU64, Ordering},
};

use anyhow::{Context, Result};

use crate::probe::STOP_NOW;

/// Installs SIGINT/SIGTERM/SIGHUP handling on a tokio runtime: the first
/// signal stops sending and lets probes in flight land, the second stops at
/// once. Either way the run ends through its normal path, so the CSV is
/// complete and the testbed is torn down.
pub(crate) fn with_signals<T: Send + 'static>(
    quiet: bool,
    f: impl FnOnce(Arc<AtomicU8>) -> Result<T> + Send + 'static,
) -> Result<T> {
    with_signals_reload(quiet, None, f)
}

/// As [`with_signals`], except that with `reload` a SIGHUP does not stop
/// the run: it adds one to `reload` (a run with `--targets FILE` reads
/// the file again).
pub(crate) fn with_signals_reload<T: Send + 'static>(
    quiet: bool,
    reload: Option<Arc<AtomicU64>>,
    f: impl FnOnce(Arc<AtomicU8>) -> Result<T> + Send + 'static,
) -> Result<T> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        // The run itself (set-up, then the collector) is one of them.
        .thread_name("rtprobe-run")
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
                    _ = sighup.recv() => {
                        if let Some(r) = &reload {
                            r.fetch_add(1, Ordering::SeqCst);
                            continue;
                        }
                    }
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
