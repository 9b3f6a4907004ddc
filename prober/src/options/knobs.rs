//! The knob flags of the probe command and of `rtprobe run`: the clap
//! side of [`KnobSpec`], which stays a plain (serde) struct in `tune` so
//! that the domain never sees clap. One field per knob, the same names;
//! [`From`] moves them over, and its exhaustive destructuring makes a
//! knob added to one struct and not the other a compile error.

use std::time::Duration;

use crate::{
    model::units,
    tune::{
        self, Bottleneck, Bytes, CpuDmaLatency, DevicePolicy, KnobSpec, LoadSpec, MissingPolicy,
        QdiscSpec, QueueLimit, Rate, ShaperKind, StressTool,
    },
};

/// The knob flags; each help line is the knob's documentation.
#[derive(Debug, Clone, Default, PartialEq, clap::Args)]
#[command(next_help_heading = "Knobs (applied for the run, restored afterwards)")]
pub(crate) struct KnobArgs {
    /// Where shaping/qdisc/BQL/txqueuelen/TX ring act: the sender's interface or the router's
    /// egress toward the receiver.
    #[arg(long, value_enum)]
    pub(crate) bottleneck: Option<Bottleneck>,

    /// Shape the bottleneck to this rate so it queues like a real link, e.g. 100mbit.
    #[arg(long)]
    pub(crate) link_rate: Option<Rate>,

    /// Shaper qdisc for --link-rate.
    #[arg(long, value_enum)]
    pub(crate) shaper: Option<ShaperKind>,

    /// Queue behind the shaper: packets (20, 20p) or bytes (64KiB) [default: txqueuelen packets].
    /// At the sender a TCP GSO packet (up to 64 KiB) counts as one: prefer bytes there.
    #[arg(long)]
    pub(crate) queue_limit: Option<QueueLimit>,

    /// Shaper bucket in bytes [default: 1 ms at the link rate, at least 2 frames].
    #[arg(long)]
    pub(crate) burst: Option<Bytes>,

    /// Bytes the shaper adds per frame for what a wire carries (FCS, preamble, gap) [default: 24].
    #[arg(long)]
    pub(crate) wire_overhead: Option<u32>,

    /// qdisc on the bottleneck (under the shaper if shaped): pfifo_fast, pfifo, bfifo, prio,
    /// fq_codel, htb, htb-prio (strict priority for the probe flow), hfsc, tbf; a bare name
    /// is the study's preset, override with KIND,key=value (e.g. fq_codel,target=5ms).
    #[arg(long)]
    pub(crate) qdisc: Option<QdiscSpec>,

    /// If the kernel lacks the qdisc: fail, or skip it (the summary says so). With `rtprobe
    /// run` it overrides every set's policy.
    #[arg(long, value_enum)]
    pub(crate) missing: Option<MissingPolicy>,

    /// BQL limit_max of every TX queue of the bottleneck, in bytes (the study: 3000).
    #[arg(long)]
    pub(crate) bql_limit_max: Option<Bytes>,

    /// TCP small queues: net.ipv4.tcp_limit_output_bytes in the sender namespace (e.g. 64KiB).
    #[arg(long)]
    pub(crate) tsq: Option<Bytes>,

    /// txqueuelen of the bottleneck interface, in packets.
    #[arg(long)]
    pub(crate) txqueuelen: Option<u32>,

    /// TX ring size of the bottleneck NIC (ethtool -G tx).
    #[arg(long)]
    pub(crate) tx_ring: Option<u32>,

    /// TSO+GSO on the sender's interface: off sends MTU-size frames, so a queue at the router
    /// (--bottleneck router) counts wire frames. TCP queues 64 KiB GSO packets at the sender's
    /// own qdisc either way: limit that queue in bytes.
    #[arg(long, value_parser = tune::parse_on_off, value_name = "on|off")]
    pub(crate) gso: Option<bool>,

    /// If the device cannot do a knob (BQL or TX ring on veth): report it, or fail.
    #[arg(long, value_enum)]
    pub(crate) device_unsupported: Option<DevicePolicy>,

    /// Competing load, repeatable: tcp[:50%|:40mbit][,cc=bbr][,flows=N],
    /// udp:150%|150mbit[,size=1470] or fetch[:100KiB][,every=1s][,cc=reno] (page fetches timed).
    #[arg(long = "load")]
    pub(crate) load: Option<Vec<LoadSpec>>,

    /// Time the load runs before the probes start [default: 1s].
    #[arg(long, value_parser = units::parse_duration)]
    pub(crate) load_warmup: Option<Duration>,

    /// CPU stress workers (the study: 8).
    #[arg(long)]
    pub(crate) stress: Option<u32>,

    /// CPU stress implementation.
    #[arg(long, value_enum)]
    pub(crate) stress_tool: Option<StressTool>,

    /// Run the probe sender SCHED_FIFO at this priority (1-99).
    #[arg(long)]
    pub(crate) rt_priority: Option<u8>,

    /// Lock the process's memory (mlockall) while probing.
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub(crate) mlockall: Option<bool>,

    /// Pin the probe sender to this CPU.
    #[arg(long)]
    pub(crate) pin_cpu: Option<usize>,

    /// Hold this CPU idle-latency limit (µs, /dev/cpu_dma_latency) while probing, or off; 0 keeps
    /// the CPUs out of idle states that halt (on a VM, halting hands the vCPU back to the host),
    /// at the price of idle CPUs polling instead of sleeping [default: 0 with --rt-priority, as
    /// cyclictest does; else off].
    #[arg(long)]
    pub(crate) cpu_dma_latency: Option<CpuDmaLatency>,

    /// Sample the bottleneck's qdisc backlog/qlen this often into a CSV next to the run.
    #[arg(long, value_parser = units::parse_duration)]
    pub(crate) queue_sample: Option<Duration>,
}

impl From<KnobArgs> for KnobSpec {
    fn from(a: KnobArgs) -> Self {
        let KnobArgs {
            bottleneck,
            link_rate,
            shaper,
            queue_limit,
            burst,
            wire_overhead,
            qdisc,
            missing,
            bql_limit_max,
            tsq,
            txqueuelen,
            tx_ring,
            gso,
            device_unsupported,
            load,
            load_warmup,
            stress,
            stress_tool,
            rt_priority,
            mlockall,
            pin_cpu,
            cpu_dma_latency,
            queue_sample,
        } = a;
        KnobSpec {
            bottleneck,
            link_rate,
            shaper,
            queue_limit,
            burst,
            wire_overhead,
            qdisc,
            missing,
            bql_limit_max,
            tsq,
            txqueuelen,
            tx_ring,
            gso,
            device_unsupported,
            load,
            load_warmup,
            stress,
            stress_tool,
            rt_priority,
            mlockall,
            pin_cpu,
            cpu_dma_latency,
            queue_sample,
        }
    }
}
