//! Link shaping: turns the bottleneck interface (a veth, which otherwise
//! forwards as fast as the CPU goes and never queues) into a link of a
//! given rate with a queue of a given size, so queues build where they
//! would on a real NIC.
//!
//! The shaper is the root of the interface's qdisc tree:
//!
//! ```text
//! htb:  root 1: htb default 1
//!         class 1:1 rate R ceil R burst B cburst B overhead O
//!           leaf 10: <the chosen qdisc, or pfifo/bfifo with the queue limit>
//! tbf:  root 1: tbf rate R burst B limit L overhead O
//!           leaf 10: <the chosen qdisc, or pfifo with a packet queue limit>
//! ```
//!
//! A qdisc chosen with `--qdisc` is the leaf under the shaper (handle 10:,
//! parent 1:1): the shaper decides *when* the link can send, the leaf
//! decides *which* packet goes and how many may wait. That is what a
//! real NIC does (the TX ring drains at line rate, the qdisc in front of it
//! orders and drops), and it is how the study's qdiscs would have seen a
//! 100 Mbit/s link. Without a chosen qdisc the leaf is a FIFO with the
//! queue limit (packets: pfifo, bytes: bfifo); with no limit either, htb
//! keeps the kernel's default leaf (pfifo, limit = txqueuelen) and tbf a
//! byte limit of 1000 full-size frames.
//!
//! A packet limit counts skbs: at the sender's own interface TCP's GSO
//! super-packets (up to 64 KiB) count as one packet each, so limit in
//! bytes there, or shape at the router with segmentation off (`gso`).
//!
//! `overhead` (default 24 bytes: FCS 4 + preamble 8 + inter-frame gap 12)
//! makes the shaper count what an Ethernet wire carries per frame, so a
//! 100 Mbit/s shaped veth carries the same payload as a 100 Mbit/s cable:
//! 1470 B of UDP payload cost 1470 + 8 + 20 + 14 + 24 = 1536 B, the
//! study's 66 B of overhead, 95.7 Mbit/s of payload.
//!
//! Kernel interface: sch_htb or sch_tbf through `tc` (module `tc`), any
//! Linux >= 3.x; `overhead` in tc_ratespec since 3.8. Pure rendering here;
//! installing and restoring the tree is `qdisc::QdiscTree`.

use crate::model::knobs::ShapingApplied;
use serde::{Deserialize, Serialize};

use super::{
    amounts::{Bytes, QueueLimit, Rate},
    tc::TcCmd,
};

/// Ethernet framing a veth does not carry but a cable does: FCS 4,
/// preamble + SFD 8, inter-frame gap 12.
pub(crate) const DEFAULT_WIRE_OVERHEAD: u32 = 24;

/// L2 header (14) + IPv4 (20) + UDP (8): what a UDP payload costs on top
/// in the frame the shaper sees.
pub(crate) const UDP_IPV4_ETH_HEADERS: u32 = 14 + 20 + 8;
/// What an IPv6 header (40) adds over IPv4's (20).
pub(crate) const IPV6_EXTRA_HEADER_BYTES: u32 = 20;

/// A full-size Ethernet frame without FCS, as the qdisc sees it.
pub(crate) const MTU_FRAME: u64 = 1514;

/// Which qdisc shapes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ShaperKind {
    /// Hierarchical token bucket: one class at the link rate.
    #[default]
    Htb,
    /// Token bucket filter (the bandwidth lab's shaper).
    Tbf,
}

impl ShaperKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ShaperKind::Htb => "htb",
            ShaperKind::Tbf => "tbf",
        }
    }
}

/// A shaped link: rate, queue and framing overhead.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Shaping {
    pub(crate) rate: Rate,
    pub(crate) shaper: ShaperKind,
    /// The FIFO leaf's limit (ignored when a qdisc is chosen: it has its own).
    pub(crate) queue_limit: Option<QueueLimit>,
    pub(crate) burst: Option<Bytes>,
    pub(crate) overhead_bytes: u32,
}

/// Handle of the shaper's root and of its class the leaf hangs from.
pub(crate) const SHAPER_ROOT: &str = "1:";
pub(crate) const SHAPER_CLASS: &str = "1:1";

impl Shaping {
    #[cfg(test)]
    pub(crate) fn new(rate: Rate) -> Self {
        Self {
            rate,
            shaper: ShaperKind::Htb,
            queue_limit: None,
            burst: None,
            overhead_bytes: DEFAULT_WIRE_OVERHEAD,
        }
    }

    /// Bucket size: what the user gave, or 1 ms at the link rate but at
    /// least two full frames (less makes the shaper stall on timer slack).
    pub(crate) fn burst_bytes(&self) -> u64 {
        match self.burst {
            Some(b) => b.0,
            None => (self.rate.bytes_per_sec() / 1000).max(2 * MTU_FRAME),
        }
    }

    /// The tbf `limit` in bytes (tbf takes bytes only).
    fn tbf_limit_bytes(&self) -> u64 {
        match self.queue_limit {
            Some(QueueLimit::Bytes(b)) => b,
            Some(QueueLimit::Packets(p)) => p as u64 * MTU_FRAME,
            None => 1000 * MTU_FRAME,
        }
    }

    /// tc commands for the shaper itself, on `dev`.
    pub(crate) fn commands(&self, dev: &str) -> Vec<TcCmd> {
        let rate = self.rate.tc();
        let burst = self.burst_bytes().to_string();
        let overhead = self.overhead_bytes.to_string();
        match self.shaper {
            ShaperKind::Htb => vec![
                TcCmd::new([
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    "root",
                    "handle",
                    SHAPER_ROOT,
                    "htb",
                    "default",
                    "1",
                ]),
                TcCmd::new([
                    "class",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    SHAPER_ROOT,
                    "classid",
                    SHAPER_CLASS,
                    "htb",
                    "rate",
                    &rate,
                    "ceil",
                    &rate,
                    "burst",
                    &burst,
                    "cburst",
                    &burst,
                    "overhead",
                    &overhead,
                ]),
            ],
            ShaperKind::Tbf => vec![TcCmd::new([
                "qdisc",
                "add",
                "dev",
                dev,
                "root",
                "handle",
                SHAPER_ROOT,
                "tbf",
                "rate",
                &rate,
                "burst",
                &burst,
                "limit",
                &self.tbf_limit_bytes().to_string(),
                "overhead",
                &overhead,
            ])],
        }
    }

    /// The FIFO leaf under the shaper when no qdisc was chosen, if the
    /// shaper's own default is not what the queue limit asks for.
    pub(crate) fn default_leaf(&self, dev: &str, handle: &str) -> Option<TcCmd> {
        let leaf = |kind: &str, limit: String| {
            TcCmd::new([
                "qdisc",
                "add",
                "dev",
                dev,
                "parent",
                SHAPER_CLASS,
                "handle",
                handle,
                kind,
                "limit",
                &limit,
            ])
        };
        match (self.shaper, self.queue_limit) {
            (_, Some(QueueLimit::Packets(p))) => Some(leaf("pfifo", p.to_string())),
            (ShaperKind::Htb, Some(QueueLimit::Bytes(b))) => Some(leaf("bfifo", b.to_string())),
            // tbf's own child is a bfifo of `limit` bytes already.
            (ShaperKind::Tbf, Some(QueueLimit::Bytes(_))) => None,
            (_, None) => None,
        }
    }

    /// Payload bits per second a UDP flow of `payload` bytes can carry.
    pub(crate) fn udp_payload_capacity_bps(&self, payload: u32) -> f64 {
        let per_pkt = (payload + UDP_IPV4_ETH_HEADERS + self.overhead_bytes) as f64;
        self.rate.bps as f64 * payload as f64 / per_pkt
    }

    /// Loss a CBR UDP flow must see when it sends `sent_payload_bps` of
    /// `payload`-byte datagrams into this link: 1 - capacity / offered.
    pub(crate) fn expected_udp_loss_pct(&self, payload: u32, sent_payload_bps: f64) -> f64 {
        let cap = self.udp_payload_capacity_bps(payload);
        if sent_payload_bps <= cap {
            0.0
        } else {
            100.0 * (1.0 - cap / sent_payload_bps)
        }
    }

    /// The shaper as installed, for the run metadata.
    pub(crate) fn metadata(&self) -> ShapingApplied {
        let leaf_limit = match self.queue_limit {
            Some(q) => q.to_string(),
            None => match self.shaper {
                ShaperKind::Htb => "kernel default (pfifo, limit = txqueuelen)".into(),
                ShaperKind::Tbf => Bytes(self.tbf_limit_bytes()).to_string(),
            },
        };
        ShapingApplied {
            burst_bytes: self.burst_bytes(),
            overhead_bytes: self.overhead_bytes,
            queue_limit: leaf_limit,
            rate: self.rate.to_string(),
            rate_bps: self.rate.bps,
            shaper: self.shaper.as_str().into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(c: &[TcCmd]) -> Vec<String> {
        c.iter().map(|c| c.line()).collect()
    }

    #[test]
    fn htb_shaper_commands() {
        let mut s = Shaping::new(Rate::mbit(100));
        s.queue_limit = Some(QueueLimit::Packets(20));
        assert_eq!(
            lines(&s.commands("veth0")),
            [
                "tc qdisc add dev veth0 root handle 1: htb default 1",
                "tc class add dev veth0 parent 1: classid 1:1 htb rate 100000000bit ceil 100000000bit burst 12500 cburst 12500 overhead 24",
            ]
        );
        assert_eq!(
            s.default_leaf("veth0", "10:").unwrap().line(),
            "tc qdisc add dev veth0 parent 1:1 handle 10: pfifo limit 20"
        );
        s.queue_limit = Some(QueueLimit::Bytes(65536));
        assert!(
            s.default_leaf("veth0", "10:")
                .unwrap()
                .line()
                .ends_with("bfifo limit 65536")
        );
        s.queue_limit = None;
        assert!(s.default_leaf("veth0", "10:").is_none());
    }

    #[test]
    fn tbf_shaper_like_the_lab() {
        // The lab: tbf rate 1mbit limit 16kB burst 1600.
        let s = Shaping {
            rate: Rate::mbit(1),
            shaper: ShaperKind::Tbf,
            queue_limit: Some(QueueLimit::Bytes(16 * 1024)),
            burst: Some(Bytes(1600)),
            overhead_bytes: 0,
        };
        assert_eq!(
            lines(&s.commands("eth1")),
            [
                "tc qdisc add dev eth1 root handle 1: tbf rate 1000000bit burst 1600 limit 16384 overhead 0"
            ]
        );
        assert!(s.default_leaf("eth1", "10:").is_none());
        let mut p = s.clone();
        p.queue_limit = Some(QueueLimit::Packets(20));
        assert!(p.commands("eth1")[0].line().contains("limit 30280"));
        assert!(
            p.default_leaf("eth1", "10:")
                .unwrap()
                .line()
                .ends_with("pfifo limit 20")
        );
    }

    #[test]
    fn burst_defaults_to_a_millisecond_or_two_frames() {
        assert_eq!(Shaping::new(Rate::mbit(100)).burst_bytes(), 12_500);
        assert_eq!(Shaping::new(Rate::mbit(1)).burst_bytes(), 3028);
    }

    #[test]
    fn study_loss_table() {
        // Study 2: 100 Mbit/s link, 1470 B payload, 66 B overhead.
        let s = Shaping::new(Rate::mbit(100));
        let cap = s.udp_payload_capacity_bps(1470);
        assert!((cap / 1e6 - 95.7).abs() < 0.05, "{cap}");
        for (sent, calc) in [(100.0, 4.3), (150.0, 36.2), (200.0, 52.1), (220.0, 56.5)] {
            let l = s.expected_udp_loss_pct(1470, sent * 1e6);
            assert!((l - calc).abs() < 0.1, "{sent}: {l} vs {calc}");
        }
        assert_eq!(s.expected_udp_loss_pct(1470, 90e6), 0.0);
    }
}
