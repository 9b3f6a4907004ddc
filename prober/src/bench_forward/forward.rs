//! `rtprobe bench-forward`: how many packets per second the router hop of
//! the veth testbed forwards, with kernel forwarding and with rtprobe's XDP
//! router in each mode, what it costs in CPU per core, and what the probe
//! latency does at the same time as the load rises.
//!
//! For every mode a fresh testbed is built; GRO is switched on on the
//! router's ingress veth and on the receiver's veth (a veth only takes
//! redirected XDP frames when it runs NAPI, and this keeps the receive
//! path the same in every mode), and the ingress NAPI runs in a kernel
//! thread of its own (threaded NAPI) so the scheduler can put the router
//! on another core than the generator. Then for every packet size the
//! generator runs flat out once (the 100 % step, which calibrates the
//! others), and each lower step offers that percentage of what the hop
//! forwarded flat out, while a probe session measures RTT and one-way
//! delay across the hop: latency as the load approaches the hop's capacity.
//!
//! Where the numbers come from: generated = what the generator handed to
//! the kernel; forwarded = packets received on the receiver's veth
//! (rtnetlink IFLA_STATS64) minus the probes; CPU per core = /proc/stat.
//! Kernel interfaces: those of `loadgen`, `links`, `cpu`, `testbed`, `ebpf`.
//!
//! This file runs the plan mode by mode; `bed` builds a mode's testbed,
//! `step` measures one step on it, `report` holds the figures and `text`
//! prints them.

mod bed;
mod report;
mod step;
mod text;

use std::{
    sync::atomic::{AtomicU8, Ordering},
    time::Duration,
};

use anyhow::{Context, Result, bail};

pub(crate) use super::plan::Plan;
use super::{
    bounce::BounceStep,
    perf::{self, PerfFigures},
};
use crate::{probe::STOP_NOW, sys::SysRef};
use bed::{ModeBed, testbed_for};
pub(crate) use report::{ForwardReport, Machine, StepResult};
use step::{FullSpeed, run_probe, run_step};
pub(crate) use text::{format_report, format_step, table_header, variant_label};

/// Port the load is sent to (discard): no socket listens there, so the
/// receiver drops it right after the UDP lookup.
const SINK_PORT: u16 = 9;
const PROBE_PORT: u16 = 5061;

fn check_stop(stop: &AtomicU8) -> Result<()> {
    if stop.load(Ordering::SeqCst) != 0 {
        bail!("interrupted; the testbed was removed");
    }
    Ok(())
}

/// Runs the whole plan. `progress` gets each step as it finishes.
pub(crate) fn run(
    plan: &Plan,
    sys: SysRef,
    stop: &AtomicU8,
    mut progress: impl FnMut(&StepResult),
    mut bounce_progress: impl FnMut(&BounceStep),
) -> Result<ForwardReport> {
    crate::testbed::require_root()?;
    let machine = Machine::describe();
    let mut steps = Vec::new();
    let mut testbed_ids = Vec::new();
    for &variant in &plan.variants {
        check_stop(stop)?;
        let bed = testbed_for(sys.clone(), variant, plan).with_context(|| {
            format!(
                "preparing the testbed for {}",
                variant_label(variant.mode, variant.work)
            )
        })?;
        testbed_ids.push(bed.tb.id.clone());
        // Resolve neighbours on every hop before any load.
        run_probe(&bed.tb, plan, Duration::from_millis(50), "prime.csv", stop)?;
        for &size in &plan.sizes {
            // Flat out first: it calibrates the paced steps.
            let flat_out = run_step(&bed, plan, variant, size, 100, None, stop)?;
            let full = FullSpeed {
                generator_pps: flat_out.generator_runs_pps,
                forwarded_pps: flat_out.forwarded_pps,
            };
            let mut results = Vec::new();
            for &load in plan.loads.iter().filter(|&&l| l < 100) {
                check_stop(stop)?;
                let r = run_step(&bed, plan, variant, size, load, Some(full), stop)?;
                progress(&r);
                results.push(r);
            }
            if plan.loads.contains(&100) {
                progress(&flat_out);
                results.push(flat_out);
            }
            steps.extend(results);
        }
        let ModeBed {
            _sink,
            work,
            tb,
            xdp,
            ..
        } = bed;
        drop(_sink);
        drop(work);
        xdp.detach().context("detach the XDP router")?;
        tb.teardown()?;
    }
    let mut bounce = Vec::new();
    if !plan.bounce.is_empty() {
        bounce = super::bounce::run(plan, &sys, stop, &mut bounce_progress)?;
    }
    if stop.load(Ordering::SeqCst) >= STOP_NOW {
        bail!("interrupted");
    }
    let perf_note = plan.perf_stat.then(|| perf_note(&steps, &bounce)).flatten();
    Ok(ForwardReport {
        machine,
        testbed_ids,
        sink: plan.sink,
        threaded_napi: plan.threaded_napi,
        rt_priority: plan.rt_priority,
        steps,
        bounce,
        perf_note,
    })
}

/// Why IPC and the miss rates are missing, if they are: perf is not
/// there, or it counted no hardware event (a VM without a virtual PMU).
fn perf_note(steps: &[StepResult], bounce: &[BounceStep]) -> Option<String> {
    if let Err(why) = perf::available() {
        return Some(format!("perf stat skipped: {why}"));
    }
    let counted: Vec<&PerfFigures> = steps
        .iter()
        .filter_map(|s| s.perf.as_ref())
        .chain(bounce.iter().filter_map(|b| b.perf.as_ref()))
        .collect();
    if !counted.is_empty() && counted.iter().all(|p| !p.has_hardware_counters()) {
        return Some(
            "perf stat ran, but this machine counts no hardware event (cycles, instructions, \
             branches, L1 misses show <not supported>: no PMU in this VM), so IPC and the \
             miss rates are unknown; only task-clock was counted"
                .into(),
        );
    }
    None
}
