//! CPU use per core from two samples of /proc/stat (any Linux; the
//! `steal` column since 2.6.11). Parsing and the arithmetic are pure.

use anyhow::{Context, Result};
use serde::Serialize;

/// One `cpuN` line of /proc/stat, in USER_HZ ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CpuTimes {
    pub(crate) cpu: usize,
    pub(crate) user: u64,
    pub(crate) nice: u64,
    pub(crate) system: u64,
    pub(crate) idle: u64,
    pub(crate) iowait: u64,
    pub(crate) irq: u64,
    pub(crate) softirq: u64,
    pub(crate) steal: u64,
}

impl CpuTimes {
    fn total(&self) -> u64 {
        self.user
            + self.nice
            + self.system
            + self.idle
            + self.iowait
            + self.irq
            + self.softirq
            + self.steal
    }
}

/// Per-core use between two samples, in percent of that core's time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct CoreUse {
    pub(crate) cpu: usize,
    /// Everything but idle and iowait.
    pub(crate) busy_pct: f64,
    pub(crate) user_pct: f64,
    pub(crate) system_pct: f64,
    /// Packet processing in softirq context (NAPI, forwarding, XDP) shows up here.
    pub(crate) softirq_pct: f64,
    /// Time the hypervisor gave to someone else.
    pub(crate) steal_pct: f64,
}

/// Parses the per-core lines (`cpu0`, `cpu1`, ...) of /proc/stat; the
/// aggregate `cpu` line is skipped.
pub(crate) fn parse_proc_stat(text: &str) -> Vec<CpuTimes> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?;
            let cpu: usize = name.strip_prefix("cpu")?.parse().ok()?;
            let v: Vec<u64> = it.map(|x| x.parse().unwrap_or(0)).collect();
            let f = |i: usize| v.get(i).copied().unwrap_or(0);
            Some(CpuTimes {
                cpu,
                user: f(0),
                nice: f(1),
                system: f(2),
                idle: f(3),
                iowait: f(4),
                irq: f(5),
                softirq: f(6),
                steal: f(7),
            })
        })
        .collect()
}

/// Use per core between `before` and `after` (cores matched by number; a
/// core missing from either sample is left out).
pub(crate) fn core_use(before: &[CpuTimes], after: &[CpuTimes]) -> Vec<CoreUse> {
    after
        .iter()
        .filter_map(|a| {
            let b = before.iter().find(|b| b.cpu == a.cpu)?;
            let total = a.total().saturating_sub(b.total());
            if total == 0 {
                return Some(CoreUse {
                    cpu: a.cpu,
                    ..Default::default()
                });
            }
            let pct = |x: u64, y: u64| 100.0 * x.saturating_sub(y) as f64 / total as f64;
            let idle = pct(a.idle + a.iowait, b.idle + b.iowait);
            Some(CoreUse {
                cpu: a.cpu,
                busy_pct: 100.0 - idle,
                user_pct: pct(a.user + a.nice, b.user + b.nice),
                system_pct: pct(a.system + a.irq, b.system + b.irq),
                softirq_pct: pct(a.softirq, b.softirq),
                steal_pct: pct(a.steal, b.steal),
            })
        })
        .collect()
}

/// utime + stime (clock ticks) from the text of /proc/PID/stat. The
/// command name may hold spaces and parentheses, so fields are counted
/// after its last ')'.
pub(crate) fn parse_task_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state is field 3 of the full line, utime 14, stime 15.
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// CPU time a task (process or kernel thread) has used so far, in seconds.
/// For a thread of this process this is the whole process's: use
/// [`own_thread_cpu_secs`].
pub(crate) fn task_cpu_secs(pid: i32) -> Option<f64> {
    stat_cpu_secs(&format!("/proc/{pid}/stat"))
}

/// CPU time one thread of this process has used so far, in seconds
/// (/proc/self/task/TID/stat: /proc/TID/stat sums the whole thread group).
pub(crate) fn own_thread_cpu_secs(tid: i32) -> Option<f64> {
    stat_cpu_secs(&format!("/proc/self/task/{tid}/stat"))
}

fn stat_cpu_secs(path: &str) -> Option<f64> {
    let t = std::fs::read_to_string(path).ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    Some(parse_task_ticks(&t)? as f64 / hz as f64)
}

/// CPU time of the calling thread so far, in seconds.
pub(crate) fn thread_cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

pub(crate) fn sample() -> Result<Vec<CpuTimes>> {
    let t = std::fs::read_to_string("/proc/stat").context("read /proc/stat")?;
    Ok(parse_proc_stat(&t))
}

/// Packets per second from a counter difference over `secs`.
pub(crate) fn rate(before: u64, after: u64, secs: f64) -> f64 {
    if secs <= 0.0 {
        return 0.0;
    }
    after.saturating_sub(before) as f64 / secs
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "cpu  300 0 200 1000 0 0 50 0 0 0\n\
        cpu0 100 0 100 500 0 0 0 0 0 0\n\
        cpu1 200 0 100 500 0 0 50 0 0 0\n\
        intr 12345\nctxt 999\n";
    const AFTER: &str = "cpu  400 0 300 1100 0 0 150 0 0 0\n\
        cpu0 150 10 140 520 0 0 60 20 0 0\n\
        cpu1 200 0 100 600 0 0 50 0 0 0\n";

    #[test]
    fn parses_per_core_lines_only() {
        let c = parse_proc_stat(BEFORE);
        assert_eq!(c.len(), 2);
        assert_eq!(c[1].cpu, 1);
        assert_eq!((c[1].user, c[1].softirq), (200, 50));
        // Short lines (old kernels) leave the missing columns at 0.
        let old = parse_proc_stat("cpu0 1 2 3 4\n");
        assert_eq!((old[0].idle, old[0].steal), (4, 0));
    }

    #[test]
    fn use_per_core_from_two_samples() {
        let u = core_use(&parse_proc_stat(BEFORE), &parse_proc_stat(AFTER));
        // cpu0: 200 ticks in all: 20 idle, 60 user+nice, 40 sys, 60 softirq, 20 steal.
        let c0 = u[0];
        assert_eq!(c0.cpu, 0);
        assert!((c0.busy_pct - 90.0).abs() < 1e-9);
        assert!((c0.user_pct - 30.0).abs() < 1e-9);
        assert!((c0.system_pct - 20.0).abs() < 1e-9);
        assert!((c0.softirq_pct - 30.0).abs() < 1e-9);
        assert!((c0.steal_pct - 10.0).abs() < 1e-9);
        // cpu1 only idled.
        assert!(u[1].busy_pct.abs() < 1e-9);
        // No time passed: zeros, not NaN.
        let same = core_use(&parse_proc_stat(BEFORE), &parse_proc_stat(BEFORE));
        assert_eq!(same[0].busy_pct, 0.0);
    }

    #[test]
    fn task_stat_times() {
        let t = "4242 (napi/veth-rin-3) S 2 0 0 0 -1 2129984 0 0 0 0 17 230 0 0 -51 0 1 0 100 0 0";
        assert_eq!(parse_task_ticks(t), Some(247));
        // A name with spaces and a parenthesis does not shift the fields.
        let t = "7 (a b) c) R 1 1 1 0 -1 0 0 0 0 0 5 6 0 0 20 0 1 0";
        assert_eq!(parse_task_ticks(t), Some(11));
        assert_eq!(parse_task_ticks("garbage"), None);
    }

    #[test]
    fn rates() {
        assert_eq!(rate(100, 1100, 2.0), 500.0);
        assert_eq!(
            rate(100, 50, 1.0),
            0.0,
            "a counter reset is no negative rate"
        );
        assert_eq!(rate(0, 10, 0.0), 0.0);
    }
}
