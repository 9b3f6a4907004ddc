//! The probe payload. Pure.
//!
//! ```text
//! 0      4    5     6     7     8            16           24           32
//! | RTPB | ver | flg | flow| rsv | session id | seq        | send_ns    | zero padding to --size
//! ```
//! All integers big-endian. `flg` bit 0 marks an echo from the reflector,
//! bit 1 a warm-up probe (see `probe/engine.rs`).
//!
//! An echo from the in-kernel reflector (XDP, `--reflector kernel`) also
//! has `flg` bit 2 set when the payload is at least 48 bytes, and then
//! carries the reflector's receive and transmit times (CLOCK_REALTIME ns,
//! i64) in the first 16 bytes of what is otherwise zero padding:
//!
//! ```text
//! 32            40            48
//! | refl_rx_ns  | refl_tx_ns  | zero padding
//! ```
//! Shorter probes are answered without times (bit 2 clear). Senders keep
//! those bytes zero; older decoders ignore them and bit 2, so the format
//! stays version 1. The constants live in `xdp-common`, which the XDP
//! program shares.

pub const MAGIC: [u8; 4] = xdp_common::RTPB_MAGIC;
pub const VERSION: u8 = xdp_common::RTPB_VERSION;
pub const FLAG_ECHO: u8 = xdp_common::RTPB_FLAG_ECHO;
/// The echo carries the in-kernel reflector's times at [`KTIMES_OFFSET`].
pub const FLAG_KERNEL_TIMES: u8 = xdp_common::RTPB_FLAG_KERNEL_TIMES;
/// Smallest payload that holds the header.
pub const HEADER_LEN: usize = xdp_common::RTPB_HEADER_LEN;
/// Where the in-kernel reflector's receive time starts (transmit time after it).
pub(crate) const KTIMES_OFFSET: usize = xdp_common::RTPB_KTIMES_OFFSET;
/// Smallest payload the in-kernel reflector writes its times into.
pub const KTIMES_MIN_LEN: usize = xdp_common::RTPB_KTIMES_MIN_LEN;

/// The in-kernel reflector's receive and transmit times of one probe
/// (CLOCK_REALTIME ns on the reflector's host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelTimes {
    pub(crate) rx_ns: i64,
    pub(crate) tx_ns: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub session: u64,
    pub seq: u64,
    pub flow: u8,
    pub echo: bool,
    pub send_ns: i64,
    /// Set on echoes of the in-kernel reflector that had room for them.
    pub kernel_times: Option<KernelTimes>,
}

/// Why a datagram is not one of this run's probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Foreign {
    /// Too short, wrong magic or version: not an rtprobe datagram at all.
    NotProbe,
    /// An rtprobe probe from another run.
    OtherSession,
}

impl Probe {
    /// Writes the header into `buf` (which must be at least [`HEADER_LEN`]);
    /// the rest of `buf` is left as is (zero padding set up once by the
    /// caller). `kernel_times` is not written: only the XDP reflector does.
    pub fn encode(&self, buf: &mut [u8]) {
        buf[0..4].copy_from_slice(&MAGIC);
        buf[4] = VERSION;
        buf[5] = if self.echo { FLAG_ECHO } else { 0 };
        buf[6] = self.flow;
        buf[7] = 0;
        buf[8..16].copy_from_slice(&self.session.to_be_bytes());
        buf[16..24].copy_from_slice(&self.seq.to_be_bytes());
        buf[24..32].copy_from_slice(&self.send_ns.to_be_bytes());
    }

    pub fn decode(buf: &[u8], session: u64) -> Result<Probe, Foreign> {
        if buf.len() < HEADER_LEN || buf[0..4] != MAGIC || buf[4] != VERSION {
            return Err(Foreign::NotProbe);
        }
        let u64_at = |o: usize| u64::from_be_bytes(buf[o..o + 8].try_into().expect("8 bytes"));
        let s = u64_at(8);
        if s != session {
            return Err(Foreign::OtherSession);
        }
        let kernel_times =
            (buf[5] & FLAG_KERNEL_TIMES != 0 && buf.len() >= KTIMES_MIN_LEN).then(|| KernelTimes {
                rx_ns: u64_at(KTIMES_OFFSET) as i64,
                tx_ns: u64_at(KTIMES_OFFSET + 8) as i64,
            });
        Ok(Probe {
            session: s,
            seq: u64_at(16),
            flow: buf[6],
            echo: buf[5] & FLAG_ECHO != 0,
            send_ns: u64_at(24) as i64,
            kernel_times,
        })
    }
}

/// Marks a received probe as an echo in place (the reflector sends the
/// datagram back unchanged otherwise, so the size is symmetric).
#[cfg(test)]
pub(crate) fn mark_echo(buf: &mut [u8]) {
    if buf.len() > 5 {
        buf[5] |= FLAG_ECHO;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let p = Probe {
            session: 0xdead_beef_0102_0304,
            seq: 42,
            flow: 1,
            echo: false,
            send_ns: 123,
            kernel_times: None,
        };
        let mut buf = vec![0u8; 64];
        p.encode(&mut buf);
        assert_eq!(Probe::decode(&buf, p.session), Ok(p));
        assert_eq!(Probe::decode(&buf, 7), Err(Foreign::OtherSession));
        assert_eq!(Probe::decode(&buf[..31], p.session), Err(Foreign::NotProbe));
        mark_echo(&mut buf);
        assert!(Probe::decode(&buf, p.session).unwrap().echo);
        // What the in-kernel reflector writes: bit 2 and the two times.
        let mut k = buf.clone();
        k[5] |= FLAG_KERNEL_TIMES;
        k[32..40].copy_from_slice(&1_000i64.to_be_bytes());
        k[40..48].copy_from_slice(&1_500i64.to_be_bytes());
        let got = Probe::decode(&k, p.session).unwrap();
        assert_eq!(
            got.kernel_times,
            Some(KernelTimes {
                rx_ns: 1_000,
                tx_ns: 1_500
            })
        );
        // The bit without room for the times is ignored.
        assert_eq!(
            Probe::decode(&k[..40], p.session).unwrap().kernel_times,
            None
        );
        // Without the bit, whatever is in the padding is not times.
        assert_eq!(Probe::decode(&buf, p.session).unwrap().kernel_times, None);
        buf[0] = b'X';
        assert_eq!(Probe::decode(&buf, p.session), Err(Foreign::NotProbe));
        assert_eq!(Probe::decode(&[], 1), Err(Foreign::NotProbe));
    }
}
