//! STAMP's wire format: the Session-Sender and Session-Reflector test
//! packets, unauthenticated (RFC 8762 §4.2.1, §4.3.1, 44 bytes) and
//! authenticated (§4.2.2, §4.3.2, 112 bytes), with the SSID of RFC 8972 §3
//! in the first two octets of the MBZ after the Error Estimate. Encoders
//! and decoders, and the offsets they share with the reflector.
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
//! Decoders do not check MBZ octets: RFC 8972 grew the SSID out of an MBZ
//! field, and later extensions may do the same, so rejecting non-zero MBZ
//! would break interop; encoders always write zeros there.

use super::{ErrorEstimate, MAX_PACKET_BYTES, Mode, StampError, Timestamp};

/// Where the fields sit in one mode's packets. Offsets from RFC 8762
/// Figures 3-6 with the SSID of RFC 8972 §3 (module docs show them all).
pub(super) struct SenderLayout {
    pub(super) seq: usize,
    pub(super) timestamp: usize,
    pub(super) error_estimate: usize,
    pub(super) ssid: usize,
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

pub(super) struct ReflectorLayout {
    pub(super) seq: usize,
    pub(super) timestamp: usize,
    pub(super) error_estimate: usize,
    pub(super) ssid: usize,
    pub(super) receive_timestamp: usize,
    pub(super) sender_seq: usize,
    pub(super) sender_timestamp: usize,
    pub(super) sender_error_estimate: usize,
    pub(super) sender_ttl: usize,
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

pub(super) fn sender_layout(mode: Mode<'_>) -> &'static SenderLayout {
    match mode {
        Mode::Unauthenticated => &SENDER_UNAUTH,
        Mode::Authenticated(_) => &SENDER_AUTH,
    }
}

pub(super) fn reflector_layout(mode: Mode<'_>) -> &'static ReflectorLayout {
    match mode {
        Mode::Unauthenticated => &REFLECTOR_UNAUTH,
        Mode::Authenticated(_) => &REFLECTOR_AUTH,
    }
}

// Readers and writers for callers that checked the length first; they
// cannot fail on a buffer at least as long as the mode's base packet.
pub(super) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(super) fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

pub(super) fn put(b: &mut [u8], at: usize, bytes: &[u8]) {
    b[at..at + bytes.len()].copy_from_slice(bytes);
}

/// The length check every decoder and the reflector start with; after it
/// the fixed offsets of the mode are in bounds.
pub(super) fn check_len(len_bytes: usize, mode: Mode<'_>) -> Result<(), StampError> {
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

#[cfg(test)]
mod tests {
    use super::{super::testutil::*, *};
    use crate::probe::stamp::{
        AUTH_LEN_BYTES, HmacKey, NtpTimestamp, PtpTimestamp, UNAUTH_LEN_BYTES,
    };

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

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
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
    }
}
