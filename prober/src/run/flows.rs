//! The flows of a testbed run, legs of one engine session, and what
//! each flow observes and reports.

use std::sync::atomic::AtomicU8;

use anyhow::Result;

use crate::{
    export::CsvWriter,
    model::meta::RunMeta,
    options::RunOptions,
    probe::{self, Endpoints, ProbeConfig, SessionEnds, SessionOutcome, engine::LegOut},
    stats::{observer::SessionObserver, report::FlowSummary},
};

/// The live outputs of each flow towards `dst_ip`: the main flow's
/// (metrics, interval lines, progress, HDR log) and the extra flows'.
pub(super) fn observers<'l>(
    live: &'l mut crate::export::live::Live,
    opts: &RunOptions,
    main_cfg: &ProbeConfig,
    dst_ip: std::net::IpAddr,
    meta: &RunMeta,
) -> Result<(
    crate::export::live::MainObserver<'l>,
    Vec<Box<dyn SessionObserver + Send>>,
)> {
    let target = |cfg: &ProbeConfig| std::net::SocketAddr::new(dst_ip, cfg.port).to_string();
    let flow_observers: Vec<_> = opts
        .extra_flows
        .iter()
        .map(|cfg| live.flow_observer(cfg.flow_labels(&target(cfg)), cfg.kernel_reflector))
        .collect();
    let main_observer = live.main_observer(
        main_cfg.flow_labels(&target(main_cfg)),
        main_cfg.kernel_reflector,
        meta,
    )?;
    Ok((main_observer, flow_observers))
}

/// The flows of a testbed run: the main one (rtprobe or STAMP) and the
/// extra ones (`--flow`), legs of one engine session, each on its own
/// port with its own sockets and sequence space, all writing rows into
/// one CSV.
pub(super) struct Flows<'a> {
    pub ep: &'a Endpoints<'a>,
    pub main_cfg: &'a ProbeConfig,
    pub extra: &'a [ProbeConfig],
    /// The main flow is a STAMP session towards the receiver (no extra
    /// flows then: the options refuse them).
    pub stamp_target: Option<&'a crate::probe::remote::Target>,
}

impl Flows<'_> {
    /// Runs every flow at once. The main flow's outcome first.
    pub(super) fn run(
        &self,
        csv: &std::sync::Mutex<CsvWriter>,
        stop: &AtomicU8,
        main_observer: &mut dyn SessionObserver,
        flow_observers: &mut [Box<dyn SessionObserver + Send>],
    ) -> Result<Vec<SessionOutcome>> {
        if let Some(target) = self.stamp_target {
            let ends = SessionEnds::Remote {
                target,
                from: Some(self.ep.sender_ns),
            };
            let mut sink = csv;
            return probe::run_session(&ends, self.main_cfg, &mut sink, stop, main_observer)
                .map(|o| vec![o]);
        }
        let cfgs: Vec<ProbeConfig> = std::iter::once(self.main_cfg)
            .chain(self.extra)
            .cloned()
            .collect();
        let mut sinks = vec![csv; cfgs.len()];
        let observers = std::iter::once(main_observer).chain(
            flow_observers
                .iter_mut()
                .map(|o| &mut **o as &mut dyn SessionObserver),
        );
        let mut outs: Vec<LegOut<'_>> = sinks
            .iter_mut()
            .zip(observers)
            .map(|(csv, observer)| LegOut { csv, observer })
            .collect();
        probe::run_testbed(self.ep, &cfgs, &mut outs, stop)
    }
}

/// Per flow, its settings and summary; none for a single-flow run.
pub(super) fn flow_summaries(opts: &RunOptions, outcomes: &[SessionOutcome]) -> Vec<FlowSummary> {
    if opts.extra_flows.is_empty() {
        return Vec::new();
    }
    std::iter::once(&opts.probe)
        .chain(&opts.extra_flows)
        .zip(outcomes)
        .map(|(cfg, o)| FlowSummary {
            flow: cfg.flow,
            interval_ns: cfg.interval.as_nanos() as u64,
            port: cfg.port,
            size: cfg.size,
            summary: o.stats.summary(),
            tos: cfg.tos,
        })
        .collect()
}
