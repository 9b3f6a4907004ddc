//! The numbers behind each picture: quartiles, whiskers and outliers for the
//! boxplot, empirical CDF points and the percentile distribution, over
//! samples as [`Sorted`] counted values (exact, or an HDR histogram's
//! buckets). Pure functions over nanoseconds; no drawing here.
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
#[cfg(test)]
pub(crate) fn quantile_sorted(sorted: &[i64], p: f64) -> Option<f64> {
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

/// Samples in ascending order as distinct values with counts: the exact
/// samples run-length coded, or the buckets of a histogram (each bucket
/// standing for its samples at one value). Every statistic below works on
/// this one form, so a run plotted from 3000 exact samples and one plotted
/// from an HDR histogram of 600 M go through the same code.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sorted {
    values: Vec<i64>,
    /// Samples at or below `values[i]`: cumulative counts.
    ends: Vec<u64>,
}

impl Sorted {
    /// From samples already sorted ascending.
    pub(crate) fn from_sorted(sorted: &[i64]) -> Sorted {
        debug_assert!(sorted.is_sorted());
        Sorted::from_pairs(sorted.iter().map(|&v| (v, 1)))
    }

    /// From (value, count) pairs in ascending value order; equal values
    /// are merged and zero counts dropped.
    pub(crate) fn from_pairs(pairs: impl IntoIterator<Item = (i64, u64)>) -> Sorted {
        let mut s = Sorted::default();
        let mut total = 0u64;
        for (v, c) in pairs {
            if c == 0 {
                continue;
            }
            total = total.saturating_add(c);
            match s.values.last() {
                Some(&last) if last == v => *s.ends.last_mut().expect("parallel") = total,
                Some(&last) => {
                    debug_assert!(last < v, "pairs must come in ascending order");
                    s.values.push(v);
                    s.ends.push(total);
                }
                None => {
                    s.values.push(v);
                    s.ends.push(total);
                }
            }
        }
        s
    }

    /// Number of samples.
    pub(crate) fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Number of distinct values (what the figures' size depends on).
    #[cfg(test)]
    pub(crate) fn distinct(&self) -> usize {
        self.values.len()
    }

    pub(crate) fn min(&self) -> Option<i64> {
        self.values.first().copied()
    }

    pub(crate) fn max(&self) -> Option<i64> {
        self.values.last().copied()
    }

    /// The sample of 0-based rank `rank` (clamped to the last one).
    pub(crate) fn at(&self, rank: u64) -> i64 {
        let i = self.ends.partition_point(|&e| e <= rank);
        self.values[i.min(self.values.len() - 1)]
    }

    /// How many samples are below `x`.
    pub(crate) fn count_below(&self, x: f64) -> u64 {
        let i = self.values.partition_point(|&v| (v as f64) < x);
        if i == 0 { 0 } else { self.ends[i - 1] }
    }

    /// How many samples are at or below `x`.
    pub(crate) fn count_at_or_below(&self, x: f64) -> u64 {
        let i = self.values.partition_point(|&v| (v as f64) <= x);
        if i == 0 { 0 } else { self.ends[i - 1] }
    }

    /// The smallest value above 0.
    pub(crate) fn min_positive(&self) -> Option<i64> {
        let i = self.values.partition_point(|&v| v <= 0);
        self.values.get(i).copied()
    }

    /// (value, count) in ascending order.
    pub fn pairs(&self) -> impl DoubleEndedIterator<Item = (i64, u64)> + '_ {
        self.values.iter().enumerate().map(|(i, &v)| {
            let before = if i == 0 { 0 } else { self.ends[i - 1] };
            (v, self.ends[i] - before)
        })
    }

    /// Q(p) by the method in the module docs.
    pub fn quantile(&self, p: f64) -> Option<f64> {
        let n = self.len();
        if n == 0 {
            return None;
        }
        let p = p.clamp(0.0, 1.0);
        let h = (n - 1) as f64 * p;
        let lo = h.floor() as u64;
        let frac = h - lo as f64;
        let a = self.at(lo) as f64;
        let b = self.at((lo + 1).min(n - 1)) as f64;
        Some(a + frac * (b - a))
    }

    /// Mean of the samples (of the bucket values, for a histogram).
    pub(crate) fn mean(&self) -> Option<f64> {
        let n = self.len();
        (n > 0).then(|| self.pairs().map(|(v, c)| v as f64 * c as f64).sum::<f64>() / n as f64)
    }
}

/// Everything a boxplot draws for one series, in nanoseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct BoxStats {
    pub(crate) n: u64,
    pub(crate) min: i64,
    pub(crate) max: i64,
    pub(crate) q1: f64,
    pub(crate) median: f64,
    pub(crate) q3: f64,
    pub(crate) mean: f64,
    /// Smallest sample >= q1 - 1.5 IQR.
    pub lower_whisker: i64,
    /// Largest sample <= q3 + 1.5 IQR.
    pub upper_whisker: i64,
    /// Distinct values below the lower fence, ascending.
    pub(crate) low_outliers: Vec<i64>,
    /// Distinct values above the upper fence, ascending.
    pub(crate) high_outliers: Vec<i64>,
    /// Samples beyond the fences (counting repeats).
    pub(crate) outlier_samples: u64,
}

impl BoxStats {
    #[cfg(test)]
    pub(crate) fn iqr(&self) -> f64 {
        self.q3 - self.q1
    }

    #[cfg(test)]
    pub(crate) fn lower_fence(&self) -> f64 {
        self.q1 - 1.5 * self.iqr()
    }

    #[cfg(test)]
    pub(crate) fn upper_fence(&self) -> f64 {
        self.q3 + 1.5 * self.iqr()
    }

    /// Samples beyond the fences.
    #[cfg(test)]
    pub(crate) fn outlier_count(&self) -> u64 {
        self.outlier_samples
    }

    /// Every distinct outlier value, low ones first (a value shared by
    /// several samples is one mark on the figure).
    pub(crate) fn outliers(&self) -> Vec<i64> {
        [&self.low_outliers[..], &self.high_outliers[..]].concat()
    }
}

/// Boxplot statistics of sorted samples; `None` for no samples.
#[cfg(test)]
pub(crate) fn box_stats(sorted: &[i64]) -> Option<BoxStats> {
    box_stats_of(&Sorted::from_sorted(sorted))
}

/// Boxplot statistics of counted values; `None` for no samples.
pub fn box_stats_of(s: &Sorted) -> Option<BoxStats> {
    let n = s.len();
    let q1 = s.quantile(0.25)?;
    let median = s.quantile(0.5)?;
    let q3 = s.quantile(0.75)?;
    let iqr = q3 - q1;
    let lower_fence = q1 - 1.5 * iqr;
    let upper_fence = q3 + 1.5 * iqr;
    // First distinct value inside the lower fence, first beyond the upper.
    let lo = s.values.partition_point(|&v| (v as f64) < lower_fence);
    let hi = s.values.partition_point(|&v| (v as f64) <= upper_fence);
    // q1 and q3 are samples or between samples, so at least one value lies
    // within the fences and lo < hi.
    let below = s.count_below(lower_fence);
    let above = n - s.count_at_or_below(upper_fence);
    Some(BoxStats {
        n,
        min: s.values[0],
        max: s.values[s.values.len() - 1],
        q1,
        median,
        q3,
        mean: s.mean()?,
        lower_whisker: s.values[lo],
        upper_whisker: s.values[hi - 1],
        low_outliers: s.values[..lo].to_vec(),
        high_outliers: s.values[hi..].to_vec(),
        outlier_samples: below + above,
    })
}

/// One step of the empirical CDF: the fraction of samples <= `value_ns`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CdfPoint {
    pub(crate) value_ns: i64,
    pub(crate) fraction: f64,
}

/// [`cdf_points_of`] over sorted samples.
#[cfg(test)]
pub(crate) fn cdf_points(sorted: &[i64], resolution: usize, log_scale: bool) -> Vec<CdfPoint> {
    cdf_points_of(&Sorted::from_sorted(sorted), resolution, log_scale)
}

/// Empirical CDF: one point per distinct value with the fraction of
/// samples at or below it, thinned so that consecutive points are at least
/// `1 / resolution` apart in either fraction or (scaled) value; the step
/// just before each kept one is kept too, so plateaus end at their true
/// height. The first and last points (min and max, the extremes) are
/// always kept, so at most about `4 * resolution + 4` points come out
/// whatever the input size. `log_scale` measures value distance on a log
/// axis (samples <= 0 are then measured as if they were 1 ns).
/// `resolution = usize::MAX` keeps every step.
pub fn cdf_points_of(s: &Sorted, resolution: usize, log_scale: bool) -> Vec<CdfPoint> {
    let n = s.len();
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
    let k = s.values.len();
    let lo = scale(s.values[0]);
    let span = scale(s.values[k - 1]) - lo;
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
    for (i, (&v, &end)) in s.values.iter().zip(&s.ends).enumerate() {
        let point = CdfPoint {
            value_ns: v,
            fraction: end as f64 / n as f64,
        };
        let sv = scale(v);
        let keep = match last {
            None => true,
            Some((lv, lp)) => i + 1 == k || (sv - lv) >= min_dv || (point.fraction - lp) >= min_dp,
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
    }
    out
}

/// [`percentile_curve_of`] over sorted samples.
#[cfg(test)]
pub(crate) fn percentile_curve(sorted: &[i64], points: usize) -> Vec<(f64, f64)> {
    percentile_curve_of(&Sorted::from_sorted(sorted), points)
}

/// The percentile distribution, HdrHistogram style: about `points + 2`
/// points (x, latency ns) with x = log10(1 / (1 - p)), so 90 % is at 1,
/// 99 % at 2, 99.9 % at 3. The latency at p is the smallest sample with at
/// least a fraction p of the samples at or below it (the inverse of the
/// empirical CDF: a recorded value, never an interpolation). x runs from 0
/// (p = 0, the minimum) to log10(n), the last percentile n samples
/// resolve, where the curve ends with a step up to the maximum.
pub fn percentile_curve_of(s: &Sorted, points: usize) -> Vec<(f64, f64)> {
    let n = s.len();
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
        let rank = (p * n as f64 - 1e-9).ceil().max(1.0) as u64;
        out.push((x, s.at(rank.min(n) - 1) as f64));
    }
    out.push((x_max, s.values[s.values.len() - 1] as f64));
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
        assert_eq!(b.outliers(), vec![100]);
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
        assert_eq!(b.outliers(), vec![-50, 16]);
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
    fn counted_values_give_the_same_statistics_as_repeated_samples() {
        // 3 x 10, 5 x 20, 1 x 1000: as pairs and as the nine samples.
        let pairs = Sorted::from_pairs([(10, 3), (20, 5), (20, 0), (1000, 1)]);
        let mut flat = vec![10; 3];
        flat.extend([20; 5]);
        flat.push(1000);
        let exact = Sorted::from_sorted(&flat);
        assert_eq!(pairs, exact);
        assert_eq!((pairs.len(), pairs.distinct()), (9, 3));
        assert_eq!(pairs.at(0), 10);
        assert_eq!(pairs.at(3), 20);
        assert_eq!(pairs.at(8), 1000);
        assert_eq!(pairs.at(99), 1000);
        for p in [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0] {
            assert_eq!(pairs.quantile(p), quantile_sorted(&flat, p), "p = {p}");
        }
        let b = box_stats_of(&pairs).unwrap();
        assert_eq!(b.outliers(), vec![1000]);
        assert_eq!(b.outlier_count(), 1);
        assert_eq!(percentile_curve_of(&pairs, 20), percentile_curve(&flat, 20));
        assert_eq!(pairs.count_below(20.0), 3);
        assert_eq!(pairs.count_at_or_below(20.0), 8);
        assert_eq!(pairs.min_positive(), Some(10));
    }
}
