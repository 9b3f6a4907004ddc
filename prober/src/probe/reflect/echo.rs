//! What an rtprobe-protocol echo carries beyond the probe: the echo flag,
//! the in-kernel reflector's times (flag bit 2, bytes 32..48) where there
//! is room, and the reflector's state (flag bit 3, payload of at least 64
//! bytes):
//!
//! ```text
//! 48                56       58
//! | received (u64)  | EE u16 | zero
//! ```
//! `received`: probes of this session (not warm-ups) the reflector has
//! seen, this one included, so the sender can tell forward from return
//! loss; EE: the reflector clock's STAMP Error Estimate (RFC 4656 §4.1.2).

use crate::probe::{
    packet::{FLAG_ECHO, FLAG_KERNEL_TIMES, KTIMES_MIN_LEN},
    stamp::ErrorEstimate,
};

/// Echo flag bit: bytes [`STATE_OFFSET`].. hold the reflector's state.
pub const FLAG_REFLECTOR_STATE: u8 = 8;
/// Warm-up probes (see `probe/engine.rs`): answered, not counted.
pub const FLAG_WARMUP: u8 = 2;
pub const STATE_OFFSET: usize = 48;
/// Smallest payload the state is written into.
pub const STATE_MIN_LEN: usize = 64;

/// Turns an rtprobe probe into its echo: the echo flag, the reflector's
/// receive and transmit times where there is room (as the in-kernel
/// reflector writes them), and its state where there is room for that.
pub(super) fn write_rtprobe_echo(
    buf: &mut [u8],
    rx_ns: i64,
    tx_ns: i64,
    received: u64,
    ee: ErrorEstimate,
) {
    buf[5] |= FLAG_ECHO;
    if buf.len() >= KTIMES_MIN_LEN {
        buf[5] |= FLAG_KERNEL_TIMES;
        buf[32..40].copy_from_slice(&rx_ns.to_be_bytes());
        buf[40..48].copy_from_slice(&tx_ns.to_be_bytes());
    }
    if buf.len() >= STATE_MIN_LEN {
        buf[5] |= FLAG_REFLECTOR_STATE;
        buf[48..56].copy_from_slice(&received.to_be_bytes());
        buf[56..58].copy_from_slice(&ee.to_bits().to_be_bytes());
        buf[58..64].fill(0);
    }
}

/// The reflector state in an rtprobe echo, if it carries one.
pub fn read_rtprobe_state(buf: &[u8]) -> Option<(u64, ErrorEstimate)> {
    if buf.len() < STATE_MIN_LEN || buf[5] & FLAG_REFLECTOR_STATE == 0 {
        return None;
    }
    Some((
        u64::from_be_bytes(buf[48..56].try_into().expect("8 bytes")),
        ErrorEstimate::from_bits(u16::from_be_bytes([buf[56], buf[57]])),
    ))
}
