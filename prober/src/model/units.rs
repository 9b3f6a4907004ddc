//! Durations and the TOS byte as every layer writes them: the command
//! line, scenario files, the knobs and the figures' axes parse with the
//! same functions and render with the same short forms (`1.5ms`, `100us`).
//! Also the latency a person reads (`5.743 µs`, in the unit that suits it),
//! and byte sizes (`64KiB`) with the serde that units share. Pure: no
//! kernel access.

use std::{fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// The longest duration rtprobe takes. Stamps are i64 nanoseconds since
/// 1970, which end in 2262, so "now + duration" must stay below that; a
/// century is beyond any run and any interval. (humantime's year is 365.25
/// days, so "100years" is exactly this.)
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(3_155_760_000);

/// The one duration parser of every option, on the command line and in
/// scenario files: "100us", "1.5ms", "10s", "2h 30min" (humantime's units).
/// Negative, malformed and over-[`MAX_DURATION`] values are one-line
/// errors; zero is the caller's to refuse where it makes no sense.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
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
pub(crate) fn parse_u8_maybe_hex(s: &str) -> Result<u8, String> {
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
pub(crate) fn fmt_duration_exact(d: Duration) -> String {
    let s = fmt_duration(d);
    if parse_duration(&s) == Ok(d) {
        s
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// Shortest humane form of a duration (`1ms`, `1.5ms`, `100us`, `2s`).
pub(crate) fn fmt_duration(d: Duration) -> String {
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
pub(crate) fn fmt_num(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}

/// serde for `Duration` fields written as humane strings.
pub(crate) mod humane_duration {
    use super::*;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        parse_duration(&s).map_err(de::Error::custom)
    }

    /// The same for `Option<Duration>`.
    pub(crate) mod option {
        use super::*;

        pub(crate) fn serialize<S: Serializer>(
            d: &Option<Duration>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match d {
                Some(d) => s.serialize_str(&fmt_duration_exact(*d)),
                None => s.serialize_none(),
            }
        }

        pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<Duration>, D::Error> {
            let s = String::deserialize(d)?;
            parse_duration(&s).map(Some).map_err(de::Error::custom)
        }
    }
}

/// The unit latencies are shown in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unit {
    Ns,
    Us,
    Ms,
    S,
}

impl Unit {
    /// The largest unit in which the axis end still reads as a whole
    /// number below 10000: ns below 10 µs, µs below 10 ms, ms below 10 s,
    /// then s. Latency bodies of tens of µs with a tail of a few ms thus
    /// stay in µs (50 .. 2000 µs) rather than turning into 0.05 ms.
    pub(crate) fn for_max(max_abs_ns: f64) -> Unit {
        let m = max_abs_ns.abs();
        if m < 1e4 {
            Unit::Ns
        } else if m < 1e7 {
            Unit::Us
        } else if m < 1e10 {
            Unit::Ms
        } else {
            Unit::S
        }
    }

    pub(crate) fn ns_per_unit(self) -> f64 {
        match self {
            Unit::Ns => 1.0,
            Unit::Us => 1e3,
            Unit::Ms => 1e6,
            Unit::S => 1e9,
        }
    }

    pub(crate) fn symbol(self) -> &'static str {
        match self {
            Unit::Ns => "ns",
            Unit::Us => "µs",
            Unit::Ms => "ms",
            Unit::S => "s",
        }
    }
}

/// Compact number: up to three decimals, trailing zeros dropped, and no
/// decimals at all from 100 up (latency labels, not accounting).
pub(crate) fn format_number(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let s = if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s == "-0" { "0".to_string() } else { s }
}

/// A duration in the unit that suits it, with 3-4 significant digits:
/// "812 ns", "5.743 µs", "64 µs", "1.5 ms", "109 ms", "10 s". Titles,
/// legends and every latency a person reads (the run summary, report.md)
/// use it; files for programs keep nanoseconds.
pub(crate) fn format_duration_ns(ns: f64) -> String {
    let (number, unit) = split_duration_ns(ns);
    format!("{number} {}", unit.symbol())
}

/// [`format_duration_ns`] as number and unit, for tables that align the
/// unit in a column of its own.
pub(crate) fn split_duration_ns(ns: f64) -> (String, Unit) {
    let mut unit = if ns.abs() < 1e3 {
        Unit::Ns
    } else if ns.abs() < 1e6 {
        Unit::Us
    } else if ns.abs() < 1e9 {
        Unit::Ms
    } else {
        Unit::S
    };
    // 999.7 µs rounds to "1000": say 1 ms instead.
    if unit != Unit::S && (ns / unit.ns_per_unit()).abs() >= 999.5 {
        unit = match unit {
            Unit::Ns => Unit::Us,
            Unit::Us => Unit::Ms,
            _ => Unit::S,
        };
    }
    (format_number(ns / unit.ns_per_unit()), unit)
}

/// A size in bytes. Plain integers are bytes; `b`, `k`/`kb`/`kib`,
/// `m`/`mb`/`mib` are powers of 1024 as in tc (`limit 16kb` = 16384).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Bytes(pub(crate) u64);

impl Bytes {}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
            write!(f, "{}MiB", b >> 20)
        } else if b >= 1024 && b.is_multiple_of(1024) {
            write!(f, "{}KiB", b >> 10)
        } else {
            write!(f, "{b}")
        }
    }
}

impl FromStr for Bytes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        let (num, unit) = split_number(&t);
        let v: f64 = num.parse().map_err(|_| {
            format!("invalid size {s:?}: expected bytes, e.g. 3000, 1514b, 64KiB, 1MiB")
        })?;
        let scale = match unit {
            "" | "b" => 1.0,
            "k" | "kb" | "kib" => 1024.0,
            "m" | "mb" | "mib" => 1024.0 * 1024.0,
            "kbit" | "mbit" | "bit" => {
                return Err(format!(
                    "invalid size {s:?}: {unit:?} is a rate unit; a size is bytes (3000, 64KiB, 1MiB)"
                ));
            }
            _ => {
                return Err(format!(
                    "invalid size {s:?}: unknown unit {unit:?} (use b, KiB, MiB; kb = KiB as in tc)"
                ));
            }
        };
        let b = v * scale;
        if !(b.is_finite() && b >= 0.0 && b <= (1u64 << 40) as f64) || b.fract() != 0.0 {
            return Err(format!(
                "invalid size {s:?}: must be a whole number of bytes up to 1TiB"
            ));
        }
        Ok(Self(b as u64))
    }
}

/// Splits "100mbit" into ("100", "mbit").
pub(crate) fn split_number(t: &str) -> (&str, &str) {
    let i = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (n, u) = t.split_at(i);
    (n, u.trim())
}

/// serde for the unit types (here and in `tune`): TOML strings or integers in, strings out, so
/// a bad value fails with the same message on the CLI and in a config file
/// (toml adds the key and the line).
macro_rules! serde_via_str {
    ($t:ty, $what:expr, $int:expr) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl de::Visitor<'_> for V {
                    type Value = $t;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($what)
                    }
                    fn visit_str<E: de::Error>(self, v: &str) -> Result<$t, E> {
                        v.parse().map_err(E::custom)
                    }
                    fn visit_i64<E: de::Error>(self, v: i64) -> Result<$t, E> {
                        let f: fn(i64) -> Result<$t, String> = $int;
                        f(v).map_err(E::custom)
                    }
                    fn visit_u64<E: de::Error>(self, v: u64) -> Result<$t, E> {
                        self.visit_i64(i64::try_from(v).map_err(E::custom)?)
                    }
                }
                d.deserialize_any(V)
            }
        }
    };
}

pub(crate) use serde_via_str;

serde_via_str!(
    Bytes,
    "a size in bytes (3000) or a string such as \"64KiB\"",
    |v| {
        u64::try_from(v)
            .map(Bytes)
            .map_err(|_| "a size cannot be negative".to_string())
    }
);

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
