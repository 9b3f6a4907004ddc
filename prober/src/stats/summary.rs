//! A run's results as the JSON carries them: the [`Summary`] with its
//! latencies, stages and pacing (accumulated by [`super::run_stats`]).

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    chain::Stage,
    hist::{Hist, Unbinned},
    report::RunReport,
};
use crate::model::record::StartSrc;

/// min/percentiles/max/mean of one latency-like quantity, in ns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Latency {
    pub(crate) count: u64,
    pub(crate) min: Option<u64>,
    /// Null when no value was recorded, or when the percentile falls among
    /// the values above the histogram's cap (`unbinned`).
    pub(crate) p50: Option<u64>,
    pub(crate) p90: Option<u64>,
    pub(crate) p99: Option<u64>,
    pub(crate) p999: Option<u64>,
    pub(crate) max: Option<u64>,
    pub(crate) mean: Option<f64>,
    /// Values the histogram did not bin (above its cap: a target among
    /// several bins up to 1.07 s); absent when it binned all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) unbinned: Option<Unbinned>,
}

impl Latency {
    pub(crate) fn from_hist(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Latency::default();
        }
        Latency {
            count: h.len(),
            min: Some(h.min()),
            p50: Some(h.value_at_quantile(0.50)),
            p90: Some(h.value_at_quantile(0.90)),
            p99: Some(h.value_at_quantile(0.99)),
            p999: Some(h.value_at_quantile(0.999)),
            max: Some(h.max()),
            mean: Some(h.mean()),
            unbinned: None,
        }
    }

    /// The same figures from one of the run's histograms, computed over
    /// its buckets only; percentiles above its cap are None.
    pub(crate) fn of(h: &Hist) -> Self {
        if h.is_empty() {
            return Latency::default();
        }
        let [p50, p90, p99, p999] = h.quantiles([0.50, 0.90, 0.99, 0.999]);
        Latency {
            count: h.len(),
            min: Some(h.min()),
            p50,
            p90,
            p99,
            p999,
            max: Some(h.max()),
            mean: Some(h.mean()),
            unbinned: h.unbinned(),
        }
    }

    /// The cap a missing percentile lies above, when it is one that fell
    /// among the values above the histogram's cap.
    pub(crate) fn above_cap(&self, p: Option<u64>) -> Option<u64> {
        match (&self.unbinned, p) {
            (Some(u), None) if u.above_cap > 0 && self.count > 0 => Some(u.cap_ns),
            _ => None,
        }
    }
}

/// The distribution of each stage of the chain (see [`super::chain`]),
/// over the probes that had both of its stamps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct Stages {
    pub(crate) stack: Latency,
    pub(crate) sender_queue: Latency,
    pub(crate) driver: Latency,
    pub(crate) path: Latency,
    pub(crate) receiver: Latency,
    pub(crate) reflector: Latency,
    #[serde(rename = "return")]
    pub(crate) return_path: Latency,
}

impl Stages {
    pub(crate) fn get(&self, stage: Stage) -> &Latency {
        match stage {
            Stage::Stack => &self.stack,
            Stage::SenderQueue => &self.sender_queue,
            Stage::Driver => &self.driver,
            Stage::Path => &self.path,
            Stage::Receiver => &self.receiver,
            Stage::Reflector => &self.reflector,
            Stage::ReturnPath => &self.return_path,
        }
    }

    pub(super) fn get_mut(&mut self, stage: Stage) -> &mut Latency {
        match stage {
            Stage::Stack => &mut self.stack,
            Stage::SenderQueue => &mut self.sender_queue,
            Stage::Driver => &mut self.driver,
            Stage::Path => &mut self.path,
            Stage::Receiver => &mut self.receiver,
            Stage::Reflector => &mut self.reflector,
            Stage::ReturnPath => &mut self.return_path,
        }
    }
}

/// The stage holding most of a headline figure's median, in words.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Dominant {
    /// The stage's key (`sender_queue`, `path`...).
    pub(crate) stage: String,
    /// Its p50 as a share of the headline p50, in percent (at most 100).
    pub(crate) share_pct: f64,
    /// "96 % of the one-way p50 is the sender's queue (qdisc and driver xmit)".
    pub(crate) text: String,
}

/// The stage with the largest median among `stages`, against `total_p50`.
pub(crate) fn dominant_stage(
    what: &str,
    total_p50: Option<u64>,
    stages: &Stages,
    candidates: impl IntoIterator<Item = Stage>,
) -> Option<Dominant> {
    let total = total_p50.filter(|&t| t > 0)? as f64;
    let (stage, p50) = candidates
        .into_iter()
        .filter_map(|s| stages.get(s).p50.map(|p| (s, p)))
        .max_by_key(|&(_, p)| p)?;
    let share_pct = (100.0 * p50 as f64 / total).min(100.0);
    Some(Dominant {
        stage: stage.key().into(),
        share_pct,
        text: format!(
            "{:.0} % of the {what} p50 is {}",
            share_pct.round(),
            stage.words()
        ),
    })
}

/// Packets and bytes for one XDP outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct PacketsBytes {
    pub(crate) packets: u64,
    pub(crate) bytes: u64,
}

/// XDP router counters by outcome name (summed over CPUs).
pub(crate) type XdpCounters = BTreeMap<String, PacketsBytes>;

/// What a run measured. Field names are the `--json` keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct Summary {
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    pub(crate) loss_pct: f64,
    pub reordered: u64,
    pub duplicates: u64,
    /// Echoes that did not come back although the probe arrived (RTT missing).
    pub echo_lost: u64,
    /// Probes sent whose kernel (driver) TX timestamp never arrived.
    pub(crate) tx_timestamp_missing: u64,
    /// Extra TX timestamps of a kind already seen for the send (kept the first).
    pub tx_timestamp_duplicates: u64,
    /// TX timestamps that came after their probe's record was written
    /// (so the record lacks them).
    #[serde(default)]
    pub tx_timestamp_late: u64,
    /// Extra TX timestamps of the reflector's echoes (kept the first).
    #[serde(default)]
    pub(crate) echo_tx_duplicates: u64,
    /// UDP datagrams on the probe port that are not this run's: another
    /// session, undecodable, or (at the sender) from an address other than
    /// the one probed.
    pub foreign_packets: u64,
    /// Datagrams of this session whose seq was never sent (echoes at the
    /// sender, probes at a testbed's receiver): forged, so refused.
    #[serde(default)]
    pub(crate) never_sent: u64,
    /// Echoes of sent probes that came after the probe's record was
    /// written (given up as lost at the timeout): refused, the probe stays lost.
    #[serde(default)]
    pub(crate) late_echoes: u64,
    /// "hardware", "software" or "mixed": where the one-way figures came from.
    pub(crate) timestamp_source: String,
    pub(crate) xdp_mode_requested: String,
    pub(crate) xdp_mode_attached: String,
    pub(crate) xdp_counters: XdpCounters,
    /// Where the headline one-way and RTT start: "sched" (the kernel's
    /// SCHED stamp, the packet entering the device layer), "user" (the
    /// user-space send time: the kernel gave no SCHED stamp) or "mixed".
    #[serde(default)]
    pub(crate) one_way_start: String,
    /// Receiver RX minus the packet's entry into the sender's stack.
    pub(crate) one_way_ns: Latency,
    /// The echo's RX minus the same start.
    pub(crate) rtt_ns: Latency,
    /// Where the time went, stage by stage.
    #[serde(default)]
    pub(crate) stages_ns: Stages,
    /// The stage holding most of the one-way median.
    #[serde(default)]
    pub(crate) one_way_dominant: Option<Dominant>,
    /// The stage holding most of the RTT median.
    #[serde(default)]
    pub(crate) rtt_dominant: Option<Dominant>,
    /// RTT minus the reflector's turnaround (`rtt_ns - turnaround_ns` per
    /// probe): the path's round trip without rtprobe's user-space
    /// reflector in it, as TWAMP and irtt subtract the server's
    /// processing time.
    #[serde(default)]
    pub(crate) rtt_net_ns: Latency,
    /// Reflector turnaround: from the probe's RX timestamp to just before
    /// the echo's send.
    #[serde(default)]
    pub(crate) reflector_turnaround_ns: Latency,
    /// |IPDV| between consecutive received probes (RFC 3393 on one-way delay).
    pub(crate) ipdv_ns: Latency,
    /// Actual send time minus scheduled send time (pacing error).
    pub(crate) send_error_ns: Latency,
    /// Probes sent more than one interval after their scheduled time
    /// (cyclictest's overruns): the pacer could not keep the schedule.
    pub(crate) missed_ticks: u64,
    /// Kernel software (driver) TX timestamp minus the user-space send
    /// time: the stack and the sender's queue together.
    pub(crate) send_to_tx_ns: Latency,
    /// Probes per second the sender achieved, first to last send: below
    /// 1 / interval when it could not keep the schedule on average.
    #[serde(default)]
    pub(crate) send_rate_pps: f64,
    /// Probes in no other count: attempted by the sender but never written
    /// as a record, plus probes seen at the receiver whose send was never
    /// recorded. Must be 0.
    pub unaccounted: u64,
    /// How the sender kept its schedule and what that cost in CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pacing: Option<Pacing>,
    /// What the run says besides the statistics: the reflector, the
    /// clocks, the load, per-flow summaries (the JSON's `extra`).
    #[serde(rename = "extra", skip_serializing_if = "RunReport::is_empty")]
    pub(crate) report: RunReport,
}

/// The sender's timing: it sleeps (clock_nanosleep, TIMER_ABSTIME on
/// CLOCK_MONOTONIC) until `margin_ns` before each send and spins the rest.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct Pacing {
    /// "adaptive" (margin learned from the wake-ups), "fixed" (`--spin`)
    /// or "busy-poll".
    pub(crate) mode: String,
    /// The margin at the end of the run (None with busy-poll).
    pub(crate) margin_ns: Option<u64>,
    /// The widest margin used during the run.
    pub(crate) margin_max_ns: Option<u64>,
    /// How late the sender's timer sleeps returned: this machine's
    /// wake-up latency during the run (cyclictest's figure).
    pub(crate) wake_late_ns: Latency,
    /// Sleeps that returned after the send was already due: the margin
    /// was too short for them.
    pub(crate) overslept: u64,
    /// Time spent spinning, per probe sent.
    pub(crate) spin_ns_per_probe: f64,
    /// Time spent spinning in percent of one CPU over the run.
    pub(crate) spin_cpu_pct: f64,
    /// All CPU time of the sender thread (spin, sends, sleeps' overhead)
    /// in percent of one CPU.
    pub(crate) sender_cpu_pct: Option<f64>,
    /// Steps of CLOCK_REALTIME seen while sending (the schedule runs on
    /// CLOCK_MONOTONIC and ignored them; the stamps followed).
    pub(crate) clock_steps: u64,
    /// Run-queue wait and hypervisor steal over the sending.
    pub(crate) waits: Option<CpuWaits>,
    /// The CPU idle-latency limit (PM QoS, µs) held while sending; None
    /// when none was.
    pub(crate) cpu_dma_latency_us: Option<u32>,
    /// Time the sender spent, per probe, rehearsing its send path on
    /// loopback right after each wake-up, before its spin (None: it did
    /// not: `--busy-poll`, several targets without `--spin`, or no usable
    /// loopback).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) warm_up_ns_per_probe: Option<f64>,
    /// Probes whose send(2) failed (each warned about, rate-limited, with
    /// its target and error; counted as lost).
    pub(crate) send_failures: u64,
    /// The thread that reads the echoes and TX stamps: the sender, or the
    /// in-process reflector's I/O thread (None: not measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reader: Option<ReaderTiming>,
}

/// The reader's timing: how long the echoes waited in their socket after
/// the kernel received them (its RX stamp) until it read them, and how
/// long the reading thread (the sender, or the in-process reflector's I/O
/// thread) waited for a CPU. A probe is given up as lost only once the
/// reader has read past its timeout, so a long read delay (CPU starvation
/// of this process) delays the records but loses no probe.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct ReaderTiming {
    /// From each echo's kernel RX stamp to its read (2 significant digits).
    pub(crate) read_delay_ns: Latency,
    /// Run-queue wait and hypervisor steal of the reading thread.
    pub(crate) waits: Option<CpuWaits>,
}

/// Where the sender thread's time went while it was not running, over
/// the sending (see `probe::cpu_wait`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct CpuWaits {
    /// The time the waits were counted over.
    pub(crate) over_ns: u64,
    /// Time the thread was runnable but not running (another task had
    /// its CPU); None when the kernel lacks schedstat.
    pub(crate) runq_wait_ns: Option<u64>,
    /// CPU time the hypervisor took from `cpus` (10 ms resolution with
    /// the usual USER_HZ of 100); None when /proc/stat has no steal column.
    pub(crate) steal_ns: Option<u64>,
    /// The CPUs the steal was summed over: those the thread may run on.
    pub(crate) cpus: Vec<usize>,
}

impl CpuWaits {
    /// Steal as a share of the time the CPUs had.
    pub(crate) fn steal_pct(&self) -> Option<f64> {
        let cpu_ns = self.over_ns as f64 * self.cpus.len() as f64;
        self.steal_ns
            .filter(|_| cpu_ns > 0.0)
            .map(|s| 100.0 * s as f64 / cpu_ns)
    }

    /// Run-queue wait as a share of the time counted over.
    pub(crate) fn runq_wait_pct(&self) -> Option<f64> {
        self.runq_wait_ns
            .filter(|_| self.over_ns > 0)
            .map(|w| 100.0 * w as f64 / self.over_ns as f64)
    }
}

impl Summary {
    /// Fills `one_way_dominant` and `rtt_dominant` from the stages.
    pub(crate) fn with_dominant_stages(mut self) -> Self {
        // The stack stage is inside the headline only where it starts at
        // the user-space send.
        let start = if self.one_way_start == "sched" {
            StartSrc::Sched
        } else {
            StartSrc::User
        };
        let one_way = Stage::ALL.into_iter().filter(|s| s.in_one_way(start));
        self.one_way_dominant =
            dominant_stage("one-way", self.one_way_ns.p50, &self.stages_ns, one_way);
        let rtt = Stage::ALL
            .into_iter()
            .filter(|&s| s != Stage::Stack || start == StartSrc::User);
        self.rtt_dominant = dominant_stage("RTT", self.rtt_ns.p50, &self.stages_ns, rtt);
        self
    }
}
