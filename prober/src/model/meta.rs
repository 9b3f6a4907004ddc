//! A run as a whole: what was asked and set up ([`RunMeta`], the CSV's
//! first line). What came out of it, with its statistics, is
//! `stats::outcome`.

use serde::{Deserialize, Serialize};

use super::knobs::AppliedKnobs;

/// Run metadata stored as the CSV's first line, so plots can be titled
/// without flags. Every field is optional on read (older or foreign CSVs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunMeta {
    pub version: String,
    /// RFC 3339 start time.
    pub started_at: String,
    pub label: Option<String>,
    /// "veth" (self-built namespaces) or "nic-pair".
    pub testbed: String,
    /// Unique id of the run's testbed: its namespaces are `rtprobe-<id>-<role>`.
    pub testbed_id: String,
    pub tx_if: Option<String>,
    pub rx_if: Option<String>,
    pub xdp_mode_requested: String,
    pub xdp_mode_attached: String,
    pub xdp_action: String,
    /// Who echoed the probes: "kernel" (rtprobe's XDP reflector) or "user".
    pub reflector: String,
    pub size: u32,
    pub interval_ns: u64,
    pub count: Option<u64>,
    pub duration_ns: Option<u64>,
    pub tos: u8,
    pub port: u16,
    pub timestamps_requested: String,
    /// Flows probed alongside the main one (flow id, port, tos, size, interval_ns).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_flows: Vec<serde_json::Value>,
    /// Knobs applied for this run (qdisc, BQL, load...), by name.
    #[serde(deserialize_with = "super::knobs::lenient")]
    pub knobs: AppliedKnobs,
}
