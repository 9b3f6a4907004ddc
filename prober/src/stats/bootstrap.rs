//! Confidence intervals for the difference of two runs' percentiles, by
//! bootstrap: resample each run with replacement, take the percentile of
//! each resample, and read the interval off the distribution of the
//! differences (the percentile method). Pure; the samples come in, usually
//! from [`Reservoir`]s filled while streaming the per-probe CSVs, so memory
//! stays bounded however long the runs were.
//!
//! Percentiles interpolate between order statistics (Hyndman & Fan
//! definition 7, as `export::plot::stats::quantile_sorted` and R's default).
//! A resample is drawn as counts over the sorted sample: the k-th smallest
//! value of the resample is then found by one scan, so a resample of n
//! values costs O(n) instead of a sort.

use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde::Serialize;

/// A uniform random sample of at most `cap` values from a stream of
/// unknown length (Vitter's algorithm R), reproducible from its seed.
pub(crate) struct Reservoir {
    cap: usize,
    seen: u64,
    values: Vec<i64>,
    rng: SmallRng,
}

impl Reservoir {
    pub(crate) fn new(cap: usize, seed: u64) -> Self {
        Self {
            cap: cap.max(1),
            seen: 0,
            values: Vec::new(),
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    pub(crate) fn push(&mut self, v: i64) {
        self.seen += 1;
        if self.values.len() < self.cap {
            self.values.push(v);
        } else {
            let j = self.rng.random_range(0..self.seen);
            if let Some(slot) = self.values.get_mut(j as usize) {
                *slot = v;
            }
        }
    }

    /// Values offered so far.
    pub(crate) fn seen(&self) -> u64 {
        self.seen
    }

    /// The sample, sorted.
    pub(crate) fn into_sorted(self) -> Vec<i64> {
        let mut v = self.values;
        v.sort_unstable();
        v
    }
}

/// One percentile of two runs and their difference (other - base), in ns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct QuantileDiff {
    /// As a fraction: 0.5, 0.99, 0.999.
    pub(crate) p: f64,
    pub(crate) base_ns: f64,
    pub(crate) other_ns: f64,
    pub(crate) diff_ns: f64,
    /// Ends of the confidence interval of `diff_ns`.
    pub(crate) ci_low_ns: f64,
    pub(crate) ci_high_ns: f64,
}

impl QuantileDiff {
    /// The interval excludes 0.
    pub(crate) fn significant(&self) -> bool {
        self.ci_low_ns > 0.0 || self.ci_high_ns < 0.0
    }
}

/// Type-7 percentile of `n` sorted values read through `at` (ascending
/// `ps` are not required here).
fn interpolate(n: usize, p: f64, mut at: impl FnMut(usize) -> f64) -> f64 {
    let h = (n - 1) as f64 * p.clamp(0.0, 1.0);
    let lo = h.floor() as usize;
    let hi = (lo + 1).min(n - 1);
    let a = at(lo);
    let b = at(hi);
    a + (h - lo as f64) * (b - a)
}

/// Percentiles `ps` (ascending) of the resample of `total` values that
/// holds `counts[i]` copies of `sorted[i]`.
fn quantiles_of_counts(
    sorted: &[i64],
    counts: &[u32],
    total: usize,
    ps: &[f64],
    out: &mut Vec<f64>,
) {
    let n = sorted.len();
    out.clear();
    // Ranks asked for never decrease, so one forward scan serves them all.
    let (mut j, mut below) = (0usize, 0usize);
    let mut value_at_rank = |r: usize| -> f64 {
        while j + 1 < n && below + counts[j] as usize <= r {
            below += counts[j] as usize;
            j += 1;
        }
        sorted[j] as f64
    };
    for &p in ps {
        out.push(interpolate(total, p, &mut value_at_rank));
    }
}

fn percentiles(sorted: &[i64], ps: &[f64]) -> Vec<f64> {
    ps.iter()
        .map(|&p| interpolate(sorted.len(), p, |i| sorted[i] as f64))
        .collect()
}

fn resample(
    sorted: &[i64],
    ps: &[f64],
    rng: &mut SmallRng,
    counts: &mut Vec<u32>,
    out: &mut Vec<f64>,
) {
    let n = sorted.len();
    counts.clear();
    counts.resize(n, 0);
    for _ in 0..n {
        counts[rng.random_range(0..n)] += 1;
    }
    quantiles_of_counts(sorted, counts, n, ps, out);
}

/// Differences of the percentiles `ps` (ascending fractions) between two
/// sorted samples, each with a `confidence` (e.g. 0.95) bootstrap interval
/// from `resamples` resamples. `None` when a sample is empty.
pub(crate) fn quantile_diffs(
    base_sorted: &[i64],
    other_sorted: &[i64],
    ps: &[f64],
    resamples: usize,
    confidence: f64,
    seed: u64,
) -> Option<Vec<QuantileDiff>> {
    if base_sorted.is_empty() || other_sorted.is_empty() || ps.is_empty() {
        return None;
    }
    let mut ps_sorted = ps.to_vec();
    ps_sorted.sort_by(f64::total_cmp);
    let base = percentiles(base_sorted, &ps_sorted);
    let other = percentiles(other_sorted, &ps_sorted);
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut counts = Vec::new();
    let (mut qb, mut qo) = (Vec::new(), Vec::new());
    let mut diffs: Vec<Vec<f64>> = vec![Vec::with_capacity(resamples); ps_sorted.len()];
    for _ in 0..resamples.max(1) {
        resample(base_sorted, &ps_sorted, &mut rng, &mut counts, &mut qb);
        resample(other_sorted, &ps_sorted, &mut rng, &mut counts, &mut qo);
        for (k, d) in diffs.iter_mut().enumerate() {
            d.push(qo[k] - qb[k]);
        }
    }
    let alpha = (1.0 - confidence).clamp(0.0, 1.0);
    Some(
        ps_sorted
            .iter()
            .enumerate()
            .map(|(k, &p)| {
                let d = &mut diffs[k];
                d.sort_by(f64::total_cmp);
                QuantileDiff {
                    p,
                    base_ns: base[k],
                    other_ns: other[k],
                    diff_ns: other[k] - base[k],
                    ci_low_ns: interpolate(d.len(), alpha / 2.0, |i| d[i]),
                    ci_high_ns: interpolate(d.len(), 1.0 - alpha / 2.0, |i| d[i]),
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` draws of a skewed latency-like distribution (exponential tail
    /// on a floor), shifted by `shift_ns`.
    fn latencies(n: usize, shift_ns: i64, seed: u64) -> Vec<i64> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut v: Vec<i64> = (0..n)
            .map(|_| {
                let u: f64 = rng.random_range(1e-12..1.0);
                20_000 + (-u.ln() * 30_000.0) as i64 + shift_ns
            })
            .collect();
        v.sort_unstable();
        v
    }

    const PS: [f64; 3] = [0.5, 0.99, 0.999];

    #[test]
    fn the_same_distribution_gives_intervals_around_zero() {
        let a = latencies(10_000, 0, 1);
        let b = latencies(10_000, 0, 2);
        let d = quantile_diffs(&a, &b, &PS, 1000, 0.95, 7).unwrap();
        for q in &d {
            assert!(q.ci_low_ns <= 0.0 && 0.0 <= q.ci_high_ns, "{q:?}");
            assert!(!q.significant());
            assert!(
                q.ci_low_ns <= q.diff_ns && q.diff_ns <= q.ci_high_ns,
                "{q:?}"
            );
        }
    }

    #[test]
    fn a_50us_shift_is_inside_the_interval_and_zero_is_not() {
        let a = latencies(10_000, 0, 3);
        let b = latencies(10_000, 50_000, 4);
        let d = quantile_diffs(&a, &b, &PS, 1000, 0.95, 7).unwrap();
        for q in &d {
            assert!(q.ci_low_ns <= 50_000.0 && 50_000.0 <= q.ci_high_ns, "{q:?}");
            assert!(q.ci_low_ns > 0.0 && q.significant(), "{q:?}");
        }
        // The median is known tightly: within a few µs.
        assert!(d[0].ci_high_ns - d[0].ci_low_ns < 5_000.0, "{:?}", d[0]);
        // Lower, too: the sign follows other - base.
        let d = quantile_diffs(&b, &a, &PS, 1000, 0.95, 7).unwrap();
        assert!(d.iter().all(|q| q.ci_high_ns < 0.0), "{d:?}");
    }

    #[test]
    fn the_seed_makes_it_reproducible() {
        let a = latencies(2_000, 0, 5);
        let b = latencies(2_000, 1_000, 6);
        let one = quantile_diffs(&a, &b, &PS, 200, 0.95, 42);
        assert_eq!(one, quantile_diffs(&a, &b, &PS, 200, 0.95, 42));
        assert_ne!(one, quantile_diffs(&a, &b, &PS, 200, 0.95, 43));
        assert!(quantile_diffs(&[], &b, &PS, 200, 0.95, 42).is_none());
    }

    #[test]
    fn percentiles_of_counts_match_the_expanded_sample() {
        let sorted = [1, 5, 9, 20];
        let counts = [2, 0, 1, 3]; // 1 1 9 20 20 20
        let mut out = Vec::new();
        quantiles_of_counts(&sorted, &counts, 6, &[0.0, 0.5, 0.9, 1.0], &mut out);
        let expanded = [1, 1, 9, 20, 20, 20];
        assert_eq!(out, percentiles(&expanded, &[0.0, 0.5, 0.9, 1.0]));
        assert_eq!(out[1], 14.5);
    }

    #[test]
    fn the_reservoir_keeps_a_uniform_sample_of_bounded_size() {
        let mut r = Reservoir::new(1000, 9);
        for v in 0..100_000 {
            r.push(v);
        }
        assert_eq!(r.seen(), 100_000);
        let s = r.into_sorted();
        assert_eq!(s.len(), 1000);
        let median = s[500];
        assert!((40_000..60_000).contains(&median), "{median}");
        let mut small = Reservoir::new(1000, 9);
        small.push(3);
        assert_eq!(small.into_sorted(), [3]);
    }
}
