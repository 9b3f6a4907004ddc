//! `rtprobe flows`' options and their check, into a [`WatchPlan`].

use std::{path::PathBuf, time::Duration};

use crate::{
    ebpf::flows::Sampling,
    options::plan::{SpecError, check_out_path},
    passive::WatchPlan,
};

/// Sampled sends per second of one flow, by default.
pub(crate) const DEFAULT_SAMPLE_RATE: u32 = 10;
/// Sampled sends per second of the host, by default.
pub(crate) const DEFAULT_MAX_SAMPLES: u32 = 2_000;
/// Flows, processes and cgroups itemized at most, by default.
pub(crate) const DEFAULT_MAX_FLOWS: usize = 1_000;

/// `rtprobe flows`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
#[command(
    after_help = "Needs root and Linux 6.15 or newer (BPF TX timestamping of TCP \
    sockets). Watches the TCP sockets of the cgroup given (default: the whole host): those \
    open in rtprobe's network namespace when it starts and any established after, in any \
    namespace; \
    on exit it turns the kernel's callbacks off again on the sockets it turned them on for. Runs until Ctrl-C or SIGTERM (or --duration), then prints the stages per \
    flow, process and cgroup as p50/p99 in µs:\n  \
    stack         sendmsg -> the qdisc (TCP's own time: the send buffer, windows, pacing)\n  \
    queue         the qdisc -> the driver (the sender's queue)\n  \
    nic           the driver -> the NIC's TX stamp (only where the NIC stamps)\n  \
    round trip    the last TX stamp -> the ACK of the last byte (the path both ways and the \
    peer, its delayed ACK included)\n\n\
    Examples:\n  \
    sudo rtprobe flows --duration 10s\n  \
    sudo rtprobe flows --port 5201 --interval 1s --json flows.json\n  \
    sudo rtprobe flows --cgroup /sys/fs/cgroup/system.slice/nginx.service"
)]
pub(crate) struct FlowsArgs {
    /// The cgroup v2 directory whose sockets to watch [default: the cgroup v2 root: the whole
    /// host].
    #[arg(long, value_name = "DIR")]
    pub(crate) cgroup: Option<PathBuf>,

    /// Stop after this long, e.g. 10s [default: until Ctrl-C or SIGTERM].
    #[arg(long, value_parser = crate::model::units::parse_duration)]
    pub(crate) duration: Option<Duration>,

    /// Print the table of the flows so far every this long, e.g. 1s [default: only at the
    /// end].
    #[arg(long, value_parser = crate::model::units::parse_duration)]
    pub(crate) interval: Option<Duration>,

    /// Only the flows with this local or remote port.
    #[arg(long)]
    pub(crate) port: Option<u16>,

    /// Sampled sends per second of one flow, at most (one in flight at a time).
    #[arg(long, value_name = "N/s", default_value_t = DEFAULT_SAMPLE_RATE,
          value_parser = crate::options::remote::parse_rate)]
    pub(crate) sample_rate: u32,

    /// Sampled sends per second of the whole host, at most.
    #[arg(long, value_name = "N/s", default_value_t = DEFAULT_MAX_SAMPLES,
          value_parser = crate::options::remote::parse_rate)]
    pub(crate) max_samples: u32,

    /// Flows (and processes and cgroups) itemized at most; the sends of others still count
    /// in their process's, cgroup's and the host's figures.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_FLOWS)]
    pub(crate) max_flows: usize,

    /// One CSV row per sampled send (`rtprobe plot` draws it).
    #[arg(long, value_name = "FILE", default_value = "flows.csv")]
    pub(crate) out: PathBuf,

    /// Write the report (per flow, process and cgroup, HDR percentiles per stage) as JSON.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,

    /// Serve Prometheus/OpenMetrics metrics at http://ADDR:PORT/metrics while watching: each
    /// stage's histogram and the sampled sends by process name and cgroup, and the program's
    /// counters. Port 0 picks a free one (printed). Anyone who reaches ADDR may scrape.
    #[arg(long, value_name = "ADDR:PORT")]
    pub(crate) metrics_listen: Option<std::net::SocketAddr>,

    /// (process name, cgroup) groups with series of their own (4 histograms and a counter
    /// each); later groups share one `other` group.
    #[arg(long, value_name = "N", default_value_t = 50)]
    pub(crate) metrics_groups: usize,

    /// Rows of the flows' table.
    #[arg(long, value_name = "N", default_value_t = 10)]
    pub(crate) top: usize,

    /// Only the final table (no live tables, no notes).
    #[arg(short, long)]
    pub(crate) quiet: bool,
}

impl FlowsArgs {
    /// The plan, with the cgroup found where none is given.
    pub(crate) fn plan(&self) -> Result<WatchPlan, SpecError> {
        if self.max_flows == 0 {
            return Err(SpecError::new("max-flows", "must be at least 1"));
        }
        if self
            .interval
            .is_some_and(|i| i < Duration::from_millis(100))
        {
            return Err(SpecError::new("interval", "must be at least 100ms"));
        }
        if self.duration.is_some_and(|d| d.is_zero()) {
            return Err(SpecError::new("duration", "must be more than 0"));
        }
        check_out_path(&self.out, "out")?;
        if let Some(j) = &self.json {
            check_out_path(j, "json")?;
        }
        let cgroup = match &self.cgroup {
            Some(c) if !c.is_dir() => {
                return Err(SpecError::new(
                    "cgroup",
                    format!(
                        "{} is not a directory: give a cgroup v2 directory, e.g. /sys/fs/cgroup",
                        c.display()
                    ),
                ));
            }
            Some(c) => c.clone(),
            None => crate::passive::default_cgroup()
                .map_err(|e| SpecError::new("cgroup", format!("{e:#}")))?,
        };
        Ok(WatchPlan {
            cgroup,
            duration: self.duration,
            interval: self.interval,
            sampling: Sampling {
                per_flow_per_sec: self.sample_rate,
                global_per_sec: self.max_samples,
                give_up: Duration::from_secs(2),
            },
            port: self.port,
            max_groups: self.max_flows,
            csv: Some(self.out.clone()),
            metrics_groups: self.metrics_groups,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: FlowsArgs,
    }

    fn parse(args: &[&str]) -> Result<FlowsArgs, String> {
        Cli::try_parse_from(std::iter::once("flows").chain(args.iter().copied()))
            .map(|c| c.args)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_rates_parse() {
        let a = parse(&["--sample-rate", "50/s", "--port", "5201"]).unwrap();
        assert_eq!(
            (a.sample_rate, a.max_samples, a.port),
            (50, DEFAULT_MAX_SAMPLES, Some(5201))
        );
        assert_eq!(a.out, PathBuf::from("flows.csv"));
        assert!(parse(&["--sample-rate", "0"]).is_err());
    }

    #[test]
    fn bad_values_are_refused_with_the_option_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "").unwrap();
        let a = parse(&["--cgroup", file.to_str().unwrap()]).unwrap();
        let e = a.plan().unwrap_err().to_string();
        assert!(e.contains("cgroup") && e.contains("not a directory"), "{e}");
        let a = parse(&["--interval", "10ms", "--cgroup", "/"]).unwrap();
        assert!(a.plan().unwrap_err().to_string().contains("interval"));
        let a = parse(&["--max-flows", "0", "--cgroup", "/"]).unwrap();
        assert!(a.plan().unwrap_err().to_string().contains("max-flows"));
    }
}
