//! One sampled send of a TCP socket already on the host, as `rtprobe
//! flows` reports it: who sent it, between which addresses, and how long
//! each stage took. Built from the sock_ops program's raw sample.
//!
//! The stages, between the kernel's callbacks on the same send:
//! - **stack**: `sendmsg` marked it -> it entered the qdisc (TCP's own
//!   time: segmentation, the congestion and receive windows, pacing);
//! - **sender queue**: qdisc -> the driver took it (qdisc and the
//!   driver's queue);
//! - **NIC**: driver -> the NIC's TX stamp came back (where a NIC stamps);
//! - **round trip**: its last TX stamp -> the ACK of its last byte: the
//!   path both ways and the peer, its delayed ACK included.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use serde::Serialize;
use xdp_common::flows::{SAMPLE_GIVEN_UP, SAMPLE_RETRANSMITTED, TxSample};

/// AF_INET6.
const AF_INET6: u32 = 10;

/// One sampled send, its stages in ns (None: a stage the kernel did not
/// report, e.g. the NIC's on a NIC that does not stamp).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct SampledSend {
    /// CLOCK_REALTIME ns of its `sendmsg`.
    pub(crate) time_ns: i64,
    /// The socket's cookie: one per socket for its life.
    pub(crate) cookie: u64,
    pub(crate) pid: u32,
    pub(crate) comm: String,
    /// The sending task's cgroup v2 id (0: unknown).
    pub(crate) cgroup_id: u64,
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
    pub(crate) bytes: u32,
    pub(crate) stack_ns: Option<u64>,
    pub(crate) sender_queue_ns: Option<u64>,
    pub(crate) nic_ns: Option<u64>,
    pub(crate) round_trip_ns: Option<u64>,
    /// No ACK came in time: it was given up.
    pub(crate) given_up: bool,
    /// A stage was seen again (the bytes were sent again).
    pub(crate) retransmitted: bool,
}

/// `b - a` where both times are known and in order.
fn between(a: u64, b: u64) -> Option<u64> {
    (a != 0 && b != 0 && b >= a).then(|| b - a)
}

/// The address of a sample's raw words (network order).
fn address(family: u32, words: [u32; 4], port: u32) -> SocketAddr {
    let ip = if family == AF_INET6 {
        let mut b = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            b[4 * i..4 * i + 4].copy_from_slice(&w.to_ne_bytes());
        }
        IpAddr::V6(Ipv6Addr::from(b))
    } else {
        IpAddr::V4(Ipv4Addr::from(words[0].to_ne_bytes()))
    };
    SocketAddr::new(ip, port as u16)
}

impl SampledSend {
    /// From the program's sample; `realtime_offset_ns` is CLOCK_REALTIME
    /// less CLOCK_MONOTONIC (the program's clock).
    pub(crate) fn from_raw(s: &TxSample, realtime_offset_ns: i64) -> Self {
        let comm_len = s.comm.iter().position(|&b| b == 0).unwrap_or(s.comm.len());
        // The last TX stamp: the NIC's callback, else the driver's.
        let last_tx = if s.hw_cb_ns != 0 { s.hw_cb_ns } else { s.sw_ns };
        Self {
            time_ns: s.sendmsg_ns as i64 + realtime_offset_ns,
            cookie: s.cookie,
            pid: s.pid,
            comm: String::from_utf8_lossy(&s.comm[..comm_len]).into_owned(),
            cgroup_id: s.cgroup_id,
            local: address(s.family, s.local_addr, s.local_port),
            remote: address(s.family, s.remote_addr, s.remote_port),
            bytes: s.bytes,
            stack_ns: between(s.sendmsg_ns, s.sched_ns),
            sender_queue_ns: between(s.sched_ns, s.sw_ns),
            nic_ns: between(s.sw_ns, s.hw_cb_ns),
            round_trip_ns: between(last_tx, s.ack_ns),
            given_up: s.flags & SAMPLE_GIVEN_UP != 0,
            retransmitted: s.flags & SAMPLE_RETRANSMITTED != 0,
        }
    }

    /// The stages in order (stack, sender queue, NIC, round trip).
    pub(crate) fn stages(&self) -> [Option<u64>; 4] {
        [
            self.stack_ns,
            self.sender_queue_ns,
            self.nic_ns,
            self.round_trip_ns,
        ]
    }
}

/// The stages' names, in [`SampledSend::stages`] order, as the CSV columns
/// and the summary's keys say them.
pub(crate) const STAGE_NAMES: [&str; 4] = ["stack", "sender_queue", "nic", "round_trip"];

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> TxSample {
        TxSample {
            cookie: 9,
            cgroup_id: 1,
            sendmsg_ns: 1_000,
            sched_ns: 1_500,
            sw_ns: 1_700,
            ack_ns: 11_700,
            pid: 42,
            bytes: 1448,
            family: 2,
            local_port: 40000,
            remote_port: 5201,
            local_addr: [u32::from_ne_bytes([10, 0, 0, 1]), 0, 0, 0],
            remote_addr: [u32::from_ne_bytes([10, 0, 1, 2]), 0, 0, 0],
            comm: *b"iperf3\0\0\0\0\0\0\0\0\0\0",
            ..TxSample::default()
        }
    }

    #[test]
    fn stages_are_the_gaps_between_the_callbacks() {
        let s = SampledSend::from_raw(&raw(), 5);
        assert_eq!(s.time_ns, 1_005);
        assert_eq!(s.stages(), [Some(500), Some(200), None, Some(10_000)]);
        assert_eq!(s.comm, "iperf3");
        assert_eq!(s.local, "10.0.0.1:40000".parse().unwrap());
        assert_eq!(s.remote, "10.0.1.2:5201".parse().unwrap());
        assert!(!s.given_up && !s.retransmitted);
    }

    #[test]
    fn the_round_trip_starts_at_the_nics_stamp_where_there_is_one() {
        let r = TxSample {
            hw_cb_ns: 2_700,
            ..raw()
        };
        let s = SampledSend::from_raw(&r, 0);
        assert_eq!((s.nic_ns, s.round_trip_ns), (Some(1_000), Some(9_000)));
    }

    #[test]
    fn a_missing_or_given_up_stage_is_none_and_said() {
        let r = TxSample {
            sched_ns: 0,
            ack_ns: 0,
            flags: SAMPLE_GIVEN_UP | SAMPLE_RETRANSMITTED,
            ..raw()
        };
        let s = SampledSend::from_raw(&r, 0);
        assert_eq!(s.stages(), [None, None, None, None]);
        assert!(s.given_up && s.retransmitted);
    }

    #[test]
    fn ipv6_addresses_keep_their_byte_order() {
        let ip: Ipv6Addr = "fd00::1:2".parse().unwrap();
        let o = ip.octets();
        let words =
            [0, 1, 2, 3].map(|i| u32::from_ne_bytes(o[4 * i..4 * i + 4].try_into().unwrap()));
        let r = TxSample {
            family: 10,
            remote_addr: words,
            ..raw()
        };
        assert_eq!(SampledSend::from_raw(&r, 0).remote.ip(), IpAddr::V6(ip));
    }
}
