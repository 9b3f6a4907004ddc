//! STAMP's Error Estimate (RFC 4656 §4.1.2, with the Z bit of RFC 8762
//! §4.2.1: 0 = NTP, 1 = PTP timestamps) and the kernel's clock state it
//! is made from ([`ClockSync`]).
//!
//! Kernel interface: `adjtimex(2)` with `modes = 0` (read only, no
//! privilege; the `tai` field needs Linux >= 2.6.26).

use super::{NS_PER_S, StampError};

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
    #[cfg(test)]
    pub(crate) fn new(
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
    pub(crate) fn from_clock_sync(sync: &ClockSync, ptp: bool) -> Self {
        Self::from_error_ns(sync.synchronized, sync.max_error_ns, ptp)
    }

    /// Reads the kernel's clock state (`adjtimex(2)`, read only) and maps it.
    #[cfg(test)]
    pub(crate) fn from_adjtimex(ptp: bool) -> Result<Self, StampError> {
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

    pub(crate) fn synchronized(self) -> bool {
        self.synchronized
    }

    /// The Z flag: the timestamps this estimate covers are PTP (else NTP).
    pub(crate) fn ptp(self) -> bool {
        self.ptp
    }

    #[cfg(test)]
    pub(crate) fn scale(self) -> u8 {
        self.scale
    }

    #[cfg(test)]
    pub(crate) fn multiplier(self) -> u8 {
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
    pub(crate) fn from_timex(clock_state: i32, status: i32, maxerror_us: i64, tai_s: i32) -> Self {
        Self {
            synchronized: status & libc::STA_UNSYNC == 0 && clock_state != libc::TIME_ERROR,
            // A negative maxerror is nonsense; treat it as no error known.
            max_error_ns: (maxerror_us.max(0) as u64).saturating_mul(1000),
            tai_offset_s: tai_s,
        }
    }

    /// Reads the kernel's state with `adjtimex(2)`, `modes = 0`: read only,
    /// allowed without privileges.
    pub(crate) fn read_kernel() -> Result<Self, StampError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
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
        }
    }
}
