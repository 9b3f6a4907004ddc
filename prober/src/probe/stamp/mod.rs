//! STAMP test packets (RFC 8762, with the RFC 8972 §3 SSID), pure: no
//! sockets. The session-sender (`rtprobe --target`) and the reflector
//! (`rtprobe reflect`) are built on it.
//!
//! This file holds what every part shares: [`StampError`] and the packet
//! lengths. The parts, and where each is specified:
//!
//! - `time.rs`: the timestamps, [`NtpTimestamp`] (RFC 5905 §6, as RFC 8762
//!   §4.2.1 uses it) and [`PtpTimestamp`] (RFC 8762 §4.2.1, format in
//!   RFC 8877 §4.3), and [`Timestamp`], the one a packet carries.
//! - `estimate.rs`: [`ErrorEstimate`] (RFC 4656 §4.1.2 with the Z bit of
//!   RFC 8762 §4.2.1) and [`ClockSync`], the kernel's view of clock
//!   synchronisation (`adjtimex(2)`, read only) it is made from.
//! - `auth.rs`: authenticated mode, [`HmacKey`] (HMAC-SHA-256 truncated to
//!   128 bits, RFC 8762 §4.4) and [`Mode`].
//! - `packet.rs`: the wire format, [`SenderPacket`] (RFC 8762 §4.2.1,
//!   §4.2.2) and [`ReflectorPacket`] (§4.3.1, §4.3.2) with the SSID of
//!   RFC 8972 §3, and the byte layouts of all four.
//! - `reflector.rs`: the Session-Reflector's behaviour (RFC 8762 §4.3),
//!   [`reflect`], stateless or stateful ([`ReflectorState`]).
//!
//! Anything after the base packet is padding (or RFC 8972 TLVs, which this
//! module does not interpret): decoders ignore it, the reflector copies it.

mod auth;
mod estimate;
mod packet;
mod reflector;
#[cfg(test)]
mod scapy_interop;
#[cfg(test)]
mod testutil;
mod time;

use thiserror::Error;

pub(crate) use self::reflector::{ReflectParams, Sequencing};
pub use self::{
    auth::{HmacKey, Mode},
    estimate::{ClockSync, ErrorEstimate},
    packet::{ReflectorPacket, SenderPacket},
    reflector::reflect,
    time::Timestamp,
};
#[cfg(test)]
pub(crate) use self::{
    reflector::ReflectorState,
    time::{NtpTimestamp, PtpTimestamp},
};

/// Base length of every unauthenticated STAMP test packet (RFC 8762 §4.2.1, §4.3.1).
pub(crate) const UNAUTH_LEN_BYTES: usize = 44;
/// Base length of every authenticated STAMP test packet (RFC 8762 §4.2.2, §4.3.2).
pub const AUTH_LEN_BYTES: usize = 112;
/// Octets an HMAC covers: the first six 16-octet blocks (RFC 8762 §4.4).
pub const HMAC_COVERED_BYTES: usize = 96;
/// HMAC-SHA-256 truncated to 128 bits (RFC 8762 §4.4, as RFC 4868 does).
pub(crate) const HMAC_LEN_BYTES: usize = 16;
/// Largest UDP payload over IPv4; no encoder builds a longer packet.
pub const MAX_PACKET_BYTES: usize = 65_507;

const NS_PER_S: i128 = 1_000_000_000;

/// Why bytes are not a STAMP packet, or a value does not fit the wire format.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StampError {
    #[error(
        "STAMP packet of {len_bytes} bytes is shorter than the {min_bytes}-byte base packet of its mode (RFC 8762 §4.2): check that both ends agree on authenticated mode"
    )]
    TooShort { len_bytes: usize, min_bytes: usize },
    #[error(
        "STAMP packet of {len_bytes} bytes exceeds the largest UDP payload ({max_bytes} bytes)"
    )]
    TooLong { len_bytes: usize, max_bytes: usize },
    #[error(
        "STAMP packet HMAC does not match: the peer uses another key, or the packet was altered"
    )]
    BadHmac,
    #[error("STAMP HMAC key is empty: give a key of at least 32 bytes (RFC 4868 §2.1.1)")]
    EmptyKey,
    #[error(
        "time {unix_ns} ns since 1970 cannot be written as a {format} timestamp (NTP: 1968-01-20 to 2104-02-26; PTP: 1970 to 2106)"
    )]
    TimestampOutOfRange { unix_ns: i64, format: &'static str },
    #[error("PTP timestamp with {nanoseconds} nanoseconds (must be below 10^9)")]
    InvalidPtpNanoseconds { nanoseconds: u32 },
    #[error(
        "timestamp format does not match the Z flag of its Error Estimate (RFC 8762 §4.2.1): build both from the same format"
    )]
    FormatMismatch,
    #[error("Error Estimate scale {scale} does not fit its 6 bits (0..=63)")]
    InvalidScale { scale: u8 },
    #[error("Error Estimate multiplier must not be zero (RFC 4656 §4.1.2)")]
    ZeroMultiplier,
    #[error("reflector state already tracks {max} sessions: refusing a new SSID from this peer")]
    TooManySessions { max: usize },
    #[error("adjtimex(2) failed with errno {errno}: cannot read the clock's sync state")]
    Adjtimex { errno: i32 },
}
