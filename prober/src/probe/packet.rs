//! The probe payload. Pure.
//!
//! ```text
//! 0      4    5     6     7     8            16           24           32
//! | RTPB | ver | flg | flow| rsv | session id | seq        | send_ns    | zero padding to --size
//! ```
//! All integers big-endian. `flg` bit 0 marks an echo from the reflector.

pub const MAGIC: [u8; 4] = *b"RTPB";
pub const VERSION: u8 = 1;
pub const FLAG_ECHO: u8 = 1;
/// Smallest payload that holds the header.
pub const HEADER_LEN: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub session: u64,
    pub seq: u64,
    pub flow: u8,
    pub echo: bool,
    pub send_ns: i64,
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
    /// the rest of `buf` is left as is (zero padding set up once by the caller).
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
        Ok(Probe {
            session: s,
            seq: u64_at(16),
            flow: buf[6],
            echo: buf[5] & FLAG_ECHO != 0,
            send_ns: u64_at(24) as i64,
        })
    }
}

/// Marks a received probe as an echo in place (the reflector sends the
/// datagram back unchanged otherwise, so the size is symmetric).
pub fn mark_echo(buf: &mut [u8]) {
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
        };
        let mut buf = vec![0u8; 64];
        p.encode(&mut buf);
        assert_eq!(Probe::decode(&buf, p.session), Ok(p));
        assert_eq!(Probe::decode(&buf, 7), Err(Foreign::OtherSession));
        assert_eq!(Probe::decode(&buf[..31], p.session), Err(Foreign::NotProbe));
        mark_echo(&mut buf);
        assert!(Probe::decode(&buf, p.session).unwrap().echo);
        buf[0] = b'X';
        assert_eq!(Probe::decode(&buf, p.session), Err(Foreign::NotProbe));
        assert_eq!(Probe::decode(&[], 1), Err(Foreign::NotProbe));
    }
}
