//! How one session's probes and their echoes look on the wire: rtprobe's
//! own format or STAMP (RFC 8762), written by the pacer and the warm-up,
//! read back by the echo rules ([`super::matcher::EchoRules`]); which
//! protocol a session speaks ([`ProtocolArg`]; the option model gives it
//! its flag), its default ports and the largest payload a 1500-byte path
//! carries.

use super::{
    packet::{HEADER_LEN, KernelTimes, Probe},
    reflect::{FLAG_WARMUP, read_rtprobe_state},
    stamp::{ErrorEstimate, HmacKey, Mode, ReflectorPacket, SenderPacket, Timestamp},
};

/// Which probes go on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProtocolArg {
    /// rtprobe's own probes (magic RTPB, 64-bit session id and sequence).
    #[default]
    Rtprobe,
    /// STAMP (RFC 8762) session-sender packets, SSID (RFC 8972) + sequence number.
    Stamp,
}

impl ProtocolArg {
    pub(crate) fn default_port(self) -> u16 {
        match self {
            ProtocolArg::Rtprobe => RTPROBE_PORT,
            ProtocolArg::Stamp => STAMP_PORT,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            ProtocolArg::Rtprobe => "rtprobe",
            ProtocolArg::Stamp => "stamp",
        }
    }
}

/// STAMP's well-known port (RFC 8762 §4.1, IANA "stamp").
pub(crate) const STAMP_PORT: u16 = 862;
/// rtprobe's own protocol's default port.
pub(crate) const RTPROBE_PORT: u16 = 5061;

/// Largest UDP payload on a 1500-byte MTU path (1500 - 20 IPv4 - 8 UDP).
pub(crate) const MAX_PAYLOAD_1500: usize = 1472;
/// The same over IPv6 (1500 - 40 IPv6 - 8 UDP).
pub(crate) const MAX_PAYLOAD_1500_IPV6: usize = 1452;

/// How the probes of one session look on the wire.
#[derive(Debug, Clone)]
pub(crate) enum Wire {
    Rtprobe {
        session: u64,
        flow: u8,
    },
    Stamp {
        ssid: u16,
        key: Option<HmacKey>,
        ee: ErrorEstimate,
        tai_offset_s: i32,
    },
}

/// What one echo said.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Echo {
    pub(crate) seq: u64,
    pub(crate) warmup: bool,
    pub(crate) times: Option<KernelTimes>,
    /// rtprobe: probes of the session the reflector received so far.
    pub(crate) received: Option<u64>,
    /// STAMP: the reflector's own sequence number.
    pub(crate) reflector_seq: Option<u32>,
    pub(crate) ee: Option<ErrorEstimate>,
    pub(crate) ttl: Option<u8>,
}

/// SSIDs of warm-up packets have the top bit set; the session's do not.
pub(crate) const SSID_WARMUP_BIT: u16 = 0x8000;
/// The warm-up probes' sequence number (both protocols).
pub(crate) const WARMUP_SEQ: u64 = u32::MAX as u64 - 1;

impl Wire {
    pub(crate) fn mode(&self) -> Mode<'_> {
        match self {
            Wire::Stamp { key: Some(k), .. } => Mode::Authenticated(k),
            _ => Mode::Unauthenticated,
        }
    }

    pub(crate) fn min_len(&self) -> usize {
        match self {
            Wire::Rtprobe { .. } => HEADER_LEN,
            Wire::Stamp { .. } => self.mode().base_len_bytes(),
        }
    }

    /// Writes probe `seq` into `buf` (its length is the probe's size).
    pub(crate) fn encode(
        &self,
        seq: u64,
        send_ns: i64,
        warmup: bool,
        buf: &mut [u8],
        scratch: &mut Vec<u8>,
    ) {
        match self {
            Wire::Rtprobe { session, flow } => {
                Probe {
                    session: *session,
                    seq,
                    flow: *flow,
                    echo: false,
                    send_ns,
                    kernel_times: None,
                }
                .encode(buf);
                if warmup {
                    buf[5] = FLAG_WARMUP;
                }
            }
            Wire::Stamp {
                ssid,
                ee,
                tai_offset_s,
                ..
            } => {
                let ts = Timestamp::from_realtime_ns(send_ns, ee.ptp(), *tai_offset_s)
                    .unwrap_or(Timestamp::from_bits(0, false).expect("zero NTP timestamp"));
                let p = SenderPacket {
                    seq: seq as u32,
                    timestamp: ts,
                    error_estimate: *ee,
                    ssid: if warmup {
                        ssid | SSID_WARMUP_BIT
                    } else {
                        *ssid
                    },
                };
                // The length was checked against the mode before the run.
                if p.encode(self.mode(), buf.len(), scratch).is_ok() {
                    buf.copy_from_slice(scratch);
                }
            }
        }
    }

    /// The echo of one of this session's probes, or None (foreign).
    pub(crate) fn decode(&self, buf: &[u8]) -> Option<Echo> {
        match self {
            Wire::Rtprobe { session, .. } => {
                let p = Probe::decode(buf, *session).ok()?;
                if !p.echo {
                    return None;
                }
                let state = read_rtprobe_state(buf);
                Some(Echo {
                    seq: p.seq,
                    warmup: buf[5] & FLAG_WARMUP != 0,
                    times: p.kernel_times,
                    received: state.map(|s| s.0),
                    reflector_seq: None,
                    ee: state.map(|s| s.1),
                    ttl: None,
                })
            }
            Wire::Stamp {
                ssid, tai_offset_s, ..
            } => {
                let r = ReflectorPacket::decode(buf, self.mode()).ok()?;
                let warmup = r.ssid == ssid | SSID_WARMUP_BIT;
                if r.ssid != *ssid && !warmup {
                    return None;
                }
                Some(Echo {
                    seq: r.sender_seq as u64,
                    warmup,
                    times: Some(KernelTimes {
                        rx_ns: r.receive_timestamp.to_realtime_ns(*tai_offset_s),
                        tx_ns: r.timestamp.to_realtime_ns(*tai_offset_s),
                    }),
                    received: None,
                    reflector_seq: Some(r.seq),
                    ee: Some(r.error_estimate),
                    ttl: Some(r.sender_ttl),
                })
            }
        }
    }
}
