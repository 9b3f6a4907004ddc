//! What the load did, as the run's summary reports it: one entry per
//! flow, their sum, and the bottleneck qdisc's count of the same window.

use std::time::Duration;

pub(crate) use crate::stats::report::{FlowReport, LoadReport, QueueWindow};

impl QueueWindow {
    /// The difference of two readings of the same qdisc `elapsed` apart.
    pub(crate) fn between(
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
    use crate::tune::FetchTimes;

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
