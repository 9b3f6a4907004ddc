//! The run report: what a run's JSON summary says besides the statistics
//! (its `extra` object): the reflector, the clocks, the load, the kernel's
//! drop counters, per-flow summaries. Typed, so that renaming a field is a
//! compile error in every exporter that reads it; its JSON Schema is
//! checked in as docs/run-report.schema.json (`run_report_schema`, built for
//! the tests, generates it).
//! Pure data: the layers that measure these facts fill them in.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use std::collections::BTreeMap;

use super::{Summary, XdpCounters};
use crate::model::{host::HostFacts, knobs::AppliedKnobs};

/// Everything a run says besides the statistics: `extra` in the JSON.
/// Fields are in the JSON's (alphabetical) order; absent ones are left out.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct RunReport {
    /// Whether one-way figures are shown, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) clock: Option<ClockReport>,
    /// `--out-rotate`: how the CSV was rotated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) csv_rotation: Option<CsvRotation>,
    /// Per probe flow, main flow first, with `--flow` only.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) flows: Vec<FlowSummary>,
    /// Per NIC with hardware stamps: its PHC against the system clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hardware_clocks: Option<HardwareClocks>,
    /// Whether each side got hardware stamps (testbed runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hardware_timestamping: Option<HardwareTimestamping>,
    /// The host the run measured on: cores, cpuidle, preemption, VM,
    /// clock source, CPU, kernel (every probe run; absent in reports
    /// written before rtprobe said).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) host: Option<HostFacts>,
    /// The run was stopped early (SIGINT/SIGTERM); absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) interrupted: bool,
    /// The probes' addresses (testbed runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ip: Option<IpReport>,
    /// Kernel counters that explain losses, over the run (testbed runs);
    /// null where the session sampled none (STAMP through the testbed).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    #[schemars(with = "Option<KernelDrops>")]
    pub(crate) kernel_drops: Option<Option<KernelDrops>>,
    /// What each knob applied, by knob name (the same as the run
    /// metadata's `knobs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) knobs: Option<AppliedKnobs>,
    /// Echoes that came after their probe was given up as lost.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) late_arrivals: Option<u64>,
    /// What the competing load (`--load`) achieved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) load: Option<LoadReport>,
    /// Loss split by direction (sessions with a reflector that counts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) loss_split: Option<LossSplit>,
    /// Probes whose one-way delay came out negative (clocks apart);
    /// absent when none did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) negative_one_way: Option<u64>,
    /// The output (CSV, HDR log...) that failed and stopped the run, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) output_error: Option<String>,
    /// The process's peak resident memory (VmHWM), KiB; null when
    /// /proc did not say.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    #[schemars(with = "Option<u64>")]
    pub(crate) peak_rss_kib: Option<Option<u64>>,
    /// Which reflector answered, and what it counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) reflector: Option<ReflectorReport>,
    /// Knobs or loads asked for that did not run, in words.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) skipped: Vec<String>,
    /// Heap bytes of one target's statistics in a run with several: its
    /// fixed histograms, allocated when the target starts and never more
    /// (the most any target held).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stats_bytes_per_target: Option<u64>,
    /// Per target, with several (`--target` repeated, `--targets FILE`);
    /// the top-level figures are then their total.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) targets: Vec<TargetSummary>,
}

impl RunReport {
    /// Nothing to say: `extra` is left out of the JSON.
    pub(crate) fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A key that is present with null is `Some(None)`, an absent one `None`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

/// The clock rule of a run: one clock (a testbed), or both clocks'
/// verdict (a session against a reflector on another host).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum ClockReport {
    Verdict(ClockVerdict),
    OneClock(OneClock),
}

impl ClockReport {
    /// What the summary says about the clocks, in words.
    pub(crate) fn note(&self) -> &str {
        match self {
            ClockReport::Verdict(v) => &v.note,
            ClockReport::OneClock(c) => &c.note,
        }
    }
}

/// Sender and receiver read the same clock: one-way is always shown.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct OneClock {
    pub(crate) note: String,
    pub(crate) one_way_shown: bool,
}

/// The one-way verdict from both clocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ClockVerdict {
    pub(crate) one_way_shown: bool,
    /// Sum of both maximum errors, when shown.
    pub(crate) bound_ns: Option<u64>,
    pub(crate) sender_synchronized: bool,
    pub(crate) sender_max_error_ns: u64,
    pub(crate) reflector_synchronized: Option<bool>,
    pub(crate) reflector_error_ns: Option<u64>,
    pub(crate) note: String,
}

/// How `--out-rotate` rotated the CSV.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct CsvRotation {
    /// Rotated files kept (`--out-keep`).
    pub(crate) keep: u32,
    /// When a new file was started, as given.
    pub(crate) when: String,
}

/// One target of a run with several (`--target` repeated, `--targets
/// FILE`), and its own summary (loss split, reflector, clock verdict in
/// its `extra`). The run's top-level figures are the total over them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct TargetSummary {
    /// Its name: the CSV's `target` cell and the metrics' `target` label.
    pub(crate) name: String,
    /// HOST:PORT probed.
    pub(crate) address: String,
    pub(crate) protocol: String,
    pub(crate) interval_ns: u64,
    pub(crate) size: usize,
    pub(crate) tos: u8,
    /// The labels the targets file gave it (its metrics carry them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) labels: BTreeMap<String, String>,
    /// Times it failed to open (its name did not resolve, socket or
    /// connect failed); it was tried again each time. 0: it never failed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) errors: u64,
    /// The last failure's cause; absent when it never failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_error: Option<String>,
    pub(crate) summary: Summary,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One probe flow of a run with `--flow`, and its own summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct FlowSummary {
    pub(crate) flow: u8,
    pub(crate) interval_ns: u64,
    pub(crate) port: u16,
    pub(crate) size: usize,
    pub(crate) summary: Summary,
    pub(crate) tos: u8,
}

/// The PHC of each side's NIC, where the side had hardware stamps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct HardwareClocks {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) receiver: Option<HardwareClock>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) sender: Option<HardwareClock>,
}

/// A NIC's PHC sampled against the system clock, or why its hardware
/// stamps were left out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum HardwareClock {
    Failed { error: String },
    Sampled(SampledClock),
}

/// A PHC that was sampled over the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct SampledClock {
    #[serde(flatten)]
    pub(crate) phc: PhcReport,
    /// Reads of the PHC that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) read_errors: Option<u64>,
    /// The last of them, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) last_read_error: Option<String>,
}

/// How the PHC related to CLOCK_REALTIME over a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct PhcReport {
    /// N of /dev/ptpN, as set by the caller.
    pub(crate) phc_index: Option<u32>,
    /// Batches that gave an offset (one kept per batch).
    pub(crate) samples: u64,
    /// Batches with no usable sample: clocks going backwards in a read, or
    /// every read window wider than the step threshold (a preempted read).
    pub(crate) rejected_batches: u64,
    /// Read windows of the kept samples: the offset, hence every converted
    /// stamp, is known to ± half of this.
    pub(crate) read_window_max_ns: Option<u64>,
    /// Median of the same, to the histogram's 3 significant digits.
    pub(crate) read_window_median_ns: Option<u64>,
    /// Slope of the offset against PHC time, fitted within segments so
    /// steps do not count: positive when the PHC runs slow relative to
    /// CLOCK_REALTIME. None with fewer than two samples in any segment.
    pub(crate) drift_ppb: Option<f64>,
    /// Steps of one clock against the other.
    pub(crate) steps: u64,
}

/// Whether each side's stamps came from its NIC.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct HardwareTimestamping {
    pub(crate) receiver: bool,
    pub(crate) sender: bool,
}

/// The probes' address family and addresses.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct IpReport {
    pub(crate) receiver: String,
    pub(crate) sender: String,
    /// 4 or 6.
    pub(crate) version: u8,
}

/// Kernel drop counters over the run; null where a counter could not be
/// read (unknown is never 0).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct KernelDrops {
    /// Packets the host's backlog (softnet) dropped; host-wide.
    pub(crate) host_backlog_drops: Option<u64>,
    pub(crate) receiver_in_errors: Option<u64>,
    pub(crate) receiver_rcvbuf_errors: Option<u64>,
    pub(crate) sender_in_errors: Option<u64>,
    pub(crate) sender_rcvbuf_errors: Option<u64>,
    pub(crate) sender_sndbuf_errors: Option<u64>,
}

/// Loss split by direction, as far as the reflector told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct LossSplit {
    /// Probes that never reached the reflector.
    pub(crate) forward: Option<u64>,
    /// Probes the reflector received whose echo did not come back.
    pub(crate) r#return: Option<u64>,
    /// Lost probes of which the direction is not known.
    pub(crate) unknown: u64,
    /// How the split was made, in words.
    pub(crate) basis: String,
}

/// Which reflector answered the probes and what it said.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct ReflectorReport {
    /// STAMP: whether the session was authenticated (HMAC-SHA-256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) authenticated: Option<bool>,
    /// What the testbed's reflector counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) counters: Option<ReflectorCounts>,
    /// Echoes received (sessions against a reflector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) echoes: Option<u64>,
    /// "kernel" (XDP), "user" or "remote".
    pub(crate) kind: String,
    /// Why this reflector and not the other, or what it cannot tell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) note: Option<String>,
    /// "rtprobe" or "stamp" (sessions against a reflector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) protocol: Option<String>,
    /// The in-kernel reflector's rate limit, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) rate_limit: Option<String>,
    /// STAMP: the TTL (hop limit) the probes arrived with, null when no
    /// echo said.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[schemars(with = "Option<u8>")]
    pub(crate) sender_ttl_max: Option<Option<u8>>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "present"
    )]
    #[schemars(with = "Option<u8>")]
    pub(crate) sender_ttl_min: Option<Option<u8>>,
    /// rtprobe protocol: the session id, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) session: Option<String>,
    /// STAMP: the session sender identifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ssid: Option<u16>,
    /// The reflector's address (sessions against a reflector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) target: Option<String>,
    /// The in-kernel reflector's XDP mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) xdp_mode: Option<String>,
}

impl ReflectorReport {
    /// A reflector of `kind` with nothing more said.
    pub(crate) fn of_kind(kind: &str) -> Self {
        Self {
            kind: kind.into(),
            ..Default::default()
        }
    }
}

/// The counters of the testbed's reflector: the in-kernel one's per
/// outcome, or the user-space one's by datagram.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub(crate) enum ReflectorCounts {
    User(ReflectorCounters),
    Kernel(XdpCounters),
}

/// What rtprobe's user-space reflector did, by datagram.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReflectorCounters {
    /// Datagrams received (= reflected + not_for_us + bad_source +
    /// malformed + rate_limited + global_limited + peer_rate_limited +
    /// peer_global_limited + auth_failed).
    pub datagrams: u64,
    pub(crate) sessions: u64,
    pub reflected: u64,
    /// Of `reflected`: replies to known peers (`--peer`, `--peers`).
    #[serde(default)]
    pub peer_reflected: u64,
    /// Sent to a broadcast or multicast destination.
    pub(crate) not_for_us: u64,
    /// From a source no single host can have (or loopback from outside).
    pub(crate) bad_source: u64,
    pub malformed: u64,
    /// Over their source's `--rate-limit`.
    pub rate_limited: u64,
    /// Over `--global-rate-limit` (every source but the known peers).
    #[serde(default)]
    pub global_limited: u64,
    /// A known peer's, over its own `--rate-limit`.
    #[serde(default)]
    pub peer_rate_limited: u64,
    /// A known peer's, over `--peers-rate-limit` (all known peers together).
    #[serde(default)]
    pub peer_global_limited: u64,
    pub auth_failed: u64,
    /// Sessions forgotten to make room in a full table.
    pub(crate) sessions_evicted: u64,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    /// Replies the kernel refused to send.
    pub(crate) send_errors: u64,
    /// Receive calls that failed (other than "nothing to read"); the
    /// reflector logs them and goes on.
    pub(crate) recv_errors: u64,
}

/// What one flow did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct FlowReport {
    /// "tcp" or "udp".
    pub(crate) kind: String,
    /// The `--load` entry it came from.
    pub(crate) spec: String,
    pub(crate) port: u16,
    pub(crate) cc: Option<String>,
    /// Pacing rate (TCP) or offered payload rate (UDP); None = unpaced.
    pub(crate) target_bps: Option<u64>,
    /// Payload bits per second that got through in the measuring window
    /// (after the warm-up). UDP: the window's datagrams received, over
    /// their first to last arrival. TCP: bytes acknowledged to the sender
    /// over the window (bytes read by the receiver if TCP_INFO lacks them).
    pub(crate) achieved_bps: f64,
    /// Payload bytes received in the window (UDP: of the window's
    /// datagrams, duplicates once; TCP: read by the receiver).
    pub(crate) bytes: u64,
    /// The window's length: mark to stop (UDP: first to last send of the
    /// window's datagrams).
    pub(crate) seconds: f64,
    /// UDP: datagrams sent in the window, those of them received (each
    /// once, also if they arrived after the sender stopped), loss %.
    pub(crate) sent_packets: Option<u64>,
    pub(crate) received_packets: Option<u64>,
    pub(crate) loss_pct: Option<f64>,
    /// UDP: the loss the shaped link must cause (66 B overhead per datagram).
    pub(crate) expected_loss_pct: Option<f64>,
    /// UDP: payload rate offered over the sender's window.
    pub(crate) offered_bps: Option<f64>,
    /// UDP: sent_packets - received_packets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) lost_packets: Option<u64>,
    /// UDP: copies of a datagram already received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) duplicate_packets: Option<u64>,
    /// UDP: datagrams that arrived after one with a higher sequence number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) reordered_packets: Option<u64>,
    /// UDP: first to last arrival of the window's datagrams, the span
    /// achieved_bps is measured over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) receive_seconds: Option<f64>,
    /// UDP: of lost_packets, those the receiver's own socket dropped
    /// (receive buffer full, SO_RXQ_OVFL): not the link's doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) socket_drops: Option<u64>,
    /// UDP: furthest behind its schedule the sender sent a datagram of the
    /// window, ms. Above the queue's drain time (12 ms for 100 full frames
    /// at 100 Mbit/s) the link idled and the loss exceeds the calculation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_send_lag_ms: Option<f64>,
    /// UDP: the sender ran SCHED_FIFO for the whole window (false: it was
    /// not allowed to, or fell too far behind; see max_send_lag_ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sender_sched_fifo: Option<bool>,
    /// TCP: bytes acknowledged to the sender in the window (tcpi_bytes_acked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) acked_bytes: Option<u64>,
    /// TCP: the receiver's rate, bytes / seconds (achieved_bps is the
    /// acknowledged rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) received_bps: Option<f64>,
    /// Fetch: completion times of the window's fetches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fetch: Option<FetchTimes>,
}

/// The competing load of one run (`--load`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct LoadReport {
    pub(crate) flows: Vec<FlowReport>,
    /// Sum of achieved_bps over all flows.
    pub(crate) total_achieved_bps: f64,
    /// The kernel's count of the same window at the bottleneck's root
    /// qdisc (None: no qdisc there to ask).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) bottleneck: Option<QueueWindow>,
}

/// What the bottleneck's root qdisc counted from the load's mark to the
/// senders' stop: the kernel's witness of the loss and of the rate the
/// shaper delivered. It counts every packet through the qdisc, the
/// probes' among them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct QueueWindow {
    pub(crate) dev: String,
    /// The root qdisc's kind and handle, e.g. "htb 1:".
    pub(crate) qdisc: String,
    pub(crate) seconds: f64,
    /// Packets and bytes the qdisc handed to the device (frames from the
    /// Ethernet header on, as the kernel counts them).
    pub(crate) sent_packets: u64,
    pub(crate) sent_bytes: u64,
    /// Packets the qdisc (or a qdisc below it) dropped.
    pub(crate) dropped_packets: u64,
    /// sent_bytes over the window, bits per second.
    pub(crate) delivered_bps: f64,
    /// dropped / (dropped + sent), %.
    pub(crate) drop_pct: f64,
}

/// What `FetchStats` reports, seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct FetchTimes {
    /// Bytes per fetch.
    pub(crate) size_bytes: u64,
    /// Fetches completed in the window.
    pub(crate) count: u64,
    /// Fetches that timed out or failed (refused, reset).
    pub(crate) failures: u64,
    pub(crate) mean_s: Option<f64>,
    /// Sample standard deviation (n - 1); None below two fetches.
    pub(crate) sd_s: Option<f64>,
    pub(crate) min_s: Option<f64>,
    pub(crate) p50_s: Option<f64>,
    pub(crate) p90_s: Option<f64>,
    pub(crate) p99_s: Option<f64>,
    pub(crate) max_s: Option<f64>,
}

/// The JSON Schema of the run summary (`--json`), as checked in at
/// docs/run-report.schema.json: every object closed
/// (`additionalProperties: false`) so that a field renamed or added
/// without the schema fails the check.
#[cfg(test)]
pub(crate) fn run_report_schema() -> serde_json::Value {
    closed_schema_of::<Summary>()
}

/// The JSON Schema of `T` (draft 2020-12), every object closed as in
/// [`run_report_schema`].
#[cfg(test)]
pub(crate) fn closed_schema_of<T: schemars::JsonSchema>() -> serde_json::Value {
    let mut settings = schemars::generate::SchemaSettings::draft2020_12();
    settings.meta_schema = Some("https://json-schema.org/draft/2020-12/schema".into());
    let schema = settings.into_generator().into_root_schema_for::<T>();
    let mut v = schema.to_value();
    close_objects(&mut v);
    v
}

/// Sets `additionalProperties: false` on every object schema that lists
/// its properties and says nothing about others (maps such as the XDP
/// counters say what their values are and stay open to any key).
#[cfg(test)]
fn close_objects(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(o) => {
            if o.contains_key("properties") && !o.contains_key("additionalProperties") {
                o.insert("additionalProperties".into(), false.into());
            }
            for (_, x) in o.iter_mut() {
                close_objects(x);
            }
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(close_objects),
        _ => {}
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
