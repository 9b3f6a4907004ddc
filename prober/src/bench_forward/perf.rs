//! `perf stat` around a bench step, as the XDP thesis measured IPC, branch
//! misses and L1 misses: `perf stat -x, -e ... -t TIDS -- sleep SECS` on the
//! threads that do the packet work (the router's or the bounce device's
//! NAPI threads, the AF_XDP threads), or system-wide (`-a`) when there are
//! none. Events the machine cannot count (a VM without a virtual PMU shows
//! `<not supported>`) are None, never 0. perf is a command here: it is the
//! tool the thesis used, and the kernel's perf_event_open(2) needs the same
//! event set-up perf already does.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::sys::process;

/// Where perf is looked for.
pub(crate) const PERF: &str = "perf";

const EVENTS: [&str; 7] = [
    "task-clock",
    "cycles",
    "instructions",
    "branches",
    "branch-misses",
    "L1-dcache-loads",
    "L1-dcache-load-misses",
];

/// What one `perf stat` counted; None: not countable on this machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct PerfFigures {
    /// CPU time of the counted threads, in ms.
    pub(crate) task_clock_ms: Option<f64>,
    pub(crate) cycles: Option<u64>,
    pub(crate) instructions: Option<u64>,
    pub(crate) branches: Option<u64>,
    pub(crate) branch_misses: Option<u64>,
    pub(crate) l1d_loads: Option<u64>,
    pub(crate) l1d_load_misses: Option<u64>,
}

impl PerfFigures {
    /// Instructions per cycle.
    pub(crate) fn ipc(&self) -> Option<f64> {
        ratio(self.instructions?, self.cycles?)
    }
    /// Branch misses in percent of branches.
    pub(crate) fn branch_miss_pct(&self) -> Option<f64> {
        Some(100.0 * ratio(self.branch_misses?, self.branches?)?)
    }
    /// L1 data-cache load misses in percent of loads.
    pub(crate) fn l1d_miss_pct(&self) -> Option<f64> {
        Some(100.0 * ratio(self.l1d_load_misses?, self.l1d_loads?)?)
    }
    /// Whether any hardware counter was counted.
    pub(crate) fn has_hardware_counters(&self) -> bool {
        self.cycles.is_some() || self.instructions.is_some()
    }
}

fn ratio(a: u64, b: u64) -> Option<f64> {
    (b > 0).then(|| a as f64 / b as f64)
}

/// Parses `perf stat -x,` output (stderr): `value,unit,event,...` per line.
/// Pure.
pub(crate) fn parse(text: &str) -> PerfFigures {
    let mut f = PerfFigures::default();
    for line in text.lines() {
        let cols: Vec<&str> = line.split(',').collect();
        if cols.len() < 3 {
            continue;
        }
        let value = cols[0].trim();
        // Events may carry a modifier suffix (cycles:u).
        let event = cols[2].trim().split(':').next().unwrap_or("");
        let int = value.parse::<u64>().ok();
        match event {
            "task-clock" => f.task_clock_ms = value.parse::<f64>().ok(),
            "cycles" => f.cycles = int,
            "instructions" => f.instructions = int,
            "branches" => f.branches = int,
            "branch-misses" => f.branch_misses = int,
            "L1-dcache-loads" => f.l1d_loads = int,
            "L1-dcache-load-misses" => f.l1d_load_misses = int,
            _ => {}
        }
    }
    f
}

/// The arguments of one `perf stat` run. Pure.
pub(crate) fn args(tids: &[i32], duration: Duration) -> Vec<String> {
    let mut a: Vec<String> = vec!["stat".into(), "-x,".into(), "-e".into(), EVENTS.join(",")];
    if tids.is_empty() {
        a.push("-a".into());
    } else {
        a.push("-t".into());
        a.push(
            tids.iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
    }
    a.extend([
        "--".into(),
        "sleep".into(),
        format!("{:.3}", duration.as_secs_f64()),
    ]);
    a
}

/// Whether perf can run at all here; the reason when not.
pub(crate) fn available() -> Result<(), String> {
    match process::output(PERF, &["--version"]) {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "`{PERF} --version` failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!(
            "{PERF} is not installed ({e}); `apt-get install linux-perf` provides it"
        )),
    }
}

/// Counts `tids` (all CPUs if empty) for `duration`; blocks that long.
pub(crate) fn stat(tids: &[i32], duration: Duration) -> Result<PerfFigures> {
    let a = args(tids, duration);
    let o = process::output(PERF, &a).with_context(|| format!("running {PERF} {}", a.join(" ")))?;
    if !o.status.success() {
        bail!(
            "{PERF} {} failed: {}",
            a.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(parse(&String::from_utf8_lossy(&o.stderr)))
}

/// A figure with `digits` decimals, or "-" when unknown (a counter the
/// machine cannot count, a rate with no time to divide by).
pub(crate) fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_counted_and_unsupported_events() {
        let text = "1995.21,msec,task-clock,1995214872,100.00,0.998,CPUs utilized\n\
            4000000000,,cycles,1995214872,100.00,2.005,GHz\n\
            6000000000,,instructions,1995214872,100.00,1.50,insn per cycle\n\
            1000000,,branches,1,100.00,,\n\
            20000,,branch-misses,1,100.00,2.00,of all branches\n\
            <not supported>,,L1-dcache-loads,0,100.00,,\n\
            <not counted>,,L1-dcache-load-misses:u,0,0.00,,\n";
        let f = parse(text);
        assert_eq!(f.task_clock_ms, Some(1995.21));
        assert_eq!(f.ipc(), Some(1.5));
        assert_eq!(f.branch_miss_pct(), Some(2.0));
        assert_eq!(f.l1d_loads, None, "unsupported is unknown, not 0");
        assert_eq!(f.l1d_miss_pct(), None);
        assert!(f.has_hardware_counters());
        let vm = parse("<not supported>,,cycles,0,100.00,,\n12.5,msec,task-clock,1,100.00,,\n");
        assert!(!vm.has_hardware_counters());
        assert_eq!(vm.ipc(), None);
    }

    #[test]
    fn counts_threads_or_everything() {
        let a = args(&[12, 34], Duration::from_millis(1500));
        assert_eq!(a[4..6], ["-t".to_string(), "12,34".to_string()]);
        assert_eq!(a.last().unwrap(), "1.500");
        assert!(args(&[], Duration::from_secs(1)).contains(&"-a".to_string()));
    }
}
