//! [`Metrics`]: the families of a probing process (a probe run or a
//! reflector, each with only its own), registered in the order of the
//! exposition, and their encoding.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use prometheus_client::{
    encoding::text::encode,
    metrics::{
        counter::Counter,
        family::{Family, MetricConstructor},
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::{Registry, Unit},
};

use super::{
    format::{self, Format},
    labels::{
        BuildLabels, CounterLabels, FlowLabels, LostLabels, OutcomeLabels, PassiveLabels,
        PassiveStageLabels, SourceLabels, StageLabels, StepLabels, XdpLabels,
    },
    process::ProcessCollector,
};
use crate::export::plan::{MetricsBuckets, MetricsSeries};

/// The smallest bucket bound, in seconds (1 µs).
const BUCKET_START_S: f64 = 1e-6;
/// Doublings from the smallest bound to the largest: 2^23.5 µs ≈ 11.9 s,
/// a stalled WAN path's RTT, then +Inf.
const SPAN_DOUBLINGS: f64 = 23.5;
/// Significant digits a spaced bound is rounded to: `le="0.00000283"`, not
/// the float noise of a product (`0.0000028284271247461907`). The bounds
/// move by at most 0.5 %, far inside a bucket's width.
const BOUND_DIGITS: usize = 3;

/// The bucket bounds of every latency histogram, in seconds, increasing:
/// N bounds spaced by one factor from 1 µs to 11.9 s (48 make the factor
/// √2), or the bounds `--metrics-buckets` lists.
#[derive(Debug, Clone)]
pub(super) struct Buckets(Arc<[f64]>);

impl Buckets {
    pub(super) fn new(spec: &MetricsBuckets) -> Self {
        match spec {
            MetricsBuckets::Count(count) => Self::spaced(*count),
            MetricsBuckets::Bounds(ns) => Self(ns.iter().map(|&n| n as f64 * 1e-9).collect()),
        }
    }

    fn spaced(count: u16) -> Self {
        let count = count.max(2);
        // 48 bounds: √2, the factor of every release so far.
        let factor = 2f64.powf(SPAN_DOUBLINGS / f64::from(count - 1));
        Self(
            exponential_buckets(BUCKET_START_S, factor, count)
                .map(round_bound)
                .collect(),
        )
    }

    #[cfg(test)]
    pub(super) fn bounds(&self) -> &[f64] {
        &self.0
    }
}

/// `v` to [`BOUND_DIGITS`] significant digits, as the f64 nearest that
/// decimal, so that it prints as the short decimal it is.
fn round_bound(v: f64) -> f64 {
    format!("{v:.prec$e}", prec = BOUND_DIGITS - 1)
        .parse()
        .unwrap_or(v)
}

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

type Histograms<L> = Family<L, Histogram, Buckets>;

/// Which command's metrics a registry carries: a probe run's never show
/// a reflector's counters, nor a reflector's the probes' families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Command {
    Probe,
    Reflect,
    Flows,
}

impl Command {
    fn name(self) -> &'static str {
        match self {
            Command::Probe => "probe",
            Command::Reflect => "reflect",
            Command::Flows => "flows",
        }
    }
}

/// The metrics of a probing process, and the registry that encodes them.
pub struct Metrics {
    pub(super) registry: Registry,
    /// The latency histograms each flow has, and their buckets.
    pub(super) series: MetricsSeries,
    /// The size of the last exposition.
    encoded_bytes: AtomicUsize,
    pub(super) one_way: Histograms<FlowLabels>,
    pub(super) rtt: Histograms<FlowLabels>,
    pub(super) stage: Histograms<StageLabels>,
    pub(super) sent: Family<FlowLabels, Counter>,
    pub(super) received: Family<FlowLabels, Counter>,
    pub(super) lost: Family<LostLabels, Counter>,
    pub(super) reordered: Family<FlowLabels, Counter>,
    pub(super) duplicates: Family<FlowLabels, Counter>,
    pub(super) foreign: Family<FlowLabels, Counter>,
    pub(super) never_sent: Family<FlowLabels, Counter>,
    pub(super) late_echoes: Family<FlowLabels, Counter>,
    pub(super) unaccounted: Family<FlowLabels, Counter>,
    /// Failures to open a target, by step.
    pub(super) target_errors: Family<StepLabels, Counter>,
    pub(super) xdp_mode: Family<XdpLabels, Gauge>,
    pub(super) timestamp_source: Family<SourceLabels, Gauge>,
    build_info: Family<BuildLabels, Gauge>,
    /// `rtprobe reflect`: datagrams by what the reflector did with them.
    pub(super) reflector_datagrams: Family<OutcomeLabels, Counter>,
    pub(super) reflector_sessions: Counter,
    /// `rtprobe reflect --kernel`: frames the XDP reflector saw, by outcome.
    pub(super) kernel_reflector_frames: Family<OutcomeLabels, Counter>,
    /// `rtprobe flows`: each stage of the sampled sends, by group.
    pub(super) passive_stage: Histograms<PassiveStageLabels>,
    /// `rtprobe flows`: sampled sends by group.
    pub(super) passive_samples: Family<PassiveLabels, Counter>,
    /// `rtprobe flows`: the sock_ops program's counters.
    pub(super) passive_program: Family<CounterLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A probe run's metrics, with every latency histogram and the
    /// default buckets.
    pub fn new() -> Self {
        Self::with_series(MetricsSeries::default())
    }

    /// A probe run's metrics, with the histograms and buckets of `series`
    /// (`--metrics-histograms`, `--metrics-buckets`).
    pub fn with_series(series: MetricsSeries) -> Self {
        Self::build(Command::Probe, series)
    }

    /// `rtprobe reflect`'s metrics: its counters, none of a probe run's.
    pub fn for_reflector() -> Self {
        Self::build(Command::Reflect, MetricsSeries::default())
    }

    /// `rtprobe flows`' metrics: its stage histograms and counters.
    pub(crate) fn for_flows() -> Self {
        Self::build(Command::Flows, MetricsSeries::default())
    }

    fn build(command: Command, series: MetricsSeries) -> Self {
        let buckets = Buckets::new(&series.buckets);
        let hist = || Family::new_with_constructor(buckets.clone());
        let m = Self {
            one_way: hist(),
            rtt: hist(),
            stage: Family::new_with_constructor(buckets.clone()),
            series,
            encoded_bytes: AtomicUsize::new(0),
            sent: Family::default(),
            received: Family::default(),
            lost: Family::default(),
            reordered: Family::default(),
            duplicates: Family::default(),
            foreign: Family::default(),
            never_sent: Family::default(),
            late_echoes: Family::default(),
            unaccounted: Family::default(),
            target_errors: Family::default(),
            xdp_mode: Family::default(),
            timestamp_source: Family::default(),
            build_info: Family::default(),
            reflector_datagrams: Family::default(),
            reflector_sessions: Counter::default(),
            kernel_reflector_frames: Family::default(),
            passive_stage: Family::new_with_constructor(buckets.clone()),
            passive_samples: Family::default(),
            passive_program: Family::default(),
            registry: Registry::default(),
        };
        m.build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").into(),
                command: command.name().into(),
            })
            .set(1);
        // The process collector's `process_*` names take no prefix.
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessCollector));
        let own = registry.sub_registry_with_prefix("rtprobe");
        own.register(
            "build_info",
            "rtprobe's version and the command this process runs (probe, reflect): always 1",
            m.build_info.clone(),
        );
        // The order of registration is the order of the exposition: a
        // flow's histograms before its counters, which is what keeps a
        // scrape's sent count from lagging its RTT count (see
        // FlowMetrics::observe).
        match command {
            Command::Probe => {
                m.register_latencies(own);
                m.register_counts(own);
                m.register_info(own);
            }
            Command::Reflect => m.register_reflector(own),
            Command::Flows => m.register_passive(own),
        }
        Self { registry, ..m }
    }

    /// `rtprobe reflect`'s families.
    fn register_reflector(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "reflector_datagrams",
            "rtprobe reflect: datagrams received, by outcome (reflected, not_for_us, bad_source, \
             malformed, rate_limited, global_limited, peer_rate_limited, peer_global_limited, \
             auth_failed; peer_reflected: the part of reflected sent to known peers; send_error: \
             a reply the kernel refused)",
            m.reflector_datagrams.clone(),
        );
        registry.register(
            "reflector_sessions",
            "rtprobe reflect: client sessions seen",
            m.reflector_sessions.clone(),
        );
        registry.register(
            "kernel_reflector_frames",
            "rtprobe reflect --kernel: frames the in-kernel (XDP) reflector saw, by outcome \
             (reflected_rtprobe, reflected_stamp, not_for_us, bad_source, rate_limited, \
             global_limited, peer_reflected, peer_rate_limited, peer_global_limited, malformed, \
             ...; the rest pass to the kernel)",
            m.kernel_reflector_frames.clone(),
        );
    }

    /// `rtprobe flows`' families.
    fn register_passive(&self, registry: &mut Registry) {
        let m = self;
        registry.register_with_unit(
            "flows_stage",
            "rtprobe flows: each stage of the host's sampled TCP sends (stack: sendmsg to the \
             qdisc; sender_queue: the qdisc to the driver; nic: the driver to the NIC's stamp; \
             round_trip: the last TX stamp to the ACK, the peer's delayed ACK included), by \
             process name and cgroup",
            Unit::Seconds,
            m.passive_stage.clone(),
        );
        registry.register(
            "flows_samples",
            "rtprobe flows: sampled sends, by process name and cgroup",
            m.passive_samples.clone(),
        );
        registry.register(
            "flows_program",
            "rtprobe flows: the sock_ops program's counters (sends, sampled, skipped_flow_rate, \
             skipped_global_cap, skipped_in_flight, reported, ring_full, given_up, \
             sockets_watched, watch_failed, sockets_unwatched)",
            m.passive_program.clone(),
        );
    }

    /// The probes' latency histograms.
    fn register_latencies(&self, registry: &mut Registry) {
        let m = self;
        registry.register_with_unit(
            "one_way",
            "One-way delay: the receiver's RX stamp minus the probe's entry into the sender's stack",
            Unit::Seconds,
            m.one_way.clone(),
        );
        registry.register_with_unit(
            "rtt",
            "Round-trip time: the echo's RX stamp minus the probe's entry into the sender's stack",
            Unit::Seconds,
            m.rtt.clone(),
        );
        registry.register_with_unit(
            "stage",
            "Each stage of the probe's timestamp chain (stack, sender_queue, driver, path, receiver, reflector, return)",
            Unit::Seconds,
            m.stage.clone(),
        );
    }

    /// The probes' counters.
    fn register_counts(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "probes_sent",
            "Probes sent and finalized (received or lost; a probe is finalized up to one timeout after its send)",
            m.sent.clone(),
        );
        registry.register(
            "probes_received",
            "Probes that reached the receiver",
            m.received.clone(),
        );
        registry.register(
            "probes_lost",
            "Probes lost, by direction where it is known",
            m.lost.clone(),
        );
        registry.register(
            "probes_reordered",
            "Probes that arrived after a later one",
            m.reordered.clone(),
        );
        registry.register(
            "probes_duplicated",
            "Extra copies of probes that arrived",
            m.duplicates.clone(),
        );
        registry.register(
            "foreign_packets",
            "Datagrams on the probe port that were not this run's: another session, undecodable, \
             or an echo from an address other than the target",
            m.foreign.clone(),
        );
        registry.register(
            "echoes_never_sent",
            "Datagrams of this session whose seq was never sent (forged), refused",
            m.never_sent.clone(),
        );
        registry.register(
            "echoes_late",
            "Echoes that came after their probe was given up as lost, refused",
            m.late_echoes.clone(),
        );
        registry.register(
            "probes_unaccounted",
            "Probes in no other count (must stay 0)",
            m.unaccounted.clone(),
        );
        registry.register(
            "target_errors",
            "Failures to open a target (step: resolve, socket, connect); it is tried again with a backoff while the others are probed",
            m.target_errors.clone(),
        );
    }

    /// What the run is made of: XDP mode, timestamp source.
    fn register_info(&self, registry: &mut Registry) {
        let m = self;
        registry.register(
            "xdp_mode_info",
            "The XDP router's attach mode: 1 for the mode requested and attached",
            m.xdp_mode.clone(),
        );
        registry.register(
            "timestamp_source_info",
            "Where the flow's one-way figures come from: 1 for the current source",
            m.timestamp_source.clone(),
        );
    }

    /// Counts a failure to open the target of `flow` at `step`.
    pub(crate) fn target_error(&self, flow: &FlowLabels, step: &str) {
        let labels = StepLabels {
            flow: flow.clone(),
            step: step.into(),
        };
        self.target_errors.get_or_create(&labels).inc();
    }

    /// The XDP mode asked for and the one the kernel attached ("off",
    /// "skb", "native"...). A run with no router at all (`--target`:
    /// requested "none") has no such gauge.
    pub fn set_xdp_mode(&self, requested: &str, attached: &str) {
        self.xdp_mode.clear();
        if requested == "none" {
            return;
        }
        self.xdp_mode
            .get_or_create(&XdpLabels {
                requested: requested.into(),
                attached: attached.into(),
            })
            .set(1);
    }

    /// The OpenMetrics text exposition (ends with `# EOF`).
    pub fn openmetrics(&self) -> String {
        // The last one's size, so that a large exposition is not copied
        // over and over as it grows.
        let last = self.encoded_bytes.load(Ordering::Relaxed);
        let mut s = String::with_capacity(last + last / 8);
        // Writing into a String cannot fail.
        let _ = encode(&mut s, &self.registry);
        self.encoded_bytes.store(s.len(), Ordering::Relaxed);
        s
    }

    /// The exposition in `format`.
    pub fn encode(&self, format: Format) -> String {
        match format {
            Format::OpenMetrics => self.openmetrics(),
            Format::Prometheus => format::prometheus_text(&self.openmetrics()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::export::plan::DEFAULT_METRICS_BUCKETS;

    #[test]
    fn buckets_span_a_microsecond_to_seconds() {
        for count in [2, 12, 24, 47, 48, 49, 96] {
            let b = Buckets::new(&MetricsBuckets::Count(count));
            let b = b.bounds();
            assert_eq!(b.len(), usize::from(count));
            assert_eq!(b[0], 1e-6);
            assert_eq!(b[b.len() - 1], 11.9, "{count}");
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{count}: {b:?}");
        }
        // The default: √2, within the rounding to 3 digits.
        let b = Buckets::new(&MetricsBuckets::Count(DEFAULT_METRICS_BUCKETS));
        let exact: Vec<f64> = exponential_buckets(1e-6, std::f64::consts::SQRT_2, 48).collect();
        for (r, e) in b.bounds().iter().zip(&exact) {
            assert!((r / e - 1.0).abs() < 0.005, "{r} for {e}");
        }
        let factor = |count| {
            let b = Buckets::new(&MetricsBuckets::Count(count));
            b.bounds()[3] / b.bounds()[2]
        };
        assert!((factor(24) - 2.03).abs() < 0.03, "{}", factor(24));
        // Listed bounds are taken as they are, ns to s.
        let listed = Buckets::new(&MetricsBuckets::Bounds(
            vec![100_000, 1_000_000, 2_500_000_000].into(),
        ));
        assert_eq!(listed.bounds(), [1e-4, 1e-3, 2.5]);
    }

    /// Every `le` of the exposition is a short decimal: the text of a
    /// bound with at most 3 significant digits, no float noise.
    #[test]
    fn le_bounds_print_as_plain_decimals() {
        let m = Arc::new(Metrics::new());
        let f = m.flow(FlowLabels::new("t", 0, 0, 64), false);
        drop(f);
        let text = m.encode(Format::Prometheus);
        let les: Vec<&str> = text
            .lines()
            .filter_map(|l| l.split("le=\"").nth(1))
            .filter_map(|l| l.split('"').next())
            .filter(|le| *le != "+Inf")
            .collect();
        assert_eq!(les.len(), usize::from(DEFAULT_METRICS_BUCKETS), "{text}");
        assert!(les.contains(&"0.000002"), "{les:?}");
        assert!(les.contains(&"0.00000141"), "{les:?}");
        assert!(les.contains(&"11.9"), "{les:?}");
        for le in les {
            let digits = le.trim_start_matches(['0', '.']).replace('.', "");
            assert!(
                digits.trim_end_matches('0').len() <= 3 && le.len() <= 12,
                "le=\"{le}\""
            );
        }
    }

    /// A probe run shows no reflector counters, a reflector no probe
    /// families; both show their build and process metrics.
    #[test]
    fn each_command_exports_only_its_own_families() {
        let probe = Metrics::new();
        probe.set_xdp_mode("none", "none");
        let text = probe.encode(Format::Prometheus);
        assert!(!text.contains("rtprobe_reflector_"), "{text}");
        assert!(!text.contains("rtprobe_xdp_mode_info{"), "{text}");
        let version = env!("CARGO_PKG_VERSION");
        assert!(text.contains(&format!(
            "rtprobe_build_info{{version=\"{version}\",command=\"probe\"}} 1\n"
        )));
        probe.set_xdp_mode("off", "off");
        assert!(
            probe
                .encode(Format::Prometheus)
                .contains("rtprobe_xdp_mode_info{requested=\"off\",attached=\"off\"} 1")
        );
        let reflector = Metrics::for_reflector();
        let text = reflector.encode(Format::Prometheus);
        assert!(
            text.contains("rtprobe_reflector_sessions_total 0\n"),
            "{text}"
        );
        assert!(text.contains("command=\"reflect\""), "{text}");
        assert!(
            !text.contains("rtprobe_probes_") && !text.contains("xdp_mode"),
            "{text}"
        );
        for t in [&text, &probe.encode(Format::Prometheus)] {
            for family in [
                "# TYPE process_cpu_seconds_total counter",
                "# TYPE process_resident_memory_bytes gauge",
                "# TYPE process_open_fds gauge",
                "# TYPE process_max_fds gauge",
                "# TYPE process_start_time_seconds gauge",
            ] {
                assert!(t.contains(family), "{family} in\n{t}");
            }
        }
    }
}
