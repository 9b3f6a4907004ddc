//! Where a thread's time went while it was not running, from the kernel's
//! own counters: waiting on the run queue for a CPU (the scheduler's
//! `run_delay`, `/proc/thread-self/schedstat`, Linux >= 2.6.9 with
//! CONFIG_SCHED_INFO) and taken by the hypervisor from the CPUs it may
//! run on (the `steal` column of `/proc/stat`, in USER_HZ ticks). A sender
//! that is late although its timer woke it early was either waiting for a
//! CPU inside this machine or for the host to give the CPU back; cyclictest
//! cannot tell these apart, these counters can.

use nix::{sched::sched_getaffinity, unistd::Pid};

pub(crate) use crate::stats::CpuWaits;

/// The counters at one moment, read on the thread they describe.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Snapshot {
    at_ns: i64,
    run_delay_ns: Option<u64>,
    /// CPUs the thread may run on, and their steal ticks.
    cpus: Vec<usize>,
    steal_ticks: Option<u64>,
}

impl Snapshot {
    /// Reads the calling thread's counters.
    pub(crate) fn now() -> Self {
        let cpus = allowed_cpus();
        let run_delay_ns = std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|t| parse_run_delay(&t));
        let steal_ticks = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| steal_ticks(&t, &cpus));
        Snapshot {
            at_ns: super::clock::monotonic_ns(),
            run_delay_ns,
            cpus,
            steal_ticks,
        }
    }

    /// The waits from `self` (earlier) to `later`.
    pub(crate) fn since(&self, later: &Snapshot) -> CpuWaits {
        let tick_ns = 1_000_000_000 / clock_ticks_per_s();
        CpuWaits {
            over_ns: later.at_ns.saturating_sub(self.at_ns).max(0) as u64,
            runq_wait_ns: later
                .run_delay_ns
                .zip(self.run_delay_ns)
                .map(|(b, a)| b.saturating_sub(a)),
            // Summed over the CPUs allowed at the start (an affinity
            // change mid-run would make the sets differ: then unknown).
            steal_ns: (self.cpus == later.cpus)
                .then(|| later.steal_ticks.zip(self.steal_ticks))
                .flatten()
                .map(|(b, a)| b.saturating_sub(a) * tick_ns),
            cpus: self.cpus.clone(),
        }
    }
}

/// `run_delay` (ns), the second field of `/proc/<pid>/schedstat`:
/// "on-CPU time, run-queue wait time, timeslices".
pub(crate) fn parse_run_delay(text: &str) -> Option<u64> {
    let mut f = text.split_whitespace();
    f.next()?.parse::<u64>().ok()?;
    f.next()?.parse().ok()
}

/// The steal ticks of `cpus` summed, from `/proc/stat` (the eighth value
/// of each `cpuN` line). None if a CPU's line or its steal column is missing.
pub(crate) fn steal_ticks(proc_stat: &str, cpus: &[usize]) -> Option<u64> {
    if cpus.is_empty() {
        return None;
    }
    let mut sum = 0u64;
    for &cpu in cpus {
        let name = format!("cpu{cpu}");
        let line = proc_stat
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name.as_str()))?;
        sum += line.split_whitespace().nth(8)?.parse::<u64>().ok()?;
    }
    Some(sum)
}

fn allowed_cpus() -> Vec<usize> {
    match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count())
            .filter(|&c| set.is_set(c).unwrap_or(false))
            .collect(),
        Err(_) => Vec::new(),
    }
}

fn clock_ticks_per_s() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 { t as u64 } else { 100 }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  3524466 218020 795437 1395280 21075 0 144660 98523 0 0\n\
cpu0 1762233 109010 397718 697640 10537 0 72330 49261 0 0\n\
cpu1 1762233 109010 397719 697640 10538 0 72330 49262 0 0\n\
intr 1 2 3\n";

    #[test]
    fn run_delay_is_the_second_field() {
        assert_eq!(parse_run_delay("1419754 2201 17\n"), Some(2201));
        assert_eq!(parse_run_delay("1419754\n"), None);
        assert_eq!(parse_run_delay("x 5 1"), None);
        assert_eq!(parse_run_delay(""), None);
    }

    #[test]
    fn steal_sums_the_allowed_cpus_only() {
        assert_eq!(steal_ticks(STAT, &[0]), Some(49261));
        assert_eq!(steal_ticks(STAT, &[1]), Some(49262));
        assert_eq!(steal_ticks(STAT, &[0, 1]), Some(98523));
        // "cpu" (the total) is not "cpu0"; a CPU that is not listed is unknown.
        assert_eq!(steal_ticks(STAT, &[2]), None);
        assert_eq!(steal_ticks(STAT, &[]), None);
        // A kernel without the steal column.
        assert_eq!(steal_ticks("cpu0 1 2 3 4\n", &[0]), None);
    }

    #[test]
    fn waits_are_differences_in_ns() {
        let a = Snapshot {
            at_ns: 0,
            run_delay_ns: Some(1_000),
            cpus: vec![0, 1],
            steal_ticks: Some(100),
        };
        let b = Snapshot {
            at_ns: 1_000_000_000,
            run_delay_ns: Some(51_000),
            cpus: vec![0, 1],
            steal_ticks: Some(103),
        };
        let w = a.since(&b);
        let tick = 1_000_000_000 / clock_ticks_per_s();
        assert_eq!(w.runq_wait_ns, Some(50_000));
        assert_eq!(w.steal_ns, Some(3 * tick));
        // 3 ticks of 2 CPUs over 1 s.
        assert_eq!(w.over_ns, 1_000_000_000);
        assert_eq!(w.runq_wait_pct(), Some(0.005));
        let pct = w.steal_pct().unwrap();
        assert!(
            (pct - 100.0 * 3.0 * tick as f64 / 2e9).abs() < 1e-9,
            "{pct}"
        );
        // Affinity changed in between: steal unknown, not wrong.
        let c = Snapshot {
            cpus: vec![0],
            ..b.clone()
        };
        assert_eq!(a.since(&c).steal_ns, None);
        // No schedstat: unknown.
        let d = Snapshot {
            run_delay_ns: None,
            ..b
        };
        assert_eq!(a.since(&d).runq_wait_ns, None);
    }

    #[test]
    fn the_calling_thread_has_counters_here() {
        let a = Snapshot::now();
        assert!(!a.cpus.is_empty());
        // Linux with schedstat and a steal column (any VM or bare metal).
        assert!(a.run_delay_ns.is_some(), "{a:?}");
        assert!(a.steal_ticks.is_some(), "{a:?}");
        let w = a.since(&Snapshot::now());
        assert!(w.runq_wait_ns.is_some() && w.steal_ns.is_some());
    }
}
