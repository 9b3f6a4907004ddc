//! Kernel drop counters that say where lost probes went: UDP receive-buffer
//! overflows of a namespace (`/proc/thread-self/net/snmp`, read on a thread
//! inside the namespace) and the per-CPU input backlog drops
//! (`/proc/net/softnet_stat`, host-wide: other traffic on the machine
//! counts too). Parsing is pure; reading needs only procfs (any Linux).

use anyhow::{Context, Result};
use serde::Serialize;

use crate::testbed::Netns;

/// The `Udp:` line of /proc/net/snmp (the fields rtprobe reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct UdpCounters {
    pub in_datagrams: u64,
    pub no_ports: u64,
    pub in_errors: u64,
    pub rcvbuf_errors: u64,
    pub sndbuf_errors: u64,
}

impl UdpCounters {
    /// Counter increase from `before` to `self`.
    pub fn since(&self, before: &UdpCounters) -> UdpCounters {
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
pub fn parse_snmp_udp(text: &str) -> Option<UdpCounters> {
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
pub fn parse_softnet_dropped(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|v| u64::from_str_radix(v, 16).ok())
        .sum()
}

/// UDP counters of the namespace `ns`.
pub fn read_udp(ns: &Netns) -> Result<UdpCounters> {
    ns.run(|| {
        let t = std::fs::read_to_string("/proc/thread-self/net/snmp")
            .context("read /proc/thread-self/net/snmp")?;
        parse_snmp_udp(&t).context("no Udp: line in /proc/net/snmp")
    })
}

/// Host-wide backlog drops so far.
pub fn read_softnet_dropped() -> Result<u64> {
    let t =
        std::fs::read_to_string("/proc/net/softnet_stat").context("read /proc/net/softnet_stat")?;
    Ok(parse_softnet_dropped(&t))
}

/// The counters of both ends, sampled before and after a run.
#[derive(Debug, Clone, Copy, Default)]
pub struct DropSnapshot {
    pub sender: UdpCounters,
    pub receiver: UdpCounters,
    pub backlog_drops: u64,
}

impl DropSnapshot {
    /// Samples both namespaces; a counter that cannot be read stays 0 (it
    /// only explains losses, it does not make them).
    pub fn take(sender: &Netns, receiver: &Netns) -> Self {
        Self {
            sender: read_udp(sender).unwrap_or_default(),
            receiver: read_udp(receiver).unwrap_or_default(),
            backlog_drops: read_softnet_dropped().unwrap_or(0),
        }
    }

    /// What happened between `before` and `self`, as reported in the summary.
    pub fn report_since(&self, before: &DropSnapshot) -> serde_json::Value {
        let s = self.sender.since(&before.sender);
        let r = self.receiver.since(&before.receiver);
        serde_json::json!({
            "receiver_rcvbuf_errors": r.rcvbuf_errors,
            "receiver_in_errors": r.in_errors,
            "sender_rcvbuf_errors": s.rcvbuf_errors,
            "sender_in_errors": s.in_errors,
            "sender_sndbuf_errors": s.sndbuf_errors,
            "host_backlog_drops": self.backlog_drops.saturating_sub(before.backlog_drops),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn sums_softnet_drops_over_cpus() {
        let t = "0000a000 00000002 00000000 00000000\n0000b000 00000010 00000001 00000000\n";
        assert_eq!(parse_softnet_dropped(t), 2 + 16);
        assert_eq!(parse_softnet_dropped(""), 0);
    }
}
