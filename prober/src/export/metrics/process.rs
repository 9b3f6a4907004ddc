//! The `process_*` metrics every Prometheus client library exports (CPU
//! seconds, resident and virtual memory, open and allowed file
//! descriptors, start time, threads), read from procfs at each render:
//! `/proc/self/stat`, `/proc/self/fd`, `/proc/stat` (`btime`) and
//! getrlimit(RLIMIT_NOFILE). Any Linux kernel; a field that cannot be read
//! (procfs hidden) is left out of the exposition rather than shown as 0.

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Unit,
};

/// Collects the process metrics at each render (see the module docs).
#[derive(Debug, Default)]
pub(super) struct ProcessCollector;

/// One reading of the process, each figure None where procfs did not say.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct ProcessFigures {
    pub(super) cpu_seconds: Option<f64>,
    pub(super) resident_bytes: Option<f64>,
    pub(super) virtual_bytes: Option<f64>,
    pub(super) start_time_seconds: Option<f64>,
    pub(super) threads: Option<f64>,
    pub(super) open_fds: Option<f64>,
    pub(super) max_fds: Option<f64>,
}

impl ProcessFigures {
    /// This process, now.
    pub(super) fn read() -> Self {
        // SAFETY: sysconf has no preconditions.
        let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        // SAFETY: as above.
        let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let boot_s = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| boot_time_s(&s));
        let mut f = from_stat(&stat, ticks_per_s, page_bytes, boot_s);
        f.open_fds = std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as f64);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct it is given.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
            f.max_fds = Some(lim.rlim_cur as f64);
        }
        f
    }
}

/// `btime` of /proc/stat: the boot time, seconds since the epoch.
fn boot_time_s(proc_stat: &str) -> Option<f64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The figures in /proc/self/stat (proc(5)): after the command name in
/// parentheses (which may hold spaces and parentheses itself), field 14
/// utime and 15 stime in clock ticks, 20 num_threads, 22 starttime in
/// ticks since boot, 23 vsize in bytes, 24 rss in pages.
fn from_stat(stat: &str, ticks_per_s: f64, page_bytes: f64, boot_s: Option<f64>) -> ProcessFigures {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return ProcessFigures::default();
    };
    // rest starts with field 3 (state).
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
    let cpu = match (field(14), field(15)) {
        (Some(u), Some(s)) if ticks_per_s > 0.0 => Some((u + s) / ticks_per_s),
        _ => None,
    };
    let start = match (field(22), boot_s) {
        (Some(t), Some(b)) if ticks_per_s > 0.0 => Some(b + t / ticks_per_s),
        _ => None,
    };
    ProcessFigures {
        cpu_seconds: cpu,
        resident_bytes: field(24).map(|p| p * page_bytes),
        virtual_bytes: field(23),
        start_time_seconds: start,
        threads: field(20),
        open_fds: None,
        max_fds: None,
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let f = ProcessFigures::read();
        // Names without their unit: the encoder adds it (and OpenMetrics'
        // `# UNIT`), as client libraries name these.
        if let Some(v) = f.cpu_seconds {
            let c = ConstCounter::new(v);
            c.encode(encoder.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds",
                Some(&Unit::Seconds),
                c.metric_type(),
            )?)?;
        }
        let gauges = [
            (
                "process_resident_memory",
                "Resident memory size in bytes",
                Some(Unit::Bytes),
                f.resident_bytes,
            ),
            (
                "process_virtual_memory",
                "Virtual memory size in bytes",
                Some(Unit::Bytes),
                f.virtual_bytes,
            ),
            (
                "process_start_time",
                "Start time of the process since unix epoch in seconds",
                Some(Unit::Seconds),
                f.start_time_seconds,
            ),
            (
                "process_threads",
                "Number of OS threads in the process",
                None,
                f.threads,
            ),
            (
                "process_open_fds",
                "Number of open file descriptors",
                None,
                f.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors (the soft limit)",
                None,
                f.max_fds,
            ),
        ];
        for (name, help, unit, value) in gauges {
            if let Some(v) = value {
                let g = ConstGauge::new(v);
                g.encode(encoder.encode_descriptor(name, help, unit.as_ref(), g.metric_type())?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_fields_are_read_past_a_command_with_spaces_and_parentheses() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
        // majflt cmajflt utime stime cutime cstime priority nice threads
        // itrealvalue starttime vsize rss ...
        let stat = "4242 (rt probe (x)) S 1 4242 4242 0 -1 4194560 500 0 0 0 \
                    250 50 0 0 20 0 7 0 1000 123456789 2048 18446744073709551615";
        let f = from_stat(stat, 100.0, 4096.0, Some(1_700_000_000.0));
        assert_eq!(f.cpu_seconds, Some(3.0));
        assert_eq!(f.threads, Some(7.0));
        assert_eq!(f.start_time_seconds, Some(1_700_000_010.0));
        assert_eq!(f.virtual_bytes, Some(123_456_789.0));
        assert_eq!(f.resident_bytes, Some(2048.0 * 4096.0));
        assert_eq!(
            from_stat("garbage", 100.0, 4096.0, None),
            ProcessFigures::default()
        );
        assert_eq!(boot_time_s("cpu 1 2\nbtime 1700000000\n"), Some(1.7e9));
    }

    #[test]
    fn this_process_is_read() {
        let f = ProcessFigures::read();
        assert!(f.cpu_seconds.is_some_and(|s| s >= 0.0), "{f:?}");
        assert!(f.resident_bytes.is_some_and(|b| b > 1e5), "{f:?}");
        assert!(f.open_fds.is_some_and(|n| n >= 3.0), "{f:?}");
        assert!(f.max_fds.is_some_and(|n| n >= f.open_fds.unwrap()), "{f:?}");
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = f.start_time_seconds.expect("start time");
        assert!(
            started <= now_s + 1.0 && started > now_s - 86_400.0 * 365.0,
            "{f:?}"
        );
    }
}
