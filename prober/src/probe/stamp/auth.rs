//! STAMP's authenticated mode: the HMAC key (HMAC-SHA-256 truncated to
//! 128 bits over the first 96 octets of a packet, RFC 8762 §4.4) and the
//! [`Mode`] a session's packets are in (RFC 8762 §4.2.1 vs §4.2.2).

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use super::{AUTH_LEN_BYTES, HMAC_COVERED_BYTES, HMAC_LEN_BYTES, StampError, UNAUTH_LEN_BYTES};

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
    pub(crate) fn verify(&self, data: &[u8], tag: &[u8]) -> Result<(), StampError> {
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
    pub(super) fn verify_packet(&self, packet: &[u8]) -> Result<(), StampError> {
        self.verify(
            &packet[..HMAC_COVERED_BYTES],
            &packet[HMAC_COVERED_BYTES..AUTH_LEN_BYTES],
        )
    }

    pub(super) fn sign_packet(&self, packet: &mut [u8]) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
