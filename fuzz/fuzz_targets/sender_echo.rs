//! Fuzzes the sender's receive path (`rtprobe --target`): every datagram
//! that reaches its socket goes through the rtprobe echo decoder
//! (`Probe::decode` and the reflector-state trailer) or the STAMP
//! Session-Reflector decoder (`ReflectorPacket::decode`, unauthenticated and
//! authenticated), then through the conversions the sender applies to what
//! they return. None of it may panic, and what decodes must re-encode to
//! the same packet.
//!
//! Input: one selector byte, then the datagram. Selector bit 0 signs an
//! authenticated STAMP datagram with the target's key first: a fuzzer
//! cannot guess an HMAC, and without a valid one the authenticated decoder
//! stops at the HMAC check.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rtprobe::probe::{
    packet::{
        FLAG_ECHO, FLAG_KERNEL_TIMES, Foreign, HEADER_LEN, KTIMES_MIN_LEN, MAGIC, Probe, VERSION,
    },
    reflect::{STATE_MIN_LEN, STATE_OFFSET, read_rtprobe_state},
    stamp::{
        AUTH_LEN_BYTES, ErrorEstimate, HMAC_COVERED_BYTES, HmacKey, MAX_PACKET_BYTES, Mode,
        ReflectorPacket, StampError,
    },
};

const KEY: &[u8] = b"rtprobe fuzz key, 32 bytes long.";
/// A session id no seed carries: the decoder must tell it from the datagram's.
const OTHER_SESSION: u64 = 0x5254_5042_f022_0001;
/// TAI - UTC offsets the sender may hold: none, today's, and the extremes.
const TAI_OFFSETS_S: [i32; 4] = [0, 37, i32::MIN, i32::MAX];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, datagram)) = data.split_first() else {
        return;
    };
    rtprobe_echo(datagram);
    let key = HmacKey::new(KEY).expect("non-empty key");
    let mut signed = datagram.to_vec();
    if selector & 1 != 0 && signed.len() >= AUTH_LEN_BYTES {
        let tag = key.tag(&signed[..HMAC_COVERED_BYTES]);
        signed[HMAC_COVERED_BYTES..AUTH_LEN_BYTES].copy_from_slice(&tag);
    }
    stamp_echo(&signed, Mode::Unauthenticated);
    stamp_echo(&signed, Mode::Authenticated(&key));
});

fn rtprobe_echo(buf: &[u8]) {
    // The session the sender holds is usually the datagram's own (else the
    // decoder stops at the session check), sometimes another.
    let own = buf
        .get(8..16)
        .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")));
    for session in [own.unwrap_or(0), OTHER_SESSION] {
        match Probe::decode(buf, session) {
            Ok(p) => {
                assert!(buf.len() >= HEADER_LEN);
                assert_eq!(p.session, session);
                assert_eq!(
                    p.kernel_times.is_some(),
                    buf[5] & FLAG_KERNEL_TIMES != 0 && buf.len() >= KTIMES_MIN_LEN
                );
                // Re-encoding gives the same header, but for the flag bits
                // and the reserved byte, which the encoder owns.
                let mut again = vec![0u8; HEADER_LEN];
                p.encode(&mut again);
                assert_eq!(again[..5], buf[..5]);
                assert_eq!(again[5] & FLAG_ECHO, buf[5] & FLAG_ECHO);
                assert_eq!(again[6], buf[6]);
                assert_eq!(again[8..], buf[8..HEADER_LEN]);
            }
            Err(Foreign::OtherSession) => assert_ne!(own, Some(session)),
            Err(Foreign::NotProbe) => {
                assert!(buf.len() < HEADER_LEN || buf[..4] != MAGIC || buf[4] != VERSION);
            }
        }
    }
    if let Some((_received, ee)) = read_rtprobe_state(buf) {
        assert!(buf.len() >= STATE_MIN_LEN);
        let raw = u16::from_be_bytes([buf[STATE_OFFSET + 8], buf[STATE_OFFSET + 9]]);
        // Any 16 bits survive: a reflector's estimate is shown as sent.
        assert_eq!(ee.to_bits(), raw);
        assert_eq!(ErrorEstimate::from_bits(raw), ee);
        let _ = ee.to_error_ns();
    }
}

fn stamp_echo(buf: &[u8], mode: Mode<'_>) {
    match ReflectorPacket::decode(buf, mode) {
        Ok(r) => {
            assert!(buf.len() >= mode.base_len_bytes());
            // What the sender does with an echo: times to CLOCK_REALTIME,
            // estimates to nanoseconds.
            for tai in TAI_OFFSETS_S {
                let _ = r.receive_timestamp.to_realtime_ns(tai);
                let _ = r.timestamp.to_realtime_ns(tai);
                let _ = r.sender_timestamp.to_realtime_ns(tai);
            }
            let _ = r.error_estimate.to_error_ns();
            let _ = r.sender_error_estimate.to_error_ns();
            if buf.len() <= MAX_PACKET_BYTES {
                let mut out = Vec::new();
                r.encode(mode, buf.len(), &mut out)
                    .expect("a decoded packet encodes again");
                assert_eq!(out.len(), buf.len());
                assert_eq!(ReflectorPacket::decode(&out, mode), Ok(r));
            }
            if let Mode::Authenticated(_) = mode {
                // One flipped bit anywhere the HMAC covers is refused.
                let at = usize::from(buf[0]) % HMAC_COVERED_BYTES;
                let mut altered = buf.to_vec();
                altered[at] ^= 1 << (buf[1] % 8);
                assert_eq!(
                    ReflectorPacket::decode(&altered, mode),
                    Err(StampError::BadHmac)
                );
            }
        }
        Err(e) => {
            match e {
                StampError::TooShort { .. } => assert!(buf.len() < mode.base_len_bytes()),
                StampError::BadHmac => assert!(matches!(mode, Mode::Authenticated(_))),
                // A PTP timestamp's nanoseconds field of 10^9 or more.
                StampError::InvalidPtpNanoseconds { .. } => {}
                other => panic!("unexpected decode error: {other:?}"),
            }
            assert!(!e.to_string().contains('\n'));
        }
    }
}
