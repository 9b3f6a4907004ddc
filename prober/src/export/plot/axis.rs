//! Latency axes: automatic units (ns / µs / ms / s), linear or log10
//! scale, tick positions and labels. Pure; the drawing code maps through
//! [`ValueAxis`] so linear and log figures share one code path (plotters
//! sees a linear axis of plot coordinates; on a log axis those are log10 of
//! the value in the chosen unit).

use anyhow::{Result, bail};

pub(crate) use crate::model::units::{Unit, format_duration_ns, format_number, split_duration_ns};

/// A latency axis: data range, unit, scale.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ValueAxis {
    pub(crate) unit: Unit,
    pub(crate) log: bool,
    /// Ends of the axis in plot coordinates (see module docs).
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    /// The user fixed the upper end (`--y-max`): drawing must not move it.
    pub(crate) fixed_hi: bool,
}

impl ValueAxis {
    /// An axis covering `[min_ns, max_ns]` with a little room at both ends,
    /// unless the user fixed an end (`fixed_min_ns` / `fixed_max_ns`). On a
    /// log axis `min_ns` must be the smallest *positive* sample.
    pub(crate) fn fit(
        min_ns: f64,
        max_ns: f64,
        log: bool,
        fixed_min_ns: Option<f64>,
        fixed_max_ns: Option<f64>,
    ) -> Result<ValueAxis> {
        let mut lo_ns = fixed_min_ns.unwrap_or(min_ns);
        let mut hi_ns = fixed_max_ns.unwrap_or(max_ns);
        if !(lo_ns.is_finite() && hi_ns.is_finite()) {
            bail!("no latency samples to draw");
        }
        if lo_ns > hi_ns {
            if fixed_min_ns.is_some() || fixed_max_ns.is_some() {
                bail!(
                    "--y-min is above --y-max or above every sample: pick a lower --y-min or a higher --y-max"
                );
            }
            std::mem::swap(&mut lo_ns, &mut hi_ns);
        }
        if log && lo_ns <= 0.0 {
            if fixed_min_ns.is_some() {
                bail!("--log needs a positive --y-min, e.g. --y-min 1us");
            }
            bail!("--log needs positive latencies, and no sample is above 0 ns");
        }
        let unit = Unit::for_max(hi_ns.abs().max(lo_ns.abs()));
        let k = unit.ns_per_unit();
        let (mut lo, mut hi) = if log {
            ((lo_ns / k).log10(), (hi_ns / k).log10())
        } else {
            (lo_ns / k, hi_ns / k)
        };
        // Room at the ends so extreme points are not drawn on the frame.
        let span = hi - lo;
        let pad = if span > 0.0 {
            span * 0.05
        } else if log {
            0.05
        } else {
            (lo.abs() * 0.1).max(1.0)
        };
        if fixed_min_ns.is_none() {
            lo -= pad;
            // Latencies that cannot be negative get no axis below zero
            // (a log axis is above zero anyway).
            if !log && min_ns >= 0.0 {
                lo = lo.max(0.0);
            }
        }
        if fixed_max_ns.is_none() {
            hi += pad;
        }
        if hi <= lo {
            hi = lo + pad.max(1e-9);
        }
        Ok(ValueAxis {
            unit,
            log,
            lo,
            hi,
            fixed_hi: fixed_max_ns.is_some(),
        })
    }

    /// The same axis with `fraction` of its height added on top (room for a
    /// legend above the data), unless the user fixed the upper end.
    pub(crate) fn with_headroom(&self, fraction: f64) -> ValueAxis {
        let mut a = self.clone();
        if !a.fixed_hi && fraction > 0.0 && fraction < 0.8 {
            a.hi += (a.hi - a.lo) * fraction / (1.0 - fraction);
        }
        a
    }

    /// Plot coordinate of a latency, or `None` if it is off the axis (or
    /// not representable: <= 0 on a log axis).
    pub(crate) fn coord(&self, ns: f64) -> Option<f64> {
        let c = self.coord_unclamped(ns)?;
        let eps = (self.hi - self.lo) * 1e-9;
        (c >= self.lo - eps && c <= self.hi + eps).then_some(c)
    }

    /// Plot coordinate of a latency, clamped to the axis ends (for boxes and
    /// whiskers cut by a user-fixed range). `None` only for <= 0 on a log
    /// axis, which is drawn at the bottom edge.
    pub(crate) fn coord_clamped(&self, ns: f64) -> f64 {
        match self.coord_unclamped(ns) {
            Some(c) => c.clamp(self.lo, self.hi),
            None => self.lo,
        }
    }

    fn coord_unclamped(&self, ns: f64) -> Option<f64> {
        let v = ns / self.unit.ns_per_unit();
        if self.log {
            (v > 0.0).then(|| v.log10())
        } else {
            Some(v)
        }
    }

    /// Tick positions in plot coordinates.
    pub(crate) fn ticks(&self) -> Vec<f64> {
        if !self.log {
            return nice_ticks(self.lo, self.hi, 10);
        }
        // 1-2-5 (or every integer multiple when the range is narrow) times
        // powers of ten; plain decades when that would crowd the axis.
        let decades = self.hi - self.lo;
        let candidates: &[&[f64]] = if decades > 4.0 {
            &[&[1.0]]
        } else {
            &[
                &[1.0, 2.0, 5.0],
                &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
            ]
        };
        for mults in candidates {
            let mut t = Vec::new();
            let first = self.lo.floor() as i32 - 1;
            let last = self.hi.ceil() as i32 + 1;
            for e in first..=last {
                for m in mults.iter() {
                    let c = (m * 10f64.powi(e)).log10();
                    if c >= self.lo && c <= self.hi {
                        t.push(c);
                    }
                }
            }
            if t.len() >= 3 || (decades > 4.0 && t.len() >= 2) {
                return t;
            }
        }
        // Less than a factor of ~2 in range: linear steps in value space.
        let (a, b) = (10f64.powf(self.lo), 10f64.powf(self.hi));
        nice_ticks(a, b, 6)
            .into_iter()
            .filter(|v| *v > 0.0)
            .map(f64::log10)
            .collect()
    }

    /// Label of a tick (plot coordinate) as a number in `self.unit`.
    pub(crate) fn format_tick(&self, c: f64) -> String {
        let v = if self.log { 10f64.powf(c) } else { c };
        format_number(v)
    }

    /// "One-way latency (µs)".
    pub(crate) fn describe(&self, what: &str) -> String {
        format!("{what} ({})", self.unit.symbol())
    }
}

/// Evenly spaced ticks at 1, 2 or 5 times a power of ten, about `target`
/// of them, covering `[lo, hi]`.
pub(crate) fn nice_ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) || hi <= lo {
        return vec![lo];
    }
    let raw = (hi - lo) / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    // The tolerance keeps -0.3 / 0.1 = -2.9999999999999996 a tick.
    let first = (lo / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    // Round to the step's decimals so 3 * 0.1 is 0.3, not 0.30000000000000004.
    let scale = 10f64.powi((-step.log10().floor()).max(0.0) as i32);
    (first..=last)
        .map(|i| (i as f64 * step * scale).round() / scale)
        .map(|v| if v == 0.0 { 0.0 } else { v })
        .collect()
}

/// A count with thousands separators: 1000000 -> "1,000,000".
pub(crate) fn format_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_follow_the_largest_value() {
        assert_eq!(Unit::for_max(9_999.0), Unit::Ns);
        assert_eq!(Unit::for_max(10_000.0), Unit::Us);
        assert_eq!(Unit::for_max(2_000_000.0), Unit::Us);
        assert_eq!(Unit::for_max(10_000_000.0), Unit::Ms);
        assert_eq!(Unit::for_max(3e9), Unit::Ms);
        assert_eq!(Unit::for_max(12e9), Unit::S);
        assert_eq!(Unit::for_max(-50e6), Unit::Ms);
    }

    #[test]
    fn linear_axis_pads_and_converts() {
        let a = ValueAxis::fit(40_000.0, 60_000.0, false, None, None).unwrap();
        assert_eq!(a.unit, Unit::Us);
        assert!((a.lo - 39.0).abs() < 1e-9 && (a.hi - 61.0).abs() < 1e-9);
        assert_eq!(a.coord(50_000.0), Some(50.0));
        assert_eq!(a.coord(90_000.0), None);
        assert_eq!(a.coord_clamped(90_000.0), a.hi);
        assert_eq!(a.describe("RTT"), "RTT (µs)");
        // Fixed ends are used as given, without padding.
        let a = ValueAxis::fit(40_000.0, 60_000.0, false, Some(0.0), None).unwrap();
        assert_eq!(a.lo, 0.0);
        assert!(ValueAxis::fit(1.0, 2.0, false, Some(5.0), Some(3.0)).is_err());
        // A 5 µs body with a 1.6 ms tail: the padding stops at zero.
        let a = ValueAxis::fit(5_000.0, 1_600_000.0, false, None, None).unwrap();
        assert_eq!(a.lo, 0.0);
        // Negative samples (unsynchronised clocks) keep their padding.
        let a = ValueAxis::fit(-5_000.0, 1_600_000.0, false, None, None).unwrap();
        assert!(a.lo < -5.0);
    }

    #[test]
    fn log_axis_ticks_and_labels() {
        let a = ValueAxis::fit(10_000.0, 10_000_000.0, true, None, None).unwrap();
        assert_eq!(a.unit, Unit::Ms);
        // 0.01 ms .. 10 ms: three decades, 1-2-5 ticks.
        let labels: Vec<String> = a.ticks().iter().map(|t| a.format_tick(*t)).collect();
        assert_eq!(
            labels,
            [
                "0.01", "0.02", "0.05", "0.1", "0.2", "0.5", "1", "2", "5", "10"
            ]
        );
        assert_eq!(a.coord(-1.0), None);
        assert_eq!(a.coord_clamped(0.0), a.lo);
        assert!(ValueAxis::fit(-5.0, 10.0, true, None, None).is_err());
        assert!(ValueAxis::fit(5.0, 10.0, true, Some(0.0), None).is_err());
        // Narrow log range still gets ticks.
        let a = ValueAxis::fit(50_000.0, 60_000.0, true, None, None).unwrap();
        assert!(a.ticks().len() >= 2, "{:?}", a.ticks());
    }

    #[test]
    fn nice_ticks_by_hand() {
        assert_eq!(
            nice_ticks(0.0, 10.0, 5),
            vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
        );
        assert_eq!(
            nice_ticks(39.0, 61.0, 8),
            vec![40.0, 45.0, 50.0, 55.0, 60.0]
        );
        assert_eq!(
            nice_ticks(-0.3, 0.3, 6),
            vec![-0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3]
        );
    }

    #[test]
    fn numbers_and_durations() {
        assert_eq!(format_number(1500.0), "1500");
        assert_eq!(format_number(12.5), "12.5");
        assert_eq!(format_number(0.1 + 0.2), "0.3");
        assert_eq!(format_number(-0.0001), "0");
        assert_eq!(format_count(0), "0");
        assert_eq!(format_count(999), "999");
        assert_eq!(format_count(1000), "1,000");
        assert_eq!(format_count(1_000_000), "1,000,000");
        assert_eq!(format_duration_ns(1e6), "1 ms");
        assert_eq!(format_duration_ns(1.5e6), "1.5 ms");
        assert_eq!(format_duration_ns(100e3), "100 µs");
        assert_eq!(format_duration_ns(64.0), "64 ns");
        assert_eq!(format_duration_ns(10e9), "10 s");
        assert_eq!(format_duration_ns(108_920_800.0), "109 ms");
        assert_eq!(format_duration_ns(5_743.0), "5.743 µs");
        assert_eq!(format_duration_ns(11_631.0), "11.63 µs");
        assert_eq!(format_duration_ns(812.0), "812 ns");
        assert_eq!(format_duration_ns(999_700.0), "1 ms");
        assert_eq!(format_duration_ns(999.4), "999 ns");
        assert_eq!(format_duration_ns(-41_000.0), "-41 µs");
        assert_eq!(format_duration_ns(0.0), "0 ns");
    }
}
