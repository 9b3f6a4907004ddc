//! One probe as the whole pipeline sees it: the matcher fills it, the CSV
//! writes it, the statistics and the live outputs read it, the plots read
//! it back. [`RecordSink`] is where a session hands finalized records.

use anyhow::Result;
use serde::{Deserialize, Serialize};

/// Where the headline figures start: the packet entering the sender's
/// device layer (the kernel's SCHED stamp) or, where the kernel gave none,
/// the user-space clock just before sendmsg().
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StartSrc {
    #[serde(rename = "sched")]
    Sched,
    #[serde(rename = "user")]
    User,
}

impl StartSrc {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            StartSrc::Sched => "sched",
            StartSrc::User => "user",
        }
    }
}

/// Where a timestamp came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TsSource {
    /// NIC hardware clock (SOF_TIMESTAMPING_RAW_HARDWARE).
    #[serde(rename = "hw")]
    Hardware,
    /// Kernel software timestamp (SOF_TIMESTAMPING_SOFTWARE).
    #[serde(rename = "sw")]
    Software,
    /// Both ends of a difference, one hardware and one software.
    #[serde(rename = "mixed")]
    Mixed,
}

impl TsSource {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TsSource::Hardware => "hw",
            TsSource::Software => "sw",
            TsSource::Mixed => "mixed",
        }
    }

    /// The source of a difference between two timestamps.
    pub(crate) fn combine(a: TsSource, b: TsSource) -> TsSource {
        if a == b { a } else { TsSource::Mixed }
    }
}

/// One probe, as written to the CSV. Every `*_ns` stamp is CLOCK_REALTIME
/// (hardware stamps converted from the NIC's PHC); `None` is "not
/// available". The statistics' `chain::derive` fills the headline figures
/// and the stages from the stamps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProbeRecord {
    pub seq: u64,
    /// Flow id (0 unless several probe flows run at once).
    pub flow: u8,
    /// UDP payload bytes.
    pub size: u32,
    /// When the pacer meant to send it.
    pub sched_ns: i64,
    /// User-space clock just before sendmsg().
    pub send_ns: i64,
    /// Sender software TX timestamp (the driver took the packet).
    pub tx_ns: Option<i64>,
    /// Receiver software RX timestamp.
    pub rx_ns: Option<i64>,
    /// Sender software RX timestamp of the echo.
    pub echo_ns: Option<i64>,
    /// Headline one-way delay: receiver RX minus the packet's entry into
    /// the sender's stack (`start_src`).
    pub one_way_ns: Option<i64>,
    /// Headline RTT: the echo's RX minus the same start.
    pub rtt_ns: Option<i64>,
    /// Clock of the TX stamp the path stage starts from.
    pub tx_src: Option<TsSource>,
    /// Clock of the RX stamp the one-way figure ends at.
    pub rx_src: Option<TsSource>,
    /// Clock of the echo RX stamp the RTT ends at.
    pub echo_src: Option<TsSource>,
    /// Source of the one-way figure (or of the RTT if only that exists).
    pub ts_source: Option<TsSource>,
    /// The probe never reached the receiver.
    pub lost: bool,
    /// Reflector turnaround: the echo's last TX stamp minus the probe's RX
    /// stamp, both taken by the reflector's kernel.
    pub turnaround_ns: Option<i64>,
    /// Where `one_way_ns` and `rtt_ns` start.
    pub start_src: Option<StartSrc>,
    /// SCHED stamp: the probe entered the sender's device layer (qdisc).
    pub tx_sched_ns: Option<i64>,
    /// Hardware TX stamp (the NIC sent it), on the system clock.
    pub tx_hw_ns: Option<i64>,
    /// Hardware RX stamp at the receiver, on the system clock.
    pub rx_hw_ns: Option<i64>,
    /// The reflector's user-space clock when recvmmsg() gave it the probe.
    pub rx_user_ns: Option<i64>,
    /// The reflector's user-space clock just before it sent the echo.
    pub echo_send_ns: Option<i64>,
    /// The echo's SCHED stamp at the reflector.
    pub echo_tx_sched_ns: Option<i64>,
    /// The echo's software TX stamp at the reflector.
    pub echo_tx_ns: Option<i64>,
    /// The echo's hardware TX stamp at the reflector, on the system clock.
    pub echo_tx_hw_ns: Option<i64>,
    /// Hardware RX stamp of the echo at the sender, on the system clock.
    pub echo_hw_ns: Option<i64>,
    /// The sender's user-space clock when it read the echo.
    pub echo_user_ns: Option<i64>,
    /// Stage: user-space send -> SCHED stamp (syscall, UDP/IP, routing).
    pub stack_ns: Option<i64>,
    /// Stage: SCHED -> software TX (qdisc, shaping, driver xmit).
    pub sender_queue_ns: Option<i64>,
    /// Stage: software TX -> hardware TX (driver ring, BQL, NIC queue).
    pub driver_ns: Option<i64>,
    /// Stage: last TX stamp -> receiver RX (wire, router and its queue).
    pub path_ns: Option<i64>,
    /// Stage: receiver RX -> the reflector's user space read it.
    pub receiver_ns: Option<i64>,
    /// Stage: reflector's read -> the echo's last TX stamp.
    pub reflector_ns: Option<i64>,
    /// Stage: the echo's last TX stamp -> its RX at the sender.
    pub return_ns: Option<i64>,
}

/// Where finalized records go: the CSV, or a CSV shared by several flows.
pub trait RecordSink: Send {
    fn write(&mut self, r: &ProbeRecord) -> Result<()>;
    fn flush(&mut self) -> Result<()>;
    /// A record of the target named `target` in a run with several (the
    /// CSV's `target` column); sinks without such a column ignore the name.
    fn write_for(&mut self, target: &str, r: &ProbeRecord) -> Result<()> {
        let _ = target;
        self.write(r)
    }
}
