//! The timestamp chain of one probe, and the stages it splits into. Pure.
//!
//! ```text
//!  sender                                   receiver (reflector)
//!  send_ns ── stack ──> tx_sched_ns           rx_hw_ns? rx_ns ── receiver ──> rx_user_ns
//!  (user space)         (SCHED: device layer,     ^                          (recvmmsg returned)
//!                        before the qdisc)        |                                │
//!     tx_sched_ns ── sender queue ──> tx_ns       |                            reflector
//!                    (qdisc, shaping)  (driver)   |                                v
//!     tx_ns ── driver ──> tx_hw_ns (NIC)          |              echo_tx_ns / echo_tx_hw_ns
//!     last TX stamp ─────────── path ─────────────┘                                │
//!  echo_ns <───────────────────── return path ─────────────────────────────────────┘
//! ```
//!
//! The headline one-way delay starts where the packet enters the sender's
//! stack as the kernel sees it (the SCHED stamp; the user-space send time
//! where the kernel gave none) and ends at the receiver's RX stamp, so
//! every queue a knob acts on (qdisc, shaping, TX ring, the router) is
//! inside it. The RTT starts at the same point and ends at the echo's RX
//! stamp. With every stamp present the stages add up exactly:
//! one-way = sender queue + driver + path (+ stack when the start is the
//! user-space send time), RTT = one-way + receiver + reflector + return.

use crate::model::record::{ProbeRecord, StartSrc, TsSource};

/// Where a probe's time goes, in chain order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Stage {
    /// User-space send -> SCHED stamp: the syscall, UDP/IP, routing.
    Stack,
    /// SCHED -> software TX stamp: the qdisc (shaping, queue) and the driver's xmit.
    SenderQueue,
    /// Software -> hardware TX stamp: the driver's ring, BQL, the NIC's queue.
    Driver,
    /// Last TX stamp -> receiver RX stamp: wire, router, the router's queue.
    Path,
    /// Receiver RX stamp -> the reflector's user space has the probe.
    Receiver,
    /// The reflector's read -> the echo's last TX stamp.
    Reflector,
    /// The echo's last TX stamp -> its RX stamp at the sender.
    ReturnPath,
}

impl Stage {
    pub(crate) const ALL: [Stage; 7] = [
        Stage::Stack,
        Stage::SenderQueue,
        Stage::Driver,
        Stage::Path,
        Stage::Receiver,
        Stage::Reflector,
        Stage::ReturnPath,
    ];

    /// The `--json` key and the CSV column stem.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Stage::Stack => "stack",
            Stage::SenderQueue => "sender_queue",
            Stage::Driver => "driver",
            Stage::Path => "path",
            Stage::Receiver => "receiver",
            Stage::Reflector => "reflector",
            Stage::ReturnPath => "return",
        }
    }

    /// Words for a sentence: "96 % of the one-way p50 is {words}".
    pub(crate) fn words(self) -> &'static str {
        match self {
            Stage::Stack => "the sender's stack (syscall to qdisc entry)",
            Stage::SenderQueue => "the sender's queue (qdisc and driver xmit)",
            Stage::Driver => "the sender's driver ring and NIC queue",
            Stage::Path => "the path (wire, router and its queue)",
            Stage::Receiver => "the receiver's wake-up",
            Stage::Reflector => "the reflector (read to echo sent)",
            Stage::ReturnPath => "the return path",
        }
    }

    /// Short row label for tables and figures.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Stage::Stack => "stack",
            Stage::SenderQueue => "sender queue",
            Stage::Driver => "driver/ring",
            Stage::Path => "path",
            Stage::Receiver => "receiver",
            Stage::Reflector => "reflector",
            Stage::ReturnPath => "return path",
        }
    }

    /// The stage's value in a record.
    pub(crate) fn of(self, r: &ProbeRecord) -> Option<i64> {
        match self {
            Stage::Stack => r.stack_ns,
            Stage::SenderQueue => r.sender_queue_ns,
            Stage::Driver => r.driver_ns,
            Stage::Path => r.path_ns,
            Stage::Receiver => r.receiver_ns,
            Stage::Reflector => r.reflector_ns,
            Stage::ReturnPath => r.return_ns,
        }
    }

    /// Whether the stage lies inside the headline one-way delay that starts
    /// at `start`.
    pub(crate) fn in_one_way(self, start: StartSrc) -> bool {
        match self {
            Stage::Stack => start == StartSrc::User,
            Stage::SenderQueue | Stage::Driver | Stage::Path => true,
            Stage::Receiver | Stage::Reflector | Stage::ReturnPath => false,
        }
    }
}

fn diff(later: Option<i64>, earlier: Option<i64>) -> Option<i64> {
    later?.checked_sub(earlier?)
}

/// Fills the headline figures, the sources and the stages of `r` from its
/// stamps (which must all be on CLOCK_REALTIME by now).
pub fn derive(r: &mut ProbeRecord) {
    let (start, start_src) = match r.tx_sched_ns {
        Some(t) => (t, StartSrc::Sched),
        None => (r.send_ns, StartSrc::User),
    };
    // The later of the two TX stamps is where the packet left the sender.
    let last_tx = match (r.tx_hw_ns, r.tx_ns) {
        (Some(h), _) => Some((h, TsSource::Hardware)),
        (None, Some(s)) => Some((s, TsSource::Software)),
        _ => None,
    };
    // The receiver "has" the packet when its stack stamped it; a hardware
    // stamp alone (no software one) still ends the figure.
    let rx_end = match (r.rx_ns, r.rx_hw_ns) {
        (Some(s), _) => Some((s, TsSource::Software)),
        (None, Some(h)) => Some((h, TsSource::Hardware)),
        _ => None,
    };
    let echo_end = match (r.echo_ns, r.echo_hw_ns) {
        (Some(s), _) => Some((s, TsSource::Software)),
        (None, Some(h)) => Some((h, TsSource::Hardware)),
        _ => None,
    };
    let echo_last_tx = r.echo_tx_hw_ns.or(r.echo_tx_ns);

    r.start_src = Some(start_src);
    r.tx_src = last_tx.map(|t| t.1);
    r.rx_src = rx_end.map(|t| t.1);
    r.echo_src = echo_end.map(|t| t.1);
    r.one_way_ns = rx_end.map(|(t, _)| t - start);
    r.rtt_ns = echo_end.map(|(t, _)| t - start);
    // The start is always a software-clock time.
    r.ts_source = rx_end
        .or(echo_end)
        .map(|(_, s)| TsSource::combine(TsSource::Software, s));

    r.stack_ns = r.tx_sched_ns.map(|t| t - r.send_ns);
    r.sender_queue_ns = diff(r.tx_ns, r.tx_sched_ns);
    r.driver_ns = diff(r.tx_hw_ns, r.tx_ns);
    r.path_ns = diff(rx_end.map(|t| t.0), last_tx.map(|t| t.0));
    r.receiver_ns = diff(r.rx_user_ns, rx_end.map(|t| t.0));
    r.reflector_ns = diff(echo_last_tx, r.rx_user_ns);
    r.return_ns = diff(echo_end.map(|t| t.0), echo_last_tx);
    r.turnaround_ns = diff(echo_last_tx, rx_end.map(|t| t.0));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full_software() -> ProbeRecord {
        ProbeRecord {
            send_ns: 1_000,
            tx_sched_ns: Some(1_010),
            tx_ns: Some(1_500),
            rx_ns: Some(1_530),
            rx_user_ns: Some(1_570),
            echo_send_ns: Some(1_575),
            echo_tx_sched_ns: Some(1_580),
            echo_tx_ns: Some(1_590),
            echo_ns: Some(1_620),
            echo_user_ns: Some(1_700),
            ..Default::default()
        }
    }

    #[test]
    fn headline_starts_at_the_sched_stamp_and_stages_add_up() {
        let mut r = full_software();
        derive(&mut r);
        assert_eq!(r.start_src, Some(StartSrc::Sched));
        assert_eq!(r.one_way_ns, Some(520), "RX minus SCHED");
        assert_eq!(r.rtt_ns, Some(610));
        assert_eq!(r.stack_ns, Some(10));
        assert_eq!(r.sender_queue_ns, Some(490));
        assert_eq!(r.driver_ns, None, "no hardware stamps");
        assert_eq!(
            r.path_ns,
            Some(30),
            "the old tx->rx figure is the path stage"
        );
        assert_eq!(r.receiver_ns, Some(40));
        assert_eq!(r.reflector_ns, Some(20));
        assert_eq!(r.return_ns, Some(30));
        assert_eq!(r.turnaround_ns, Some(60));
        let one_way: i64 = Stage::ALL
            .iter()
            .filter(|s| s.in_one_way(StartSrc::Sched))
            .filter_map(|s| s.of(&r))
            .sum();
        assert_eq!(Some(one_way), r.one_way_ns);
        let rtt: i64 = Stage::ALL
            .iter()
            .filter(|&&s| s != Stage::Stack)
            .filter_map(|s| s.of(&r))
            .sum();
        assert_eq!(Some(rtt), r.rtt_ns);
        assert_eq!(
            (r.tx_src, r.rx_src, r.echo_src, r.ts_source),
            (
                Some(TsSource::Software),
                Some(TsSource::Software),
                Some(TsSource::Software),
                Some(TsSource::Software)
            )
        );
    }

    #[test]
    fn without_a_sched_stamp_the_user_space_send_starts_it() {
        let mut r = ProbeRecord {
            tx_sched_ns: None,
            ..full_software()
        };
        derive(&mut r);
        assert_eq!(r.start_src, Some(StartSrc::User));
        assert_eq!(r.one_way_ns, Some(530));
        assert_eq!(r.stack_ns, None);
        assert_eq!(r.sender_queue_ns, None);
        assert!(Stage::Stack.in_one_way(StartSrc::User));
        assert!(!Stage::Stack.in_one_way(StartSrc::Sched));
    }

    #[test]
    fn hardware_stamps_split_the_driver_from_the_path() {
        let mut r = ProbeRecord {
            tx_hw_ns: Some(1_505),
            rx_hw_ns: Some(1_520),
            echo_tx_hw_ns: Some(1_595),
            echo_hw_ns: Some(1_610),
            ..full_software()
        };
        derive(&mut r);
        assert_eq!(r.driver_ns, Some(5));
        assert_eq!(r.path_ns, Some(25), "NIC TX to the receiver's stack");
        assert_eq!(r.reflector_ns, Some(25), "read to the echo's NIC TX");
        assert_eq!(r.return_ns, Some(25));
        assert_eq!(r.tx_src, Some(TsSource::Hardware));
        assert_eq!(r.rx_src, Some(TsSource::Software));
        assert_eq!(r.one_way_ns, Some(520));
    }

    #[test]
    fn lost_probe_keeps_its_sender_stages() {
        let mut r = ProbeRecord {
            send_ns: 100,
            tx_sched_ns: Some(105),
            tx_ns: Some(900),
            lost: true,
            ..Default::default()
        };
        derive(&mut r);
        assert_eq!((r.one_way_ns, r.rtt_ns), (None, None));
        assert_eq!(r.sender_queue_ns, Some(795));
        assert_eq!(r.path_ns, None);
        assert_eq!(r.ts_source, None);
    }

    #[test]
    fn only_hardware_rx_still_ends_the_figure() {
        let mut r = ProbeRecord {
            send_ns: 0,
            tx_ns: Some(10),
            rx_hw_ns: Some(40),
            ..Default::default()
        };
        derive(&mut r);
        assert_eq!(r.one_way_ns, Some(40));
        assert_eq!(r.ts_source, Some(TsSource::Mixed));
        assert_eq!(r.rx_src, Some(TsSource::Hardware));
    }
}
