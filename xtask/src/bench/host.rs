//! What else the machine was doing while a figure was measured: the
//! hypervisor's steal, the CPU time of the runs, and the machine line.

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

pub(super) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    format!(
        "{} CPUs ({cpu}), kernel {}, load average {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        kernel.trim(),
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
