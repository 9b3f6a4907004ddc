//! The numbers behind each picture: quartiles, whiskers and outliers for the
//! boxplot, empirical CDF points, the percentile distribution, and min/max
//! decimation for time series.
//! Pure functions over nanosecond samples; no drawing here.
//!
//! Quartile method: linear interpolation between order statistics,
//! Hyndman & Fan (1996) definition 7, the default of R's `quantile()`,
//! NumPy's `percentile(method="linear")` and Excel's `QUARTILE.INC`. For `n`
//! sorted samples `x[0..n]` and probability `p`, let `h = (n - 1) p`; then
//! `Q(p) = x[floor(h)] + (h - floor(h)) (x[floor(h) + 1] - x[floor(h)])`.
//!
//! Whiskers follow Tukey: they reach the most extreme *sample* within
//! 1.5 IQR of the box (not the fence itself); every sample beyond is an
//! outlier.

/// Q(p) of already sorted samples by the method in the module docs.
/// `None` for no samples.
pub fn quantile_sorted(sorted: &[i64], p: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let p = p.clamp(0.0, 1.0);
    let h = (n - 1) as f64 * p;
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(n - 1);
    let frac = h - lo as f64;
    // In f64 so i64 extremes cannot overflow the difference.
    let a = sorted[lo] as f64;
    let b = sorted[hi] as f64;
    Some(a + frac * (b - a))
}

/// Everything a boxplot draws for one series, in nanoseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct BoxStats {
    pub n: usize,
    pub min: i64,
    pub max: i64,
    pub q1: f64,
    pub median: f64,
    pub q3: f64,
    pub mean: f64,
    /// Smallest sample >= q1 - 1.5 IQR.
    pub lower_whisker: i64,
    /// Largest sample <= q3 + 1.5 IQR.
    pub upper_whisker: i64,
    /// Samples below the lower fence (index range into the sorted input).
    pub low_outliers: std::ops::Range<usize>,
    /// Samples above the upper fence (index range into the sorted input).
    pub high_outliers: std::ops::Range<usize>,
}

impl BoxStats {
    pub fn iqr(&self) -> f64 {
        self.q3 - self.q1
    }

    pub fn lower_fence(&self) -> f64 {
        self.q1 - 1.5 * self.iqr()
    }

    pub fn upper_fence(&self) -> f64 {
        self.q3 + 1.5 * self.iqr()
    }

    pub fn outlier_count(&self) -> usize {
        self.low_outliers.len() + self.high_outliers.len()
    }

    /// Every outlier, low ones first, as slices of the sorted input the
    /// stats were computed from.
    pub fn outliers<'a>(&self, sorted: &'a [i64]) -> (&'a [i64], &'a [i64]) {
        (
            &sorted[self.low_outliers.clone()],
            &sorted[self.high_outliers.clone()],
        )
    }
}

/// Boxplot statistics of sorted samples; `None` for no samples.
pub fn box_stats(sorted: &[i64]) -> Option<BoxStats> {
    let n = sorted.len();
    debug_assert!(sorted.is_sorted());
    let q1 = quantile_sorted(sorted, 0.25)?;
    let median = quantile_sorted(sorted, 0.5)?;
    let q3 = quantile_sorted(sorted, 0.75)?;
    let iqr = q3 - q1;
    let lower_fence = q1 - 1.5 * iqr;
    let upper_fence = q3 + 1.5 * iqr;
    // First index inside the lower fence, first index beyond the upper fence.
    let lo = sorted.partition_point(|&v| (v as f64) < lower_fence);
    let hi = sorted.partition_point(|&v| (v as f64) <= upper_fence);
    // q1 and q3 are samples or between samples, so at least one sample lies
    // within the fences and lo < hi.
    let sum: f64 = sorted.iter().map(|&v| v as f64).sum();
    Some(BoxStats {
        n,
        min: sorted[0],
        max: sorted[n - 1],
        q1,
        median,
        q3,
        mean: sum / n as f64,
        lower_whisker: sorted[lo],
        upper_whisker: sorted[hi - 1],
        low_outliers: 0..lo,
        high_outliers: hi..n,
    })
}

/// One step of the empirical CDF: the fraction of samples <= `value_ns`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CdfPoint {
    pub value_ns: i64,
    pub fraction: f64,
}

/// Empirical CDF of sorted samples: one point per distinct value with the
/// fraction of samples at or below it, thinned so that consecutive points
/// are at least `1 / resolution` apart in either fraction or (scaled)
/// value; the step just before each kept one is kept too, so plateaus end
/// at their true height. The first and last points (min and max, the
/// extremes) are always kept, so at most about `4 * resolution + 4` points
/// come out whatever the input size. `log_scale` measures value distance on a log axis (samples
/// <= 0 are then measured as if they were 1 ns). `resolution = usize::MAX`
/// keeps every step.
pub fn cdf_points(sorted: &[i64], resolution: usize, log_scale: bool) -> Vec<CdfPoint> {
    let n = sorted.len();
    if n == 0 {
        return Vec::new();
    }
    let scale = |v: i64| -> f64 {
        if log_scale {
            (v.max(1) as f64).ln()
        } else {
            v as f64
        }
    };
    let lo = scale(sorted[0]);
    let span = scale(sorted[n - 1]) - lo;
    let res = resolution.max(1) as f64;
    let min_dv = if span > 0.0 {
        span / res
    } else {
        f64::INFINITY
    };
    let min_dp = 1.0 / res;

    let mut out = Vec::new();
    let mut last: Option<(f64, f64)> = None;
    // The step before the current one, if it was thinned away.
    let mut skipped: Option<CdfPoint> = None;
    let mut i = 0;
    while i < n {
        let v = sorted[i];
        // Jump past the run of equal values: the CDF steps once per value.
        let run_end = i + sorted[i..].partition_point(|&x| x == v);
        let point = CdfPoint {
            value_ns: v,
            fraction: run_end as f64 / n as f64,
        };
        let sv = scale(v);
        let keep = match last {
            None => true,
            Some((lv, lp)) => {
                run_end == n || (sv - lv) >= min_dv || (point.fraction - lp) >= min_dp
            }
        };
        if keep {
            // Keep the corner before a kept step too, so the plateau before
            // a long jump (the tail) is drawn at its true height.
            if let Some(prev) = skipped.take() {
                out.push(prev);
            }
            out.push(point);
            last = Some((sv, point.fraction));
        } else {
            skipped = Some(point);
        }
        i = run_end;
    }
    out
}

/// The percentile distribution of sorted samples, HdrHistogram style: about
/// `points + 2` points (x, latency ns) with x = log10(1 / (1 - p)), so 90 %
/// is at 1, 99 % at 2, 99.9 % at 3. The latency at p is the smallest sample
/// with at least a fraction p of the samples at or below it (the inverse of
/// the empirical CDF: a recorded value, never an interpolation). x runs from
/// 0 (p = 0, the minimum) to log10(n), the last percentile n samples
/// resolve, where the curve ends with a step up to the maximum.
pub fn percentile_curve(sorted: &[i64], points: usize) -> Vec<(f64, f64)> {
    let n = sorted.len();
    if n == 0 {
        return Vec::new();
    }
    let x_max = (n as f64).log10();
    let points = points.max(1);
    let mut out = Vec::with_capacity(points + 2);
    for i in 0..=points {
        let x = x_max * i as f64 / points as f64;
        let p = 1.0 - 10f64.powf(-x);
        // The tolerance keeps p * n = 9.000000000000002 at the 9th sample.
        let rank = (p * n as f64 - 1e-9).ceil().max(1.0) as usize;
        out.push((x, sorted[rank.min(n) - 1] as f64));
    }
    out.push((x_max, sorted[n - 1] as f64));
    out
}

/// Thins a time series for drawing while keeping its extremes: the x range
/// is cut into `buckets` equal slices and each slice keeps only its lowest
/// and highest sample (in x order), so spikes survive however many points
/// share a pixel column. Series with at most `2 * buckets` points come back
/// whole. `x` and `y` are parallel; x need not be sorted.
pub fn decimate_minmax(x: &[i64], y: &[i64], buckets: usize) -> Vec<(i64, i64)> {
    assert_eq!(x.len(), y.len(), "x and y must be parallel");
    let n = x.len();
    let buckets = buckets.max(1);
    if n <= 2 * buckets {
        let mut all: Vec<(i64, i64)> = x.iter().copied().zip(y.iter().copied()).collect();
        all.sort_by_key(|p| p.0);
        return all;
    }
    let (xmin, xmax) = x
        .iter()
        .fold((i64::MAX, i64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
    // In i128 so a span of the whole i64 range does not overflow.
    let span = (xmax as i128 - xmin as i128).max(1);
    // (index of min, index of max) per bucket.
    let mut slots: Vec<Option<(usize, usize)>> = vec![None; buckets];
    for i in 0..n {
        let b = ((x[i] as i128 - xmin as i128) * buckets as i128 / (span + 1)) as usize;
        let slot = &mut slots[b.min(buckets - 1)];
        match slot {
            None => *slot = Some((i, i)),
            Some((lo, hi)) => {
                if y[i] < y[*lo] {
                    *lo = i;
                }
                if y[i] > y[*hi] {
                    *hi = i;
                }
            }
        }
    }
    let mut out = Vec::with_capacity(2 * buckets);
    for (lo, hi) in slots.into_iter().flatten() {
        let (a, b) = if x[lo] <= x[hi] { (lo, hi) } else { (hi, lo) };
        out.push((x[a], y[a]));
        if b != a {
            out.push((x[b], y[b]));
        }
    }
    out
}

/// Thins x positions (e.g. of lost probes) to at most one per bucket of the
/// x range: markers closer than a pixel are indistinguishable anyway.
pub fn decimate_marks(x: &[i64], lo: i64, hi: i64, buckets: usize) -> Vec<i64> {
    let buckets = buckets.max(1);
    let span = (hi as i128 - lo as i128).max(1);
    let mut seen = vec![false; buckets];
    let mut out = Vec::new();
    for &v in x {
        let b = ((v as i128 - lo as i128).clamp(0, span) * buckets as i128 / (span + 1)) as usize;
        let b = b.min(buckets - 1);
        if !seen[b] {
            seen[b] = true;
            out.push(v);
        }
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quartiles_type7_by_hand() {
        // n = 4: h(0.25) = 0.75 -> 1 + 0.75 * (2 - 1) = 1.75;
        // h(0.5) = 1.5 -> 2.5; h(0.75) = 2.25 -> 3 + 0.25 = 3.25.
        let s = [1, 2, 3, 4];
        assert_eq!(quantile_sorted(&s, 0.25), Some(1.75));
        assert_eq!(quantile_sorted(&s, 0.5), Some(2.5));
        assert_eq!(quantile_sorted(&s, 0.75), Some(3.25));
        assert_eq!(quantile_sorted(&s, 0.0), Some(1.0));
        assert_eq!(quantile_sorted(&s, 1.0), Some(4.0));
        // Odd n = 5: the median is the middle sample, quartiles are samples.
        let s = [10, 20, 30, 40, 50];
        assert_eq!(quantile_sorted(&s, 0.25), Some(20.0));
        assert_eq!(quantile_sorted(&s, 0.5), Some(30.0));
        assert_eq!(quantile_sorted(&s, 0.75), Some(40.0));
        assert_eq!(quantile_sorted(&[7], 0.25), Some(7.0));
        assert_eq!(quantile_sorted(&[], 0.5), None);
    }

    #[test]
    fn whiskers_and_outliers_by_hand() {
        // n = 10: q1 at h = 2.25 -> 3.25, median at h = 4.5 -> 5.5,
        // q3 at h = 6.75 -> 7.75; IQR 4.5, fences -3.5 and 14.5.
        let s = [1, 2, 3, 4, 5, 6, 7, 8, 9, 100];
        let b = box_stats(&s).unwrap();
        assert_eq!((b.q1, b.median, b.q3), (3.25, 5.5, 7.75));
        assert_eq!(b.iqr(), 4.5);
        assert_eq!((b.lower_fence(), b.upper_fence()), (-3.5, 14.5));
        // Whiskers stop at the last sample inside the fences, not at them.
        assert_eq!((b.lower_whisker, b.upper_whisker), (1, 9));
        assert_eq!(b.outliers(&s), (&[][..], &[100][..]));
        assert_eq!((b.min, b.max, b.n), (1, 100, 10));
        assert_eq!(b.mean, 14.5);
    }

    #[test]
    fn outliers_on_both_sides_and_ties_at_the_fence() {
        // q1 = 10, q3 = 12 (h = 2 and 6 of n = 9), IQR 2, fences 7 and 15.
        // 7 and 15 sit exactly on the fences: inside, so they are whiskers.
        let s = [-50, 7, 10, 11, 11, 11, 12, 15, 16];
        let b = box_stats(&s).unwrap();
        assert_eq!((b.q1, b.q3), (10.0, 12.0));
        assert_eq!((b.lower_whisker, b.upper_whisker), (7, 15));
        assert_eq!(b.outliers(&s), (&[-50][..], &[16][..]));
        assert_eq!(b.outlier_count(), 2);
    }

    #[test]
    fn constant_series_has_no_outliers() {
        let s = [5; 6];
        let b = box_stats(&s).unwrap();
        assert_eq!((b.q1, b.median, b.q3), (5.0, 5.0, 5.0));
        assert_eq!((b.lower_whisker, b.upper_whisker), (5, 5));
        assert_eq!(b.outlier_count(), 0);
        assert!(box_stats(&[]).is_none());
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let s = [i64::MIN, 0, i64::MAX];
        let b = box_stats(&s).unwrap();
        assert_eq!(b.median, 0.0);
        assert_eq!(b.n, 3);
    }

    #[test]
    fn cdf_exact_steps_by_hand() {
        let mut s = vec![3, 1, 2, 2];
        s.sort_unstable();
        let p = cdf_points(&s, usize::MAX, false);
        let want = [(1, 0.25), (2, 0.75), (3, 1.0)];
        assert_eq!(p.len(), want.len());
        for (got, (v, f)) in p.iter().zip(want) {
            assert_eq!((got.value_ns, got.fraction), (v, f));
        }
        assert!(cdf_points(&[], 10, false).is_empty());
        assert_eq!(
            cdf_points(&[4], 10, true),
            vec![CdfPoint {
                value_ns: 4,
                fraction: 1.0
            }]
        );
    }

    #[test]
    fn cdf_thinning_is_bounded_and_keeps_extremes() {
        // 1..=100_000 plus one far outlier.
        let mut s: Vec<i64> = (1..=100_000).collect();
        s.push(10_000_000);
        let p = cdf_points(&s, 100, false);
        assert!(p.len() <= 4 * 100 + 4, "{} points", p.len());
        assert_eq!(p.first().unwrap().value_ns, 1);
        let last = p.last().unwrap();
        assert_eq!((last.value_ns, last.fraction), (10_000_000, 1.0));
        // The corner just below the outlier survives: the plateau before
        // the jump is drawn at its true height.
        let before = p[p.len() - 2];
        assert_eq!(before.value_ns, 100_000);
        // Fractions never decrease and never skip more than 1/resolution
        // without a value jump.
        for w in p.windows(2) {
            assert!(w[1].fraction > w[0].fraction && w[1].value_ns > w[0].value_ns);
        }
        let log = cdf_points(&s, 100, true);
        assert!(log.len() <= 4 * 100 + 4);
    }

    #[test]
    fn minmax_decimation_keeps_spikes() {
        let n = 100_000;
        let x: Vec<i64> = (0..n).collect();
        let mut y = vec![50i64; n as usize];
        y[12_345] = 9_000; // a spike
        y[77_777] = -3; // a dip
        let d = decimate_minmax(&x, &y, 100);
        assert!(d.len() <= 200);
        assert!(d.contains(&(12_345, 9_000)));
        assert!(d.contains(&(77_777, -3)));
        assert!(d.windows(2).all(|w| w[0].0 <= w[1].0), "x order kept");
        // Short series come back whole, sorted by x.
        assert_eq!(
            decimate_minmax(&[3, 1, 2], &[30, 10, 20], 10),
            vec![(1, 10), (2, 20), (3, 30)]
        );
        // Extreme x values do not overflow the bucket arithmetic.
        let x = [i64::MIN, 0, i64::MAX, 5, 6];
        let d = decimate_minmax(&x, &[1, 2, 3, 4, 5], 2);
        // Buckets: [MIN] and [0, MAX, 5, 6]; the second keeps its lowest
        // (x 0, y 2) and highest (x 6, y 5) sample, in x order.
        assert_eq!(d, vec![(i64::MIN, 1), (0, 2), (6, 5)]);
    }

    #[test]
    fn percentile_curve_by_hand() {
        // 1..=1000: x = 1 is p = 0.9, the 900th sample; x = 2 is p = 0.99,
        // the 990th; the curve ends at x = 3 with the maximum.
        let s: Vec<i64> = (1..=1000).collect();
        let c = percentile_curve(&s, 300);
        assert_eq!(c[0], (0.0, 1.0));
        let at = |x: f64| c.iter().find(|p| (p.0 - x).abs() < 1e-9).unwrap().1;
        assert_eq!(at(1.0), 900.0);
        assert_eq!(at(2.0), 990.0);
        assert_eq!(*c.last().unwrap(), (3.0, 1000.0));
        assert!(c.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1));
        assert!(percentile_curve(&[], 10).is_empty());
        assert_eq!(percentile_curve(&[7], 10).last(), Some(&(0.0, 7.0)));
    }

    #[test]
    fn marks_thinned_per_bucket() {
        let x: Vec<i64> = (0..1000).collect();
        let m = decimate_marks(&x, 0, 999, 10);
        assert_eq!(m.len(), 10);
        assert_eq!(m[0], 0);
        assert_eq!(decimate_marks(&[5, 5, 900], 0, 1000, 10), vec![5, 900]);
    }
}
