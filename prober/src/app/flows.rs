//! `rtprobe flows`: watches the host's TCP sends until Ctrl-C (or
//! `--duration`), then prints their stages per flow, process and cgroup.

use std::{process::ExitCode, sync::Arc, time::Duration};

use anyhow::{Result, anyhow};

use crate::{
    export::{
        metrics::{Access, Metrics, MetricsServer},
        passive::{flows_table, groups_table},
    },
    options::passive::FlowsArgs,
    passive::{FlowsReport, WatchObserver},
    signals::with_signals,
    stats::passive::{GroupSummary, PassiveStats},
};

pub(super) fn command(args: &FlowsArgs) -> Result<ExitCode> {
    let plan = args.plan().map_err(|e| anyhow!(e.for_cli()))?;
    let (quiet, top) = (args.quiet, args.top);
    let metrics = args
        .metrics_listen
        .map(|addr| {
            let m = Arc::new(Metrics::for_flows());
            MetricsServer::start(addr, m.clone(), Access::open()).map(|s| (m, s))
        })
        .transpose()?;
    if let Some((_, server)) = &metrics {
        err_line(format_args!(
            "rtprobe flows: metrics at http://{}/metrics",
            server.local_addr()
        ));
    }
    let published = metrics.as_ref().map(|(m, _)| m.clone());
    let report = with_signals(quiet, move |stop| {
        let mut live = Live { quiet, top };
        let sys = crate::sys::linux();
        crate::passive::watch(sys, &plan, &stop, &mut live, published.as_deref())
    })?;
    out_line(format_args!("{}", final_text(&report, top).trim_end()));
    if let Some(j) = &args.json {
        crate::export::json::write_value(j, &report)?;
    }
    if !quiet {
        for n in notes(&report) {
            err_line(format_args!("note: {n}"));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the flows' table every `--interval`.
struct Live {
    quiet: bool,
    top: usize,
}

impl WatchObserver for Live {
    fn on_start(&mut self, plan: &crate::passive::WatchPlan) {
        if self.quiet {
            return;
        }
        err_line(format_args!(
            "rtprobe flows: watching the TCP sockets of {} (those open in this network \
             namespace now, and any established from now on; at most {}/s per flow, {}/s in \
             all); Ctrl-C to stop",
            plan.cgroup.display(),
            plan.sampling.per_flow_per_sec,
            plan.sampling.global_per_sec
        ));
    }

    fn on_tick(&mut self, stats: &PassiveStats, elapsed: Duration) {
        if self.quiet {
            return;
        }
        out_line(format_args!(
            "--- {:.0} s: {} samples\n{}",
            elapsed.as_secs_f64(),
            stats.all().samples,
            flows_table(&stats.flows(), &stats.all(), self.top)
        ));
    }
}

/// The tables at the end: flows, processes, cgroups.
fn final_text(r: &FlowsReport, top: usize) -> String {
    let mut t = flows_table(&r.flows, &r.all, top);
    if r.flows_left_out > 0 {
        t += &format!(
            "({} more flows not itemized: --max-flows; their sends are in \"all\")\n",
            r.flows_left_out
        );
    }
    t += "\n";
    t += &groups_table("process", &r.processes, top);
    let cgroups: Vec<GroupSummary> = r
        .cgroups
        .iter()
        .map(|c| GroupSummary {
            key: c.path.clone(),
            stages: c.group.stages.clone(),
        })
        .collect();
    t += "\n";
    t += &groups_table("cgroup", &cgroups, top);
    t
}

/// What the figures do not show by themselves.
fn notes(r: &FlowsReport) -> Vec<String> {
    let c = |k: &str| r.counters.get(k).copied().unwrap_or(0);
    let mut n = Vec::new();
    if r.all.samples == 0 {
        n.push(
            "no send was sampled: no TCP socket of the cgroup sent data (sockets open at the \
             start in other network namespaces are watched only once they reconnect)"
                .to_string(),
        );
    }
    if c("ring_full") > 0 {
        n.push(format!(
            "{} samples were lost: the ring buffer was full (rtprobe fell behind); lower \
             --max-samples",
            c("ring_full")
        ));
    }
    if r.all.given_up > 0 {
        n.push(format!(
            "{} sampled sends got no ACK within 2 s and were given up",
            r.all.given_up
        ));
    }
    if r.all.samples > 0 && r.all.nic.count == 0 {
        n.push("no NIC stage: the NICs on these paths do not timestamp in hardware".into());
    }
    n.push(
        "the round trip runs to the ACK of the sampled bytes: a peer's delayed ACK (up to \
         40 ms on Linux) is in it"
            .into(),
    );
    n
}

/// A line on stderr; a closed stderr (e.g. `2>&1 | head`) is not an error
/// of the run.
fn err_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{args}");
}

/// A line on stdout; a closed stdout is not an error of the run.
fn out_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{args}");
}
