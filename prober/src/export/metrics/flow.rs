//! [`FlowMetrics`]: the handles of one probe flow's series, fed every
//! finalized record and the running counts.

use std::sync::{Arc, OnceLock};

use prometheus_client::metrics::{counter::Counter, histogram::Histogram};

use super::{
    labels::{FlowLabels, LostLabels, SourceLabels, StageLabels},
    registry::Metrics,
};
use crate::{
    model::record::ProbeRecord,
    stats::{
        Counts, RunStats,
        chain::Stage,
        observer::{LossDirections, SessionObserver},
    },
};

impl Metrics {
    /// The handles of one probe flow's metrics. The RTT histogram and the
    /// counters exist from the start; the one-way and stage histograms
    /// once the flow measures them (a `--target` run has no one-way delay
    /// and only the stages its stamps cover), so a target costs only the
    /// series it can fill.
    pub fn flow(self: &Arc<Self>, labels: FlowLabels, kernel_reflector: bool) -> FlowMetrics {
        let lost_labels = |direction: &str| LostLabels {
            flow: labels.clone(),
            direction: direction.into(),
        };
        let (forward, back) = if kernel_reflector {
            ("unknown", None)
        } else {
            ("forward", Some("return"))
        };
        // One statement per handle: get_or_create holds the family's read
        // lock until the end of the statement, and creating a second label
        // set of the same family in that statement would wait for it forever.
        let lost = self.lost.get_or_create(&lost_labels(forward)).clone();
        let echo_lost = back.map(|d| self.lost.get_or_create(&lost_labels(d)).clone());
        let rtt = self
            .series
            .rtt
            .then(|| self.rtt.get_or_create(&labels).clone());
        FlowMetrics {
            metrics: self.clone(),
            one_way: OnceLock::new(),
            rtt,
            stages: Default::default(),
            sent: self.sent.get_or_create(&labels).clone(),
            received: self.received.get_or_create(&labels).clone(),
            lost,
            echo_lost,
            reordered: self.reordered.get_or_create(&labels).clone(),
            duplicates: self.duplicates.get_or_create(&labels).clone(),
            foreign: self.foreign.get_or_create(&labels).clone(),
            never_sent: self.never_sent.get_or_create(&labels).clone(),
            late_echoes: self.late_echoes.get_or_create(&labels).clone(),
            unaccounted: self.unaccounted.get_or_create(&labels).clone(),
            labels,
            told: None,
            told_counted: LossDirections::default(),
            unknown: OnceLock::new(),
            counted: Counts::default(),
            source: String::new(),
        }
    }
}

/// One probe flow's metrics: give it every finalized record and the
/// running counts (it is a [`SessionObserver`]).
pub struct FlowMetrics {
    metrics: Arc<Metrics>,
    labels: FlowLabels,
    /// Created by the first one-way figure (if the series has one-way).
    one_way: OnceLock<Histogram>,
    /// None when the series leave RTT out.
    rtt: Option<Histogram>,
    /// Each created by the stage's first figure (if the series has stages).
    stages: [OnceLock<Histogram>; 7],
    sent: Counter,
    received: Counter,
    lost: Counter,
    echo_lost: Option<Counter>,
    reordered: Counter,
    duplicates: Counter,
    foreign: Counter,
    never_sent: Counter,
    late_echoes: Counter,
    unaccounted: Counter,
    /// The loss by direction as the session told it (a reflector not
    /// ours), in place of the arrival-based split; and what was added.
    told: Option<LossDirections>,
    told_counted: LossDirections,
    /// `direction="unknown"` beside forward and return, once told.
    unknown: OnceLock<Counter>,
    /// The counts already added to the counters.
    counted: Counts,
    source: String,
}

fn seconds(ns: i64) -> f64 {
    ns.max(0) as f64 * 1e-9
}

impl FlowMetrics {
    /// A finalized probe: its counts, then its latencies. The counts go
    /// first, and a scrape reads the histograms before the counters (the
    /// registration order): a histogram's lock orders what was written
    /// before it, so a scrape never shows more RTTs than probes sent or
    /// received.
    pub fn observe(&mut self, r: &ProbeRecord) {
        self.count(r);
        let m = &self.metrics;
        if let Some(v) = r.one_way_ns
            && m.series.one_way
        {
            self.one_way
                .get_or_init(|| m.one_way.get_or_create(&self.labels).clone())
                .observe(seconds(v));
        }
        if let (Some(v), Some(h)) = (r.rtt_ns, &self.rtt) {
            h.observe(seconds(v));
        }
        if !m.series.stages {
            return;
        }
        for (h, stage) in self.stages.iter().zip(Stage::ALL) {
            if let Some(v) = stage.of(r) {
                h.get_or_init(|| {
                    let labels = StageLabels {
                        flow: self.labels.clone(),
                        stage: stage.key().into(),
                    };
                    m.stage.get_or_create(&labels).clone()
                })
                .observe(seconds(v));
            }
        }
    }

    /// The counts a record adds, as the run's statistics count it
    /// (RunStats::on_record), published at once rather than at the next
    /// tick. A loss waits for the tick: its direction is the session's to
    /// tell against a reflector not ours ([`Self::add_told`]), and only
    /// the sent and received counts bound the histograms.
    fn count(&mut self, r: &ProbeRecord) {
        let c = &mut self.counted;
        self.sent.inc();
        c.sent += 1;
        if r.lost {
            return;
        }
        self.received.inc();
        c.received += 1;
        if r.echo_ns.is_none() {
            if let Some(e) = &self.echo_lost {
                e.inc();
            }
            c.echo_lost += 1;
        }
    }

    /// Brings the counters up to the run's counts (counters only grow:
    /// a count that went down, or that the records already brought
    /// further, is left where it was).
    pub fn update(&mut self, c: &Counts, timestamp_source: &str) {
        let add = |counter: &Counter, now: u64, before: u64| {
            if now > before {
                counter.inc_by(now - before);
            }
        };
        let was = self.counted;
        add(&self.sent, c.sent, was.sent);
        add(&self.received, c.received, was.received);
        if let Some(t) = self.told {
            self.add_told(&t);
        } else {
            add(&self.lost, c.lost, was.lost);
            if let Some(e) = &self.echo_lost {
                add(e, c.echo_lost, was.echo_lost);
            }
        }
        add(&self.reordered, c.reordered, was.reordered);
        add(&self.duplicates, c.duplicates, was.duplicates);
        add(&self.foreign, c.foreign, was.foreign);
        add(&self.never_sent, c.never_sent, was.never_sent);
        add(&self.late_echoes, c.late_echoes, was.late_echoes);
        add(&self.unaccounted, c.unaccounted, was.unaccounted);
        self.counted = Counts {
            sent: c.sent.max(was.sent),
            received: c.received.max(was.received),
            lost: c.lost.max(was.lost),
            echo_lost: c.echo_lost.max(was.echo_lost),
            reordered: c.reordered.max(was.reordered),
            duplicates: c.duplicates.max(was.duplicates),
            foreign: c.foreign.max(was.foreign),
            never_sent: c.never_sent.max(was.never_sent),
            late_echoes: c.late_echoes.max(was.late_echoes),
            unaccounted: c.unaccounted.max(was.unaccounted),
        };
        if self.source != timestamp_source {
            let family = &self.metrics.timestamp_source;
            let labels = |source: &str| SourceLabels {
                flow: self.labels.clone(),
                source: source.into(),
            };
            if !self.source.is_empty() {
                family.remove(&labels(&self.source));
            }
            family.get_or_create(&labels(timestamp_source)).set(1);
            self.source = timestamp_source.into();
        }
    }
}

impl FlowMetrics {
    /// The told directions' counters brought up to `t` (they only grow);
    /// the `unknown` series is created by its first loss.
    fn add_told(&mut self, t: &LossDirections) {
        let was = self.told_counted;
        let unknown = || {
            self.unknown.get_or_init(|| {
                let labels = LostLabels {
                    flow: self.labels.clone(),
                    direction: "unknown".into(),
                };
                self.metrics.lost.get_or_create(&labels).clone()
            })
        };
        let add = |c: &Counter, now: u64, before: u64| {
            if now > before {
                c.inc_by(now - before);
            }
        };
        // No return series (`lost` is already "unknown"): all goes there.
        let ret = self.echo_lost.as_ref().unwrap_or(&self.lost);
        add(&self.lost, t.forward, was.forward);
        add(ret, t.r#return, was.r#return);
        if t.unknown > was.unknown {
            add(unknown(), t.unknown, was.unknown);
        }
        self.told_counted = LossDirections {
            forward: t.forward.max(was.forward),
            r#return: t.r#return.max(was.r#return),
            unknown: t.unknown.max(was.unknown),
        };
    }
}

impl SessionObserver for FlowMetrics {
    fn on_record(&mut self, r: &ProbeRecord) {
        self.observe(r);
    }

    fn on_loss_directions(&mut self, d: &LossDirections) {
        self.told = Some(*d);
    }

    fn on_tick(&mut self, stats: &RunStats, _last: bool) -> Result<(), String> {
        self.update(&stats.counts(), stats.timestamp_source());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        export::plan::{DEFAULT_METRICS_BUCKETS, MetricsBuckets, MetricsSeries},
        model::record::ProbeRecord,
    };

    fn record(one_way_us: i64) -> ProbeRecord {
        ProbeRecord {
            one_way_ns: Some(one_way_us * 1000),
            echo_ns: Some(1),
            rtt_ns: Some(2 * one_way_us * 1000),
            path_ns: Some(one_way_us * 500),
            ..Default::default()
        }
    }

    #[test]
    fn exposition_has_histograms_counters_and_info() {
        let m = Arc::new(Metrics::new());
        m.set_xdp_mode("auto", "native");
        let mut f = m.flow(FlowLabels::new("10.0.0.2:5061", 0, 0xc0, 64), false);
        for us in [10, 20, 40, 3_000_000] {
            f.observe(&record(us));
        }
        f.update(
            &Counts {
                sent: 5,
                received: 4,
                lost: 1,
                echo_lost: 2,
                reordered: 1,
                ..Default::default()
            },
            "software",
        );
        // Counters only grow, and only by the difference.
        f.update(
            &Counts {
                sent: 7,
                received: 6,
                lost: 1,
                echo_lost: 2,
                reordered: 1,
                foreign: 3,
                never_sent: 2,
                late_echoes: 1,
                ..Default::default()
            },
            "hardware",
        );
        let text = m.openmetrics();
        let labels = r#"target="10.0.0.2:5061",flow="0",tos="0xc0",size="64""#;
        for want in [
            "# TYPE rtprobe_one_way_seconds histogram".to_string(),
            "# UNIT rtprobe_one_way_seconds seconds".into(),
            format!("rtprobe_one_way_seconds_count{{{labels}}} 4"),
            format!("rtprobe_rtt_seconds_bucket{{le=\"+Inf\",{labels}}} 4"),
            format!("rtprobe_probes_sent_total{{{labels}}} 7"),
            format!("rtprobe_probes_received_total{{{labels}}} 6"),
            format!("rtprobe_probes_lost_total{{{labels},direction=\"forward\"}} 1"),
            format!("rtprobe_probes_lost_total{{{labels},direction=\"return\"}} 2"),
            format!("rtprobe_probes_reordered_total{{{labels}}} 1"),
            format!("rtprobe_probes_unaccounted_total{{{labels}}} 0"),
            format!("rtprobe_foreign_packets_total{{{labels}}} 3"),
            format!("rtprobe_echoes_never_sent_total{{{labels}}} 2"),
            format!("rtprobe_echoes_late_total{{{labels}}} 1"),
            format!("rtprobe_timestamp_source_info{{{labels},source=\"hardware\"}} 1"),
            "rtprobe_xdp_mode_info{requested=\"auto\",attached=\"native\"} 1".into(),
            format!("rtprobe_stage_seconds_count{{{labels},stage=\"path\"}} 4"),
            "# EOF".into(),
        ] {
            assert!(text.contains(&want), "missing {want:?} in\n{text}");
        }
        assert!(
            !text.contains("source=\"software\""),
            "the old source is gone"
        );
        // Cumulative buckets: 10 µs lies in (8 µs, 11.3 µs], 3 s above 2.9 s.
        let prefix = "rtprobe_one_way_seconds_bucket{le=\"";
        let buckets: Vec<(f64, u64)> = text
            .lines()
            .filter(|l| l.starts_with(prefix) && l.contains(labels))
            .map(|l| {
                let le = &l[prefix.len()..l[prefix.len()..].find('"').unwrap() + prefix.len()];
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                };
                (le, l.rsplit(' ').next().unwrap().parse().unwrap())
            })
            .collect();
        assert_eq!(buckets.len(), usize::from(DEFAULT_METRICS_BUCKETS) + 1);
        let at = |v: f64| buckets.iter().find(|b| b.0 >= v * 0.999_999).unwrap().1;
        assert_eq!(at(8e-6), 0);
        assert_eq!(at(11.3e-6), 1);
        assert_eq!(at(40e-6), 3);
        assert_eq!(at(2.9), 3);
        assert_eq!(at(f64::INFINITY), 4);
    }

    #[test]
    fn a_targets_labels_are_on_every_series_of_it() {
        let m = Arc::new(Metrics::new());
        let extra = std::collections::BTreeMap::from([
            ("rack".to_string(), "r7".to_string()),
            ("site".to_string(), "fra1".to_string()),
        ]);
        let mut f = m.flow(FlowLabels::new("db-1", 0, 0, 64).with_extra(&extra), false);
        f.observe(&record(20));
        f.update(
            &Counts {
                sent: 2,
                received: 1,
                lost: 1,
                ..Default::default()
            },
            "software",
        );
        let text = m.openmetrics();
        let series: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains("target=\"db-1\""))
            .collect();
        assert!(series.len() > 10, "{text}");
        for l in &series {
            assert!(l.contains("rack=\"r7\",site=\"fra1\""), "{l}");
        }
        assert!(series.iter().any(|l| l.contains("direction=")), "{text}");
        assert!(series.iter().any(|l| l.contains("stage=")), "{text}");
    }

    #[test]
    fn kernel_reflector_loss_has_no_direction() {
        let m = Arc::new(Metrics::new());
        let mut f = m.flow(FlowLabels::new("t", 1, 0, 64), true);
        f.update(
            &Counts {
                sent: 3,
                lost: 1,
                ..Default::default()
            },
            "software",
        );
        let text = m.openmetrics();
        assert!(text.contains("direction=\"unknown\"} 1"), "{text}");
        assert!(!text.contains("direction=\"return\""));
    }

    #[test]
    fn loss_directions_told_by_the_session_replace_the_arrival_split() {
        let m = Arc::new(Metrics::new());
        let mut f = m.flow(FlowLabels::new("t", 0, 0, 64), false);
        f.on_loss_directions(&LossDirections {
            forward: 1,
            r#return: 0,
            unknown: 3,
        });
        let c = Counts {
            sent: 9,
            lost: 4,
            ..Default::default()
        };
        f.update(&c, "software");
        let text = m.openmetrics();
        assert!(text.contains("direction=\"forward\"} 1"), "{text}");
        assert!(text.contains("direction=\"return\"} 0"), "{text}");
        assert!(text.contains("direction=\"unknown\"} 3"), "{text}");
    }

    /// A remote session's lost records come before their directions (told
    /// at the tick): the loss counts where the session says, never as
    /// forward by default.
    #[test]
    fn lost_records_wait_for_the_directions_the_session_tells() {
        let m = Arc::new(Metrics::new());
        let mut f = m.flow(FlowLabels::new("t", 0, 0, 64), false);
        let lost = ProbeRecord {
            lost: true,
            ..Default::default()
        };
        f.on_record(&lost);
        f.on_record(&lost);
        f.on_loss_directions(&LossDirections {
            forward: 0,
            r#return: 0,
            unknown: 2,
        });
        let c = Counts {
            sent: 2,
            lost: 2,
            ..Default::default()
        };
        f.update(&c, "software");
        let text = m.openmetrics();
        assert!(text.contains("direction=\"forward\"} 0"), "{text}");
        assert!(text.contains("direction=\"unknown\"} 2"), "{text}");
        assert!(
            text.contains(
                "rtprobe_probes_sent_total{target=\"t\",flow=\"0\",tos=\"0x00\",size=\"64\"} 2"
            ),
            "{text}"
        );
    }

    /// A record with every latency a testbed run has: one-way, RTT and
    /// all seven stages.
    fn full_record() -> ProbeRecord {
        ProbeRecord {
            stack_ns: Some(1_000),
            sender_queue_ns: Some(1_000),
            driver_ns: Some(1_000),
            receiver_ns: Some(1_000),
            reflector_ns: Some(1_000),
            return_ns: Some(1_000),
            ..record(20)
        }
    }

    /// The series one flow costs: every sample line of its target.
    fn series_in(text: &str) -> usize {
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains("target=\"t\""))
            .count()
    }

    /// The budget docs/CONTINUOUS.md states: a histogram is its bounds
    /// plus +Inf, sum and count; a flow has 10 counters (9 when the loss
    /// has no direction) and its timestamp source. (The process adds its
    /// own: build info, `process_*`, and the XDP mode once set.)
    #[test]
    fn a_flow_costs_the_stated_series() {
        let cost = |series: MetricsSeries, r: &ProbeRecord, kernel: bool| {
            let m = Arc::new(Metrics::with_series(series));
            let mut f = m.flow(FlowLabels::new("t", 0, 0, 64), kernel);
            f.observe(r);
            f.update(&Counts::default(), "software");
            let text = m.openmetrics();
            (series_in(&text), text)
        };
        let full = MetricsSeries::default();
        let r = full_record();
        let (n, text) = cost(full.clone(), &r, false);
        assert_eq!(n, (2 + 7) * 51 + 10 + 1, "{text}");
        // A --target run: no one-way figure, so no one-way series.
        // and only the stages its stamps cover (here: stack and return).
        let remote = ProbeRecord {
            one_way_ns: None,
            path_ns: None,
            stack_ns: Some(1_000),
            return_ns: Some(1_000),
            ..record(20)
        };
        let (n, text) = cost(full, &remote, false);
        assert!(!text.contains("rtprobe_one_way_seconds_count"), "{text}");
        assert_eq!(n, (1 + 2) * 51 + 10 + 1, "{text}");
        // The fleet budget: RTT only, 24 buckets.
        let lean = MetricsSeries {
            rtt: true,
            one_way: false,
            stages: false,
            buckets: MetricsBuckets::Count(24),
        };
        let (n, text) = cost(lean.clone(), &r, false);
        assert_eq!(n, 27 + 10 + 1, "{text}");
        assert!(!text.contains("rtprobe_stage_seconds_count"));
        // Counters only (the kernel reflector: one loss direction).
        let none = MetricsSeries { rtt: false, ..lean };
        assert_eq!(cost(none, &r, true).0, 9 + 1);
    }

    /// The value of the first sample whose line starts with `prefix`.
    fn sample(text: &str, prefix: &str) -> f64 {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// Scrapes taken while a flow is fed never show more RTTs than probes
    /// sent or received (the sent count used to wait for the next tick).
    #[test]
    fn a_scrape_never_shows_more_rtts_than_probes_sent() {
        let m = Arc::new(Metrics::with_series(MetricsSeries::for_fleet()));
        let mut f = m.flow(FlowLabels::new("t", 0, 0, 64), false);
        let done = std::sync::atomic::AtomicBool::new(false);
        let scrapes = std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..20_000 {
                    f.observe(&record(10 + i % 1000));
                }
                done.store(true, std::sync::atomic::Ordering::SeqCst);
            });
            let mut scrapes = 0;
            loop {
                let finished = done.load(std::sync::atomic::Ordering::SeqCst);
                let text = m.openmetrics();
                let rtts = sample(&text, "rtprobe_rtt_seconds_count{");
                let sent = sample(&text, "rtprobe_probes_sent_total{");
                let received = sample(&text, "rtprobe_probes_received_total{");
                assert!(
                    sent >= rtts && received >= rtts,
                    "sent {sent} received {received} rtts {rtts}"
                );
                scrapes += 1;
                if finished {
                    break scrapes;
                }
            }
        });
        eprintln!("{scrapes} scrapes beside 20000 records");
        let text = m.openmetrics();
        assert_eq!(sample(&text, "rtprobe_probes_sent_total{"), 20_000.0);
        assert_eq!(sample(&text, "rtprobe_rtt_seconds_count{"), 20_000.0);
    }
}
