//! The host a figure was measured on and what else it was doing: the
//! host line (from `rtprobe host`), the load average, the hypervisor's
//! steal, the CPU time of the runs.

use std::{path::Path, process::Command};

use serde_json::Value;

/// The host's steal over a stretch of time: the share of all this
/// machine's CPU time the hypervisor took (the `steal` column of
/// /proc/stat's `cpu` line against the line's total).
pub(super) struct StealMeter(Option<(u64, u64)>);

impl StealMeter {
    pub(super) fn start() -> Self {
        StealMeter(read_steal())
    }

    pub(super) fn pct(&self) -> Option<f64> {
        let ((s0, t0), (s1, t1)) = (self.0?, read_steal()?);
        (t1 > t0).then(|| 100.0 * s1.saturating_sub(s0) as f64 / (t1 - t0) as f64)
    }
}

pub(super) fn read_steal() -> Option<(u64, u64)> {
    parse_steal(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// (steal, total) ticks of /proc/stat's aggregate `cpu` line.
pub(super) fn parse_steal(proc_stat: &str) -> Option<(u64, u64)> {
    let line = proc_stat
        .lines()
        .find(|l| l.split_whitespace().next() == Some("cpu"))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    // guest and guest_nice (9th, 10th) are already inside user and nice.
    Some((*v.get(7)?, v.iter().take(8).sum()))
}

/// "run queue 4.6 ms (0.09 %), host steal 9.9 % of CPUs [0, 1]" from a
/// summary's `pacing.waits`: why a woken sender was still late.
pub(super) fn waits_text(w: &Value) -> String {
    let over = w["over_ns"].as_f64().filter(|&o| o > 0.0);
    let runq = match (w["runq_wait_ns"].as_f64(), over) {
        (Some(r), Some(o)) => format!("run queue {:.1} ms ({:.2} %)", r / 1e6, 100.0 * r / o),
        _ => "run queue -".into(),
    };
    let cpus = w["cpus"].as_array().map_or(0, |c| c.len());
    let steal = match (w["steal_ns"].as_f64(), over) {
        (Some(st), Some(o)) if cpus > 0 => format!(
            "host steal {:.1} % of CPUs {}",
            100.0 * st / (o * cpus as f64),
            w["cpus"]
        ),
        _ => "host steal -".into(),
    };
    format!("{runq}, {steal}")
}

/// CPU time (user + system) of every child process waited for so far, in
/// seconds (getrusage RUSAGE_CHILDREN).
pub(super) fn children_cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to a rusage.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

/// The host line every bench table starts with: the facts every run's
/// summary names, from the binary under test (`rtprobe host`: the same
/// reader as its reports, so the bench and the product cannot disagree).
pub(super) fn host_line(bin: &Path) -> String {
    let out = Command::new(bin).arg("host").output();
    match out {
        Ok(o) if o.status.success() => {
            format!("host: {}", String::from_utf8_lossy(&o.stdout).trim())
        }
        Ok(o) => format!(
            "host: unknown (`{} host` failed: {})",
            bin.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("host: unknown (cannot run {}: {e})", bin.display()),
    }
}

/// "load average 1.20 0.95 0.50" now.
pub(super) fn load_average() -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "load average {}",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn steal_from_proc_stat_and_waits_in_words() {
        let stat = "cpu  100 5 50 800 10 0 5 30 7 0\ncpu0 50 2 25 400 5 0 2 15 3 0\n";
        assert_eq!(parse_steal(stat), Some((30, 1000)));
        assert_eq!(parse_steal("cpu0 1 2 3\n"), None);
        assert_eq!(parse_steal("cpu  1 2 3\n"), None);
        let w = serde_json::json!({"over_ns": 5e9, "runq_wait_ns": 4.6e6,
                                   "steal_ns": 9.9e8, "cpus": [0, 1]});
        assert_eq!(
            waits_text(&w),
            "run queue 4.6 ms (0.09 %), host steal 9.9 % of CPUs [0,1]"
        );
        assert_eq!(waits_text(&Value::Null), "run queue -, host steal -");
    }
}
