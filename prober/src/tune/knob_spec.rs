//! Kernel knobs applied for a run and restored afterwards, as the option
//! model asks for them: the command line's knob flags (the option model's
//! `KnobArgs`, whose help documents each knob), a scenario's
//! `[knobs]` table and each `[set.NAME]`. A knob is one field here, named
//! as its TOML key and (in kebab case) its flag; [`Knobs`](super::Knobs)
//! is this spec checked, and the rest of `tune` applies it. Every field is
//! optional: not given lets a lower layer of the merge show through.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{
    Bottleneck, Bytes, CpuDmaLatency, DevicePolicy, LoadSpec, MissingPolicy, QdiscSpec, QueueLimit,
    Rate, ShaperKind, StressTool,
};
use crate::model::units::humane_duration;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KnobSpec {
    /// Where shaping, qdisc, BQL, txqueuelen and TX ring act.
    pub(crate) bottleneck: Option<Bottleneck>,
    /// Shaper rate at the bottleneck.
    pub(crate) link_rate: Option<Rate>,
    /// Shaper qdisc for `link_rate`.
    pub(crate) shaper: Option<ShaperKind>,
    /// Queue behind the shaper, in packets or bytes.
    pub(crate) queue_limit: Option<QueueLimit>,
    /// Shaper bucket.
    pub(crate) burst: Option<Bytes>,
    /// Bytes the shaper adds per frame for what a wire carries.
    pub(crate) wire_overhead: Option<u32>,
    /// qdisc on the bottleneck (under the shaper if shaped).
    pub(crate) qdisc: Option<QdiscSpec>,
    /// What to do if the kernel lacks the qdisc.
    pub(crate) missing: Option<MissingPolicy>,
    /// BQL limit_max of every TX queue of the bottleneck.
    pub(crate) bql_limit_max: Option<Bytes>,
    /// net.ipv4.tcp_limit_output_bytes in the sender namespace.
    pub(crate) tsq: Option<Bytes>,
    pub(crate) txqueuelen: Option<u32>,
    /// TX ring size of the bottleneck NIC, in descriptors.
    pub(crate) tx_ring: Option<u32>,
    /// TSO+GSO on the sender's interface.
    pub(crate) gso: Option<bool>,
    /// What to do if the device cannot do a knob.
    pub(crate) device_unsupported: Option<DevicePolicy>,
    /// Competing load flows.
    pub(crate) load: Option<Vec<LoadSpec>>,
    /// Time the load runs before the probes start.
    #[serde(default, with = "humane_duration::option")]
    pub(crate) load_warmup: Option<Duration>,
    /// CPU stress workers.
    pub(crate) stress: Option<u32>,
    pub(crate) stress_tool: Option<StressTool>,
    /// SCHED_FIFO priority of the probe sender (1-99).
    pub(crate) rt_priority: Option<u8>,
    pub(crate) mlockall: Option<bool>,
    pub(crate) pin_cpu: Option<usize>,
    /// The /dev/cpu_dma_latency limit held while probing.
    pub(crate) cpu_dma_latency: Option<CpuDmaLatency>,
    /// Period of the bottleneck's qdisc backlog samples.
    #[serde(default, with = "humane_duration::option")]
    pub(crate) queue_sample: Option<Duration>,
}
