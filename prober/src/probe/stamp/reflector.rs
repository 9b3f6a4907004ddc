//! The Session-Reflector's behaviour (RFC 8762 §4.3): [`reflect`] builds
//! the reply to a Session-Sender packet, stateless (the request's
//! sequence number) or stateful (its own counter per session,
//! [`ReflectorState`]). Pure: the caller gives the times and the TTL.

use std::collections::HashMap;

use super::{
    ErrorEstimate, Mode, StampError, Timestamp,
    packet::{check_len, get_u16, get_u32, put, reflector_layout, sender_layout},
};

/// Sessions (SSIDs) one [`ReflectorState`] tracks: bounds the memory a
/// single peer can make the reflector spend.
const MAX_SESSIONS_PER_STATE: usize = 1024;

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
    #[cfg(test)]
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// The sequence number the next reply of session `ssid` will carry.
    #[cfg(test)]
    pub(crate) fn peek(&self, ssid: u16) -> u32 {
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
    pub(crate) rx_realtime_ns: i64,
    /// T3: CLOCK_REALTIME when the reply leaves.
    pub(crate) tx_realtime_ns: i64,
    /// TTL or Hop Limit of the request's IP header.
    pub(crate) ttl: u8,
    /// The reflector's own estimate; its Z flag picks the format of T2, T3.
    pub(crate) error_estimate: ErrorEstimate,
    /// TAI - UTC, used for PTP timestamps only ([`Timestamp::from_realtime_ns`]).
    pub(crate) tai_offset_s: i32,
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
    use super::{super::testutil::*, *};
    use crate::probe::stamp::{AUTH_LEN_BYTES, ReflectorPacket, SenderPacket};

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
