//! Test-only fixtures the STAMP tests share: estimates, a key, reflector
//! parameters and a sender packet.

use super::{ErrorEstimate, HmacKey, Mode, ReflectParams, SenderPacket, Timestamp};

pub(super) fn ntp_ee() -> ErrorEstimate {
    ErrorEstimate::new(true, false, 5, 135).unwrap()
}

pub(super) fn ptp_ee() -> ErrorEstimate {
    ErrorEstimate::new(true, true, 0, 1).unwrap()
}

pub(super) fn key() -> HmacKey {
    HmacKey::new(b"0123456789abcdef0123456789abcdef").unwrap()
}

pub(super) fn params(ptp: bool) -> ReflectParams {
    ReflectParams {
        rx_realtime_ns: 1_763_850_000_000_000_500,
        tx_realtime_ns: 1_763_850_000_000_020_001,
        ttl: 63,
        error_estimate: if ptp { ptp_ee() } else { ntp_ee() },
        tai_offset_s: 37,
    }
}

pub(super) fn sender(seq: u32, ssid: u16) -> SenderPacket {
    SenderPacket {
        seq,
        timestamp: Timestamp::from_realtime_ns(1_763_850_000_123_456_789, false, 0).unwrap(),
        error_estimate: ntp_ee(),
        ssid,
    }
}

pub(super) fn encoded(p: &SenderPacket, mode: Mode<'_>, len_bytes: usize) -> Vec<u8> {
    let mut v = Vec::new();
    p.encode(mode, len_bytes, &mut v).unwrap();
    v
}
