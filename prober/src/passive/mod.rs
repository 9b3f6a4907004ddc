//! `rtprobe flows`: the stages of the TCP traffic already on the host,
//! with no probe sent. The sock_ops program ([`crate::ebpf::flows`])
//! samples sends of every TCP socket of a cgroup established after it is
//! attached; this module reads its samples until a stop or the duration,
//! keeps their stage histograms per flow, process and cgroup
//! ([`PassiveStats`]), writes a CSV row per sample, and returns the typed
//! report ([`FlowsReport`]).

use std::{
    collections::{BTreeMap, HashMap},
    path::PathBuf,
    sync::atomic::{AtomicU8, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use xdp_common::flows::FlowCounter;

use crate::{
    ebpf::flows::{FlowsProgram, Sampling},
    export::{
        metrics::{GroupBudget, Metrics},
        passive::SendsCsv,
    },
    model::{host::HostFacts, passive::SampledSend},
    probe::clock,
    stats::passive::{FlowSummary, GroupSummary, PassiveStats, StageSummary},
    sys::SysRef,
};

/// What `rtprobe flows` watches and where its output goes.
#[derive(Debug, Clone)]
pub(crate) struct WatchPlan {
    /// The cgroup v2 directory the program is attached to.
    pub(crate) cgroup: PathBuf,
    /// None: until stopped.
    pub(crate) duration: Option<Duration>,
    /// How often the caller is shown the figures so far (None: never).
    pub(crate) interval: Option<Duration>,
    pub(crate) sampling: Sampling,
    /// Only the flows with this local or remote port.
    pub(crate) port: Option<u16>,
    /// Flows, processes and cgroups itemized at most, each.
    pub(crate) max_groups: usize,
    /// One CSV row per sampled send.
    pub(crate) csv: Option<PathBuf>,
    /// (process name, cgroup) groups with metric series of their own.
    pub(crate) metrics_groups: usize,
}

/// A cgroup's figures, with its directory where it was found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct CgroupSummary {
    /// Its directory under the cgroup v2 root ("/" for the root); the id
    /// where the directory is gone.
    pub(crate) path: String,
    #[serde(flatten)]
    pub(crate) group: GroupSummary,
}

/// The report of one `rtprobe flows` run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct FlowsReport {
    /// The host the figures came from.
    pub(crate) host: HostFacts,
    pub(crate) cgroup: String,
    pub(crate) seconds: f64,
    pub(crate) sample_rate_per_flow: u32,
    pub(crate) max_samples_per_sec: u32,
    pub(crate) port: Option<u16>,
    /// The program's counters (sends seen, sampled, skipped and why,
    /// reported, lost to a full ring buffer, given up, sockets watched).
    pub(crate) counters: BTreeMap<String, u64>,
    /// The whole host's (or the port's) stages.
    pub(crate) all: StageSummary,
    pub(crate) flows: Vec<FlowSummary>,
    /// Flows seen beyond the itemized ones; their sends are in `all`,
    /// `processes` and `cgroups`.
    pub(crate) flows_left_out: usize,
    pub(crate) processes: Vec<GroupSummary>,
    pub(crate) cgroups: Vec<CgroupSummary>,
    /// The run was stopped before its duration.
    pub(crate) interrupted: bool,
}

/// What the caller sees while the run goes on.
pub(crate) trait WatchObserver {
    /// The program is attached: sends are sampled from now on.
    fn on_start(&mut self, plan: &WatchPlan);
    /// Every `interval`: the figures so far.
    fn on_tick(&mut self, stats: &PassiveStats, elapsed: Duration);
}

/// The metric series of a run: the registry, the groups' budget and the
/// cgroup directories found so far.
struct Published<'m> {
    metrics: &'m Metrics,
    budget: GroupBudget,
    cgroups: HashMap<u64, String>,
    root: PathBuf,
    counters: Vec<u64>,
}

impl Published<'_> {
    fn observe(&mut self, s: &SampledSend) {
        let cap = self.budget_cap();
        let dir = match self.cgroups.get(&s.cgroup_id) {
            Some(d) => d.clone(),
            None if self.cgroups.len() < cap => {
                let found = crate::sys::host::cgroup_paths(&self.root, &[s.cgroup_id]);
                let d = found
                    .get(&s.cgroup_id)
                    .cloned()
                    .unwrap_or_else(|| format!("id {}", s.cgroup_id));
                self.cgroups.insert(s.cgroup_id, d.clone());
                d
            }
            None => crate::export::metrics::OTHER.to_string(),
        };
        self.metrics.flows_observe(&mut self.budget, &dir, s);
    }

    fn budget_cap(&self) -> usize {
        self.budget.cap()
    }
}

/// Attaches the program, reads its samples until `stop` or the duration,
/// publishing them to `metrics` (when given), detaches it and reports.
pub(crate) fn watch(
    sys: SysRef,
    plan: &WatchPlan,
    stop: &AtomicU8,
    observer: &mut dyn WatchObserver,
    metrics: Option<&Metrics>,
) -> Result<FlowsReport> {
    let mut prog = FlowsProgram::attach(sys, &plan.cgroup, &plan.sampling)?;
    let mut csv = plan.csv.as_deref().map(SendsCsv::create).transpose()?;
    observer.on_start(plan);
    let offset_ns = clock::realtime_ns() - clock::monotonic_ns();
    let mut stats = PassiveStats::new(plan.max_groups);
    let mut published = metrics.map(|metrics| Published {
        metrics,
        budget: GroupBudget::new(plan.metrics_groups),
        cgroups: HashMap::new(),
        root: plan.cgroup.clone(),
        counters: Vec::new(),
    });
    let start = Instant::now();
    let mut next_tick = plan.interval.map(|i| start + i);
    let mut next_counters = start;
    let mut write_error = None;
    let interrupted = loop {
        if stop.load(Ordering::SeqCst) != 0 {
            break true;
        }
        let elapsed = start.elapsed();
        if plan.duration.is_some_and(|d| elapsed >= d) {
            break false;
        }
        prog.drain(Duration::from_millis(100), &mut |raw| {
            let s = SampledSend::from_raw(raw, offset_ns);
            if plan
                .port
                .is_some_and(|p| s.local.port() != p && s.remote.port() != p)
            {
                return;
            }
            stats.record(&s);
            if let Some(p) = published.as_mut() {
                p.observe(&s);
            }
            if let Some(c) = csv.as_mut()
                && write_error.is_none()
                && let Err(e) = c.write(&s)
            {
                write_error = Some(e);
            }
        })?;
        if let Some(e) = write_error.take() {
            return Err(e);
        }
        if let Some(p) = published.as_mut()
            && Instant::now() >= next_counters
        {
            p.metrics.flows_counters(&mut p.counters, &prog.counters()?);
            next_counters += Duration::from_secs(1);
        }
        if let (Some(t), Some(i)) = (next_tick, plan.interval)
            && Instant::now() >= t
        {
            observer.on_tick(&stats, start.elapsed());
            next_tick = Some(t + i);
        }
    };
    let counters = prog.detach()?;
    if let Some(p) = published.as_mut() {
        p.metrics.flows_counters(&mut p.counters, &counters);
    }
    if let Some(c) = csv {
        c.finish()?;
    }
    Ok(report(
        plan,
        &stats,
        &counters,
        start.elapsed(),
        interrupted,
    ))
}

/// The report of the figures kept.
fn report(
    plan: &WatchPlan,
    stats: &PassiveStats,
    counters: &[u64],
    elapsed: Duration,
    interrupted: bool,
) -> FlowsReport {
    let groups = stats.cgroups();
    let ids: Vec<u64> = groups.iter().filter_map(|g| g.key.parse().ok()).collect();
    let paths = crate::sys::host::cgroup_paths(&plan.cgroup, &ids);
    let cgroups = groups
        .into_iter()
        .map(|g| CgroupSummary {
            path: g
                .key
                .parse()
                .ok()
                .and_then(|id: u64| paths.get(&id).cloned())
                .unwrap_or_else(|| format!("id {}", g.key)),
            group: g,
        })
        .collect();
    FlowsReport {
        host: crate::sys::host::host_facts(),
        cgroup: plan.cgroup.display().to_string(),
        seconds: elapsed.as_secs_f64(),
        sample_rate_per_flow: plan.sampling.per_flow_per_sec,
        max_samples_per_sec: plan.sampling.global_per_sec,
        port: plan.port,
        counters: FlowCounter::ALL
            .iter()
            .zip(counters)
            .map(|(c, &n)| (c.name().to_string(), n))
            .collect(),
        all: stats.all(),
        flows: stats.flows(),
        flows_left_out: stats.flows_left_out(),
        processes: stats.processes(),
        cgroups,
        interrupted,
    }
}

/// The cgroup v2 root, the default place to attach.
pub(crate) fn default_cgroup() -> Result<PathBuf> {
    crate::sys::host::cgroup2_root().context(
        "no cgroup v2 hierarchy is mounted: mount one (mount -t cgroup2 none /sys/fs/cgroup/unified) or give --cgroup",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema file of `rtprobe flows --json`.
    const SCHEMA_FILE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/flows-report.schema.json"
    );

    /// The checked-in schema is what the report's types say (regenerate
    /// with RTPROBE_WRITE_SCHEMA=1, as docs/run-report.schema.json).
    #[test]
    fn checked_in_flows_schema_matches_the_types() {
        let now =
            serde_json::to_string_pretty(&crate::stats::report::closed_schema_of::<FlowsReport>())
                .unwrap()
                + "\n";
        if std::env::var("RTPROBE_WRITE_SCHEMA").is_ok_and(|v| v == "1") {
            std::fs::write(SCHEMA_FILE, &now).unwrap();
            return;
        }
        let file = std::fs::read_to_string(SCHEMA_FILE).unwrap_or_default();
        assert!(
            file == now,
            "{SCHEMA_FILE} differs from FlowsReport's types; if the change is meant, regenerate \
             it with RTPROBE_WRITE_SCHEMA=1 cargo test -p rtprobe --lib \
             checked_in_flows_schema_matches_the_types"
        );
    }

    #[test]
    fn a_kernel_without_the_kfuncs_is_refused_with_the_kernel_it_needs() {
        let e = crate::ebpf::flows::kfunc_ids(&aya::Btf::new()).unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("Linux 6.15 or newer") && e.contains("bpf_sock_ops_enable_tx_tstamp"),
            "{e}"
        );
    }
}
