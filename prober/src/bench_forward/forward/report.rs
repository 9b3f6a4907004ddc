//! What `bench-forward` reports: each step's figures, what limited it, and
//! the machine the bench ran on.

use serde::Serialize;

use crate::{
    bench_forward::{
        bounce::BounceStep,
        cpu::CoreUse,
        kinds::{ForwardMode, Generator, Sink},
        perf::PerfFigures,
    },
    model::host::HostFacts,
    stats::{Summary, XdpCounters},
};

/// What stopped the forwarded rate from going higher in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Limit {
    /// The hop dropped part of what it was offered: it was the bottleneck.
    Router,
    /// Flat out and nothing dropped: the generator could not offer more.
    Generator,
    /// A paced step the hop carried in full: no limit reached.
    None,
}

impl Limit {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Limit::Router => "router",
            Limit::Generator => "generator",
            Limit::None => "-",
        }
    }
}

/// Drops above this share of what was generated mean the hop is the limit
/// (below it: packets still in flight when the counters were read, and
/// the odd neighbour-resolution drop).
pub(super) const ROUTER_LIMIT_DROP_PCT: f64 = 1.0;

/// Names the limit of a step from what was generated and forwarded. Pure.
pub(super) fn classify(load_pct: u32, generated: u64, forwarded: u64) -> Limit {
    if generated == 0 {
        return Limit::None;
    }
    let drop_pct = 100.0 * generated.saturating_sub(forwarded) as f64 / generated as f64;
    if drop_pct > ROUTER_LIMIT_DROP_PCT {
        Limit::Router
    } else if load_pct >= 100 {
        Limit::Generator
    } else {
        Limit::None
    }
}

/// Probe figures of one step.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct ProbeFigures {
    pub(crate) sent: u64,
    pub(crate) lost: u64,
    pub(crate) rtt_p50_ns: Option<u64>,
    pub(crate) rtt_p99_ns: Option<u64>,
    /// RTT of the path without the reflector's user-space turnaround.
    pub(crate) rtt_net_p50_ns: Option<u64>,
    pub(crate) rtt_net_p99_ns: Option<u64>,
    pub(crate) one_way_p50_ns: Option<u64>,
    pub(crate) one_way_p99_ns: Option<u64>,
}

impl ProbeFigures {
    pub(super) fn from_summary(s: &Summary) -> Self {
        Self {
            sent: s.sent,
            lost: s.lost,
            rtt_p50_ns: s.rtt_ns.p50,
            rtt_p99_ns: s.rtt_ns.p99,
            rtt_net_p50_ns: s.rtt_net_ns.p50,
            rtt_net_p99_ns: s.rtt_net_ns.p99,
            one_way_p50_ns: s.one_way_ns.p50,
            one_way_p99_ns: s.one_way_ns.p99,
        }
    }
}

/// One measured step.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StepResult {
    pub(crate) mode: ForwardMode,
    /// Memory accesses per packet of the router's work variant (None: the router itself).
    pub(crate) work: Option<u32>,
    pub(crate) xdp_mode_attached: String,
    pub(crate) generator: Generator,
    pub(crate) size: usize,
    pub(crate) load_pct: u32,
    pub(crate) offered_pps: Option<f64>,
    pub(crate) generated: u64,
    pub(crate) forwarded: u64,
    pub(crate) secs: f64,
    pub(crate) generated_pps: f64,
    pub(crate) forwarded_pps: f64,
    pub(crate) drop_pct: f64,
    /// XDP generator: program runs per second (it keeps a share); socket: datagrams sent.
    pub(crate) generator_runs_pps: f64,
    /// CPU the generator threads used, in percent of one core.
    pub(crate) generator_cpu_pct: f64,
    /// CPU the router's NAPI thread used, in percent of one core (threaded NAPI only;
    /// the receiver's softirq work is not in it).
    pub(crate) router_cpu_pct: Option<f64>,
    pub(crate) cores: Vec<CoreUse>,
    pub(crate) probe: ProbeFigures,
    /// Router XDP counters during the step (empty without XDP).
    pub(crate) xdp_counters: XdpCounters,
    /// Interface counters during the step, for finding where drops happened.
    pub(crate) router_in_rx_dropped: u64,
    pub(crate) limit: Limit,
    /// `perf stat` of the router's threads (flat-out steps with --perf-stat).
    pub(crate) perf: Option<PerfFigures>,
}

/// Everything `bench-forward` measured, with the machine it ran on.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ForwardReport {
    pub(crate) machine: Machine,
    /// Ids of the testbeds built (one per mode); all removed at the end.
    pub(crate) testbed_ids: Vec<String>,
    pub(crate) sink: Sink,
    pub(crate) threaded_napi: bool,
    pub(crate) rt_priority: Option<u8>,
    pub(crate) steps: Vec<StepResult>,
    /// The bounce device's steps (--bounce), per hook and queue count.
    pub(crate) bounce: Vec<BounceStep>,
    /// Why the perf figures are missing, when they are.
    pub(crate) perf_note: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Machine {
    pub(crate) cpus: usize,
    pub(crate) cpu_model: String,
    pub(crate) kernel: String,
    /// 1-minute load average when the bench started: other work on the
    /// machine shares the cores with the router under test.
    pub(crate) loadavg_at_start: f64,
    /// Everything a probe run's summary says of its host (the three
    /// fields above come from it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) host: Option<HostFacts>,
}

impl Machine {
    pub(crate) fn describe() -> Self {
        let host = crate::sys::host::host_facts();
        let loadavg_at_start = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
            .unwrap_or(0.0);
        Self {
            cpus: host.cores.map_or_else(
                || std::thread::available_parallelism().map_or(1, |n| n.get()),
                |c| c as usize,
            ),
            cpu_model: host.cpu_model.clone().unwrap_or_else(|| "unknown".into()),
            kernel: host.kernel.clone(),
            loadavg_at_start,
            host: Some(host),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_classification() {
        assert_eq!(classify(100, 1_000_000, 1_000_000), Limit::Generator);
        assert_eq!(classify(100, 1_000_000, 995_000), Limit::Generator);
        assert_eq!(classify(100, 1_000_000, 900_000), Limit::Router);
        assert_eq!(classify(50, 500_000, 400_000), Limit::Router);
        assert_eq!(classify(50, 500_000, 500_000), Limit::None);
        assert_eq!(classify(0, 0, 0), Limit::None);
    }
}
