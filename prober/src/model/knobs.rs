//! What the knobs of a run applied, by knob: [`AppliedKnobs`], the run
//! metadata's `knobs` (the CSV's first line) and the JSON summary's
//! `extra.knobs`. Pure data: `tune` fills it in as it applies each knob,
//! the run adds how the sender paced.
//! Every struct's fields are in alphabetical order, the order the JSON
//! had when this was a map; a knob that was not applied is left out.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

/// `status` of a knob that is in effect.
pub(crate) const APPLIED: &str = "applied";

/// One entry per knob applied, plus where the bottleneck is, how the sender
/// paced, and what was asked for but skipped or unsupported.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct AppliedKnobs {
    /// Where the bottleneck knobs act (every run with knobs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bottleneck: Option<BottleneckAt>,
    /// `--bql-limit-max`: the BQL limit of each TX queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) bql: Option<BqlApplied>,
    /// `--gso`: segmentation offload on the sender's interface.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) gso: Option<GsoApplied>,
    /// `--load`: the competing load as started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) load: Option<LoadStarted>,
    /// How the sender paced its probes (testbed runs); not a knob.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pacing: Option<PacingKnobs>,
    /// The shaper and qdisc installed at the bottleneck.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) qdisc_tree: Option<QdiscTreeApplied>,
    /// `--queue-sample`: where the bottleneck's queue was sampled to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) queue_sampler: Option<QueueSamplerApplied>,
    /// The sender thread's real-time settings.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) rt: Option<RtApplied>,
    /// Requested but not run, in words: the run is not what was asked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) skipped: Vec<String>,
    /// `--stress`: the CPU stress workers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) stress: Option<StressApplied>,
    /// `--tsq`: the TCP small queues limit in the sender namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tsq: Option<TsqApplied>,
    /// `--tx-ring`: the TX ring size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tx_ring: Option<TxRingApplied>,
    /// `--txqueuelen`: the interface's queue length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) txqueuelen: Option<TxQueueLenApplied>,
    /// Device knobs the driver cannot do (`bql`, `tx_ring`): why, by knob.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) unsupported: BTreeMap<String, String>,
}

impl AppliedKnobs {
    /// Nothing recorded.
    pub(crate) fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The keys present in the JSON, in its order.
    pub(crate) fn names(&self) -> Vec<&'static str> {
        let present = [
            ("bottleneck", self.bottleneck.is_some()),
            ("bql", self.bql.is_some()),
            ("gso", self.gso.is_some()),
            ("load", self.load.is_some()),
            ("pacing", self.pacing.is_some()),
            ("qdisc_tree", self.qdisc_tree.is_some()),
            ("queue_sampler", self.queue_sampler.is_some()),
            ("rt", self.rt.is_some()),
            ("skipped", !self.skipped.is_empty()),
            ("stress", self.stress.is_some()),
            ("tsq", self.tsq.is_some()),
            ("tx_ring", self.tx_ring.is_some()),
            ("txqueuelen", self.txqueuelen.is_some()),
            ("unsupported", !self.unsupported.is_empty()),
        ];
        present
            .into_iter()
            .filter_map(|(k, p)| p.then_some(k))
            .collect()
    }
}

/// Reads the knobs of a CSV's metadata line leniently: knobs written in
/// another shape (an older or foreign file) read as none rather than
/// losing the whole line.
pub(crate) fn lenient<'de, D: Deserializer<'de>>(d: D) -> Result<AppliedKnobs, D::Error> {
    let v = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(v).unwrap_or_default())
}

/// Where the bottleneck knobs act.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct BottleneckAt {
    pub(crate) dev: String,
    pub(crate) netns: String,
    /// "sender" or "router".
    pub(crate) side: String,
}

/// The BQL limit written to every TX queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct BqlApplied {
    pub(crate) dev: String,
    pub(crate) limit_max_bytes: u64,
    pub(crate) netns: String,
    /// Each queue's limit before, to restore.
    pub(crate) queues: Vec<BqlQueue>,
    pub(crate) status: String,
}

/// One TX queue's BQL limit before the run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct BqlQueue {
    pub(crate) previous: u64,
    /// `tx-N`.
    pub(crate) queue: String,
}

/// TSO and GSO switched together.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct GsoApplied {
    pub(crate) dev: String,
    pub(crate) netns: String,
    pub(crate) previous: TsoGso,
    pub(crate) status: String,
    /// The state set for both.
    pub(crate) tso_gso: bool,
}

/// TSO and GSO, each on or off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct TsoGso {
    pub(crate) gso: bool,
    pub(crate) tso: bool,
}

/// The competing load as started.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct LoadStarted {
    /// The link rate the load's specs were relative to, if any.
    pub(crate) link_rate: Option<String>,
    /// CLOCK_REALTIME when the measured part began (after the warm-up).
    pub(crate) measured_from_ns: i64,
    /// The receiver's address the load was sent to.
    pub(crate) receiver: String,
    /// Each `--load` as written.
    pub(crate) specs: Vec<String>,
    /// CLOCK_REALTIME when the load came on.
    pub(crate) started_ns: i64,
    /// The load's warm-up, e.g. `2s`.
    pub(crate) warmup: String,
}

/// How the sender paced its probes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct PacingKnobs {
    pub busy_poll: bool,
    /// "busy-poll", "fixed" (a given spin) or "adaptive".
    pub(crate) mode: String,
    pub(crate) no_warm_up: bool,
    /// The spin before each send (not with busy-poll).
    pub(crate) spin_ns: Option<u64>,
}

/// The tc tree installed at the bottleneck: shaper and/or qdisc.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct QdiscTreeApplied {
    pub(crate) dev: String,
    pub(crate) netns: String,
    /// The qdisc, when one was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) qdisc: Option<QdiscApplied>,
    /// The shaper, when a rate was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) shaping: Option<ShapingApplied>,
    pub(crate) status: String,
    /// The tc commands, as run.
    pub(crate) tc: Vec<String>,
}

/// A qdisc as installed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct QdiscApplied {
    /// Its parameters with the autos resolved; the fields are the kind's
    /// own (`limit_packets` for pfifo, `hp_rate` for htb-prio...).
    pub(crate) effective: serde_json::Value,
    pub(crate) kind: String,
    /// "root", or a leaf under the shaper.
    pub(crate) position: String,
    /// The qdisc as asked for, every parameter written out.
    pub(crate) spec: String,
}

/// The shaper as installed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct ShapingApplied {
    pub(crate) burst_bytes: u64,
    pub(crate) overhead_bytes: u32,
    /// The FIFO leaf's limit, in words (`20p`, `64KiB`, the kernel default).
    pub(crate) queue_limit: String,
    pub(crate) rate: String,
    pub(crate) rate_bps: u64,
    /// "htb" or "tbf".
    pub(crate) shaper: String,
}

/// The queue sampler's output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct QueueSamplerApplied {
    pub(crate) csv: String,
    pub(crate) interval: String,
    /// Samples written; null while it runs.
    pub(crate) samples: Option<u64>,
}

/// The sender thread's real-time settings, as asked for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct RtApplied {
    pub(crate) cpu: Option<usize>,
    pub(crate) cpu_dma_latency_us: Option<u32>,
    pub(crate) mlockall: bool,
    pub(crate) sched_fifo_priority: Option<u8>,
}

/// CPU stress workers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct StressApplied {
    /// What each worker computes ("sqrt").
    pub(crate) method: String,
    pub(crate) status: String,
    /// "builtin" or "stress-ng".
    pub(crate) tool: String,
    pub(crate) workers: u32,
}

/// The TCP small queues limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct TsqApplied {
    pub(crate) bytes: u64,
    pub(crate) netns: String,
    pub(crate) previous: u64,
    pub(crate) status: String,
    pub(crate) sysctl: String,
}

/// The TX ring size.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct TxRingApplied {
    pub(crate) dev: String,
    pub(crate) netns: String,
    pub(crate) previous: u32,
    pub(crate) status: String,
    pub(crate) tx: u32,
}

/// The interface's queue length.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub(crate) struct TxQueueLenApplied {
    pub(crate) dev: String,
    pub(crate) netns: String,
    pub(crate) packets: u32,
    pub(crate) previous: u64,
    pub(crate) status: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A typical run's knobs, every group, as the map builders wrote them
    /// before the knobs were typed (keys from their `json!` literals).
    fn old_map() -> serde_json::Value {
        serde_json::json!({
            "bottleneck": { "side": "sender", "netns": "rtprobe-1-snd", "dev": "veth-snd" },
            "load": {
                "specs": ["tcp:2"], "warmup": "2s", "link_rate": null,
                "receiver": "10.77.0.2", "started_ns": 1_700_000_000_000_000_000i64,
                "measured_from_ns": 1_700_000_002_000_000_000i64,
            },
            "pacing": { "mode": "adaptive", "busy_poll": false, "no_warm_up": false, "spin_ns": null },
            "queue_sampler": { "csv": "/tmp/q.csv", "interval": "10ms", "samples": 120 },
            "rt": { "sched_fifo_priority": 80, "mlockall": true, "cpu": null,
                    "cpu_dma_latency_us": 0 },
            "skipped": ["qdisc fq_codel skipped: the kernel lacks fq_codel"],
            "stress": { "status": "applied", "workers": 2, "tool": "builtin", "method": "sqrt" },
            "tx_ring": { "status": "applied", "netns": "rtprobe-1-snd", "dev": "eth0",
                         "tx": 64, "previous": 256 },
            "unsupported": { "bql": "no BQL on this device (veth)" },
        })
    }

    fn typed() -> AppliedKnobs {
        AppliedKnobs {
            bottleneck: Some(BottleneckAt {
                dev: "veth-snd".into(),
                netns: "rtprobe-1-snd".into(),
                side: "sender".into(),
            }),
            load: Some(LoadStarted {
                link_rate: None,
                measured_from_ns: 1_700_000_002_000_000_000,
                receiver: "10.77.0.2".into(),
                specs: vec!["tcp:2".into()],
                started_ns: 1_700_000_000_000_000_000,
                warmup: "2s".into(),
            }),
            pacing: Some(PacingKnobs {
                busy_poll: false,
                mode: "adaptive".into(),
                no_warm_up: false,
                spin_ns: None,
            }),
            queue_sampler: Some(QueueSamplerApplied {
                csv: "/tmp/q.csv".into(),
                interval: "10ms".into(),
                samples: Some(120),
            }),
            rt: Some(RtApplied {
                cpu: None,
                cpu_dma_latency_us: Some(0),
                mlockall: true,
                sched_fifo_priority: Some(80),
            }),
            skipped: vec!["qdisc fq_codel skipped: the kernel lacks fq_codel".into()],
            stress: Some(StressApplied {
                method: "sqrt".into(),
                status: APPLIED.into(),
                tool: "builtin".into(),
                workers: 2,
            }),
            tx_ring: Some(TxRingApplied {
                dev: "eth0".into(),
                netns: "rtprobe-1-snd".into(),
                previous: 256,
                status: APPLIED.into(),
                tx: 64,
            }),
            unsupported: BTreeMap::from([("bql".into(), "no BQL on this device (veth)".into())]),
            ..Default::default()
        }
    }

    #[test]
    fn typed_knobs_write_the_json_the_map_wrote() {
        let old = old_map();
        assert_eq!(serde_json::to_value(typed()).unwrap(), old);
        // Same order too: the map's keys were sorted, so are the fields.
        assert_eq!(serde_json::to_string(&typed()).unwrap(), old.to_string());
        assert_eq!(
            serde_json::from_value::<AppliedKnobs>(old).unwrap(),
            typed()
        );
        assert_eq!(
            typed().names(),
            [
                "bottleneck",
                "load",
                "pacing",
                "queue_sampler",
                "rt",
                "skipped",
                "stress",
                "tx_ring",
                "unsupported"
            ]
        );
        // None applied: an empty object, as the empty map was.
        assert_eq!(
            serde_json::to_string(&AppliedKnobs::default()).unwrap(),
            "{}"
        );
    }

    /// A CSV whose knobs have another shape keeps the rest of its metadata.
    #[test]
    fn knobs_of_another_shape_read_as_none_in_run_metadata() {
        let line = r#"{"version":"0.1.0","knobs":{"rt":"fifo"},"size":64}"#;
        let m: crate::model::meta::RunMeta = serde_json::from_str(line).unwrap();
        assert!(m.knobs.is_empty());
        assert_eq!(m.size, 64);
    }
}
