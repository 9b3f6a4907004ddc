//! The sessions of a testbed run, one per flow, and what each flow
//! observes and reports.

use std::sync::atomic::{AtomicU8, Ordering};

use anyhow::Result;

use crate::{
    export::CsvWriter,
    model::meta::RunMeta,
    options::RunOptions,
    probe::{self, Endpoints, ProbeConfig, SessionEnds, SessionOutcome},
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

/// The sessions of a testbed run: the main flow (rtprobe or STAMP) and
/// the extra flows (`--flow`), each its own session (sockets, reflector,
/// matcher) on its own port, all writing rows into one CSV.
pub(super) struct Flows<'a> {
    pub ep: &'a Endpoints<'a>,
    pub main_cfg: &'a ProbeConfig,
    pub extra: &'a [ProbeConfig],
    /// The main flow is a STAMP session towards the receiver.
    pub stamp_target: Option<&'a crate::probe::remote::Target>,
}

impl Flows<'_> {
    /// Runs every flow at once, each in its own thread but the main one;
    /// a flow that fails stops the others. The main flow's outcome first.
    pub(super) fn run(
        &self,
        csv: &std::sync::Mutex<CsvWriter>,
        stop: &AtomicU8,
        main_observer: &mut dyn SessionObserver,
        flow_observers: &mut [Box<dyn SessionObserver + Send>],
    ) -> Result<Vec<SessionOutcome>> {
        let session = |ends: &SessionEnds<'_>, cfg, observer: &mut dyn SessionObserver| {
            let mut sink = csv;
            let r = probe::run_session(ends, cfg, &mut sink, stop, observer);
            if r.is_err() {
                stop.fetch_max(probe::STOP_NOW, Ordering::SeqCst);
            }
            r
        };
        let testbed = SessionEnds::Testbed(self.ep);
        let main_ends = match self.stamp_target {
            Some(target) => SessionEnds::Remote {
                target,
                from: Some(self.ep.sender_ns),
            },
            None => SessionEnds::Testbed(self.ep),
        };
        std::thread::scope(|s| {
            let others: Vec<_> = self
                .extra
                .iter()
                .zip(flow_observers.iter_mut())
                .map(|(cfg, observer)| {
                    let (session, testbed) = (&session, &testbed);
                    s.spawn(move || session(testbed, cfg, &mut **observer))
                })
                .collect();
            let main = session(&main_ends, self.main_cfg, main_observer);
            // Every thread joined before the first error is returned: a
            // flow that panicked is then an error, not the scope's panic.
            let all: Vec<_> = std::iter::once(main)
                .chain(others.into_iter().map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a probe flow thread panicked")))
                }))
                .collect();
            all.into_iter().collect()
        })
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
