//! Knobs: everything a run changes in the kernel besides the testbed
//! itself, one file per knob, each applied in the right namespace, each
//! returning a guard that puts the previous state back (on `restore()` or
//! drop) and records what it applied for the run metadata.
//!
//! Where the knobs act. The study shaped and queued on the sender's NIC:
//! probes and the competing TCP flow share the sender's egress queue, and
//! that queue is what the qdisc, BQL and TSQ change. So the bottleneck is
//! `testbed.sender_if` in the sender namespace by default; `bottleneck =
//! router` moves shaping/qdisc/BQL/txqueuelen/ring to the router's egress
//! toward the receiver (`router_out`), which behaves like a switch port
//! (the sender's socket is no longer charged for the queued packets). XDP
//! in redirect mode transmits straight from the router's ingress and skips
//! router_out's qdisc, so that combination is refused by the scenario
//! layer. TSQ is a property of the sending TCP stack and is always set in
//! the sender namespace.
//!
//! Packet counts: TCP hands the qdisc GSO super-packets (up to 64 KiB) and
//! they are cut into frames only after the qdisc, so a packet limit at the
//! sender's own qdisc counts super-packets. Limit that queue in bytes, or
//! put the bottleneck at the router with `gso = false` (frames leave the
//! sender cut to the MTU) for a queue of wire frames (see `gso`).
//!
//! Order of application (reverse on restore): txqueuelen (read by qdiscs
//! when created), segmentation offload (sender), TX ring, BQL, the qdisc tree (shaper + qdisc), TSQ, CPU
//! stress, then the competing load, which runs a warm-up before the
//! probes start so TCP is in its steady state.
//!
//! A missing qdisc fails the run unless `missing = skip`; then the run
//! goes on without it and the metadata's `skipped` list says so. Device
//! knobs a driver cannot do (BQL or TX ring on veth) are reported under
//! `unsupported` unless `device_unsupported = fail`.
//!
//! Kernel interface: only through the knob modules (tc/rtnetlink, sysfs,
//! /proc/sys, SIOCETHTOOL, sockets, sched_*), each of which names its own
//! interface and minimum version; together Linux >= 4.15.

pub(crate) mod amounts;
mod apply;
mod at;
pub(crate) mod bql;
pub(crate) mod gso;
mod knob_spec;
pub(crate) mod load;
pub(crate) mod qdisc;
pub(crate) mod ring;
pub(crate) mod sampler;
pub(crate) mod shaping;
pub(crate) mod stress;
#[cfg(test)]
mod sysfs;
pub(crate) mod tc;
pub(crate) mod tsq;
pub(crate) mod txqueuelen;

#[cfg(test)]
mod root_tests;
#[cfg(test)]
mod sys_tests;
#[cfg(test)]
pub(crate) mod testutil;

use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

pub(crate) use self::{
    amounts::{Bytes, CpuDmaLatency, QueueLimit, Rate},
    at::At,
    knob_spec::KnobSpec,
    load::{FetchTimes, LoadReport, LoadSpec},
    qdisc::QdiscSpec,
    shaping::{ShaperKind, Shaping},
    stress::StressTool,
};
use crate::{model::knobs::AppliedKnobs, sys::rt::RtSettings};
#[cfg(test)]
use apply::decide_qdisc;
pub(crate) use apply::{Applied, apply};

/// A knob that is in effect and can be undone.
pub(crate) trait KnobGuard: Send {
    /// Key in the run metadata, and the knob's name in messages.
    fn name(&self) -> &'static str;
    /// Puts what was applied into its field of RunMeta.knobs.
    fn record(&self, into: &mut AppliedKnobs);
    /// Puts the previous state back. Idempotent.
    fn restore(&mut self) -> Result<()>;
}

/// A device knob either applies or the device cannot do it.
pub(crate) enum Outcome<G> {
    Applied(G),
    Unsupported(String),
}

/// Where shaping, qdisc, BQL, txqueuelen and TX ring act.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Bottleneck {
    /// The sender's interface, in the sender namespace (the study's choice).
    #[default]
    Sender,
    /// The router's interface toward the receiver (veth testbed only).
    Router,
}

impl Bottleneck {
    /// Its serde word, for the run metadata.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Bottleneck::Sender => "sender",
            Bottleneck::Router => "router",
        }
    }
}

/// What to do when the kernel lacks a requested qdisc.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum MissingPolicy {
    /// Stop with an error before anything is changed.
    #[default]
    Fail,
    /// Run without it; the metadata and the summary say it was skipped.
    Skip,
}

/// What to do when the device cannot do a knob (BQL, TX ring on veth).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum DevicePolicy {
    /// Record "unsupported" with the reason and go on.
    #[default]
    Report,
    /// Stop with an error.
    Fail,
}

/// `FromStr` of the knobs' word enums: the words their serde names give
/// (the same in TOML and on the command line).
macro_rules! from_str_via_serde {
    ($($t:ty),+) => {$(
        impl std::str::FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                use serde::de::{IntoDeserializer, value::Error};
                let d: serde::de::value::StrDeserializer<'_, Error> = s.trim().into_deserializer();
                <$t>::deserialize(d).map_err(|e| e.to_string())
            }
        }
    )+};
}

from_str_via_serde!(
    Bottleneck,
    MissingPolicy,
    DevicePolicy,
    ShaperKind,
    StressTool
);

/// What the knobs need to know about the probe flow: the port for the
/// priority filters, size and interval for the probe class rate.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProbeContext {
    pub(crate) port: u16,
    /// UDP payload bytes.
    pub(crate) size: usize,
    pub(crate) interval: Duration,
    /// The probes go over IPv6 (`--ip 6`): a 40-byte IP header, not 20.
    pub(crate) ipv6: bool,
}

impl Default for ProbeContext {
    fn default() -> Self {
        // The probe CLI's defaults.
        Self {
            port: 5061,
            size: 64,
            interval: Duration::from_millis(1),
            ipv6: false,
        }
    }
}

impl ProbeContext {
    /// Bits per second the probe flow puts on an Ethernet wire.
    pub(crate) fn wire_rate(&self, overhead_bytes: u32) -> Rate {
        let ip_extra = if self.ipv6 {
            shaping::IPV6_EXTRA_HEADER_BYTES
        } else {
            0
        };
        let per_pkt = self.size as u64
            + (shaping::UDP_IPV4_ETH_HEADERS + ip_extra) as u64
            + overhead_bytes as u64;
        let secs = self.interval.as_secs_f64().max(1e-9);
        Rate::from_bps((per_pkt as f64 * 8.0 / secs).round() as u64)
    }
}

/// Default warm-up between starting the load and starting the probes.
pub(crate) const DEFAULT_LOAD_WARMUP: Duration = Duration::from_secs(1);

/// The knobs of one run: the option model's [`KnobSpec`] as asked for
/// (the command line's flags or a scenario's merged `[knobs]` and
/// `[set.NAME]`), checked by [`Knobs::validate`], plus what the runner
/// knows about the probe flow. Its fields are the spec's (through
/// `Deref`): a knob is declared once, in `KnobSpec` (its flag in
/// `options::KnobArgs`). Every field is
/// optional; the accessors give the defaults.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "KnobSpec", into = "KnobSpec")]
pub(crate) struct Knobs {
    spec: KnobSpec,
    /// Not from the user: set by the runner from the probe options.
    pub(crate) probe: ProbeContext,
}

impl From<KnobSpec> for Knobs {
    fn from(spec: KnobSpec) -> Self {
        Self {
            spec,
            probe: ProbeContext::default(),
        }
    }
}

impl From<Knobs> for KnobSpec {
    fn from(k: Knobs) -> Self {
        k.spec
    }
}

impl std::ops::Deref for Knobs {
    type Target = KnobSpec;
    fn deref(&self) -> &KnobSpec {
        &self.spec
    }
}

impl std::ops::DerefMut for Knobs {
    fn deref_mut(&mut self) -> &mut KnobSpec {
        &mut self.spec
    }
}

/// A knob setting that cannot work, with the key to blame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KnobError {
    pub(crate) key: &'static str,
    pub(crate) message: String,
}

impl std::fmt::Display for KnobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

impl std::error::Error for KnobError {}

fn knob_err(key: &'static str, message: String) -> Result<(), KnobError> {
    Err(KnobError { key, message })
}

impl Knobs {
    /// Tells the knobs about the probe flow (port for filters, rate for
    /// the probe class). The runner calls this before `apply`.
    pub(crate) fn set_probe(&mut self, port: u16, size: usize, interval: Duration) {
        self.probe = ProbeContext {
            port,
            size,
            interval,
            ipv6: false,
        };
    }

    pub(crate) fn bottleneck(&self) -> Bottleneck {
        self.bottleneck.unwrap_or_default()
    }

    pub(crate) fn missing(&self) -> MissingPolicy {
        self.missing.unwrap_or_default()
    }

    pub(crate) fn device_unsupported(&self) -> DevicePolicy {
        self.device_unsupported.unwrap_or_default()
    }

    pub(crate) fn loads(&self) -> &[LoadSpec] {
        self.load.as_deref().unwrap_or(&[])
    }

    pub(crate) fn overhead_bytes(&self) -> u32 {
        self.wire_overhead.unwrap_or(shaping::DEFAULT_WIRE_OVERHEAD)
    }

    pub(crate) fn shaping(&self) -> Option<Shaping> {
        self.link_rate.map(|rate| Shaping {
            rate,
            shaper: self.shaper.unwrap_or_default(),
            queue_limit: self.queue_limit,
            burst: self.burst,
            overhead_bytes: self.overhead_bytes(),
        })
    }

    pub(crate) fn rt(&self) -> RtSettings {
        RtSettings {
            fifo_priority: self.rt_priority,
            mlockall: self.mlockall.unwrap_or(false),
            cpu: self.pin_cpu,
            // As cyclictest does: a real-time sender on a CPU that halts
            // when idle waits for the halt's exit (on a VM, for the host).
            cpu_dma_latency_us: match (self.cpu_dma_latency, self.rt_priority) {
                (Some(CpuDmaLatency::Us(us)), _) => Some(us),
                (None, Some(_)) => Some(0),
                (Some(CpuDmaLatency::Off), _) | (None, None) => None,
            },
            cpu_dma_latency_explicit: self.cpu_dma_latency.is_some(),
        }
    }

    /// Does this set change anything at all?
    pub(crate) fn is_empty(&self) -> bool {
        self.spec == KnobSpec::default()
    }

    /// Cross-field checks that need no system access.
    pub(crate) fn validate(&self) -> Result<(), KnobError> {
        self.validate_shaping()?;
        self.validate_device_limits()?;
        self.validate_stress()?;
        self.validate_load()?;
        self.validate_bottleneck()?;
        self.rt().validate().or_else(|m| {
            knob_err(
                if m.contains("CPU") {
                    "pin_cpu"
                } else {
                    "rt_priority"
                },
                m,
            )
        })
    }

    /// Shaping keys need a link rate, and the shaper's FIFO limit cannot
    /// apply when a qdisc is the leaf.
    fn validate_shaping(&self) -> Result<(), KnobError> {
        if self.link_rate.is_none() {
            for (key, set) in [
                ("shaper", self.shaper.is_some()),
                ("queue_limit", self.queue_limit.is_some()),
                ("burst", self.burst.is_some()),
                ("wire_overhead", self.wire_overhead.is_some()),
            ] {
                if set {
                    return knob_err(
                        key,
                        format!(
                            "{key} belongs to link shaping: set link_rate too (without shaping, \
                             put a limit on the qdisc, e.g. qdisc = \"pfifo,limit=20\")"
                        ),
                    );
                }
            }
        }
        if self.queue_limit.is_some()
            && let Some(q) = &self.qdisc
        {
            return knob_err(
                "queue_limit",
                format!(
                    "queue_limit sizes the shaper's FIFO, but qdisc {} is the leaf here: \
                     give {} its own limit instead",
                    q.kind(),
                    q.kind()
                ),
            );
        }
        if self.wire_overhead.is_some_and(|o| o > 1000) {
            return knob_err("wire_overhead", "at most 1000 bytes per frame".into());
        }
        Ok(())
    }

    /// Ranges of the device and socket knobs the kernel would refuse.
    fn validate_device_limits(&self) -> Result<(), KnobError> {
        if self
            .bql_limit_max
            .is_some_and(|b| b.0 == 0 || b.0 > 1 << 30)
        {
            return knob_err("bql_limit_max", "must be 1 byte to 1GiB".into());
        }
        if self.tsq.is_some_and(|b| b.0 == 0 || b.0 > i32::MAX as u64) {
            return knob_err("tsq", "must be 1 byte to 2GiB".into());
        }
        if self.txqueuelen == Some(0) {
            return knob_err("txqueuelen", "must be at least 1 packet".into());
        }
        if self.tx_ring == Some(0) {
            return knob_err("tx_ring", "must be at least 1 descriptor".into());
        }
        Ok(())
    }

    fn validate_stress(&self) -> Result<(), KnobError> {
        if self.stress_tool.is_some() && self.stress.is_none() {
            return knob_err("stress_tool", "set stress = N (workers) too".into());
        }
        if self.stress.is_some_and(|n| n == 0 || n > 1024) {
            return knob_err("stress", "workers must be 1 to 1024".into());
        }
        Ok(())
    }

    /// The competing load and the queue sampler that watches it: warm-up,
    /// sampling interval, flow count and distinct ports.
    fn validate_load(&self) -> Result<(), KnobError> {
        if self.load_warmup.is_some() && self.loads().is_empty() {
            return knob_err("load_warmup", "there is no load to warm up".into());
        }
        if self
            .queue_sample
            .is_some_and(|d| d < Duration::from_millis(1))
        {
            return knob_err("queue_sample", "sample at most every 1ms".into());
        }
        let flows: u32 = self.loads().iter().map(LoadSpec::flows).sum();
        if flows > load::MAX_FLOWS {
            return knob_err(
                "load",
                format!("{flows} flows; at most {}", load::MAX_FLOWS),
            );
        }
        let mut ports = std::collections::HashSet::new();
        for l in self.loads() {
            if let Some(p) = l.port()
                && !ports.insert(p)
            {
                return knob_err("load", format!("port {p} is used by two load entries"));
            }
        }
        Ok(())
    }

    /// `bottleneck = router` only means something with a knob to move there.
    fn validate_bottleneck(&self) -> Result<(), KnobError> {
        if self.bottleneck() == Bottleneck::Router
            && self.link_rate.is_none()
            && self.qdisc.is_none()
            && self.bql_limit_max.is_none()
            && self.txqueuelen.is_none()
            && self.tx_ring.is_none()
        {
            return knob_err(
                "bottleneck",
                "bottleneck = router moves shaping/qdisc/BQL/txqueuelen/ring, but none is set"
                    .into(),
            );
        }
        Ok(())
    }

    /// Checks against the probe flow (set by `set_probe`).
    pub(crate) fn validate_with_probe(&self) -> Result<(), KnobError> {
        self.validate()?;
        let mut next = load::DEFAULT_LOAD_PORT;
        for l in self.loads() {
            let p = l.port().unwrap_or_else(|| {
                next += 1;
                next - 1
            });
            if p == self.probe.port {
                return Err(KnobError {
                    key: "load",
                    message: format!(
                        "load {l} uses port {p}, the probe port: give it another (port=...)"
                    ),
                });
            }
        }
        Ok(())
    }

    /// One line for reports: the knobs that are set, in TOML-ish words.
    pub(crate) fn describe(&self) -> String {
        let mut k = self.clone();
        k.probe = ProbeContext::default();
        match serde_json::to_value(&k) {
            Ok(serde_json::Value::Object(m)) => {
                let parts: Vec<String> = m
                    .iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| match v {
                        serde_json::Value::String(s) => format!("{k}={s}"),
                        serde_json::Value::Array(a) => format!(
                            "{k}=[{}]",
                            a.iter()
                                .map(|x| x.as_str().map(str::to_string).unwrap_or(x.to_string()))
                                .collect::<Vec<_>>()
                                .join(" ")
                        ),
                        v => format!("{k}={v}"),
                    })
                    .collect();
                if parts.is_empty() {
                    "(none)".into()
                } else {
                    parts.join(", ")
                }
            }
            _ => "(none)".into(),
        }
    }
}

/// `on`/`off` (and true/false, 1/0) for switch flags.
pub(crate) fn parse_on_off(s: &str) -> Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        _ => Err(format!("invalid switch {s:?}: expected on or off")),
    }
}

#[cfg(test)]
mod tests;
