//! A sparse HDR histogram: the buckets of an `hdrhistogram` histogram of
//! 1 ns .. 100 s (3 significant digits, or 2), keeping only the buckets
//! that hold a count.
//!
//! A dense histogram at 3 digits is 24 KiB empty and 90–230 KiB once it
//! holds µs–ms latencies (a u64 for every bucket up to the largest value);
//! a target keeps 14 of them, which made 1000 targets cost about 1 GiB as
//! the pages filled. A probe stream's values fall into a few hundred to a
//! few thousand buckets, at 8 bytes each here. The figures are the same:
//! min, max, mean and quantiles follow `hdrhistogram`'s definitions over
//! the same buckets (the tests hold them against it), in one pass over
//! the buckets held instead of one over every bucket per quantile.

use hdrhistogram::Histogram;

/// An entry is the bucket's index in the top 16 bits (a value up to
/// 100 s has an index below 28 672 at 3 digits, 3 968 at 2) and its count
/// in the low 48.
const COUNT_BITS: u32 = 48;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// Counts per bucket, sorted by bucket; values above [`Hist::MAX_NS`] are
/// left out. The buckets are `hdrhistogram`'s with a 1 ns unit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hist {
    entries: Vec<u64>,
    /// log2 of half the sub-buckets: 10 for 3 significant digits
    /// (0.1 %), 7 for 2 (1 %).
    half_magnitude: u32,
}

impl Default for Hist {
    fn default() -> Self {
        Self::new()
    }
}

impl Hist {
    /// Largest value recorded: what a dense histogram bounded at 100 s
    /// would refuse is left out.
    pub const MAX_NS: u64 = 100_000_000_000;

    /// 3 significant digits (0.1 % resolution), as a single target's.
    pub fn new() -> Self {
        Self::with_digits(3)
    }

    /// `digits` significant digits: 2 or 3.
    pub fn with_digits(digits: u8) -> Self {
        Self {
            entries: Vec::new(),
            half_magnitude: if digits <= 2 { 7 } else { 10 },
        }
    }

    /// Significant digits kept.
    pub fn digits(&self) -> u8 {
        if self.half_magnitude == 7 { 2 } else { 3 }
    }

    /// The index `hdrhistogram` gives `v`.
    fn index_of(&self, v: u64) -> u64 {
        let h = self.half_magnitude;
        let mask = (2u64 << h) - 1;
        let bucket = (64 - (h + 1)) - (v | mask).leading_zeros();
        let sub_bucket = v >> bucket;
        ((u64::from(bucket) + 1) << h) + sub_bucket - (1 << h)
    }

    /// The lowest value of bucket `index` and the bucket's width.
    fn range_of(&self, index: u64) -> (u64, u64) {
        let h = self.half_magnitude;
        let bucket = (index >> h) as i64 - 1;
        let sub_bucket = (index & ((1 << h) - 1)) + (1 << h);
        if bucket < 0 {
            (sub_bucket - (1 << h), 1)
        } else {
            (sub_bucket << bucket, 1 << bucket)
        }
    }

    pub fn record(&mut self, v: u64) {
        if v <= Self::MAX_NS {
            self.record_n(self.index_of(v), 1);
        }
    }

    fn record_n(&mut self, index: u64, n: u64) {
        match self
            .entries
            .binary_search_by_key(&index, |e| e >> COUNT_BITS)
        {
            Ok(i) => {
                let e = &mut self.entries[i];
                let count = ((*e & COUNT_MASK) + n).min(COUNT_MASK);
                *e = (*e & !COUNT_MASK) | count;
            }
            Err(i) => {
                // New buckets get rare as a run goes on: grow by an eighth,
                // not by doubling, so that capacity stays close to use.
                if self.entries.len() == self.entries.capacity() {
                    self.entries.reserve_exact(self.entries.len() / 8 + 8);
                }
                self.entries
                    .insert(i, index << COUNT_BITS | n.min(COUNT_MASK));
            }
        }
    }

    /// (bucket's lowest value, its width, count), lowest bucket first.
    fn buckets_iter(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.entries.iter().map(|e| {
            let (low, width) = self.range_of(e >> COUNT_BITS);
            (low, width, e & COUNT_MASK)
        })
    }

    /// Values recorded.
    pub fn len(&self) -> u64 {
        self.entries.iter().map(|e| e & COUNT_MASK).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Buckets that hold a count (8 bytes each).
    pub fn buckets(&self) -> usize {
        self.entries.len()
    }

    /// Bytes held on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<u64>()
    }

    /// The lowest value recorded, as `hdrhistogram::Histogram::min` says it.
    pub fn min(&self) -> u64 {
        self.buckets_iter().next().map_or(0, |(low, _, _)| low)
    }

    /// The highest, as `hdrhistogram::Histogram::max` says it.
    pub fn max(&self) -> u64 {
        self.buckets_iter()
            .last()
            .map_or(0, |(low, width, _)| low + width - 1)
    }

    /// The mean, as `hdrhistogram::Histogram::mean` computes it (each
    /// bucket at its middle, summed in the same order).
    pub fn mean(&self) -> f64 {
        let total = self.len();
        if total == 0 {
            return 0.0;
        }
        self.buckets_iter().fold(0.0, |sum, (low, width, n)| {
            sum + (low + (width >> 1)) as f64 * n as f64 / total as f64
        })
    }

    /// The values at `quantiles` (ascending, each in 0 ..= 1), as
    /// `hdrhistogram::Histogram::value_at_quantile` gives them, in one pass.
    pub fn quantiles<const N: usize>(&self, quantiles: [f64; N]) -> [u64; N] {
        let total = self.len();
        let mut out = [0; N];
        let mut it = self.buckets_iter();
        let (mut seen, mut at) = (0u64, (0, 1));
        for (q, slot) in quantiles.into_iter().zip(&mut out) {
            let want = ((q.min(1.0) * total as f64).ceil() as u64).max(1);
            while seen < want {
                let Some((low, width, n)) = it.next() else {
                    return out;
                };
                seen += n;
                at = (low, width);
            }
            *slot = if q == 0.0 { at.0 } else { at.0 + at.1 - 1 };
        }
        out
    }

    /// Adds `o`'s counts to these. With different precisions the sum
    /// keeps the coarser one (a fine bucket lies inside one coarse bucket,
    /// so that is exact).
    pub fn add(&mut self, o: &Hist) {
        if o.entries.is_empty() {
            return;
        }
        if self.half_magnitude > o.half_magnitude {
            *self = self.coarsened(o.half_magnitude);
        }
        if self.half_magnitude != o.half_magnitude {
            let o = o.coarsened(self.half_magnitude);
            self.add(&o);
            return;
        }
        let mut out = Vec::with_capacity(self.entries.len() + o.entries.len());
        let (mut a, mut b) = (self.entries.iter().peekable(), o.entries.iter().peekable());
        loop {
            let next = match (a.peek(), b.peek()) {
                (Some(&&x), Some(&&y)) if x >> COUNT_BITS == y >> COUNT_BITS => {
                    a.next();
                    b.next();
                    let count = ((x & COUNT_MASK) + (y & COUNT_MASK)).min(COUNT_MASK);
                    (x & !COUNT_MASK) | count
                }
                (Some(&&x), Some(&&y)) if x < y => *a.next().expect("peeked"),
                (_, Some(_)) => *b.next().expect("peeked"),
                (Some(_), None) => *a.next().expect("peeked"),
                (None, None) => break,
            };
            out.push(next);
        }
        out.shrink_to_fit();
        self.entries = out;
    }

    fn coarsened(&self, half_magnitude: u32) -> Hist {
        let mut h = Hist {
            entries: Vec::new(),
            half_magnitude,
        };
        for (low, _, n) in self.buckets_iter() {
            h.record_n(h.index_of(low), n);
        }
        h
    }

    /// A dense `hdrhistogram` copy (1 ns unit, the same significant
    /// digits, sized to the largest value held) with the same counts.
    pub fn to_hdr(&self) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, self.max().max(2048), self.digits())
            .expect("bounds within 1 ns .. 100 s are valid");
        for (low, _, n) in self.buckets_iter() {
            // The bucket's lowest value falls in the same bucket there.
            let _ = h.record_n(low, n);
        }
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(digits: u8) -> Histogram<u64> {
        Histogram::new_with_bounds(1, Hist::MAX_NS, digits).unwrap()
    }

    #[test]
    fn buckets_are_hdrhistograms() {
        for digits in [2, 3] {
            let (h, s) = (dense(digits), Hist::with_digits(digits));
            let mut v = 0u64;
            while v <= Hist::MAX_NS {
                let i = s.index_of(v);
                assert!(i < 1 << 16, "{v}");
                let (low, width) = s.range_of(i);
                assert_eq!(low, h.lowest_equivalent(v), "{digits}: {v}");
                assert_eq!(low + width - 1, h.highest_equivalent(v), "{digits}: {v}");
                v += if v < 5000 { 1 } else { v / 997 + 1 };
            }
        }
    }

    /// Latencies from 1 ns to 100 s, with repeats.
    fn values(n: usize) -> impl Iterator<Item = u64> {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        (0..n).map(move |_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1_000_000) * 10u64.pow((x >> 60) as u32 % 6) + (x >> 40) % 3
        })
    }

    fn assert_same_figures(s: &Hist, d: &Histogram<u64>) {
        assert_eq!(s.len(), d.len());
        assert_eq!((s.min(), s.max()), (d.min(), d.max()));
        assert_eq!(s.mean(), d.mean());
        let qs = [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0];
        assert_eq!(s.quantiles(qs), qs.map(|q| d.value_at_quantile(q)));
        let h = s.to_hdr();
        assert_eq!((h.len(), h.min(), h.max()), (d.len(), d.min(), d.max()));
        assert_eq!(
            qs.map(|q| h.value_at_quantile(q)),
            qs.map(|q| d.value_at_quantile(q))
        );
    }

    #[test]
    fn figures_are_a_dense_histograms() {
        for digits in [2, 3] {
            let (mut s, mut d) = (Hist::with_digits(digits), dense(digits));
            for v in values(20_000) {
                s.record(v);
                if v <= Hist::MAX_NS {
                    d.record(v).unwrap();
                }
            }
            s.record(Hist::MAX_NS + 1);
            assert_same_figures(&s, &d);
            assert!(s.buckets() < 28_672);
        }
        let one = {
            let mut s = Hist::new();
            s.record(7);
            s
        };
        assert_eq!(one.quantiles([0.0, 0.5, 1.0]), [7, 7, 7]);
        assert_eq!(Hist::new().quantiles([0.5]), [0]);
    }

    #[test]
    fn add_sums_bucket_by_bucket() {
        let (mut a, mut b, mut d) = (Hist::new(), Hist::new(), dense(3));
        for v in [1, 5, 100, 100, 3000, 1_000_000] {
            a.record(v);
            d.record(v).unwrap();
        }
        for v in [0, 5, 2999, 3001, 50_000_000] {
            b.record(v);
            d.record(v).unwrap();
        }
        a.add(&b);
        a.add(&Hist::new());
        assert_same_figures(&a, &d);
        assert!(a.entries.windows(2).all(|w| w[0] >> 48 < w[1] >> 48));
    }

    #[test]
    fn a_sum_of_precisions_keeps_the_coarser() {
        let (mut fine, mut coarse, mut d) = (Hist::new(), Hist::with_digits(2), dense(2));
        for (i, v) in values(5000).enumerate() {
            let v = v.min(Hist::MAX_NS);
            if i % 2 == 0 {
                fine.record(v)
            } else {
                coarse.record(v)
            }
            d.record(v).unwrap();
        }
        let mut total = Hist::new();
        total.add(&fine);
        total.add(&coarse);
        assert_eq!(total.digits(), 2);
        assert_same_figures(&total, &d);
    }
}
