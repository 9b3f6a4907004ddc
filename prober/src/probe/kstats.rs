//! Kernel drop counters that say where lost probes went: UDP receive-buffer
//! overflows of a namespace (`/proc/thread-self/net/snmp`, read by the
//! kernel layer's worker inside the namespace) and the per-CPU input
//! backlog drops (`/proc/net/softnet_stat`, host-wide: other traffic on the
//! machine counts too). Parsing is pure; reading needs only procfs (any
//! Linux) and goes through [`crate::sys::Sys::proc_net`].

use anyhow::{Context, Result};
use serde::Serialize;

use crate::{
    stats::report::KernelDrops,
    sys::{Ns, Sys},
};

/// The `Udp:` line of /proc/net/snmp (the fields rtprobe reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct UdpCounters {
    pub(crate) in_datagrams: u64,
    pub(crate) no_ports: u64,
    pub(crate) in_errors: u64,
    pub(crate) rcvbuf_errors: u64,
    pub(crate) sndbuf_errors: u64,
}

impl UdpCounters {
    /// Counter increase from `before` to `self`.
    pub(crate) fn since(&self, before: &UdpCounters) -> UdpCounters {
        UdpCounters {
            in_datagrams: self.in_datagrams.saturating_sub(before.in_datagrams),
            no_ports: self.no_ports.saturating_sub(before.no_ports),
            in_errors: self.in_errors.saturating_sub(before.in_errors),
            rcvbuf_errors: self.rcvbuf_errors.saturating_sub(before.rcvbuf_errors),
            sndbuf_errors: self.sndbuf_errors.saturating_sub(before.sndbuf_errors),
        }
    }
}

/// Parses the `Udp:` header/value line pair of /proc/net/snmp.
pub(crate) fn parse_snmp_udp(text: &str) -> Option<UdpCounters> {
    let mut lines = text.lines().filter(|l| l.starts_with("Udp: "));
    let names: Vec<&str> = lines.next()?.split_whitespace().skip(1).collect();
    let values: Vec<u64> = lines
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let get = |name: &str| {
        names
            .iter()
            .position(|n| *n == name)
            .and_then(|i| values.get(i).copied())
            .unwrap_or(0)
    };
    Some(UdpCounters {
        in_datagrams: get("InDatagrams"),
        no_ports: get("NoPorts"),
        in_errors: get("InErrors"),
        rcvbuf_errors: get("RcvbufErrors"),
        sndbuf_errors: get("SndbufErrors"),
    })
}

/// Sum over CPUs of the second column of /proc/net/softnet_stat (packets
/// dropped because a CPU's input backlog was over netdev_max_backlog).
pub(crate) fn parse_softnet_dropped(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|v| u64::from_str_radix(v, 16).ok())
        .sum()
}

/// UDP counters of the namespace `ns`, through `sys`.
pub(crate) fn read_udp_in(sys: &dyn Sys, ns: Ns) -> Result<UdpCounters> {
    let t = sys.proc_net(ns, "snmp")?;
    parse_snmp_udp(&t).context("no Udp: line in /proc/net/snmp")
}

/// Host-wide backlog drops so far, through `sys`.
pub(crate) fn read_softnet_dropped_in(sys: &dyn Sys) -> Result<u64> {
    Ok(parse_softnet_dropped(
        &sys.proc_net(Ns::Host, "softnet_stat")?,
    ))
}

/// The counters of both ends, sampled before and after a run. A counter
/// that cannot be read is `None`, reported as null (unknown), never as 0.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DropSnapshot {
    pub(crate) sender: Option<UdpCounters>,
    pub(crate) receiver: Option<UdpCounters>,
    pub(crate) backlog_drops: Option<u64>,
}

impl DropSnapshot {
    /// Samples both namespaces through `sys`; what cannot be read is
    /// logged and left unknown (it only explains losses, it does not make
    /// them).
    pub(crate) fn take(sys: &dyn Sys, sender: Ns, receiver: Ns) -> Self {
        fn known<T>(what: &str, r: Result<T>) -> Option<T> {
            r.map_err(|e| log::info!("kernel drop counters of the {what}: {e:#}"))
                .ok()
        }
        Self {
            sender: known("sender", read_udp_in(sys, sender)),
            receiver: known("receiver", read_udp_in(sys, receiver)),
            backlog_drops: known("host", read_softnet_dropped_in(sys)),
        }
    }

    /// What happened between `before` and `self`, as reported in the
    /// summary: null where either sample is unknown.
    pub(crate) fn report_since(&self, before: &DropSnapshot) -> KernelDrops {
        let s = self.sender.zip(before.sender).map(|(a, b)| a.since(&b));
        let r = self.receiver.zip(before.receiver).map(|(a, b)| a.since(&b));
        KernelDrops {
            receiver_rcvbuf_errors: r.map(|c| c.rcvbuf_errors),
            receiver_in_errors: r.map(|c| c.in_errors),
            sender_rcvbuf_errors: s.map(|c| c.rcvbuf_errors),
            sender_in_errors: s.map(|c| c.in_errors),
            sender_sndbuf_errors: s.map(|c| c.sndbuf_errors),
            host_backlog_drops: self
                .backlog_drops
                .zip(before.backlog_drops)
                .map(|(a, b)| a.saturating_sub(b)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreadable_counters_are_null_not_zero() {
        let c = UdpCounters {
            rcvbuf_errors: 5,
            ..Default::default()
        };
        let before = DropSnapshot {
            sender: None,
            receiver: Some(UdpCounters::default()),
            backlog_drops: Some(10),
        };
        let after = DropSnapshot {
            sender: Some(c),
            receiver: Some(c),
            backlog_drops: None,
        };
        let r = serde_json::to_value(after.report_since(&before)).unwrap();
        assert_eq!(r["receiver_rcvbuf_errors"], 5);
        assert_eq!(r["receiver_in_errors"], 0, "read and zero is 0");
        assert!(r["sender_rcvbuf_errors"].is_null(), "{r}");
        assert!(r["sender_sndbuf_errors"].is_null(), "{r}");
        assert!(r["host_backlog_drops"].is_null(), "{r}");
    }

    const SNMP: &str = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
        Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n\
        Udp: 1200 3 40 1100 37 2 0 0 0\n\
        UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n\
        UdpLite: 0 0 0 0 0 0 0 0 0\n";

    #[test]
    fn parses_udp_line_by_name() {
        let c = parse_snmp_udp(SNMP).unwrap();
        assert_eq!(
            c,
            UdpCounters {
                in_datagrams: 1200,
                no_ports: 3,
                in_errors: 40,
                rcvbuf_errors: 37,
                sndbuf_errors: 2,
            }
        );
        assert!(parse_snmp_udp("Ip: a\nIp: 1\n").is_none());
        let before = UdpCounters {
            rcvbuf_errors: 30,
            ..c
        };
        assert_eq!(c.since(&before).rcvbuf_errors, 7);
        assert_eq!(c.since(&before).in_datagrams, 0);
    }

    /// Through the fake kernel: a namespace whose snmp cannot be read and
    /// a missing softnet_stat are null in the report, the rest counted.
    #[test]
    fn snapshots_through_sys_leave_what_cannot_be_read_unknown() {
        use crate::sys::fake::{Call, FakeSys};
        let f = FakeSys::new();
        f.create_netns("snd").unwrap();
        f.create_netns("rcv").unwrap();
        f.with_file(Ns::Named("rcv"), "procnet:snmp", SNMP);
        let before = DropSnapshot::take(&f, Ns::Named("snd"), Ns::Named("rcv"));
        let bumped = SNMP.replace("Udp: 1200 3 40 1100 37 2", "Udp: 1300 3 41 1100 45 2");
        f.with_file(Ns::Named("rcv"), "procnet:snmp", &bumped);
        let after = DropSnapshot::take(&f, Ns::Named("snd"), Ns::Named("rcv"));
        let r = serde_json::to_value(after.report_since(&before)).unwrap();
        assert_eq!(r["receiver_rcvbuf_errors"], 8);
        assert_eq!(r["receiver_in_errors"], 1);
        assert!(r["sender_rcvbuf_errors"].is_null(), "{r}");
        assert!(r["host_backlog_drops"].is_null(), "{r}");
        assert!(
            f.calls()
                .contains(&Call::ProcNet("host".into(), "softnet_stat".into()))
        );
    }

    #[test]
    fn sums_softnet_drops_over_cpus() {
        let t = "0000a000 00000002 00000000 00000000\n0000b000 00000010 00000001 00000000\n";
        assert_eq!(parse_softnet_dropped(t), 2 + 16);
        assert_eq!(parse_softnet_dropped(""), 0);
    }
}
