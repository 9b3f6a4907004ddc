//! [`Metrics`]: the families of a probing process, registered in the
//! order of the exposition, and their encoding.

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
    labels::{FlowLabels, LostLabels, OutcomeLabels, SourceLabels, StageLabels, XdpLabels},
};
use crate::spec::continuous::{DEFAULT_METRICS_BUCKETS, MetricsSeries};

/// The smallest bucket bound, in seconds (1 µs).
const BUCKET_START_S: f64 = 1e-6;
/// Doublings from the smallest bound to the largest: 2^23.5 µs ≈ 11.9 s,
/// a stalled WAN path's RTT, then +Inf.
const SPAN_DOUBLINGS: f64 = 23.5;

/// The bucket bounds of every latency histogram: `count` bounds from 1 µs
/// to 11.9 s, each the one before times the same factor. 48 bounds make
/// the factor √2 exactly, so the default `le` labels stay those of every
/// earlier release (a changed label would split a stored series in two).
#[derive(Debug, Clone)]
pub(super) struct Buckets(Arc<[f64]>);

impl Buckets {
    pub(super) fn new(count: u16) -> Self {
        let factor = if count == DEFAULT_METRICS_BUCKETS {
            std::f64::consts::SQRT_2
        } else {
            2f64.powf(SPAN_DOUBLINGS / f64::from(count.max(2) - 1))
        };
        Self(exponential_buckets(BUCKET_START_S, factor, count).collect())
    }
}

impl MetricConstructor<Histogram> for Buckets {
    fn new_metric(&self) -> Histogram {
        Histogram::new(self.0.iter().copied())
    }
}

type Histograms<L> = Family<L, Histogram, Buckets>;

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
    pub(super) xdp_mode: Family<XdpLabels, Gauge>,
    pub(super) timestamp_source: Family<SourceLabels, Gauge>,
    /// `rtprobe reflect`: datagrams by what the reflector did with them.
    pub(super) reflector_datagrams: Family<OutcomeLabels, Counter>,
    pub(super) reflector_sessions: Counter,
    /// `rtprobe reflect --kernel`: frames the XDP reflector saw, by outcome.
    pub(super) kernel_reflector_frames: Family<OutcomeLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// The metrics of a probing process, with every latency histogram
    /// and the default buckets.
    pub fn new() -> Self {
        Self::with_series(MetricsSeries::default())
    }

    /// The metrics of a probing process, with the histograms and buckets
    /// of `series` (`--metrics-histograms`, `--metrics-buckets`).
    pub fn with_series(series: MetricsSeries) -> Self {
        let mut registry = Registry::with_prefix("rtprobe");
        let buckets = Buckets::new(series.buckets);
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
            xdp_mode: Family::default(),
            timestamp_source: Family::default(),
            reflector_datagrams: Family::default(),
            reflector_sessions: Counter::default(),
            kernel_reflector_frames: Family::default(),
            registry: Registry::default(),
        };
        // The order of registration is the order of the exposition.
        m.register_reflector(&mut registry);
        m.register_latencies(&mut registry);
        m.register_counts(&mut registry);
        m.register_info(&mut registry);
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

    /// The XDP mode asked for and the one the kernel attached ("off",
    /// "skb", "native"...).
    pub fn set_xdp_mode(&self, requested: &str, attached: &str) {
        self.xdp_mode.clear();
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

    #[test]
    fn buckets_span_a_microsecond_to_seconds() {
        for count in [2, 12, 24, 47, 48, 49, 96] {
            let b = &Buckets::new(count).0;
            assert_eq!(b.len(), usize::from(count));
            assert_eq!(b[0], 1e-6);
            let last = b[b.len() - 1];
            assert!((11.8..11.9).contains(&last), "{count}: {last}");
        }
        // The default is √2 exactly, as the bounds always were.
        let b: Vec<f64> = exponential_buckets(1e-6, std::f64::consts::SQRT_2, 48).collect();
        assert_eq!(&*Buckets::new(48).0, &b[..]);
        let factor = |count| {
            let b = Buckets::new(count).0;
            b[1] / b[0]
        };
        assert!((factor(24) - 2.03).abs() < 0.01, "{}", factor(24));
        // Without the special case, 48 would give √2 too, to the last bits.
        assert!((2f64.powf(SPAN_DOUBLINGS / 47.0) - std::f64::consts::SQRT_2).abs() < 1e-15);
    }
}
