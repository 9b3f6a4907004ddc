//! Durations and the TOS byte as every layer writes them: the command
//! line, scenario files, the knobs and the figures' axes parse with the
//! same functions and render with the same short forms (`1.5ms`, `100us`).
//! Pure: no kernel access.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer, de};

/// The longest duration rtprobe takes. Stamps are i64 nanoseconds since
/// 1970, which end in 2262, so "now + duration" must stay below that; a
/// century is beyond any run and any interval. (humantime's year is 365.25
/// days, so "100years" is exactly this.)
pub const MAX_DURATION: Duration = Duration::from_secs(3_155_760_000);

/// The one duration parser of every option, on the command line and in
/// scenario files: "100us", "1.5ms", "10s", "2h 30min" (humantime's units).
/// Negative, malformed and over-[`MAX_DURATION`] values are one-line
/// errors; zero is the caller's to refuse where it makes no sense.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s.trim()).map_err(|e| match e {
        humantime::DurationError::NumberOverflow => {
            format!("duration {s:?} is too large: at most 100 years")
        }
        e => format!("invalid duration {s:?}: {e} (use e.g. 100us, 1.5ms, 10s)"),
    })?;
    if d > MAX_DURATION {
        return Err(format!("duration {s:?} is too large: at most 100 years"));
    }
    Ok(d)
}

/// A byte written 192, 0xC0 or 0b11000000 (the TOS of probes and filters).
pub fn parse_u8_maybe_hex(s: &str) -> Result<u8, String> {
    let t = s.trim();
    let r = if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u8::from_str_radix(h, 16)
    } else if let Some(b) = t.strip_prefix("0b") {
        u8::from_str_radix(b, 2)
    } else {
        t.parse::<u8>()
    };
    r.map_err(|_| format!("invalid TOS {s:?}: expected 0..255, e.g. 0xC0"))
}

/// `fmt_duration`, or humantime's exact form where that would round, so
/// what is written reads back as the same duration.
pub fn fmt_duration_exact(d: Duration) -> String {
    let s = fmt_duration(d);
    if parse_duration(&s) == Ok(d) {
        s
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// Shortest humane form of a duration (`1ms`, `1.5ms`, `100us`, `2s`).
pub fn fmt_duration(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".into();
    }
    let (v, unit) = if ns.is_multiple_of(1_000_000_000) {
        return format!("{}s", ns / 1_000_000_000);
    } else if ns >= 1_000_000_000 {
        (ns as f64 / 1e9, "s")
    } else if ns >= 1_000_000 {
        (ns as f64 / 1e6, "ms")
    } else if ns >= 1_000 {
        (ns as f64 / 1e3, "us")
    } else {
        (ns as f64, "ns")
    };
    format!("{}{unit}", fmt_num(v))
}

/// A number without trailing zeros: 1.5, 100, 0.25.
pub fn fmt_num(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// serde for `Duration` fields written as humane strings.
pub mod humane_duration {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s).map_err(de::Error::custom)
    }

    /// The same for `Option<Duration>`.
    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => s.serialize_str(&fmt_duration_exact(*d)),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
            let s = String::deserialize(d)?;
            parse_duration(&s).map(Some).map_err(de::Error::custom)
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn durations_parse_with_fractions_and_refuse_what_the_clock_cannot_hold() {
        let ok = |t: &str| parse_duration(t).unwrap();
        assert_eq!(ok("1.5ms"), Duration::from_micros(1500));
        assert_eq!(ok(" 100us "), Duration::from_micros(100));
        assert_eq!(ok("100years"), MAX_DURATION);
        for bad in ["99999999999999999999.5s", "300years", "101years"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("too large: at most 100 years"), "{bad}: {e}");
        }
        for bad in ["-1s", "soon", "", "1e3s", "5"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.starts_with("invalid duration"), "{bad}: {e}");
        }
    }

    proptest! {
        #[test]
        fn duration_parser_never_panics(s in "\\PC*") {
            let _ = parse_duration(&s);
        }

        #[test]
        fn duration_parser_never_panics_on_number_unit_shapes(
            n in "[0-9]{1,30}(\\.[0-9]{0,12})?",
            unit in "(ns|us|µs|ms|s|sec|min|m|h|d|w|years|y|)",
        ) {
            if let Ok(d) = parse_duration(&format!("{n}{unit}")) {
                prop_assert!(d <= MAX_DURATION);
            }
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100us").unwrap(), Duration::from_micros(100));
        assert_eq!(parse_duration("1ms").unwrap(), Duration::from_millis(1));
        assert_eq!(
            parse_duration("1.5ms").unwrap(),
            Duration::from_micros(1500)
        );
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("1.5parsecs").is_err());
        assert_eq!(fmt_duration(Duration::from_micros(1500)), "1.5ms");
        assert_eq!(fmt_duration(Duration::from_millis(1)), "1ms");
        assert_eq!(fmt_duration(Duration::from_micros(100)), "100us");
        assert_eq!(fmt_duration(Duration::from_secs(2)), "2s");
    }

    #[test]
    fn tos() {
        assert_eq!(parse_u8_maybe_hex("0xC0").unwrap(), 0xc0);
        assert_eq!(parse_u8_maybe_hex("192").unwrap(), 192);
        assert!(parse_u8_maybe_hex("256").is_err());
        assert!(parse_u8_maybe_hex("0xZZ").is_err());
    }
}
