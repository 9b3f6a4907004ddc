//! What the load did, as the run's summary reports it: one entry per
//! flow, their sum, and the bottleneck qdisc's count of the same window.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::acct::FetchTimes;

/// What one flow did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FlowReport {
    /// "tcp" or "udp".
    pub kind: String,
    /// The `--load` entry it came from.
    pub spec: String,
    pub port: u16,
    pub cc: Option<String>,
    /// Pacing rate (TCP) or offered payload rate (UDP); None = unpaced.
    pub target_bps: Option<u64>,
    /// Payload bits per second that got through in the measuring window
    /// (after the warm-up). UDP: the window's datagrams received, over
    /// their first to last arrival. TCP: bytes acknowledged to the sender
    /// over the window (bytes read by the receiver if TCP_INFO lacks them).
    pub achieved_bps: f64,
    /// Payload bytes received in the window (UDP: of the window's
    /// datagrams, duplicates once; TCP: read by the receiver).
    pub bytes: u64,
    /// The window's length: mark to stop (UDP: first to last send of the
    /// window's datagrams).
    pub seconds: f64,
    /// UDP: datagrams sent in the window, those of them received (each
    /// once, also if they arrived after the sender stopped), loss %.
    pub sent_packets: Option<u64>,
    pub received_packets: Option<u64>,
    pub loss_pct: Option<f64>,
    /// UDP: the loss the shaped link must cause (66 B overhead per datagram).
    pub expected_loss_pct: Option<f64>,
    /// UDP: payload rate offered over the sender's window.
    pub offered_bps: Option<f64>,
    /// UDP: sent_packets - received_packets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_packets: Option<u64>,
    /// UDP: copies of a datagram already received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_packets: Option<u64>,
    /// UDP: datagrams that arrived after one with a higher sequence number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reordered_packets: Option<u64>,
    /// UDP: first to last arrival of the window's datagrams, the span
    /// achieved_bps is measured over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receive_seconds: Option<f64>,
    /// UDP: of lost_packets, those the receiver's own socket dropped
    /// (receive buffer full, SO_RXQ_OVFL): not the link's doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_drops: Option<u64>,
    /// UDP: furthest behind its schedule the sender sent a datagram of the
    /// window, ms. Above the queue's drain time (12 ms for 100 full frames
    /// at 100 Mbit/s) the link idled and the loss exceeds the calculation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_send_lag_ms: Option<f64>,
    /// UDP: the sender ran SCHED_FIFO for the whole window (false: it was
    /// not allowed to, or fell too far behind; see max_send_lag_ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender_sched_fifo: Option<bool>,
    /// TCP: bytes acknowledged to the sender in the window (tcpi_bytes_acked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acked_bytes: Option<u64>,
    /// TCP: the receiver's rate, bytes / seconds (achieved_bps is the
    /// acknowledged rate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_bps: Option<f64>,
    /// Fetch: completion times of the window's fetches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fetch: Option<FetchTimes>,
}

/// The load of one run, for `Summary.extra["load"]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LoadReport {
    pub flows: Vec<FlowReport>,
    /// Sum of achieved_bps over all flows.
    pub total_achieved_bps: f64,
    /// The kernel's count of the same window at the bottleneck's root
    /// qdisc (None: no qdisc there to ask).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bottleneck: Option<QueueWindow>,
}

/// What the bottleneck's root qdisc counted from the load's mark to the
/// senders' stop: the kernel's witness of the loss and of the rate the
/// shaper delivered. It counts every packet through the qdisc, the
/// probes' among them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueWindow {
    pub dev: String,
    /// The root qdisc's kind and handle, e.g. "htb 1:".
    pub qdisc: String,
    pub seconds: f64,
    /// Packets and bytes the qdisc handed to the device (frames from the
    /// Ethernet header on, as the kernel counts them).
    pub sent_packets: u64,
    pub sent_bytes: u64,
    /// Packets the qdisc (or a qdisc below it) dropped.
    pub dropped_packets: u64,
    /// sent_bytes over the window, bits per second.
    pub delivered_bps: f64,
    /// dropped / (dropped + sent), %.
    pub drop_pct: f64,
}

impl QueueWindow {
    /// The difference of two readings of the same qdisc `elapsed` apart.
    pub fn between(
        dev: &str,
        before: &crate::sys::QdiscInfo,
        after: &crate::sys::QdiscInfo,
        elapsed: Duration,
    ) -> Self {
        let sent_packets = after.sent_packets.saturating_sub(before.sent_packets);
        let sent_bytes = after.sent_bytes.saturating_sub(before.sent_bytes);
        // The kernel keeps drops in 32 bits: a wrap is one lap.
        let dropped_packets = u64::from(after.drops.wrapping_sub(before.drops));
        let seconds = elapsed.as_secs_f64().max(1e-9);
        let offered = sent_packets + dropped_packets;
        Self {
            dev: dev.to_string(),
            qdisc: format!("{} {}", after.kind, after.handle),
            seconds,
            sent_packets,
            sent_bytes,
            dropped_packets,
            delivered_bps: sent_bytes as f64 * 8.0 / seconds,
            drop_pct: if offered == 0 {
                0.0
            } else {
                100.0 * dropped_packets as f64 / offered as f64
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_window_is_the_difference_of_two_readings() {
        let q = |sent_packets, sent_bytes, drops| crate::sys::QdiscInfo {
            ifindex: 3,
            kind: "htb".into(),
            handle: "1:".into(),
            parent: "root".into(),
            qlen: 0,
            backlog_bytes: 0,
            drops,
            overlimits: 0,
            requeues: 0,
            sent_bytes,
            sent_packets,
        };
        let w = QueueWindow::between(
            "rtp-r",
            &q(1000, 1_512_000, u32::MAX - 9),
            &q(3000, 4_536_000, 990),
            Duration::from_secs(2),
        );
        assert_eq!(w.qdisc, "htb 1:");
        assert_eq!((w.sent_packets, w.sent_bytes), (2000, 3_024_000));
        // 10 drops up to the wrap and 990 after it.
        assert_eq!(w.dropped_packets, 1000);
        assert!((w.drop_pct - 100.0 / 3.0).abs() < 1e-9);
        assert!((w.delivered_bps - 12.096e6).abs() < 1.0);
        let idle = QueueWindow::between("d", &q(5, 5, 5), &q(5, 5, 5), Duration::ZERO);
        assert_eq!(idle.drop_pct, 0.0);
    }

    #[test]
    fn fetch_report_is_optional_in_json() {
        // A report written before the fetch load existed still reads.
        let old = serde_json::json!({"kind": "tcp", "spec": "tcp:100%", "port": 5201,
            "cc": "cubic", "target_bps": null, "achieved_bps": 9e6, "bytes": 1, "seconds": 1.0,
            "sent_packets": null, "received_packets": null, "loss_pct": null,
            "expected_loss_pct": null, "offered_bps": null});
        let f: FlowReport = serde_json::from_value(old).unwrap();
        assert_eq!(f.fetch, None);
        assert!(serde_json::to_value(&f).unwrap().get("fetch").is_none());
        let with = FlowReport {
            kind: "fetch".into(),
            fetch: Some(FetchTimes {
                size_bytes: 100,
                count: 3,
                mean_s: Some(0.5),
                ..Default::default()
            }),
            ..Default::default()
        };
        let v = serde_json::to_value(&with).unwrap();
        assert_eq!(v["fetch"]["count"], 3);
        assert_eq!(serde_json::from_value::<FlowReport>(v).unwrap(), with);
    }

    #[test]
    fn report_round_trips_through_json() {
        let r = LoadReport {
            bottleneck: None,
            flows: vec![FlowReport {
                kind: "udp".into(),
                spec: "udp:150mbit,size=1470".into(),
                port: 5201,
                sent_packets: Some(10),
                received_packets: Some(6),
                loss_pct: Some(40.0),
                ..Default::default()
            }],
            total_achieved_bps: 1e6,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(serde_json::from_value::<LoadReport>(v).unwrap(), r);
    }
}
