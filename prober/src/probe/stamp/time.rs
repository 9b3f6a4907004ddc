//! STAMP's two timestamp formats and the conversions from and to
//! CLOCK_REALTIME: NTP 64-bit (RFC 5905 §6, as RFC 8762 §4.2.1 uses it:
//! seconds since 1900-01-01 + a 32-bit binary fraction) and PTPv2
//! truncated (RFC 8762 §4.2.1, format in RFC 8877 §4.3: 32-bit seconds +
//! 32-bit nanoseconds since 1970-01-01 00:00:00 TAI). Pure: no clock is
//! read here.

use super::{NS_PER_S, StampError};

/// Seconds from the NTP epoch (1900-01-01) to the Unix epoch (1970-01-01).
const NTP_UNIX_OFFSET_S: i64 = 2_208_988_800;
/// Unix seconds the NTP era pivot of RFC 4330 §3 can express: NTP seconds
/// with the top bit set are 1968..2036 (era 0), the others 2036..2104 (era 1).
const NTP_MIN_UNIX_S: i64 = (1 << 31) - NTP_UNIX_OFFSET_S;
const NTP_MAX_UNIX_S: i64 = (1 << 31) + (1 << 32) - NTP_UNIX_OFFSET_S;

/// NTP 64-bit timestamp (RFC 5905 §6): seconds since 1900-01-01 00:00 UTC,
/// modulo 2^32 (the NTP era), and a fraction in units of 2^-32 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NtpTimestamp {
    pub(crate) seconds: u32,
    pub(crate) fraction: u32,
}

impl NtpTimestamp {
    /// Converts Unix-epoch nanoseconds (CLOCK_REALTIME) with the fraction
    /// rounded to the nearest 2^-32 s. One fraction unit (0.23 ns) is finer
    /// than a nanosecond, so `to_unix_ns` gives back exactly `unix_ns`.
    /// The range is the one [`NtpTimestamp::to_unix_ns`] can tell apart
    /// without knowing the era: 1968-01-20 .. 2104-02-26.
    pub(crate) fn from_unix_ns(unix_ns: i64) -> Result<Self, StampError> {
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
    pub(crate) fn to_unix_ns(self) -> i64 {
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

    pub(crate) fn to_bits(self) -> u64 {
        (self.seconds as u64) << 32 | self.fraction as u64
    }

    pub(crate) fn from_bits(bits: u64) -> Self {
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
    pub(crate) seconds: u32,
    /// Always below 10^9 in a value from [`PtpTimestamp::from_unix_ns`] or
    /// a decoder.
    pub(crate) nanoseconds: u32,
}

impl PtpTimestamp {
    /// Exact: both sides count nanoseconds. Range 1970 .. 2106 (32-bit seconds).
    pub(crate) fn from_unix_ns(tai_unix_ns: i64) -> Result<Self, StampError> {
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
    pub(crate) fn to_unix_ns(self) -> i64 {
        self.seconds as i64 * NS_PER_S as i64 + self.nanoseconds as i64
    }

    pub(crate) fn to_bits(self) -> u64 {
        (self.seconds as u64) << 32 | self.nanoseconds as u64
    }

    /// Rejects a nanoseconds field of 10^9 or more: no clock produces one,
    /// and accepting it would make two encodings of the same instant.
    pub(crate) fn from_bits(bits: u64) -> Result<Self, StampError> {
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
    /// 2017; [`super::ClockSync::tai_offset_s`]) is added for them; NTP ignores it.
    pub(crate) fn from_realtime_ns(
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

    pub(crate) fn is_ptp(self) -> bool {
        matches!(self, Timestamp::Ptp(_))
    }

    pub(crate) fn to_bits(self) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;

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

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
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
        }
    }
}
