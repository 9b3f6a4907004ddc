//! CPU stress on N workers, as the study's `stress` with 8 sqrt workers
//! (scenarios 1.3 and 1.4). Built in: N threads computing square roots
//! until stopped. With `stress_tool = "stress-ng"` (and stress-ng on the
//! PATH) it runs `stress-ng --cpu N --cpu-method sqrt` instead and stops it
//! with SIGTERM (stress-ng then stops its own workers).
//!
//! Kernel interface: none beyond threads and processes (the child process
//! through `sys::process`); any Linux.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::KnobGuard;
use crate::model::knobs::{APPLIED, AppliedKnobs, StressApplied};
use crate::sys::process::Background;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum StressTool {
    /// sqrt loops on threads inside rtprobe.
    #[default]
    Builtin,
    /// The stress-ng program (must be installed).
    StressNg,
}

impl StressTool {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StressTool::Builtin => "builtin",
            StressTool::StressNg => "stress-ng",
        }
    }
}

/// Whether stress-ng can be run.
pub(crate) fn stress_ng_path() -> Option<std::path::PathBuf> {
    which::which("stress-ng").ok()
}

pub(crate) struct Stress {
    workers: u32,
    tool: StressTool,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<u64>>,
    child: Option<Background>,
    started: Instant,
    /// sqrt iterations done by the builtin workers (filled on stop).
    iterations: u64,
    stopped_after: Option<Duration>,
}

pub(crate) fn start(workers: u32, tool: StressTool) -> Result<Stress> {
    if workers == 0 || workers > 1024 {
        bail!("stress workers {workers} out of range: use 1 to 1024");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut s = Stress {
        workers,
        tool,
        stop: stop.clone(),
        threads: Vec::new(),
        child: None,
        started: Instant::now(),
        iterations: 0,
        stopped_after: None,
    };
    match tool {
        StressTool::Builtin => {
            for i in 0..workers {
                let stop = stop.clone();
                let h = std::thread::Builder::new()
                    .name(format!("stress-{i}"))
                    .spawn(move || sqrt_worker(&stop))
                    .context("spawn a stress worker")?;
                s.threads.push(h);
            }
        }
        StressTool::StressNg => {
            let path = stress_ng_path().ok_or_else(|| {
                anyhow::anyhow!(
                    "stress-ng is not installed: install it (apt-get install stress-ng) or use the built-in stress"
                )
            })?;
            let child = Background::spawn(
                path,
                &[
                    "--cpu",
                    &workers.to_string(),
                    "--cpu-method",
                    "sqrt",
                    "--timeout",
                    "0",
                    "--quiet",
                ],
            )
            .context("start stress-ng")?;
            s.child = Some(child);
        }
    }
    Ok(s)
}

fn sqrt_worker(stop: &AtomicBool) -> u64 {
    let mut n: u64 = 0;
    let mut x = 1.0f64;
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..100_000 {
            x = std::hint::black_box(x + 1.0).sqrt();
        }
        n += 100_000;
    }
    std::hint::black_box(x);
    n
}

impl Stress {
    pub(crate) fn stop(&mut self) -> Result<()> {
        if self.stopped_after.is_some() {
            return Ok(());
        }
        self.stopped_after = Some(self.started.elapsed());
        self.stop.store(true, Ordering::Relaxed);
        for h in self.threads.drain(..) {
            self.iterations += h.join().unwrap_or(0);
        }
        if let Some(mut c) = self.child.take() {
            // stress-ng stops its own workers on SIGTERM.
            c.stop(Duration::from_secs(5))?;
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn running(&self) -> bool {
        self.stopped_after.is_none()
    }
}

impl KnobGuard for Stress {
    fn name(&self) -> &'static str {
        "stress"
    }

    fn record(&self, into: &mut AppliedKnobs) {
        into.stress = Some(StressApplied {
            method: "sqrt".into(),
            status: APPLIED.into(),
            tool: self.tool.as_str().into(),
            workers: self.workers,
        });
    }

    fn restore(&mut self) -> Result<()> {
        self.stop()
    }
}

impl Drop for Stress {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            log::warn!("stopping the CPU stress: {e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_workers_burn_and_stop() {
        let mut s = start(2, StressTool::Builtin).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(s.running());
        s.stop().unwrap();
        assert!(!s.running());
        assert!(s.iterations > 0);
        assert!(start(0, StressTool::Builtin).is_err());
    }

    #[test]
    fn stress_ng_runs_and_stops_when_present() {
        use nix::{sys::signal::kill, unistd::Pid};

        if stress_ng_path().is_none() {
            eprintln!("SKIPPED: stress-ng not installed");
            return;
        }
        let mut s = start(1, StressTool::StressNg).unwrap();
        let pid = s.child.as_ref().unwrap().id().unwrap() as i32;
        std::thread::sleep(Duration::from_millis(200));
        s.stop().unwrap();
        // Our child is gone (reaped): signal 0 fails.
        assert!(kill(Pid::from_raw(pid), None).is_err());
    }
}
