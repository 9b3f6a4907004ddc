//! Streaming accumulators that keep `rtprobe plot`'s memory flat in the
//! number of probes: [`Dist`] for a latency distribution (exact samples up
//! to [`EXACT_LIMIT`], an HDR histogram beyond) and [`TimeGrid`] for a time
//! series (a fixed number of columns, each holding min, max, a coarse
//! sketch for its percentiles and the lost probes that fell in it).
//!
//! Both take one sample at a time and never hold more than a bounded
//! amount whatever the run's length: a week of probes at 1 ms (600 M rows)
//! costs what an hour does.

use hdrhistogram::Histogram;

use super::stats::Sorted;

/// Samples per series kept exactly. Up to this many (100 s of probes at
/// 1 ms, 800 KB) the figures are drawn from the samples themselves, every
/// outlier and every CDF step exact; beyond it the series moves into an
/// HDR histogram of [`HDR_SIGFIG`] significant digits.
pub const EXACT_LIMIT: usize = 100_000;

/// Significant decimal digits of the histograms: every value is known to
/// within 0.1 % (1 µs at 1 ms), finer than a pixel on any latency axis.
pub(crate) const HDR_SIGFIG: u8 = 3;

/// A latency distribution, fed one sample at a time. Values may be zero
/// or negative (a one-way delay between skewed clocks, a stage whose
/// stamps came out of order): magnitudes of negative values go into a
/// second histogram, so nothing is dropped or clamped.
#[derive(Debug, Clone)]
pub struct Dist {
    exact: Vec<i64>,
    limit: usize,
    hist: Option<Box<Hists>>,
    n: u64,
    min: i64,
    max: i64,
}

#[derive(Debug, Clone)]
struct Hists {
    /// Values >= 0.
    pos: Histogram<u64>,
    /// |v| of values < 0.
    neg: Histogram<u64>,
}

impl Hists {
    fn new() -> Hists {
        let h = || Histogram::new(HDR_SIGFIG).expect("3 significant digits are valid");
        Hists { pos: h(), neg: h() }
    }

    fn record(&mut self, v: i64, count: u64) {
        let (h, m) = if v >= 0 {
            (&mut self.pos, v as u64)
        } else {
            (&mut self.neg, v.unsigned_abs())
        };
        // An auto-resizing histogram takes any u64 but the very top of the
        // range; there, the largest value it can track stands in (the
        // exact min and max are kept beside it).
        if h.record_n(m, count).is_err() {
            let top = h.high();
            let _ = h.record_n(top, count);
        }
    }
}

impl Default for Dist {
    fn default() -> Self {
        Dist::new(EXACT_LIMIT)
    }
}

impl Dist {
    /// Keeps up to `exact_limit` samples exactly (0: histogram from the
    /// first sample; `usize::MAX`: always exact).
    pub fn new(exact_limit: usize) -> Dist {
        Dist {
            exact: Vec::new(),
            limit: exact_limit,
            hist: None,
            n: 0,
            min: i64::MAX,
            max: i64::MIN,
        }
    }

    pub(crate) fn record(&mut self, v: i64) {
        self.n += 1;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        match &mut self.hist {
            Some(h) => h.record(v, 1),
            None if self.exact.len() < self.limit => self.exact.push(v),
            None => {
                self.spill().record(v, 1);
            }
        }
    }

    /// Records `count` samples at `v` (an HDR log's bucket): they go into
    /// the histogram unless they fit the exact budget.
    pub fn record_n(&mut self, v: i64, count: u64) {
        if count == 0 {
            return;
        }
        if self.hist.is_none()
            && (self.exact.len() as u64).saturating_add(count) <= self.limit as u64
        {
            for _ in 0..count {
                self.record(v);
            }
            return;
        }
        self.n += count;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.spill().record(v, count);
    }

    /// Moves the exact samples into histograms (once).
    fn spill(&mut self) -> &mut Hists {
        if self.hist.is_none() {
            let mut h = Hists::new();
            for v in std::mem::take(&mut self.exact) {
                h.record(v, 1);
            }
            self.hist = Some(Box::new(h));
        }
        self.hist.as_mut().expect("just set")
    }

    /// Samples recorded.
    pub fn n(&self) -> u64 {
        self.n
    }

    /// Whether every sample is still known exactly.
    pub(crate) fn is_exact(&self) -> bool {
        self.hist.is_none()
    }

    /// The samples as counted values in ascending order. From a histogram
    /// each bucket stands at its highest equivalent value (HdrHistogram's
    /// convention for percentiles: a latency is never understated), kept
    /// within the exact min and max.
    pub fn finish(self) -> Sorted {
        let Dist {
            mut exact,
            hist,
            min,
            max,
            ..
        } = self;
        let Some(h) = hist else {
            exact.sort_unstable();
            return Sorted::from_sorted(&exact);
        };
        let neg: Vec<(i64, u64)> = h
            .neg
            .iter_recorded()
            .map(|b| {
                let m = h.neg.lowest_equivalent(b.value_iterated_to());
                (neg_of(m), b.count_at_value())
            })
            .collect();
        let pos = h.pos.iter_recorded().map(|b| {
            let v = i64::try_from(b.value_iterated_to()).unwrap_or(i64::MAX);
            (v, b.count_at_value())
        });
        Sorted::from_pairs(
            neg.into_iter()
                .rev()
                .chain(pos)
                .map(|(v, c)| (v.clamp(min, max), c)),
        )
    }
}

/// -m for a magnitude of a negative i64 (2^63 is i64::MIN).
fn neg_of(m: u64) -> i64 {
    if m >= 1 << 63 { i64::MIN } else { -(m as i64) }
}

/// Sub-buckets per octave of a column's sketch, as a power of two: with 32
/// per octave a column's percentile lies between the lowest and highest
/// sample of a bucket 3 % wide (placed by rank between them), under a
/// pixel on a figure's latency axis.
const SKETCH_SUB_BITS: u32 = 5;
const SKETCH_SUB: u64 = 1 << SKETCH_SUB_BITS;

/// Sketch bucket of `v`, ordered like the values (negative ones first).
fn sketch_key(v: i64) -> u16 {
    let idx = magnitude_index(v.unsigned_abs());
    if v >= 0 { 0x8000 + idx } else { 0x7fff - idx }
}

fn magnitude_index(m: u64) -> u16 {
    if m < SKETCH_SUB {
        return m as u16;
    }
    let e = 63 - m.leading_zeros();
    let mant = (m >> (e - SKETCH_SUB_BITS)) & (SKETCH_SUB - 1);
    (((e - SKETCH_SUB_BITS + 1) as u64) << SKETCH_SUB_BITS | mant) as u16
}

/// The middle of a sketch bucket.
#[cfg(test)]
fn sketch_value(key: u16) -> i64 {
    let (lo, hi) = sketch_range(key);
    lo + (hi - lo) / 2
}

/// The values a sketch bucket holds, lowest and highest.
#[cfg(test)]
fn sketch_range(key: u16) -> (i64, i64) {
    let (neg, idx) = if key >= 0x8000 {
        (false, key - 0x8000)
    } else {
        (true, 0x7fff - key)
    };
    let idx = idx as u64;
    let (lo, hi) = if idx < SKETCH_SUB {
        (idx, idx)
    } else {
        let e = (idx >> SKETCH_SUB_BITS) + SKETCH_SUB_BITS as u64 - 1;
        let mant = idx & (SKETCH_SUB - 1);
        let shift = e - SKETCH_SUB_BITS as u64;
        let lo = (SKETCH_SUB + mant) << shift;
        (lo, lo + ((1u64 << shift) - 1))
    };
    let signed = |m: u64| i64::try_from(m).unwrap_or(i64::MAX);
    if neg {
        (neg_of(hi), neg_of(lo))
    } else {
        (signed(lo), signed(hi))
    }
}

/// One column of a [`TimeGrid`].
#[derive(Debug, Clone, Default)]
struct Col {
    n: u64,
    /// Sum of the x of the samples, for their mean.
    x_sum: i128,
    min: i64,
    max: i64,
    lost: u64,
    /// x of the first lost probe in the column.
    lost_x: i64,
    /// Per sketch bucket, ascending by key.
    sketch: Vec<Bucket>,
}

impl Col {
    fn merge(&mut self, o: Col) {
        if o.n > 0 {
            if self.n == 0 {
                self.min = o.min;
                self.max = o.max;
            } else {
                self.min = self.min.min(o.min);
                self.max = self.max.max(o.max);
            }
            self.n += o.n;
            self.x_sum += o.x_sum;
            for b in o.sketch {
                add_to_sketch(&mut self.sketch, b);
            }
        }
        if o.lost > 0 {
            if self.lost == 0 {
                self.lost_x = o.lost_x;
            } else {
                self.lost_x = self.lost_x.min(o.lost_x);
            }
            self.lost += o.lost;
        }
    }

    /// The sample of rank ceil(p n): found in the sketch, placed by its
    /// rank between the lowest and highest sample of its bucket, so a
    /// bucket holding one value gives it exactly.
    fn percentile(&self, p: f64) -> i64 {
        if self.n == 1 || self.min == self.max {
            return self.min;
        }
        let want = ((p * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0;
        for b in &self.sketch {
            if seen + b.n >= want {
                if b.n == 1 {
                    return b.min;
                }
                let f = ((want - seen) as f64 - 1.0) / (b.n - 1) as f64;
                let v = b.min as f64 + (b.max as f64 - b.min as f64) * f;
                return (v.round() as i64).clamp(b.min, b.max);
            }
            seen += b.n;
        }
        self.max
    }
}

/// The samples of a column within one sketch bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    key: u16,
    n: u64,
    min: i64,
    max: i64,
}

fn add_to_sketch(sketch: &mut Vec<Bucket>, b: Bucket) {
    match sketch.binary_search_by_key(&b.key, |e| e.key) {
        Ok(i) => {
            let e = &mut sketch[i];
            e.n += b.n;
            e.min = e.min.min(b.min);
            e.max = e.max.max(b.max);
        }
        Err(i) => sketch.insert(i, b),
    }
}

/// What a time series figure draws of one pixel column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ColumnSummary {
    /// Mean x of the column's samples (raw x: ns or sequence number); for
    /// a column with only lost probes, the first lost one's.
    pub(crate) x: i64,
    pub n: u64,
    pub(crate) min: i64,
    pub(crate) p50: i64,
    pub(crate) p99: i64,
    pub(crate) max: i64,
    pub(crate) lost: u64,
    /// x of the first lost probe in the column (if any).
    pub(crate) lost_x: i64,
}

/// A time series decimated while it streams in: the x range is cut into at
/// most `columns` equal columns whose width is a power of two (in x
/// units); when a sample falls outside, the width doubles and neighbouring
/// columns merge, so memory stays at `columns` columns however long the
/// run and however its x values arrive. Spikes survive (each column keeps
/// its min and max), lost probes stay visible (each column counts them).
#[derive(Debug, Clone)]
pub struct TimeGrid {
    columns: usize,
    /// x of column 0's left edge; a multiple of the width.
    base: i128,
    /// log2 of the column width.
    shift: u32,
    cols: Vec<Col>,
    started: bool,
}

impl TimeGrid {
    pub(crate) fn new(columns: usize) -> TimeGrid {
        TimeGrid {
            columns: columns.max(2),
            base: 0,
            shift: 0,
            cols: Vec::new(),
            started: false,
        }
    }

    /// The column for x, regridding when x falls outside.
    fn slot(&mut self, x: i64) -> &mut Col {
        let x = x as i128;
        if !self.started {
            self.started = true;
            self.base = x;
            self.cols = vec![Col::default(); self.columns];
        }
        let mut k = (x - self.base) >> self.shift;
        if k < 0 || k >= self.columns as i128 {
            self.regrid(x);
            k = (x - self.base) >> self.shift;
        }
        &mut self.cols[k as usize]
    }

    /// Slides the columns, or doubles their width until the occupied
    /// columns and `x` fit, merging columns that fall together.
    fn regrid(&mut self, x: i128) {
        let used = |c: &Col| c.n > 0 || c.lost > 0;
        let first = self.cols.iter().position(used);
        let last = self.cols.iter().rposition(used);
        let w = 1i128 << self.shift;
        let (mut lo, mut hi) = (x, x);
        if let (Some(f), Some(l)) = (first, last) {
            lo = lo.min(self.base + f as i128 * w);
            hi = hi.max(self.base + (l as i128 + 1) * w - 1);
        }
        // The same width if the columns only need to slide (an x before
        // the first one), else doubled until everything fits.
        let mut shift = self.shift;
        let new_base = loop {
            let base = lo.div_euclid(1i128 << shift) * (1i128 << shift);
            if hi < base + ((self.columns as i128) << shift) {
                break base;
            }
            shift += 1;
        };
        let old = std::mem::replace(&mut self.cols, vec![Col::default(); self.columns]);
        for (i, c) in old.into_iter().enumerate() {
            if used(&c) {
                let left = self.base + i as i128 * w;
                let k = ((left - new_base) >> shift) as usize;
                self.cols[k].merge(c);
            }
        }
        self.base = new_base;
        self.shift = shift;
    }

    /// One latency sample at `x`.
    pub(crate) fn record(&mut self, x: i64, v: i64) {
        self.record_n(x, v, 1);
    }

    /// `count` samples at `v` and `x` (an HDR log interval's bucket).
    pub(crate) fn record_n(&mut self, x: i64, v: i64, count: u64) {
        if count == 0 {
            return;
        }
        let c = self.slot(x);
        if c.n == 0 {
            c.min = v;
            c.max = v;
        } else {
            c.min = c.min.min(v);
            c.max = c.max.max(v);
        }
        c.n += count;
        c.x_sum += x as i128 * count as i128;
        add_to_sketch(
            &mut c.sketch,
            Bucket {
                key: sketch_key(v),
                n: count,
                min: v,
                max: v,
            },
        );
    }

    /// A lost probe at `x`.
    pub(crate) fn record_lost(&mut self, x: i64) {
        let c = self.slot(x);
        if c.lost == 0 {
            c.lost_x = x;
        }
        c.lost += 1;
    }

    /// The non-empty columns, in x order.
    pub fn finish(&self) -> Vec<ColumnSummary> {
        self.cols
            .iter()
            .filter(|c| c.n > 0 || c.lost > 0)
            .map(|c| ColumnSummary {
                x: if c.n > 0 {
                    (c.x_sum / c.n as i128) as i64
                } else {
                    c.lost_x
                },
                n: c.n,
                min: c.min,
                p50: if c.n > 0 { c.percentile(0.5) } else { 0 },
                p99: if c.n > 0 { c.percentile(0.99) } else { 0 },
                max: c.max,
                lost: c.lost,
                lost_x: c.lost_x,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::plot::stats;

    #[test]
    fn small_runs_stay_exact() {
        let mut d = Dist::new(10);
        for v in [5, -3, 7, 7, 0] {
            d.record(v);
        }
        assert!(d.is_exact());
        let s = d.finish();
        assert_eq!(s, Sorted::from_sorted(&[-3, 0, 5, 7, 7]));
    }

    #[test]
    fn histogram_beyond_the_limit_within_its_precision() {
        // 0..200_000 ns uniform plus a far tail and negative values: the
        // histogram's quartiles and extremes against the exact ones.
        let mut exact = Dist::new(usize::MAX);
        let mut hist = Dist::new(1000);
        let mut all = Vec::new();
        for i in 0..200_000i64 {
            let v = (i * 7919) % 200_000 - 1000;
            let v = if i % 10_000 == 0 { 50_000_000 + i } else { v };
            exact.record(v);
            hist.record(v);
            all.push(v);
        }
        assert!(!hist.is_exact() && exact.is_exact());
        assert_eq!(hist.n(), 200_000);
        let (e, h) = (exact.finish(), hist.finish());
        assert_eq!(h.len(), e.len());
        assert_eq!((h.min(), h.max()), (e.min(), e.max()), "extremes exact");
        assert!(h.distinct() < 10_000, "{} buckets", h.distinct());
        for p in [0.01, 0.25, 0.5, 0.75, 0.99, 0.9999] {
            let (a, b) = (e.quantile(p).unwrap(), h.quantile(p).unwrap());
            // 3 significant digits: within 0.1 % (plus 1 ns of rounding).
            assert!((a - b).abs() <= a.abs() * 1e-3 + 1.0, "p {p}: {a} vs {b}");
        }
        let (be, bh) = (
            stats::box_stats_of(&e).unwrap(),
            stats::box_stats_of(&h).unwrap(),
        );
        assert_eq!(be.outlier_count(), bh.outlier_count());
        assert_eq!(bh.outlier_count(), 20);
        assert!((be.median - bh.median).abs() <= be.median * 1e-3 + 1.0);
    }

    #[test]
    fn extreme_values_survive_the_histogram() {
        let mut d = Dist::new(0);
        for v in [i64::MIN, -1, 0, 1, i64::MAX] {
            d.record(v);
        }
        d.record_n(42, 3);
        let s = d.finish();
        assert_eq!(s.len(), 8);
        assert_eq!((s.min(), s.max()), (Some(i64::MIN), Some(i64::MAX)));
        assert_eq!(s.at(2), 0);
        assert!((s.at(4) - 42).abs() <= 1);
    }

    #[test]
    fn sketch_keys_are_ordered_and_values_close() {
        let vals = [
            i64::MIN,
            -1_000_000,
            -33,
            -1,
            0,
            1,
            31,
            32,
            33,
            1000,
            45_678,
            1_000_000_007,
            i64::MAX,
        ];
        for w in vals.windows(2) {
            assert!(sketch_key(w[0]) <= sketch_key(w[1]), "{w:?}");
        }
        for &v in &vals[1..vals.len() - 1] {
            let r = sketch_value(sketch_key(v));
            assert!(
                (r - v).abs() as f64 <= v.abs() as f64 / 32.0 + 1.0,
                "{v} -> {r}"
            );
        }
    }

    #[test]
    fn grid_keeps_spikes_losses_and_its_size() {
        let mut g = TimeGrid::new(100);
        let n = 1_000_000i64;
        for i in 0..n {
            let x = 1_700_000_000_000_000_000 + i * 1_000_000;
            if i % 100_000 == 5 {
                g.record_lost(x);
                continue;
            }
            let v = if i == 123_456 {
                9_000_000
            } else {
                50_000 + i % 10
            };
            g.record(x, v);
        }
        let cols = g.finish();
        assert!(
            cols.len() <= 100 && cols.len() >= 50,
            "{} columns",
            cols.len()
        );
        assert_eq!(cols.iter().map(|c| c.n).sum::<u64>(), n as u64 - 10);
        assert_eq!(cols.iter().map(|c| c.lost).sum::<u64>(), 10);
        assert_eq!(cols.iter().map(|c| c.max).max(), Some(9_000_000));
        assert_eq!(cols.iter().map(|c| c.min).min(), Some(50_000));
        assert!(cols.windows(2).all(|w| w[0].x < w[1].x), "x order");
        for c in &cols {
            assert!(c.min <= c.p50 && c.p50 <= c.p99 && c.p99 <= c.max);
            // Ten values share a sketch bucket: placed by rank in it.
            assert!((c.p50 - 50_004).abs() <= 1, "{c:?}");
        }
    }

    #[test]
    fn grid_takes_x_in_any_order_and_extreme_x() {
        let mut g = TimeGrid::new(4);
        for (x, v) in [(100, 1), (-5, 2), (i64::MAX, 3), (i64::MIN, 4), (50, 5)] {
            g.record(x, v);
        }
        g.record_lost(0);
        let cols = g.finish();
        assert!(cols.len() <= 4);
        assert_eq!(cols.iter().map(|c| c.n).sum::<u64>(), 5);
        // The first column holds i64::MIN's sample, the last i64::MAX's.
        let (first, last) = (cols[0], cols[cols.len() - 1]);
        assert!(first.min <= 4 && 4 <= first.max, "{first:?}");
        assert!(last.min <= 3 && 3 <= last.max, "{last:?}");
        // A short series comes back whole, one column per sample.
        let mut g = TimeGrid::new(64);
        for (x, v) in [(3, 30), (1, 10), (2, 20)] {
            g.record(x, v);
        }
        let cols: Vec<(i64, i64)> = g.finish().iter().map(|c| (c.x, c.p50)).collect();
        assert_eq!(cols, [(1, 10), (2, 20), (3, 30)]);
    }
}
