//! What a probe run shows and serves while it runs: interval lines
//! (`--report-every`), the progress bar's figures, the HDR interval log
//! (`--hdr-log`) and the Prometheus metrics (`--metrics-listen`). All of it
//! hangs off the probe session as a [`SessionObserver`], and all of it
//! works from interval histograms and counters: nothing grows with the
//! length of the run.

use std::{
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use anyhow::Result;

use crate::{
    export::{
        hdrlog::{HdrLog, TAG_ONE_WAY, TAG_RTT},
        metrics::{Access, FlowLabels, FlowMetrics, Metrics, MetricsServer},
        plan::ContinuousPlan,
    },
    model::{meta::RunMeta, record::ProbeRecord},
    stats::{
        Counts, RunStats,
        interval::{Interval, IntervalStats, quantiles_words},
        observer::{NoObserver, SessionObserver},
    },
};

/// What the progress bar shows: the run's counts and the latest interval.
pub struct Progress<'a> {
    pub(crate) counts: Counts,
    /// The interval being filled, or the last complete one while the new
    /// one holds few probes.
    pub(crate) interval: &'a Interval,
}

impl Progress<'_> {
    /// "sent 12000  lost 3 (0.03 %)  one-way p50 45.1 µs p99 80.2 µs max 120 µs".
    pub fn message(&self) -> String {
        let c = &self.counts;
        let loss = if c.sent == 0 {
            0.0
        } else {
            100.0 * c.lost as f64 / c.sent as f64
        };
        let (name, h) = self.interval.headline();
        format!(
            "sent {}  lost {} ({loss:.2} %)  {name} {}",
            c.sent,
            c.lost,
            quantiles_words(h)
        )
    }
}

type Print = Box<dyn FnMut(&str) + Send>;
type ShowProgress = Box<dyn FnMut(&Progress<'_>) + Send>;

/// The live outputs of one probe run.
pub struct Live {
    plan: ContinuousPlan,
    metrics: Option<Arc<Metrics>>,
    server: Option<MetricsServer>,
    print: Print,
    progress: ShowProgress,
}

impl Live {
    /// Starts the metrics server if the plan asks for one. `print` takes
    /// the interval lines, `progress` the progress bar's figures (~4x/s).
    pub fn new(plan: &ContinuousPlan, print: Print, progress: ShowProgress) -> Result<Self> {
        let (metrics, server) = match plan.metrics_listen {
            Some(addr) => {
                let access = Access::from_token_file(plan.metrics_token_file.as_deref())?;
                let m = Arc::new(Metrics::with_series(plan.metrics_series.clone()));
                let s = MetricsServer::start(addr, m.clone(), access)?;
                (Some(m), Some(s))
            }
            None => (None, None),
        };
        Ok(Self {
            plan: plan.clone(),
            metrics,
            server,
            print,
            progress,
        })
    }

    /// Where the metrics are served, if they are.
    pub(crate) fn metrics_url(&self) -> Option<String> {
        self.server
            .as_ref()
            .map(|s| format!("http://{}/metrics", s.local_addr()))
    }

    /// The registry, for commands that add metrics of their own.
    pub(crate) fn metrics(&self) -> Option<&Arc<Metrics>> {
        self.metrics.as_ref()
    }

    /// What the run attached (the XDP mode), once it is known.
    pub(crate) fn set_run(&mut self, meta: &RunMeta) {
        if let Some(m) = &self.metrics {
            m.set_xdp_mode(&meta.xdp_mode_requested, &meta.xdp_mode_attached);
        }
    }

    /// The observer of a flow besides the main one: its metrics.
    pub(crate) fn flow_observer(
        &self,
        labels: FlowLabels,
        kernel_reflector: bool,
    ) -> Box<dyn SessionObserver + Send> {
        match &self.metrics {
            Some(m) => Box::new(m.flow(labels, kernel_reflector)),
            None => Box::new(NoObserver),
        }
    }

    /// The main flow's observer: metrics, interval lines, progress, HDR log.
    pub fn main_observer(
        &mut self,
        labels: FlowLabels,
        kernel_reflector: bool,
        meta: &RunMeta,
    ) -> Result<MainObserver<'_>> {
        let hdr = match &self.plan.hdr_log {
            Some(p) => Some(HdrLog::create(
                p,
                SystemTime::now(),
                &format!(
                    "rtprobe {} {}: size {} B, interval {} ns, tos {}, xdp {}",
                    meta.version,
                    labels.target,
                    labels.size,
                    meta.interval_ns,
                    labels.tos,
                    meta.xdp_mode_attached
                ),
            )?),
            None => None,
        };
        let metrics = self
            .metrics
            .as_ref()
            .map(|m| m.flow(labels, kernel_reflector));
        Ok(MainObserver {
            intervals: IntervalStats::new(self.plan.interval()),
            lines: self.plan.report_every.is_some(),
            hdr_base_ns: now_ns(),
            hdr,
            metrics,
            error: None,
            print: &mut self.print,
            progress: &mut self.progress,
            trimmed_at: Instant::now(),
        })
    }
}

/// How often a run hands the allocator's free memory back to the kernel.
const TRIM_EVERY: Duration = Duration::from_secs(10);

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// The main flow's observer (see [`Live::main_observer`]).
pub struct MainObserver<'a> {
    intervals: IntervalStats,
    lines: bool,
    hdr: Option<HdrLog>,
    /// The HDR log's BaseTime, CLOCK_REALTIME ns.
    hdr_base_ns: i64,
    metrics: Option<FlowMetrics>,
    /// The first output that failed.
    error: Option<String>,
    print: &'a mut Print,
    progress: &'a mut ShowProgress,
    /// When the heap was last trimmed ([`crate::heap::trim`]).
    trimmed_at: Instant,
}

/// Writes a complete interval to the outputs that take intervals.
fn interval_done(
    i: &Interval,
    lines: bool,
    print: &mut Print,
    hdr: &mut Option<HdrLog>,
    hdr_base_ns: i64,
    error: &mut Option<String>,
) {
    if lines {
        print(&i.line());
    }
    if let Some(log) = hdr {
        let start = Duration::from_nanos(i.start_ns.saturating_sub(hdr_base_ns).max(0) as u64);
        let len = Duration::from_nanos(i.len_ns as u64);
        let r = log
            .write(TAG_ONE_WAY, start, len, &i.one_way)
            .and_then(|()| log.write(TAG_RTT, start, len, &i.rtt));
        if let Err(e) = r {
            error.get_or_insert(format!("{e:#}"));
            // No more writes to a log that failed.
            *hdr = None;
        }
    }
}

impl SessionObserver for MainObserver<'_> {
    fn on_record(&mut self, r: &ProbeRecord) {
        let Self {
            intervals,
            lines,
            hdr,
            hdr_base_ns,
            error,
            print,
            metrics,
            ..
        } = self;
        intervals.on_record(r, |i| {
            interval_done(i, *lines, print, hdr, *hdr_base_ns, error)
        });
        if let Some(m) = metrics {
            m.observe(r);
        }
    }

    fn on_loss_directions(&mut self, d: &crate::stats::observer::LossDirections) {
        if let Some(m) = &mut self.metrics {
            m.on_loss_directions(d);
        }
    }

    fn on_tick(&mut self, stats: &RunStats, last: bool) -> Result<(), String> {
        if let Some(m) = &mut self.metrics {
            m.update(&stats.counts(), stats.timestamp_source());
        }
        if last {
            let Self {
                intervals,
                lines,
                hdr,
                hdr_base_ns,
                error,
                print,
                ..
            } = self;
            intervals.finish(|i| interval_done(i, *lines, print, hdr, *hdr_base_ns, error));
            if let Some(log) = self.hdr.take()
                && let Err(e) = log.finish()
            {
                self.error.get_or_insert(format!("{e:#}"));
            }
        }
        (self.progress)(&Progress {
            counts: stats.counts(),
            interval: self.intervals.display(),
        });
        if self.trimmed_at.elapsed() >= TRIM_EVERY {
            crate::heap::trim();
            self.trimmed_at = Instant::now();
        }
        // Reported once: the failed output is closed by now.
        match self.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::export::plan::ContinuousPlan;

    /// The main flow of 64-byte probes, TOS 0xc0.
    fn labels() -> FlowLabels {
        FlowLabels::new("10.0.0.2:5061", 0, 0xc0, 64)
    }

    #[test]
    fn the_main_observer_feeds_lines_progress_hdr_log_and_metrics() {
        let dir = tempfile::tempdir().unwrap();
        let hlog = dir.path().join("x.hlog");
        let plan = ContinuousPlan {
            report_every: Some(Duration::from_millis(100)),
            hdr_log: Some(hlog.clone()),
            metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
            ..Default::default()
        };
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let shown = Arc::new(Mutex::new(Vec::<String>::new()));
        let (l, s) = (lines.clone(), shown.clone());
        let mut live = Live::new(
            &plan,
            Box::new(move |line| l.lock().unwrap().push(line.to_string())),
            Box::new(move |p| s.lock().unwrap().push(p.message())),
        )
        .unwrap();
        assert!(live.metrics_url().unwrap().starts_with("http://127.0.0.1:"));
        let meta = RunMeta {
            xdp_mode_requested: "auto".into(),
            xdp_mode_attached: "native".into(),
            ..Default::default()
        };
        live.set_run(&meta);
        let mut stats = RunStats::new();
        {
            let mut obs = live.main_observer(labels(), false, &meta).unwrap();
            // 350 probes 1 ms apart: three whole 100 ms intervals and a half.
            for seq in 0..350u64 {
                let r = ProbeRecord {
                    seq,
                    sched_ns: 1_000_000_000 + seq as i64 * 1_000_000,
                    one_way_ns: (seq % 50 != 7).then_some(20_000 + seq as i64),
                    rtt_ns: (seq % 50 != 7).then_some(40_000),
                    lost: seq % 50 == 7,
                    ..Default::default()
                };
                stats.on_record(&r);
                obs.on_record(&r);
                if seq == 200 {
                    obs.on_tick(&stats, false).unwrap();
                }
            }
            obs.on_tick(&stats, true).unwrap();
        }
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert!(
            lines[0].contains("sent     100  lost     2 ( 2.00 %)"),
            "{}",
            lines[0]
        );
        assert!(lines[3].contains("sent      50"), "{}", lines[3]);
        let shown = shown.lock().unwrap();
        assert_eq!(shown.len(), 2);
        assert!(
            shown[0].starts_with("sent 201  lost 4 (1.99 %)  one-way p50 20."),
            "{}",
            shown[0]
        );
        let bytes = std::fs::read(&hlog).unwrap();
        let n = hdrhistogram::serialization::interval_log::IntervalLogIterator::new(&bytes)
            .filter(|e| {
                matches!(
                    e,
                    Ok(hdrhistogram::serialization::interval_log::LogEntry::Interval(_))
                )
            })
            .count();
        assert_eq!(n, 8, "one-way and rtt for each of the 4 intervals");
        let text = live.metrics().unwrap().openmetrics();
        assert!(text.contains("rtprobe_one_way_seconds_count{target=\"10.0.0.2:5061\",flow=\"0\",tos=\"0xc0\",size=\"64\"} 343"), "{text}");
        assert!(text.contains("rtprobe_probes_sent_total{target=\"10.0.0.2:5061\",flow=\"0\",tos=\"0xc0\",size=\"64\"} 350"));
        assert!(text.contains("rtprobe_xdp_mode_info{requested=\"auto\",attached=\"native\"} 1"));
    }
}
