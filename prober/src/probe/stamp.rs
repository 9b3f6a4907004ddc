//! STAMP test packets (RFC 8762, with the RFC 8972 §3 SSID), pure: no
//! sockets. The session-sender (`rtprobe --target`) and the reflector
//! (`rtprobe reflect`) are built on it.
//!
//! What lives here, and where each piece is specified:
//!
//! - [`NtpTimestamp`]: NTP 64-bit timestamp (RFC 5905 §6, as RFC 8762
//!   §4.2.1 uses it): seconds since 1900-01-01 + 32-bit binary fraction.
//! - [`PtpTimestamp`]: PTPv2 truncated timestamp (RFC 8762 §4.2.1, format in
//!   RFC 8877 §4.3): 32-bit seconds + 32-bit nanoseconds since the PTP epoch,
//!   1970-01-01 00:00:00 TAI.
//! - [`ErrorEstimate`]: RFC 4656 §4.1.2 (S, Scale, Multiplier) with the Z
//!   bit of RFC 8762 §4.2.1 (0 = NTP, 1 = PTP timestamps).
//! - [`SenderPacket`]: Session-Sender test packet, unauthenticated (RFC 8762
//!   §4.2.1, 44 bytes) and authenticated (§4.2.2, 112 bytes), SSID from
//!   RFC 8972 §3 in the first two octets of the MBZ after the Error Estimate.
//! - [`ReflectorPacket`]: Session-Reflector test packet, unauthenticated
//!   (RFC 8762 §4.3.1, 44 bytes) and authenticated (§4.3.2, 112 bytes), SSID
//!   (RFC 8972 §3) in the same place as in the sender's packet.
//! - [`HmacKey`]: HMAC-SHA-256 truncated to 128 bits over the first 96
//!   octets of an authenticated packet (RFC 8762 §4.4).
//! - [`reflect`]: the Session-Reflector's behaviour (RFC 8762 §4.3),
//!   stateless or stateful ([`ReflectorState`]).
//! - [`ClockSync`]: the kernel's view of clock synchronisation, read with
//!   `adjtimex(2)` with `modes = 0` (read only, no privilege; the `tai`
//!   field needs Linux >= 2.6.26), mapped to an Error Estimate.
//!
//! Byte offsets (all integers big-endian):
//!
//! ```text
//! Session-Sender, unauthenticated (44)     Session-Sender, authenticated (112)
//!   0 Sequence Number (4)                    0 Sequence Number (4)
//!   4 Timestamp (8)                          4 MBZ (12)
//!  12 Error Estimate (2)                    16 Timestamp (8)
//!  14 SSID (2)                              24 Error Estimate (2)
//!  16 MBZ (28)                              26 SSID (2)
//!                                           28 MBZ (68)
//!                                           96 HMAC (16)
//!
//! Session-Reflector, unauthenticated (44)  Session-Reflector, authenticated (112)
//!   0 Sequence Number (4)                    0 Sequence Number (4)
//!   4 Timestamp (8)                          4 MBZ (12)
//!  12 Error Estimate (2)                    16 Timestamp (8)
//!  14 SSID (2)                              24 Error Estimate (2)
//!  16 Receive Timestamp (8)                 26 SSID (2)
//!  24 Session-Sender Sequence Number (4)    28 MBZ (4)
//!  28 Session-Sender Timestamp (8)          32 Receive Timestamp (8)
//!  36 Session-Sender Error Estimate (2)     40 MBZ (8)
//!  38 MBZ (2)                               48 Session-Sender Sequence Number (4)
//!  40 Session-Sender TTL (1)                52 MBZ (12)
//!  41 MBZ (3)                               64 Session-Sender Timestamp (8)
//!                                           72 Session-Sender Error Estimate (2)
//!                                           74 MBZ (6)
//!                                           80 Session-Sender TTL (1)
//!                                           81 MBZ (15)
//!                                           96 HMAC (16)
//! ```
//!
//! Anything after the base packet is padding (or RFC 8972 TLVs, which this
//! module does not interpret): decoders ignore it, the reflector copies it.
//! Decoders do not check MBZ octets: RFC 8972 grew the SSID out of an MBZ
//! field, and later extensions may do the same, so rejecting non-zero MBZ
//! would break interop; encoders always write zeros there.

use std::collections::HashMap;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use thiserror::Error;

/// Seconds from the NTP epoch (1900-01-01) to the Unix epoch (1970-01-01).
pub const NTP_UNIX_OFFSET_S: i64 = 2_208_988_800;
/// Base length of every unauthenticated STAMP test packet (RFC 8762 §4.2.1, §4.3.1).
pub const UNAUTH_LEN_BYTES: usize = 44;
/// Base length of every authenticated STAMP test packet (RFC 8762 §4.2.2, §4.3.2).
pub const AUTH_LEN_BYTES: usize = 112;
/// Octets an HMAC covers: the first six 16-octet blocks (RFC 8762 §4.4).
pub const HMAC_COVERED_BYTES: usize = 96;
/// HMAC-SHA-256 truncated to 128 bits (RFC 8762 §4.4, as RFC 4868 does).
pub const HMAC_LEN_BYTES: usize = 16;
/// Largest UDP payload over IPv4; no encoder builds a longer packet.
pub const MAX_PACKET_BYTES: usize = 65_507;
/// Sessions (SSIDs) one [`ReflectorState`] tracks: bounds the memory a
/// single peer can make the reflector spend.
pub const MAX_SESSIONS_PER_STATE: usize = 1024;

const NS_PER_S: i128 = 1_000_000_000;
/// Unix seconds the NTP era pivot of RFC 4330 §3 can express: NTP seconds
/// with the top bit set are 1968..2036 (era 0), the others 2036..2104 (era 1).
const NTP_MIN_UNIX_S: i64 = (1 << 31) - NTP_UNIX_OFFSET_S;
const NTP_MAX_UNIX_S: i64 = (1 << 31) + (1 << 32) - NTP_UNIX_OFFSET_S;

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

// ---------------------------------------------------------------- timestamps

/// NTP 64-bit timestamp (RFC 5905 §6): seconds since 1900-01-01 00:00 UTC,
/// modulo 2^32 (the NTP era), and a fraction in units of 2^-32 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NtpTimestamp {
    pub seconds: u32,
    pub fraction: u32,
}

impl NtpTimestamp {
    /// Converts Unix-epoch nanoseconds (CLOCK_REALTIME) with the fraction
    /// rounded to the nearest 2^-32 s. One fraction unit (0.23 ns) is finer
    /// than a nanosecond, so `to_unix_ns` gives back exactly `unix_ns`.
    /// The range is the one [`NtpTimestamp::to_unix_ns`] can tell apart
    /// without knowing the era: 1968-01-20 .. 2104-02-26.
    pub fn from_unix_ns(unix_ns: i64) -> Result<Self, StampError> {
        let secs = unix_ns.div_euclid(NS_PER_S as i64);
        if !(NTP_MIN_UNIX_S..NTP_MAX_UNIX_S).contains(&secs) {
            return Err(StampError::TimestampOutOfRange {
                unix_ns,
                format: "NTP",
            });
        }
        let rem_ns = unix_ns.rem_euclid(NS_PER_S as i64) as u128;
        // Below 2^32 - 3 even for 999_999_999 ns: no carry into seconds.
        let fraction = (((rem_ns << 32) + NS_PER_S as u128 / 2) / NS_PER_S as u128) as u32;
        Ok(Self {
            // Era folding: the range check above keeps this in one era pair.
            seconds: (secs + NTP_UNIX_OFFSET_S).rem_euclid(1 << 32) as u32,
            fraction,
        })
    }

    /// Unix-epoch nanoseconds, the fraction rounded to the nearest
    /// nanosecond (so an arbitrary fraction loses up to 0.5 ns). The era is
    /// taken from the top bit as RFC 4330 §3 suggests: set = 1968..2036,
    /// clear = 2036..2104.
    pub fn to_unix_ns(self) -> i64 {
        let era_s: i64 = if self.seconds & 0x8000_0000 != 0 {
            0
        } else {
            1 << 32
        };
        let secs = self.seconds as i64 + era_s - NTP_UNIX_OFFSET_S;
        let frac_ns = ((self.fraction as u64 * NS_PER_S as u64) + (1 << 31)) >> 32;
        // Cannot overflow: |secs| < 2^33 and frac_ns <= 10^9.
        secs * NS_PER_S as i64 + frac_ns as i64
    }

    pub fn to_bits(self) -> u64 {
        (self.seconds as u64) << 32 | self.fraction as u64
    }

    pub fn from_bits(bits: u64) -> Self {
        Self {
            seconds: (bits >> 32) as u32,
            fraction: bits as u32,
        }
    }
}

/// PTPv2 truncated timestamp (RFC 8877 §4.3, used by RFC 8762 §4.2.1):
/// seconds and nanoseconds since 1970-01-01 00:00:00 TAI.
///
/// The conversions here are pure epoch arithmetic on nanoseconds since
/// 1970 *on the TAI timescale*; [`Timestamp::from_realtime_ns`] adds the
/// TAI-UTC offset to CLOCK_REALTIME readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PtpTimestamp {
    pub seconds: u32,
    /// Always below 10^9 in a value from [`PtpTimestamp::from_unix_ns`] or
    /// a decoder.
    pub nanoseconds: u32,
}

impl PtpTimestamp {
    /// Exact: both sides count nanoseconds. Range 1970 .. 2106 (32-bit seconds).
    pub fn from_unix_ns(tai_unix_ns: i64) -> Result<Self, StampError> {
        let secs = tai_unix_ns.div_euclid(NS_PER_S as i64);
        let seconds = u32::try_from(secs).map_err(|_| StampError::TimestampOutOfRange {
            unix_ns: tai_unix_ns,
            format: "PTP",
        })?;
        Ok(Self {
            seconds,
            nanoseconds: tai_unix_ns.rem_euclid(NS_PER_S as i64) as u32,
        })
    }

    /// Exact inverse of [`PtpTimestamp::from_unix_ns`].
    pub fn to_unix_ns(self) -> i64 {
        self.seconds as i64 * NS_PER_S as i64 + self.nanoseconds as i64
    }

    pub fn to_bits(self) -> u64 {
        (self.seconds as u64) << 32 | self.nanoseconds as u64
    }

    /// Rejects a nanoseconds field of 10^9 or more: no clock produces one,
    /// and accepting it would make two encodings of the same instant.
    pub fn from_bits(bits: u64) -> Result<Self, StampError> {
        let nanoseconds = bits as u32;
        if nanoseconds as i128 >= NS_PER_S {
            return Err(StampError::InvalidPtpNanoseconds { nanoseconds });
        }
        Ok(Self {
            seconds: (bits >> 32) as u32,
            nanoseconds,
        })
    }
}

/// A STAMP timestamp; which one a packet carries is the Z flag of the Error
/// Estimate next to it (RFC 8762 §4.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Timestamp {
    Ntp(NtpTimestamp),
    Ptp(PtpTimestamp),
}

impl Timestamp {
    /// From a CLOCK_REALTIME reading (UTC). PTP timestamps are on the TAI
    /// timescale (RFC 8877 §4.3), so `tai_offset_s` (TAI - UTC, 37 s since
    /// 2017; [`ClockSync::tai_offset_s`]) is added for them; NTP ignores it.
    pub fn from_realtime_ns(
        realtime_ns: i64,
        ptp: bool,
        tai_offset_s: i32,
    ) -> Result<Self, StampError> {
        if ptp {
            let tai_ns = realtime_ns
                .checked_add(tai_offset_s as i64 * NS_PER_S as i64)
                .ok_or(StampError::TimestampOutOfRange {
                    unix_ns: realtime_ns,
                    format: "PTP",
                })?;
            PtpTimestamp::from_unix_ns(tai_ns).map(Timestamp::Ptp)
        } else {
            NtpTimestamp::from_unix_ns(realtime_ns).map(Timestamp::Ntp)
        }
    }

    /// Back to CLOCK_REALTIME nanoseconds (inverse of
    /// [`Timestamp::from_realtime_ns`] with the same offset).
    pub fn to_realtime_ns(self, tai_offset_s: i32) -> i64 {
        match self {
            Timestamp::Ntp(t) => t.to_unix_ns(),
            Timestamp::Ptp(t) => t.to_unix_ns() - tai_offset_s as i64 * NS_PER_S as i64,
        }
    }

    pub fn is_ptp(self) -> bool {
        matches!(self, Timestamp::Ptp(_))
    }

    pub fn to_bits(self) -> u64 {
        match self {
            Timestamp::Ntp(t) => t.to_bits(),
            Timestamp::Ptp(t) => t.to_bits(),
        }
    }

    pub fn from_bits(bits: u64, ptp: bool) -> Result<Self, StampError> {
        if ptp {
            PtpTimestamp::from_bits(bits).map(Timestamp::Ptp)
        } else {
            Ok(Timestamp::Ntp(NtpTimestamp::from_bits(bits)))
        }
    }
}

// ---------------------------------------------------------------- error estimate

/// Error Estimate (RFC 4656 §4.1.2; Z bit from RFC 8762 §4.2.1):
///
/// ```text
///  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5
/// |S|Z|   Scale   |   Multiplier  |    error = Multiplier * 2^(Scale-32) s
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ErrorEstimate {
    synchronized: bool,
    ptp: bool,
    scale: u8,
    multiplier: u8,
}

impl ErrorEstimate {
    /// Checked constructor: `scale` has 6 bits, and RFC 4656 §4.1.2 forbids
    /// a zero multiplier.
    pub fn new(
        synchronized: bool,
        ptp: bool,
        scale: u8,
        multiplier: u8,
    ) -> Result<Self, StampError> {
        if scale > 63 {
            return Err(StampError::InvalidScale { scale });
        }
        if multiplier == 0 {
            return Err(StampError::ZeroMultiplier);
        }
        Ok(Self {
            synchronized,
            ptp,
            scale,
            multiplier,
        })
    }

    /// The smallest representable error that is not below `error_ns`: the
    /// estimate may overstate the error (by less than one multiplier step,
    /// under 2/255 = 0.8 %), never understate it. Zero is not representable (the
    /// multiplier must be non-zero), so 0 ns becomes 2^-32 s (0.23 ns).
    /// Every u64 fits: the largest estimate is 255 * 2^31 s.
    pub fn from_error_ns(synchronized: bool, error_ns: u64, ptp: bool) -> Self {
        // Units of 2^-32 s, rounded up; at most 2^67, so u128 is ample.
        let units = ((error_ns as u128) << 32).div_ceil(NS_PER_S as u128).max(1);
        // The finest scale whose multiplier fits 8 bits gives the smallest
        // value >= units: a coarser scale only rounds up to a multiple of a
        // larger power of two.
        let mut scale = 0u8;
        while units.div_ceil(1u128 << scale) > 255 {
            scale += 1;
        }
        Self {
            synchronized,
            ptp,
            scale,
            multiplier: units.div_ceil(1u128 << scale) as u8,
        }
    }

    /// From the kernel's clock state; see [`ClockSync`] for which kernel
    /// numbers are used and why.
    pub fn from_clock_sync(sync: &ClockSync, ptp: bool) -> Self {
        Self::from_error_ns(sync.synchronized, sync.max_error_ns, ptp)
    }

    /// Reads the kernel's clock state (`adjtimex(2)`, read only) and maps it.
    pub fn from_adjtimex(ptp: bool) -> Result<Self, StampError> {
        Ok(Self::from_clock_sync(&ClockSync::read_kernel()?, ptp))
    }

    /// The error in nanoseconds, rounded up (so it is never below what the
    /// field says) and saturating at u64::MAX (scales above ~62 exceed it).
    /// `None` for a zero multiplier, which RFC 4656 §4.1.2 forbids: a peer
    /// sending one gives no usable estimate.
    pub fn to_error_ns(self) -> Option<u64> {
        if self.multiplier == 0 {
            return None;
        }
        let ns = ((self.multiplier as u128) << self.scale)
            .saturating_mul(NS_PER_S as u128)
            .div_ceil(1 << 32);
        Some(u64::try_from(ns).unwrap_or(u64::MAX))
    }

    pub fn synchronized(self) -> bool {
        self.synchronized
    }

    /// The Z flag: the timestamps this estimate covers are PTP (else NTP).
    pub fn ptp(self) -> bool {
        self.ptp
    }

    pub fn scale(self) -> u8 {
        self.scale
    }

    pub fn multiplier(self) -> u8 {
        self.multiplier
    }

    pub fn to_bits(self) -> u16 {
        (self.synchronized as u16) << 15
            | (self.ptp as u16) << 14
            | ((self.scale & 0x3f) as u16) << 8
            | self.multiplier as u16
    }

    /// Any 16 bits are accepted as they are (a zero multiplier shows up as
    /// `to_error_ns() == None`), so reflected estimates survive unchanged.
    pub fn from_bits(bits: u16) -> Self {
        Self {
            synchronized: bits & 0x8000 != 0,
            ptp: bits & 0x4000 != 0,
            scale: ((bits >> 8) & 0x3f) as u8,
            multiplier: bits as u8,
        }
    }
}

/// The kernel's clock discipline state, as far as STAMP needs it.
///
/// The error is the kernel's `maxerror`, not `esterror`. `maxerror` is an
/// upper bound: the NTP daemon sets it from the root distance and the
/// kernel adds 500 ppm of it per second until the daemon's next update, so
/// a clock whose daemon stopped shows a growing error (and turns
/// unsynchronised at 16 s). `esterror` is a statistical estimate that the
/// kernel never ages and that some daemons leave at 0, which would claim a
/// sub-nanosecond error. An Error Estimate that never understates (see
/// [`ErrorEstimate::from_error_ns`]) needs the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSync {
    /// S flag: no STA_UNSYNC in the status and the clock state is not TIME_ERROR.
    pub synchronized: bool,
    pub max_error_ns: u64,
    /// TAI - UTC in seconds (`timex.tai`, 0 when no daemon set it).
    pub tai_offset_s: i32,
}

impl ClockSync {
    /// Pure mapping of what `adjtimex(2)` returned: its return value
    /// (`clock_state`, TIME_OK .. TIME_ERROR), `timex.status`,
    /// `timex.maxerror` (µs) and `timex.tai`.
    pub fn from_timex(clock_state: i32, status: i32, maxerror_us: i64, tai_s: i32) -> Self {
        Self {
            synchronized: status & libc::STA_UNSYNC == 0 && clock_state != libc::TIME_ERROR,
            // A negative maxerror is nonsense; treat it as no error known.
            max_error_ns: (maxerror_us.max(0) as u64).saturating_mul(1000),
            tai_offset_s: tai_s,
        }
    }

    /// Reads the kernel's state with `adjtimex(2)`, `modes = 0`: read only,
    /// allowed without privileges.
    pub fn read_kernel() -> Result<Self, StampError> {
        // SAFETY: timex is a plain C struct for which all-zero is valid, and
        // modes = 0 makes adjtimex only write into it.
        let mut tx: libc::timex = unsafe { std::mem::zeroed() };
        tx.modes = 0;
        // SAFETY: tx is a valid, exclusively borrowed timex.
        let state = unsafe { libc::adjtimex(&mut tx) };
        if state < 0 {
            return Err(StampError::Adjtimex {
                errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
            });
        }
        Ok(Self::from_timex(
            state,
            tx.status,
            tx.maxerror as i64,
            tx.tai,
        ))
    }
}

// ---------------------------------------------------------------- HMAC

/// An HMAC-SHA-256 key for authenticated mode (RFC 8762 §4.4). Holds the
/// keyed state (not the key bytes); `Debug` shows nothing of it.
#[derive(Clone)]
pub struct HmacKey(Hmac<Sha256>);

impl std::fmt::Debug for HmacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HmacKey(..)")
    }
}

impl HmacKey {
    /// Any non-empty key; RFC 4868 §2.1.1 recommends 32 bytes for
    /// HMAC-SHA-256, which the caller reading the key file may enforce.
    pub fn new(key: &[u8]) -> Result<Self, StampError> {
        if key.is_empty() {
            return Err(StampError::EmptyKey);
        }
        <Hmac<Sha256> as KeyInit>::new_from_slice(key)
            .map(HmacKey)
            // Unreachable: HMAC takes keys of any length.
            .map_err(|_| StampError::EmptyKey)
    }

    /// HMAC-SHA-256 of `data`, truncated to its leftmost 128 bits.
    pub fn tag(&self, data: &[u8]) -> [u8; HMAC_LEN_BYTES] {
        let mut mac = self.0.clone();
        mac.update(data);
        let full = mac.finalize().into_bytes();
        let mut tag = [0u8; HMAC_LEN_BYTES];
        tag.copy_from_slice(&full[..HMAC_LEN_BYTES]);
        tag
    }

    /// Constant-time check of a truncated tag (a timing difference would
    /// let an attacker guess the tag byte by byte).
    pub fn verify(&self, data: &[u8], tag: &[u8]) -> Result<(), StampError> {
        if tag.len() != HMAC_LEN_BYTES {
            return Err(StampError::BadHmac);
        }
        let mut mac = self.0.clone();
        mac.update(data);
        mac.verify_truncated_left(tag)
            .map_err(|_| StampError::BadHmac)
    }

    /// Checks the HMAC field of an authenticated packet of at least
    /// [`AUTH_LEN_BYTES`].
    fn verify_packet(&self, packet: &[u8]) -> Result<(), StampError> {
        self.verify(
            &packet[..HMAC_COVERED_BYTES],
            &packet[HMAC_COVERED_BYTES..AUTH_LEN_BYTES],
        )
    }

    fn sign_packet(&self, packet: &mut [u8]) {
        let tag = self.tag(&packet[..HMAC_COVERED_BYTES]);
        packet[HMAC_COVERED_BYTES..AUTH_LEN_BYTES].copy_from_slice(&tag);
    }
}

/// Which packet formats a session uses (RFC 8762 §4.2.1 vs §4.2.2).
#[derive(Debug, Clone, Copy)]
pub enum Mode<'k> {
    Unauthenticated,
    Authenticated(&'k HmacKey),
}

impl Mode<'_> {
    /// Length of the base packet, sender and reflector alike.
    pub fn base_len_bytes(self) -> usize {
        match self {
            Mode::Unauthenticated => UNAUTH_LEN_BYTES,
            Mode::Authenticated(_) => AUTH_LEN_BYTES,
        }
    }
}

// ---------------------------------------------------------------- layouts

/// Where the fields sit in one mode's packets. Offsets from RFC 8762
/// Figures 3-6 with the SSID of RFC 8972 §3 (module docs show them all).
struct SenderLayout {
    seq: usize,
    timestamp: usize,
    error_estimate: usize,
    ssid: usize,
}

const SENDER_UNAUTH: SenderLayout = SenderLayout {
    seq: 0,
    timestamp: 4,
    error_estimate: 12,
    ssid: 14,
};

const SENDER_AUTH: SenderLayout = SenderLayout {
    seq: 0,
    timestamp: 16,
    error_estimate: 24,
    ssid: 26,
};

struct ReflectorLayout {
    seq: usize,
    timestamp: usize,
    error_estimate: usize,
    ssid: usize,
    receive_timestamp: usize,
    sender_seq: usize,
    sender_timestamp: usize,
    sender_error_estimate: usize,
    sender_ttl: usize,
}

const REFLECTOR_UNAUTH: ReflectorLayout = ReflectorLayout {
    seq: 0,
    timestamp: 4,
    error_estimate: 12,
    ssid: 14,
    receive_timestamp: 16,
    sender_seq: 24,
    sender_timestamp: 28,
    sender_error_estimate: 36,
    sender_ttl: 40,
};

const REFLECTOR_AUTH: ReflectorLayout = ReflectorLayout {
    seq: 0,
    timestamp: 16,
    error_estimate: 24,
    ssid: 26,
    receive_timestamp: 32,
    sender_seq: 48,
    sender_timestamp: 64,
    sender_error_estimate: 72,
    sender_ttl: 80,
};

fn sender_layout(mode: Mode<'_>) -> &'static SenderLayout {
    match mode {
        Mode::Unauthenticated => &SENDER_UNAUTH,
        Mode::Authenticated(_) => &SENDER_AUTH,
    }
}

fn reflector_layout(mode: Mode<'_>) -> &'static ReflectorLayout {
    match mode {
        Mode::Unauthenticated => &REFLECTOR_UNAUTH,
        Mode::Authenticated(_) => &REFLECTOR_AUTH,
    }
}

// Readers and writers for callers that checked the length first; they
// cannot fail on a buffer at least as long as the mode's base packet.
fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    b[at..at + bytes.len()].copy_from_slice(bytes);
}

/// The length check every decoder and the reflector start with; after it
/// the fixed offsets of the mode are in bounds.
fn check_len(len_bytes: usize, mode: Mode<'_>) -> Result<(), StampError> {
    let min_bytes = mode.base_len_bytes();
    if len_bytes < min_bytes {
        return Err(StampError::TooShort {
            len_bytes,
            min_bytes,
        });
    }
    Ok(())
}

/// A zeroed buffer of `len_bytes` for an encoder: checks the length against
/// the mode's base packet and the UDP limit.
fn new_packet(out: &mut Vec<u8>, len_bytes: usize, mode: Mode<'_>) -> Result<(), StampError> {
    check_len(len_bytes, mode)?;
    if len_bytes > MAX_PACKET_BYTES {
        return Err(StampError::TooLong {
            len_bytes,
            max_bytes: MAX_PACKET_BYTES,
        });
    }
    out.clear();
    out.resize(len_bytes, 0);
    Ok(())
}

// ---------------------------------------------------------------- packets

/// Session-Sender test packet (RFC 8762 §4.2.1 unauthenticated, §4.2.2
/// authenticated; SSID per RFC 8972 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SenderPacket {
    pub seq: u32,
    /// Its format must match `error_estimate.ptp()`.
    pub timestamp: Timestamp,
    pub error_estimate: ErrorEstimate,
    /// STAMP Session Identifier; 0 is allowed (RFC 8972 §3).
    pub ssid: u16,
}

impl SenderPacket {
    /// Writes the packet into `out` (replacing its contents), `len_bytes`
    /// long: the base packet of `mode` plus zero padding, which asks the
    /// reflector for a reply of the same size (RFC 8762 §4.2.1).
    pub fn encode(
        &self,
        mode: Mode<'_>,
        len_bytes: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), StampError> {
        if self.timestamp.is_ptp() != self.error_estimate.ptp() {
            return Err(StampError::FormatMismatch);
        }
        new_packet(out, len_bytes, mode)?;
        let l = sender_layout(mode);
        put(out, l.seq, &self.seq.to_be_bytes());
        put(out, l.timestamp, &self.timestamp.to_bits().to_be_bytes());
        put(
            out,
            l.error_estimate,
            &self.error_estimate.to_bits().to_be_bytes(),
        );
        put(out, l.ssid, &self.ssid.to_be_bytes());
        if let Mode::Authenticated(key) = mode {
            key.sign_packet(out);
        }
        Ok(())
    }

    /// Reads a packet; in authenticated mode the HMAC is checked first.
    /// Bytes after the base packet (padding, TLVs) are ignored.
    pub fn decode(buf: &[u8], mode: Mode<'_>) -> Result<Self, StampError> {
        check_len(buf.len(), mode)?;
        if let Mode::Authenticated(key) = mode {
            key.verify_packet(buf)?;
        }
        let l = sender_layout(mode);
        let error_estimate = ErrorEstimate::from_bits(get_u16(buf, l.error_estimate));
        Ok(Self {
            seq: get_u32(buf, l.seq),
            timestamp: Timestamp::from_bits(get_u64(buf, l.timestamp), error_estimate.ptp())?,
            error_estimate,
            ssid: get_u16(buf, l.ssid),
        })
    }
}

/// Session-Reflector test packet (RFC 8762 §4.3.1 unauthenticated, §4.3.2
/// authenticated; SSID per RFC 8972 §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReflectorPacket {
    pub seq: u32,
    /// T3, when the reply left; format per `error_estimate.ptp()`.
    pub timestamp: Timestamp,
    pub error_estimate: ErrorEstimate,
    pub ssid: u16,
    /// T2, when the request arrived; same format and estimate as `timestamp`.
    pub receive_timestamp: Timestamp,
    pub sender_seq: u32,
    /// T1, copied from the request; format per `sender_error_estimate.ptp()`.
    pub sender_timestamp: Timestamp,
    pub sender_error_estimate: ErrorEstimate,
    /// TTL / Hop Limit of the request as it arrived at the reflector.
    pub sender_ttl: u8,
}

impl ReflectorPacket {
    /// Writes the reply into `out` (replacing its contents), `len_bytes`
    /// long with zero padding.
    pub fn encode(
        &self,
        mode: Mode<'_>,
        len_bytes: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), StampError> {
        if self.timestamp.is_ptp() != self.error_estimate.ptp()
            || self.receive_timestamp.is_ptp() != self.error_estimate.ptp()
            || self.sender_timestamp.is_ptp() != self.sender_error_estimate.ptp()
        {
            return Err(StampError::FormatMismatch);
        }
        new_packet(out, len_bytes, mode)?;
        let l = reflector_layout(mode);
        put(out, l.seq, &self.seq.to_be_bytes());
        put(out, l.timestamp, &self.timestamp.to_bits().to_be_bytes());
        put(
            out,
            l.error_estimate,
            &self.error_estimate.to_bits().to_be_bytes(),
        );
        put(out, l.ssid, &self.ssid.to_be_bytes());
        put(
            out,
            l.receive_timestamp,
            &self.receive_timestamp.to_bits().to_be_bytes(),
        );
        put(out, l.sender_seq, &self.sender_seq.to_be_bytes());
        put(
            out,
            l.sender_timestamp,
            &self.sender_timestamp.to_bits().to_be_bytes(),
        );
        put(
            out,
            l.sender_error_estimate,
            &self.sender_error_estimate.to_bits().to_be_bytes(),
        );
        out[l.sender_ttl] = self.sender_ttl;
        if let Mode::Authenticated(key) = mode {
            key.sign_packet(out);
        }
        Ok(())
    }

    /// Reads a reply; in authenticated mode the HMAC is checked first.
    pub fn decode(buf: &[u8], mode: Mode<'_>) -> Result<Self, StampError> {
        check_len(buf.len(), mode)?;
        if let Mode::Authenticated(key) = mode {
            key.verify_packet(buf)?;
        }
        let l = reflector_layout(mode);
        let error_estimate = ErrorEstimate::from_bits(get_u16(buf, l.error_estimate));
        let sender_error_estimate = ErrorEstimate::from_bits(get_u16(buf, l.sender_error_estimate));
        Ok(Self {
            seq: get_u32(buf, l.seq),
            timestamp: Timestamp::from_bits(get_u64(buf, l.timestamp), error_estimate.ptp())?,
            error_estimate,
            ssid: get_u16(buf, l.ssid),
            receive_timestamp: Timestamp::from_bits(
                get_u64(buf, l.receive_timestamp),
                error_estimate.ptp(),
            )?,
            sender_seq: get_u32(buf, l.sender_seq),
            sender_timestamp: Timestamp::from_bits(
                get_u64(buf, l.sender_timestamp),
                sender_error_estimate.ptp(),
            )?,
            sender_error_estimate,
            sender_ttl: buf[l.sender_ttl],
        })
    }
}

// ---------------------------------------------------------------- reflector

/// The stateful reflector's counters (RFC 8762 §4.3.1: "counts the
/// transmitted STAMP-Test packets ... starts with zero and is incremented
/// by one for each subsequent packet for each test session"). A session is
/// the SSID together with the peer's addresses and ports (RFC 8972 §3), so
/// the caller keeps one state per peer address and port; inside it, one
/// counter per SSID.
#[derive(Debug, Clone, Default)]
pub struct ReflectorState {
    next_seq: HashMap<u16, u32>,
}

impl ReflectorState {
    pub fn new() -> Self {
        Self::default()
    }

    /// The sequence number the next reply of session `ssid` will carry.
    pub fn peek(&self, ssid: u16) -> u32 {
        self.next_seq.get(&ssid).copied().unwrap_or(0)
    }

    /// Checks that `ssid` can be counted without taking a number yet, so a
    /// refused request leaves the counters untouched.
    fn admit(&self, ssid: u16) -> Result<(), StampError> {
        if !self.next_seq.contains_key(&ssid) && self.next_seq.len() >= MAX_SESSIONS_PER_STATE {
            return Err(StampError::TooManySessions {
                max: MAX_SESSIONS_PER_STATE,
            });
        }
        Ok(())
    }

    fn take(&mut self, ssid: u16) -> u32 {
        let n = self.next_seq.entry(ssid).or_insert(0);
        let seq = *n;
        // 2^32 replies at 1 Mpps is over an hour: wrap, as the field does.
        *n = n.wrapping_add(1);
        seq
    }
}

/// How the reflector numbers its replies (RFC 8762 §4.3.1).
#[derive(Debug)]
pub enum Sequencing<'s> {
    /// Reply sequence number = request sequence number.
    Stateless,
    /// Its own counter per session, starting at 0.
    Stateful(&'s mut ReflectorState),
}

/// What the reflector adds to a reply besides the request's fields.
#[derive(Debug, Clone, Copy)]
pub struct ReflectParams {
    /// T2: CLOCK_REALTIME when the request arrived (ideally the kernel's RX
    /// timestamp).
    pub rx_realtime_ns: i64,
    /// T3: CLOCK_REALTIME when the reply leaves.
    pub tx_realtime_ns: i64,
    /// TTL or Hop Limit of the request's IP header.
    pub ttl: u8,
    /// The reflector's own estimate; its Z flag picks the format of T2, T3.
    pub error_estimate: ErrorEstimate,
    /// TAI - UTC, used for PTP timestamps only ([`Timestamp::from_realtime_ns`]).
    pub tai_offset_s: i32,
}

/// Builds the reply to `request` into `reply` (replacing its contents), as a
/// Session-Reflector does (RFC 8762 §4.3).
///
/// - The reply is exactly as long as the request: the sender's padding asks
///   for symmetrical sizes (RFC 8762 §4.2.1), and it can never be longer,
///   so the reflector cannot amplify. Bytes after the base packet (padding,
///   RFC 8972 TLVs) are copied unchanged.
/// - A request shorter than the base packet is refused (`TooShort`): RFC
///   8762 §4.2 gives 44 (unauthenticated) or 112 (authenticated) octets as
///   the minimum sender packet, and a reply to a shorter request would have
///   to be longer than it. This also refuses TWAMP-Light senders that send
///   the RFC 5357 §4.1.2 minimum of 14 octets; zero-filling them, as some
///   reflectors do, would triple the traffic sent to a spoofable address.
/// - In authenticated mode the request's HMAC is checked before anything
///   else, and the reply gets its own. Bytes after the 112-octet packet are
///   not covered by either HMAC (RFC 8762 §4.4 covers the first 96 octets;
///   RFC 8972's HMAC TLV, which would cover TLVs, is not implemented).
/// - The request's Sequence Number, Timestamp and Error Estimate are copied
///   verbatim into the Session-Sender fields, the SSID into the SSID (RFC
///   8972 §3); the timestamp is not interpreted, it is the sender's to read.
/// - In stateful mode the counter only advances for a reply actually built.
pub fn reflect(
    request: &[u8],
    mode: Mode<'_>,
    sequencing: Sequencing<'_>,
    params: &ReflectParams,
    reply: &mut Vec<u8>,
) -> Result<(), StampError> {
    check_len(request.len(), mode)?;
    if let Mode::Authenticated(key) = mode {
        key.verify_packet(request)?;
    }
    let sl = sender_layout(mode);
    let ssid = get_u16(request, sl.ssid);
    let ptp = params.error_estimate.ptp();
    let t2 = Timestamp::from_realtime_ns(params.rx_realtime_ns, ptp, params.tai_offset_s)?;
    let t3 = Timestamp::from_realtime_ns(params.tx_realtime_ns, ptp, params.tai_offset_s)?;
    let seq = match sequencing {
        Sequencing::Stateless => get_u32(request, sl.seq),
        Sequencing::Stateful(state) => {
            state.admit(ssid)?;
            state.take(ssid)
        }
    };

    reply.clear();
    reply.extend_from_slice(request);
    reply[..mode.base_len_bytes()].fill(0);
    let rl = reflector_layout(mode);
    put(reply, rl.seq, &seq.to_be_bytes());
    put(reply, rl.timestamp, &t3.to_bits().to_be_bytes());
    put(
        reply,
        rl.error_estimate,
        &params.error_estimate.to_bits().to_be_bytes(),
    );
    put(reply, rl.ssid, &ssid.to_be_bytes());
    put(reply, rl.receive_timestamp, &t2.to_bits().to_be_bytes());
    put(reply, rl.sender_seq, &request[sl.seq..sl.seq + 4]);
    put(
        reply,
        rl.sender_timestamp,
        &request[sl.timestamp..sl.timestamp + 8],
    );
    put(
        reply,
        rl.sender_error_estimate,
        &request[sl.error_estimate..sl.error_estimate + 2],
    );
    reply[rl.sender_ttl] = params.ttl;
    if let Mode::Authenticated(key) = mode {
        key.sign_packet(reply);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ntp_ee() -> ErrorEstimate {
        ErrorEstimate::new(true, false, 5, 135).unwrap()
    }

    fn ptp_ee() -> ErrorEstimate {
        ErrorEstimate::new(true, true, 0, 1).unwrap()
    }

    fn key() -> HmacKey {
        HmacKey::new(b"0123456789abcdef0123456789abcdef").unwrap()
    }

    fn params(ptp: bool) -> ReflectParams {
        ReflectParams {
            rx_realtime_ns: 1_763_850_000_000_000_500,
            tx_realtime_ns: 1_763_850_000_000_020_001,
            ttl: 63,
            error_estimate: if ptp { ptp_ee() } else { ntp_ee() },
            tai_offset_s: 37,
        }
    }

    fn sender(seq: u32, ssid: u16) -> SenderPacket {
        SenderPacket {
            seq,
            timestamp: Timestamp::from_realtime_ns(1_763_850_000_123_456_789, false, 0).unwrap(),
            error_estimate: ntp_ee(),
            ssid,
        }
    }

    fn encoded(p: &SenderPacket, mode: Mode<'_>, len_bytes: usize) -> Vec<u8> {
        let mut v = Vec::new();
        p.encode(mode, len_bytes, &mut v).unwrap();
        v
    }

    // ------------------------------------------------------------ timestamps

    #[test]
    fn ntp_epoch_offset() {
        // The Unix epoch is 2 208 988 800 s after the NTP epoch (RFC 5905 §6, Figure 4).
        let t = NtpTimestamp::from_unix_ns(0).unwrap();
        assert_eq!(t.seconds, 2_208_988_800);
        assert_eq!(t.seconds, 0x83AA_7E80);
        assert_eq!(t.fraction, 0);
        assert_eq!(t.to_unix_ns(), 0);
    }

    #[test]
    fn ntp_fraction_rounding() {
        // Half a second is the top bit of the fraction.
        assert_eq!(
            NtpTimestamp::from_unix_ns(500_000_000).unwrap().fraction,
            0x8000_0000
        );
        // 1 ns = 4.29 units: rounds to 4, and 4 units round back to 1 ns.
        let t = NtpTimestamp::from_unix_ns(1).unwrap();
        assert_eq!(t.fraction, 4);
        assert_eq!(t.to_unix_ns(), 1);
        let t = NtpTimestamp::from_unix_ns(999_999_999).unwrap();
        assert_eq!(t.seconds, 0x83AA_7E80);
        assert_eq!(t.to_unix_ns(), 999_999_999);
        // A fraction just below one second rounds up into the next second.
        let t = NtpTimestamp {
            seconds: 0x83AA_7E80,
            fraction: u32::MAX,
        };
        assert_eq!(t.to_unix_ns(), 1_000_000_000);
    }

    #[test]
    fn ntp_eras() {
        // 2036-02-07T06:28:16Z: NTP era 1 begins, seconds wrap to 0 (RFC 5905 §6).
        let era1_unix_s: i64 = (1 << 32) - NTP_UNIX_OFFSET_S;
        assert_eq!(era1_unix_s, 2_085_978_496);
        let t = NtpTimestamp::from_unix_ns(era1_unix_s * 1_000_000_000).unwrap();
        assert_eq!((t.seconds, t.fraction), (0, 0));
        assert_eq!(t.to_unix_ns(), era1_unix_s * 1_000_000_000);
        // The window of RFC 4330 §3 and its edges.
        let lo = NTP_MIN_UNIX_S * 1_000_000_000;
        let hi = NTP_MAX_UNIX_S * 1_000_000_000;
        assert_eq!(NtpTimestamp::from_unix_ns(lo).unwrap().to_unix_ns(), lo);
        assert_eq!(
            NtpTimestamp::from_unix_ns(hi - 1).unwrap().to_unix_ns(),
            hi - 1
        );
        for bad in [lo - 1, hi, i64::MIN, i64::MAX] {
            assert!(matches!(
                NtpTimestamp::from_unix_ns(bad),
                Err(StampError::TimestampOutOfRange { format: "NTP", .. })
            ));
        }
        // The last fraction of era 0 rounds to the first second of era 1.
        let t = NtpTimestamp::from_bits(u64::MAX);
        assert_eq!(t.to_unix_ns(), era1_unix_s * 1_000_000_000);
        assert_eq!(
            NtpTimestamp::from_unix_ns(t.to_unix_ns())
                .unwrap()
                .to_bits(),
            0
        );
        // Before 1970 still works (1969-12-31T23:59:59.5Z).
        let t = NtpTimestamp::from_unix_ns(-500_000_000).unwrap();
        assert_eq!((t.seconds, t.fraction), (0x83AA_7E7F, 0x8000_0000));
        assert_eq!(t.to_unix_ns(), -500_000_000);
    }

    #[test]
    fn ptp_conversion_is_exact() {
        let ns = 1_763_850_037_999_999_999;
        let t = PtpTimestamp::from_unix_ns(ns).unwrap();
        assert_eq!((t.seconds, t.nanoseconds), (1_763_850_037, 999_999_999));
        assert_eq!(t.to_unix_ns(), ns);
        assert_eq!(t.to_bits(), (1_763_850_037u64 << 32) | 999_999_999);
        assert_eq!(PtpTimestamp::from_bits(t.to_bits()), Ok(t));
        assert!(PtpTimestamp::from_unix_ns(-1).is_err());
        assert!(PtpTimestamp::from_unix_ns((1i64 << 32) * 1_000_000_000).is_err());
        assert_eq!(
            PtpTimestamp::from_bits(1_000_000_000),
            Err(StampError::InvalidPtpNanoseconds {
                nanoseconds: 1_000_000_000
            })
        );
    }

    #[test]
    fn ptp_timestamps_are_tai() {
        // RFC 8877 §4.3: PTP counts TAI seconds; TAI - UTC = 37 s since 2017.
        let utc_ns = 1_700_000_000_000_000_123;
        let t = Timestamp::from_realtime_ns(utc_ns, true, 37).unwrap();
        assert_eq!(
            t,
            Timestamp::Ptp(PtpTimestamp {
                seconds: 1_700_000_037,
                nanoseconds: 123
            })
        );
        assert_eq!(t.to_realtime_ns(37), utc_ns);
        // NTP is UTC: the offset does not apply.
        let n = Timestamp::from_realtime_ns(utc_ns, false, 37).unwrap();
        assert_eq!(n.to_realtime_ns(37), utc_ns);
        assert!(Timestamp::from_realtime_ns(i64::MAX, true, 37).is_err());
    }

    // ------------------------------------------------------------ error estimate

    #[test]
    fn error_estimate_bits() {
        let e = ErrorEstimate::new(true, true, 63, 255).unwrap();
        assert_eq!(e.to_bits(), 0xFFFF);
        assert_eq!(ErrorEstimate::from_bits(0xFFFF), e);
        let e = ErrorEstimate::new(false, true, 1, 2).unwrap();
        assert_eq!(e.to_bits(), 0x4102);
        let e = ErrorEstimate::new(true, false, 0x2A, 0x55).unwrap();
        assert_eq!(e.to_bits(), 0xAA55);
        assert_eq!(
            ErrorEstimate::new(false, false, 64, 1),
            Err(StampError::InvalidScale { scale: 64 })
        );
        assert_eq!(
            ErrorEstimate::new(false, false, 0, 0),
            Err(StampError::ZeroMultiplier)
        );
        // From the wire a zero multiplier is kept but gives no estimate.
        assert_eq!(ErrorEstimate::from_bits(0x0100).to_error_ns(), None);
    }

    #[test]
    fn error_estimate_from_ns() {
        // 0 is not representable: the smallest estimate, 2^-32 s.
        let e = ErrorEstimate::from_error_ns(false, 0, false);
        assert_eq!((e.scale(), e.multiplier()), (0, 1));
        assert_eq!(e.to_error_ns(), Some(1));
        // 1 s = 2^32 units = 128 * 2^25.
        let e = ErrorEstimate::from_error_ns(true, 1_000_000_000, true);
        assert_eq!((e.scale(), e.multiplier()), (25, 128));
        assert!(e.synchronized() && e.ptp());
        assert_eq!(e.to_error_ns(), Some(1_000_000_000));
        // 1 µs = 4294.97 units -> 4295 -> ceil(4295 / 32) = 135 at scale 5,
        // i.e. 1005.8 ns, the smallest value >= 1 µs.
        let e = ErrorEstimate::from_error_ns(true, 1_000, false);
        assert_eq!((e.scale(), e.multiplier()), (5, 135));
        assert_eq!(e.to_error_ns(), Some(1_006));
        // 255 units fit scale 0; 256 need scale 1.
        let e = ErrorEstimate::from_error_ns(true, 59, false); // 253.4 units
        assert_eq!((e.scale(), e.multiplier()), (0, 254));
        let e = ErrorEstimate::from_error_ns(true, 60, false); // 257.7 units
        assert_eq!((e.scale(), e.multiplier()), (1, 129));
        // The largest input does not panic and is not understated.
        let e = ErrorEstimate::from_error_ns(false, u64::MAX, false);
        assert_eq!(e.to_error_ns(), Some(u64::MAX));
        assert!(e.scale() < 63);
        // The largest field saturates.
        assert_eq!(
            ErrorEstimate::from_bits(0x3FFF).to_error_ns(),
            Some(u64::MAX)
        );
    }

    /// Smallest representable error (in 2^-32 s units) not below `units`,
    /// by trying every scale and multiplier.
    fn brute_force_min_units(units: u128) -> u128 {
        (0..64u32)
            .flat_map(|s| (1..=255u128).map(move |m| m << s))
            .filter(|&v| v >= units)
            .min()
            .unwrap()
    }

    #[test]
    fn error_estimate_is_the_tightest_upper_bound() {
        for ns in [
            0u64,
            1,
            59,
            60,
            999,
            1_000,
            12_345,
            1_000_000,
            16_000_000_000,
            123_456_789_012,
        ] {
            let units = ((ns as u128) << 32).div_ceil(1_000_000_000).max(1);
            let e = ErrorEstimate::from_error_ns(false, ns, false);
            assert_eq!(
                (e.multiplier() as u128) << e.scale(),
                brute_force_min_units(units),
                "{ns} ns"
            );
        }
    }

    #[test]
    fn clock_sync_mapping() {
        // adjtimex returned TIME_OK, no STA_UNSYNC, maxerror 1500 µs, TAI - UTC 37 s.
        let c = ClockSync::from_timex(libc::TIME_OK, libc::STA_PLL, 1_500, 37);
        assert_eq!(
            c,
            ClockSync {
                synchronized: true,
                max_error_ns: 1_500_000,
                tai_offset_s: 37
            }
        );
        let e = ErrorEstimate::from_clock_sync(&c, false);
        assert!(e.synchronized() && !e.ptp());
        assert!(e.to_error_ns().unwrap() >= 1_500_000);
        // STA_UNSYNC, or a TIME_ERROR state, clear S.
        assert!(!ClockSync::from_timex(libc::TIME_OK, libc::STA_UNSYNC, 0, 0).synchronized);
        assert!(!ClockSync::from_timex(libc::TIME_ERROR, 0, 0, 0).synchronized);
        // A leap second pending is still synchronised.
        assert!(ClockSync::from_timex(libc::TIME_INS, 0, 10, 0).synchronized);
        // Unsynchronised kernels report 16 s; nonsense is clamped.
        assert_eq!(
            ClockSync::from_timex(libc::TIME_ERROR, libc::STA_UNSYNC, 16_000_000, 0).max_error_ns,
            16_000_000_000
        );
        assert_eq!(ClockSync::from_timex(0, 0, -5, 0).max_error_ns, 0);
        let huge = ClockSync::from_timex(0, 0, i64::MAX, 0);
        assert_eq!(huge.max_error_ns, u64::MAX);
        let e = ErrorEstimate::from_clock_sync(&huge, true);
        assert_eq!(e.to_error_ns(), Some(u64::MAX));
    }

    #[test]
    fn adjtimex_reads_or_reports_errno() {
        // Containers may filter adjtimex; either outcome is well-formed.
        match ErrorEstimate::from_adjtimex(false) {
            Ok(e) => assert!(e.multiplier() != 0),
            Err(StampError::Adjtimex { .. }) => {}
            Err(e) => panic!("unexpected {e}"),
        }
    }

    // ------------------------------------------------------------ HMAC

    #[test]
    fn hmac_rfc4231_vector_truncated() {
        // RFC 4231 §4.3 (test case 2), HMAC-SHA-256 truncated to 128 bits.
        let k = HmacKey::new(b"Jefe").unwrap();
        let tag = k.tag(b"what do ya want for nothing?");
        assert_eq!(
            tag,
            [
                0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24, 0x26, 0x08, 0x95,
                0x75, 0xc7
            ]
        );
        assert_eq!(k.verify(b"what do ya want for nothing?", &tag), Ok(()));
        let mut bad = tag;
        bad[15] ^= 1;
        assert_eq!(
            k.verify(b"what do ya want for nothing?", &bad),
            Err(StampError::BadHmac)
        );
        assert_eq!(
            k.verify(b"what do ya want for nothing?", &tag[..8]),
            Err(StampError::BadHmac)
        );
        assert_eq!(HmacKey::new(b"").unwrap_err(), StampError::EmptyKey);
        assert_eq!(format!("{k:?}"), "HmacKey(..)");
    }

    // ------------------------------------------------------------ packets

    #[test]
    fn sender_unauthenticated_layout() {
        let p = SenderPacket {
            seq: 0x0102_0304,
            timestamp: Timestamp::Ntp(NtpTimestamp::from_bits(0x1112_1314_1516_1718)),
            error_estimate: ErrorEstimate::from_bits(0x2122),
            ssid: 0x3132,
        };
        let b = encoded(&p, Mode::Unauthenticated, UNAUTH_LEN_BYTES);
        assert_eq!(b.len(), 44);
        assert_eq!(b[0..4], [1, 2, 3, 4]);
        assert_eq!(b[4..12], [0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]);
        assert_eq!(b[12..14], [0x21, 0x22]);
        assert_eq!(b[14..16], [0x31, 0x32]);
        assert!(b[16..44].iter().all(|&x| x == 0), "MBZ (28 octets)");
        assert_eq!(SenderPacket::decode(&b, Mode::Unauthenticated), Ok(p));
    }

    #[test]
    fn sender_authenticated_layout() {
        let k = key();
        let p = SenderPacket {
            seq: 0x0102_0304,
            timestamp: Timestamp::Ptp(PtpTimestamp::from_bits(0x1112_1314_0516_1718).unwrap()),
            error_estimate: ErrorEstimate::from_bits(0x6122),
            ssid: 0x3132,
        };
        let b = encoded(&p, Mode::Authenticated(&k), AUTH_LEN_BYTES);
        assert_eq!(b.len(), 112);
        assert_eq!(b[0..4], [1, 2, 3, 4]);
        assert!(b[4..16].iter().all(|&x| x == 0), "MBZ (12 octets)");
        assert_eq!(b[16..24], [0x11, 0x12, 0x13, 0x14, 0x05, 0x16, 0x17, 0x18]);
        assert_eq!(b[24..26], [0x61, 0x22]);
        assert_eq!(b[26..28], [0x31, 0x32]);
        assert!(b[28..96].iter().all(|&x| x == 0), "MBZ (68 octets)");
        assert_eq!(b[96..112], k.tag(&b[..96]));
        assert_eq!(SenderPacket::decode(&b, Mode::Authenticated(&k)), Ok(p));
        // Any altered bit, or another key, fails the check.
        for i in [0, 20, 95, 96, 111] {
            let mut t = b.clone();
            t[i] ^= 0x80;
            assert_eq!(
                SenderPacket::decode(&t, Mode::Authenticated(&k)),
                Err(StampError::BadHmac),
                "byte {i}"
            );
        }
        let other = HmacKey::new(b"another key").unwrap();
        assert_eq!(
            SenderPacket::decode(&b, Mode::Authenticated(&other)),
            Err(StampError::BadHmac)
        );
    }

    #[test]
    fn reflector_unauthenticated_layout() {
        let p = ReflectorPacket {
            seq: 0x0102_0304,
            timestamp: Timestamp::Ntp(NtpTimestamp::from_bits(0x1112_1314_1516_1718)),
            error_estimate: ErrorEstimate::from_bits(0x2122),
            ssid: 0x3132,
            receive_timestamp: Timestamp::Ntp(NtpTimestamp::from_bits(0x4142_4344_4546_4748)),
            sender_seq: 0x5152_5354,
            sender_timestamp: Timestamp::Ptp(
                PtpTimestamp::from_bits(0x6162_6364_0566_6768).unwrap(),
            ),
            sender_error_estimate: ErrorEstimate::from_bits(0x7172),
            sender_ttl: 0x81,
        };
        let b = {
            let mut v = Vec::new();
            p.encode(Mode::Unauthenticated, 44, &mut v).unwrap();
            v
        };
        assert_eq!(b.len(), 44);
        assert_eq!(b[0..4], [1, 2, 3, 4]);
        assert_eq!(b[4], 0x11);
        assert_eq!(b[12..14], [0x21, 0x22]);
        assert_eq!(b[14..16], [0x31, 0x32]);
        assert_eq!(b[16..24], [0x41, 0x42, 0x43, 0x44, 0x45, 0x46, 0x47, 0x48]);
        assert_eq!(b[24..28], [0x51, 0x52, 0x53, 0x54]);
        assert_eq!(b[28..36], [0x61, 0x62, 0x63, 0x64, 0x05, 0x66, 0x67, 0x68]);
        assert_eq!(b[36..38], [0x71, 0x72]);
        assert_eq!(b[38..40], [0, 0], "MBZ (2 octets)");
        assert_eq!(b[40], 0x81);
        assert_eq!(b[41..44], [0, 0, 0], "MBZ (3 octets)");
        assert_eq!(ReflectorPacket::decode(&b, Mode::Unauthenticated), Ok(p));
    }

    #[test]
    fn reflector_authenticated_layout() {
        let k = key();
        let p = ReflectorPacket {
            seq: 0x0102_0304,
            timestamp: Timestamp::Ntp(NtpTimestamp::from_bits(0x1112_1314_1516_1718)),
            error_estimate: ErrorEstimate::from_bits(0x2122),
            ssid: 0x3132,
            receive_timestamp: Timestamp::Ntp(NtpTimestamp::from_bits(0x4142_4344_4546_4748)),
            sender_seq: 0x5152_5354,
            sender_timestamp: Timestamp::Ntp(NtpTimestamp::from_bits(0x6162_6364_6566_6768)),
            sender_error_estimate: ErrorEstimate::from_bits(0x3172),
            sender_ttl: 0x81,
        };
        let mut b = Vec::new();
        p.encode(Mode::Authenticated(&k), AUTH_LEN_BYTES, &mut b)
            .unwrap();
        assert_eq!(b.len(), 112);
        let zero = |r: std::ops::Range<usize>| b[r].iter().all(|&x| x == 0);
        assert_eq!(b[0..4], [1, 2, 3, 4]);
        assert!(zero(4..16));
        assert_eq!(b[16], 0x11);
        assert_eq!(b[24..26], [0x21, 0x22]);
        assert_eq!(b[26..28], [0x31, 0x32]);
        assert!(zero(28..32));
        assert_eq!(b[32], 0x41);
        assert!(zero(40..48));
        assert_eq!(b[48..52], [0x51, 0x52, 0x53, 0x54]);
        assert!(zero(52..64));
        assert_eq!(b[64], 0x61);
        assert_eq!(b[72..74], [0x31, 0x72]);
        assert!(zero(74..80));
        assert_eq!(b[80], 0x81);
        assert!(zero(81..96));
        assert_eq!(b[96..112], k.tag(&b[..96]));
        assert_eq!(ReflectorPacket::decode(&b, Mode::Authenticated(&k)), Ok(p));
    }

    #[test]
    fn encode_checks() {
        let p = sender(1, 1);
        let mut v = Vec::new();
        assert_eq!(
            p.encode(Mode::Unauthenticated, 43, &mut v),
            Err(StampError::TooShort {
                len_bytes: 43,
                min_bytes: 44
            })
        );
        let k = key();
        assert_eq!(
            p.encode(Mode::Authenticated(&k), 111, &mut v),
            Err(StampError::TooShort {
                len_bytes: 111,
                min_bytes: 112
            })
        );
        assert!(matches!(
            p.encode(Mode::Unauthenticated, MAX_PACKET_BYTES + 1, &mut v),
            Err(StampError::TooLong { .. })
        ));
        let mismatched = SenderPacket {
            error_estimate: ptp_ee(),
            ..p
        };
        assert_eq!(
            mismatched.encode(Mode::Unauthenticated, 44, &mut v),
            Err(StampError::FormatMismatch)
        );
        // Padding is zeros and decoders skip it.
        p.encode(Mode::Unauthenticated, 1000, &mut v).unwrap();
        assert_eq!(v.len(), 1000);
        assert!(v[44..].iter().all(|&x| x == 0));
        v[500] = 0xAB;
        assert_eq!(SenderPacket::decode(&v, Mode::Unauthenticated), Ok(p));
    }

    #[test]
    fn decode_rejects_short_and_bad_ptp() {
        let b = encoded(&sender(1, 1), Mode::Unauthenticated, 44);
        assert_eq!(
            SenderPacket::decode(&b[..43], Mode::Unauthenticated),
            Err(StampError::TooShort {
                len_bytes: 43,
                min_bytes: 44
            })
        );
        assert_eq!(
            ReflectorPacket::decode(&[], Mode::Unauthenticated),
            Err(StampError::TooShort {
                len_bytes: 0,
                min_bytes: 44
            })
        );
        // Z = 1 with 10^9 nanoseconds.
        let mut b = b;
        b[4..12].copy_from_slice(&((5u64 << 32) | 1_000_000_000).to_be_bytes());
        b[12] |= 0x40;
        assert_eq!(
            SenderPacket::decode(&b, Mode::Unauthenticated),
            Err(StampError::InvalidPtpNanoseconds {
                nanoseconds: 1_000_000_000
            })
        );
    }

    // ------------------------------------------------------------ reflector

    #[test]
    fn reflect_stateless_unauthenticated() {
        let req = sender(0xDEAD_BEEF, 0x0ABC);
        let mut bytes = encoded(&req, Mode::Unauthenticated, 44 + 36);
        // Whatever follows the base packet comes back unchanged.
        bytes[44..48].copy_from_slice(&[0x10, 0x01, 0x00, 0x04]);
        let p = params(false);
        let mut reply = Vec::new();
        reflect(
            &bytes,
            Mode::Unauthenticated,
            Sequencing::Stateless,
            &p,
            &mut reply,
        )
        .unwrap();
        assert_eq!(reply.len(), bytes.len());
        assert_eq!(reply[44..], bytes[44..]);
        let r = ReflectorPacket::decode(&reply, Mode::Unauthenticated).unwrap();
        assert_eq!(r.seq, 0xDEAD_BEEF);
        assert_eq!(r.ssid, 0x0ABC);
        assert_eq!(r.sender_seq, req.seq);
        assert_eq!(r.sender_timestamp, req.timestamp);
        assert_eq!(r.sender_error_estimate, req.error_estimate);
        assert_eq!(r.sender_ttl, 63);
        assert_eq!(r.error_estimate, p.error_estimate);
        assert_eq!(r.receive_timestamp.to_realtime_ns(0), p.rx_realtime_ns);
        assert_eq!(r.timestamp.to_realtime_ns(0), p.tx_realtime_ns);
    }

    #[test]
    fn reflect_ptp_reflector_for_ntp_sender() {
        // Each side's Z flag covers its own timestamps (RFC 8762 §4.3.1).
        let req = sender(5, 5);
        let bytes = encoded(&req, Mode::Unauthenticated, 44);
        let p = params(true);
        let mut reply = Vec::new();
        reflect(
            &bytes,
            Mode::Unauthenticated,
            Sequencing::Stateless,
            &p,
            &mut reply,
        )
        .unwrap();
        let r = ReflectorPacket::decode(&reply, Mode::Unauthenticated).unwrap();
        assert!(r.timestamp.is_ptp() && r.receive_timestamp.is_ptp());
        assert!(!r.sender_timestamp.is_ptp());
        assert_eq!(r.timestamp.to_realtime_ns(37), p.tx_realtime_ns);
        assert_eq!(r.receive_timestamp.to_realtime_ns(37), p.rx_realtime_ns);
        assert_eq!(r.sender_timestamp, req.timestamp);
    }

    #[test]
    fn reflect_copies_sender_fields_verbatim() {
        // An invalid PTP timestamp from the sender is the sender's business.
        let mut bytes = vec![0u8; 44];
        bytes[4..12].copy_from_slice(&u64::MAX.to_be_bytes());
        bytes[12..14].copy_from_slice(&0x7F00u16.to_be_bytes());
        let mut reply = Vec::new();
        reflect(
            &bytes,
            Mode::Unauthenticated,
            Sequencing::Stateless,
            &params(false),
            &mut reply,
        )
        .unwrap();
        assert_eq!(reply[28..36], [0xFF; 8]);
        assert_eq!(reply[36..38], [0x7F, 0x00]);
    }

    #[test]
    fn reflect_stateful_counts_per_ssid() {
        let mut state = ReflectorState::new();
        let mut reply = Vec::new();
        let mut seqs = Vec::new();
        for (seq, ssid) in [(100, 1), (101, 1), (7, 2), (102, 1), (8, 2)] {
            let b = encoded(&sender(seq, ssid), Mode::Unauthenticated, 44);
            reflect(
                &b,
                Mode::Unauthenticated,
                Sequencing::Stateful(&mut state),
                &params(false),
                &mut reply,
            )
            .unwrap();
            let r = ReflectorPacket::decode(&reply, Mode::Unauthenticated).unwrap();
            assert_eq!(r.sender_seq, seq);
            seqs.push(r.seq);
        }
        assert_eq!(seqs, [0, 1, 0, 2, 1]);
        assert_eq!(state.peek(1), 3);
        // A refused request does not advance the counter.
        let b = encoded(&sender(103, 1), Mode::Unauthenticated, 44);
        assert!(
            reflect(
                &b[..40],
                Mode::Unauthenticated,
                Sequencing::Stateful(&mut state),
                &params(false),
                &mut reply
            )
            .is_err()
        );
        assert_eq!(state.peek(1), 3);
    }

    #[test]
    fn reflect_stateful_bounds_sessions() {
        let mut state = ReflectorState::new();
        let mut reply = Vec::new();
        let mut run = |ssid: u16, state: &mut ReflectorState| {
            let b = encoded(&sender(0, ssid), Mode::Unauthenticated, 44);
            reflect(
                &b,
                Mode::Unauthenticated,
                Sequencing::Stateful(state),
                &params(false),
                &mut reply,
            )
        };
        for ssid in 0..MAX_SESSIONS_PER_STATE as u16 {
            run(ssid, &mut state).unwrap();
        }
        assert_eq!(
            run(MAX_SESSIONS_PER_STATE as u16, &mut state),
            Err(StampError::TooManySessions {
                max: MAX_SESSIONS_PER_STATE
            })
        );
        // Known sessions keep working.
        run(3, &mut state).unwrap();
        assert_eq!(state.peek(3), 2);
    }

    #[test]
    fn reflect_authenticated() {
        let k = key();
        let mode = Mode::Authenticated(&k);
        let req = sender(9, 0);
        let bytes = encoded(&req, mode, 128);
        let mut state = ReflectorState::new();
        let mut reply = Vec::new();
        reflect(
            &bytes,
            mode,
            Sequencing::Stateful(&mut state),
            &params(false),
            &mut reply,
        )
        .unwrap();
        assert_eq!(reply.len(), 128);
        let r = ReflectorPacket::decode(&reply, mode).unwrap();
        assert_eq!((r.seq, r.sender_seq, r.ssid), (0, 9, 0));
        assert_eq!(r.sender_timestamp, req.timestamp);
        // A forged request: refused, counter untouched, reply buffer not used.
        let mut forged = bytes.clone();
        forged[0] ^= 1;
        assert_eq!(
            reflect(
                &forged,
                mode,
                Sequencing::Stateful(&mut state),
                &params(false),
                &mut reply
            ),
            Err(StampError::BadHmac)
        );
        assert_eq!(state.peek(0), 1);
        // An unauthenticated request to an authenticated reflector is short.
        let plain = encoded(&req, Mode::Unauthenticated, 44);
        assert_eq!(
            reflect(
                &plain,
                mode,
                Sequencing::Stateless,
                &params(false),
                &mut reply
            ),
            Err(StampError::TooShort {
                len_bytes: 44,
                min_bytes: 112
            })
        );
    }

    // ------------------------------------------------------------ properties

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn arbitrary_bytes_never_panic_nor_amplify(
                bytes in proptest::collection::vec(any::<u8>(), 0..300),
                stateful in any::<bool>(),
                ptp in any::<bool>(),
                rx_ns in any::<i64>(),
            ) {
                let k = key();
                let mut state = ReflectorState::new();
                let mut reply = Vec::new();
                for mode in [Mode::Unauthenticated, Mode::Authenticated(&k)] {
                    let _ = SenderPacket::decode(&bytes, mode);
                    let _ = ReflectorPacket::decode(&bytes, mode);
                    let seq = if stateful {
                        Sequencing::Stateful(&mut state)
                    } else {
                        Sequencing::Stateless
                    };
                    let p = ReflectParams { rx_realtime_ns: rx_ns, ..params(ptp) };
                    reply.clear();
                    if reflect(&bytes, mode, seq, &p, &mut reply).is_ok() {
                        prop_assert_eq!(reply.len(), bytes.len());
                        prop_assert!(ReflectorPacket::decode(&reply, mode).is_ok()
                            || ptp_invalid_sender_ts(&reply, mode));
                    }
                }
            }

            #[test]
            fn signed_requests_get_signed_replies_of_equal_length(
                body in proptest::collection::vec(any::<u8>(), AUTH_LEN_BYTES..400),
                stateful in any::<bool>(),
            ) {
                // Arbitrary fields and padding, but a valid HMAC, so the
                // reflector gets past the check that stops random bytes.
                let k = key();
                let mode = Mode::Authenticated(&k);
                let mut request = body;
                k.sign_packet(&mut request);
                let mut state = ReflectorState::new();
                let seq = if stateful { Sequencing::Stateful(&mut state) } else { Sequencing::Stateless };
                let mut reply = Vec::new();
                reflect(&request, mode, seq, &params(false), &mut reply).unwrap();
                prop_assert_eq!(reply.len(), request.len());
                prop_assert_eq!(&reply[AUTH_LEN_BYTES..], &request[AUTH_LEN_BYTES..]);
                prop_assert_eq!(k.verify_packet(&reply), Ok(()));
                let ssid = &request[26..28];
                prop_assert_eq!(&reply[26..28], ssid);
                prop_assert_eq!(&reply[48..52], &request[0..4]);
            }

            #[test]
            fn ntp_round_trip(ns in (NTP_MIN_UNIX_S * 1_000_000_000)..(NTP_MAX_UNIX_S * 1_000_000_000)) {
                prop_assert_eq!(NtpTimestamp::from_unix_ns(ns).unwrap().to_unix_ns(), ns);
            }

            #[test]
            fn ntp_bits_round_trip_within_half_ns(bits in any::<u64>()) {
                let t = NtpTimestamp::from_bits(bits);
                // The last half nanosecond of 2104 rounds out of the window.
                if let Ok(back) = NtpTimestamp::from_unix_ns(t.to_unix_ns()) {
                    // Nanoseconds are coarser than 2^-32 s: within 0.5 ns +
                    // 0.5 unit, modulo the era (2036 rolls over to 0).
                    let d = (back.to_bits().wrapping_sub(bits) as i64).unsigned_abs();
                    prop_assert!(d <= 3, "{bits:#x} -> {:#x}", back.to_bits());
                }
            }

            #[test]
            fn ptp_round_trip(ns in 0i64..((1i64 << 32) * 1_000_000_000)) {
                let t = PtpTimestamp::from_unix_ns(ns).unwrap();
                prop_assert_eq!(t.to_unix_ns(), ns);
                prop_assert_eq!(PtpTimestamp::from_bits(t.to_bits()), Ok(t));
            }

            #[test]
            fn error_estimate_never_understates(ns in any::<u64>(), sync in any::<bool>(), ptp in any::<bool>()) {
                let e = ErrorEstimate::from_error_ns(sync, ns, ptp);
                prop_assert!(e.multiplier() != 0);
                prop_assert_eq!((e.synchronized(), e.ptp()), (sync, ptp));
                prop_assert_eq!(ErrorEstimate::from_bits(e.to_bits()), e);
                let got = e.to_error_ns().unwrap();
                prop_assert!(got >= ns);
                // At most one multiplier step (< 2/255) above, plus rounding.
                prop_assert!(got as u128 <= ns as u128 + ns as u128 / 127 + 2, "{ns} -> {got}");
            }

            #[test]
            fn sender_round_trip(
                seq in any::<u32>(), ssid in any::<u16>(), bits in any::<u64>(),
                ee in any::<u16>(), pad in 0usize..64, auth in any::<bool>(),
            ) {
                let error_estimate = ErrorEstimate::from_bits(ee);
                let timestamp = if error_estimate.ptp() {
                    Timestamp::Ptp(PtpTimestamp { seconds: (bits >> 32) as u32, nanoseconds: (bits as u32) % 1_000_000_000 })
                } else {
                    Timestamp::Ntp(NtpTimestamp::from_bits(bits))
                };
                let p = SenderPacket { seq, timestamp, error_estimate, ssid };
                let k = key();
                let mode = if auth { Mode::Authenticated(&k) } else { Mode::Unauthenticated };
                let mut v = Vec::new();
                p.encode(mode, mode.base_len_bytes() + pad, &mut v).unwrap();
                prop_assert_eq!(SenderPacket::decode(&v, mode), Ok(p));
            }
        }

        /// A reply may fail to decode only because the sender's own PTP
        /// timestamp, reflected verbatim, is invalid.
        fn ptp_invalid_sender_ts(reply: &[u8], mode: Mode<'_>) -> bool {
            matches!(
                ReflectorPacket::decode(reply, mode),
                Err(StampError::InvalidPtpNanoseconds { .. })
            )
        }
    }
}

/// Interop with scapy's STAMP layer (`scapy.contrib.stamp`), an independent
/// implementation of RFC 8762 + RFC 8972. It has the unauthenticated
/// packets only (no §4.2.2/§4.3.2 layouts, no HMAC), so authenticated mode
/// is covered by the RFC-derived unit tests above alone. The tests print
/// `SKIPPED: ...` and pass when python3 or scapy is missing
/// (`cargo xtask setup` installs scapy).
#[cfg(test)]
mod scapy_interop {
    use super::*;
    use serde_json::Value;
    use std::{io::Write, path::PathBuf, process::Command};

    const SCRIPT: &str = "tests/fixtures/stamp_scapy.py";

    /// The helper script, if python3 can import scapy's STAMP layer.
    fn scapy(test: &str) -> Option<PathBuf> {
        let ok = Command::new("python3")
            .args(["-c", "import scapy.contrib.stamp"])
            .output()
            .is_ok_and(|o| o.status.success());
        if !ok {
            // Straight to stderr: println! is captured for passing tests,
            // and a skip must show in a plain `cargo test`.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: {test}: python3 with scapy not found (python3 -m pip install scapy, or cargo xtask setup)"
            );
            return None;
        }
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(SCRIPT))
    }

    fn run(script: &PathBuf, args: &[String]) -> Vec<Value> {
        let out = Command::new("python3")
            .arg(script)
            .args(args)
            .output()
            .expect("run python3");
        assert!(
            out.status.success(),
            "{} {args:?}: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        match serde_json::from_slice(&out.stdout).expect("JSON from the script") {
            Value::Array(v) => v,
            other => panic!("expected a JSON list, got {other}"),
        }
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn u64_of(v: &Value) -> u64 {
        v.as_u64().unwrap_or_else(|| panic!("not an integer: {v}"))
    }

    /// scapy's Error Estimate fields against ours.
    fn assert_ee(v: &Value, e: ErrorEstimate, what: &str) {
        assert_eq!(u64_of(&v["S"]), e.synchronized() as u64, "{what}: S");
        assert_eq!(u64_of(&v["Z"]), e.ptp() as u64, "{what}: Z");
        assert_eq!(u64_of(&v["scale"]), e.scale() as u64, "{what}: scale");
        assert_eq!(
            u64_of(&v["multiplier"]),
            e.multiplier() as u64,
            "{what}: multiplier"
        );
    }

    /// (a) scapy builds session-sender packets; rtprobe decodes them field
    /// by field, reflects them, and scapy decodes the replies.
    #[test]
    fn scapy_sender_packets_decode_and_reflect() {
        let Some(script) = scapy("scapy_sender_packets_decode_and_reflect") else {
            return;
        };
        let cases = run(&script, &["build-sender".into()]);
        assert!(cases.len() >= 6);
        let mut replies = Vec::new();
        let mut expected = Vec::new();
        let mut state = ReflectorState::new();
        for (i, c) in cases.iter().enumerate() {
            let bytes = unhex(c["hex"].as_str().unwrap());
            let p = SenderPacket::decode(&bytes, Mode::Unauthenticated)
                .unwrap_or_else(|e| panic!("case {i}: {e}"));
            assert_eq!(p.seq as u64, u64_of(&c["seq"]), "case {i}: seq");
            assert_eq!(p.timestamp.to_bits(), u64_of(&c["ts"]), "case {i}: ts");
            assert_ee(&c["ee"], p.error_estimate, &format!("case {i}"));
            assert_eq!(p.ssid as u64, u64_of(&c["ssid"]), "case {i}: ssid");
            // scapy converted these from exact rational seconds since 1900
            // (flooring the fraction): rounding to the nearest nanosecond
            // must give the instant back, epoch offset and era included.
            if let Some(unix_ns) = c["unix_ns"].as_i64() {
                assert_eq!(p.timestamp.to_realtime_ns(0), unix_ns, "case {i}: unix ns");
            }

            // Alternate stateless and stateful replies, NTP and PTP reflector.
            let params = ReflectParams {
                rx_realtime_ns: 1_763_850_000_000_000_000 + i as i64 * 1_000_001,
                tx_realtime_ns: 1_763_850_000_000_050_000 + i as i64 * 1_000_001,
                ttl: 60 + i as u8,
                error_estimate: ErrorEstimate::from_error_ns(
                    i % 2 == 0,
                    1_000 * i as u64,
                    i % 3 == 0,
                ),
                tai_offset_s: 37,
            };
            let seq = if i % 2 == 0 {
                Sequencing::Stateless
            } else {
                Sequencing::Stateful(&mut state)
            };
            let mut reply = Vec::new();
            reflect(&bytes, Mode::Unauthenticated, seq, &params, &mut reply).unwrap();
            assert_eq!(reply.len(), bytes.len());
            let r = ReflectorPacket::decode(&reply, Mode::Unauthenticated).unwrap();
            replies.push(hex(&reply));
            expected.push((c.clone(), r));
        }

        let decoded = run(
            &script,
            &[vec!["decode-reflector".into()], replies].concat(),
        );
        assert_eq!(decoded.len(), expected.len());
        for (i, (d, (c, r))) in decoded.iter().zip(&expected).enumerate() {
            assert_eq!(u64_of(&d["seq"]), r.seq as u64, "reply {i}: seq");
            assert_eq!(u64_of(&d["ts"]), r.timestamp.to_bits(), "reply {i}: ts");
            assert_ee(&d["ee"], r.error_estimate, &format!("reply {i}"));
            assert_eq!(d["ssid"], c["ssid"], "reply {i}: ssid copied");
            assert_eq!(
                u64_of(&d["ts_rx"]),
                r.receive_timestamp.to_bits(),
                "reply {i}: ts_rx"
            );
            assert_eq!(d["seq_sender"], c["seq"], "reply {i}: seq_sender");
            assert_eq!(d["ts_sender"], c["ts"], "reply {i}: ts_sender");
            assert_eq!(d["ee_sender"], c["ee"], "reply {i}: ee_sender");
            assert_eq!(u64_of(&d["ttl_sender"]), 60 + i as u64, "reply {i}: ttl");
            assert_eq!(u64_of(&d["mbz1"]), 0, "reply {i}: mbz1");
            assert_eq!(u64_of(&d["mbz2"]), 0, "reply {i}: mbz2");
            // RFC 8972 TLVs after the base packet come back unchanged.
            assert_eq!(d["tlvs"], c["tlvs"], "reply {i}: tlvs");
        }
        // The TLV case is really there, so the comparison above means something.
        assert!(
            expected
                .iter()
                .any(|(c, _)| c["tlvs"].as_array().is_some_and(|t| !t.is_empty()))
        );
    }

    /// (b) rtprobe encodes session-sender packets and reflector replies;
    /// scapy decodes them field by field.
    #[test]
    #[allow(clippy::too_many_lines)]
    fn rtprobe_packets_decode_in_scapy() {
        let Some(script) = scapy("rtprobe_packets_decode_in_scapy") else {
            return;
        };
        let ntp = |ns| Timestamp::from_realtime_ns(ns, false, 0).unwrap();
        let ptp = |ns| Timestamp::from_realtime_ns(ns, true, 37).unwrap();
        let senders = [
            (
                SenderPacket {
                    seq: 0,
                    timestamp: ntp(0),
                    error_estimate: ErrorEstimate::from_error_ns(false, 0, false),
                    ssid: 0,
                },
                44,
            ),
            (
                SenderPacket {
                    seq: 123_456,
                    timestamp: ntp(1_763_850_000_987_654_321),
                    error_estimate: ErrorEstimate::from_error_ns(true, 1_500_000, false),
                    ssid: 0xBEEF,
                },
                44 + 64,
            ),
            (
                SenderPacket {
                    seq: u32::MAX,
                    timestamp: ptp(1_763_850_000_000_000_001),
                    error_estimate: ErrorEstimate::from_error_ns(true, 50, true),
                    ssid: u16::MAX,
                },
                1472,
            ),
            (
                SenderPacket {
                    seq: 77,
                    // NTP era 1 (2040).
                    timestamp: ntp(2_208_988_800_500_000_000),
                    error_estimate: ErrorEstimate::new(false, false, 63, 255).unwrap(),
                    ssid: 1,
                },
                48,
            ),
        ];
        let mut args = vec!["decode-sender".to_string()];
        for (p, len) in &senders {
            let mut v = Vec::new();
            p.encode(Mode::Unauthenticated, *len, &mut v).unwrap();
            args.push(hex(&v));
        }
        let decoded = run(&script, &args);
        assert_eq!(decoded.len(), senders.len());
        for (i, (d, (p, _))) in decoded.iter().zip(&senders).enumerate() {
            assert_eq!(u64_of(&d["seq"]), p.seq as u64, "sender {i}: seq");
            assert_eq!(u64_of(&d["ts"]), p.timestamp.to_bits(), "sender {i}: ts");
            assert_ee(&d["ee"], p.error_estimate, &format!("sender {i}"));
            assert_eq!(u64_of(&d["ssid"]), p.ssid as u64, "sender {i}: ssid");
            assert_eq!(u64_of(&d["mbz"]), 0, "sender {i}: mbz");
            assert_eq!(d["tlvs"], Value::Array(vec![]), "sender {i}: padding");
        }

        let reflectors = [
            ReflectorPacket {
                seq: 1,
                timestamp: ntp(1_763_850_000_000_020_000),
                error_estimate: ErrorEstimate::from_error_ns(true, 1_000, false),
                ssid: 0x0102,
                receive_timestamp: ntp(1_763_850_000_000_000_999),
                sender_seq: 0xFFFF_FFFE,
                sender_timestamp: ptp(1_763_849_999_999_999_999),
                sender_error_estimate: ErrorEstimate::from_error_ns(false, 7, true),
                sender_ttl: 255,
            },
            ReflectorPacket {
                seq: 0,
                timestamp: ptp(0),
                error_estimate: ErrorEstimate::new(false, true, 0, 1).unwrap(),
                ssid: 0,
                receive_timestamp: ptp(1),
                sender_seq: 0,
                sender_timestamp: ntp(-1),
                sender_error_estimate: ErrorEstimate::new(true, false, 33, 200).unwrap(),
                sender_ttl: 1,
            },
        ];
        let mut args = vec!["decode-reflector".to_string()];
        for (i, r) in reflectors.iter().enumerate() {
            let mut v = Vec::new();
            r.encode(Mode::Unauthenticated, 44 + 16 * i, &mut v)
                .unwrap();
            args.push(hex(&v));
        }
        let decoded = run(&script, &args);
        assert_eq!(decoded.len(), reflectors.len());
        for (i, (d, r)) in decoded.iter().zip(&reflectors).enumerate() {
            assert_eq!(u64_of(&d["seq"]), r.seq as u64, "reflector {i}: seq");
            assert_eq!(u64_of(&d["ts"]), r.timestamp.to_bits(), "reflector {i}: ts");
            assert_ee(&d["ee"], r.error_estimate, &format!("reflector {i}"));
            assert_eq!(u64_of(&d["ssid"]), r.ssid as u64, "reflector {i}: ssid");
            assert_eq!(
                u64_of(&d["ts_rx"]),
                r.receive_timestamp.to_bits(),
                "reflector {i}: ts_rx"
            );
            assert_eq!(
                u64_of(&d["seq_sender"]),
                r.sender_seq as u64,
                "reflector {i}: seq_sender"
            );
            assert_eq!(
                u64_of(&d["ts_sender"]),
                r.sender_timestamp.to_bits(),
                "reflector {i}: ts_sender"
            );
            assert_ee(
                &d["ee_sender"],
                r.sender_error_estimate,
                &format!("reflector {i} sender"),
            );
            assert_eq!(
                u64_of(&d["ttl_sender"]),
                r.sender_ttl as u64,
                "reflector {i}: ttl"
            );
            assert_eq!(u64_of(&d["mbz1"]), 0);
            assert_eq!(u64_of(&d["mbz2"]), 0);
        }
    }
}
