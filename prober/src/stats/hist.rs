//! The latency histograms of a run: the buckets of an `hdrhistogram`
//! histogram (1 ns unit), in one of two layouts, and what they did not bin.
//!
//! - **Sparse** ([`Hist::new`], a single target or the testbed): 3
//!   significant digits over 1 ns .. 100 s, keeping only the buckets that
//!   hold a count (8 bytes each). A dense histogram at 3 digits is 24 KiB
//!   empty and 90–230 KiB once it holds µs–ms latencies; a probe stream's
//!   values fall into a few hundred to a few thousand buckets. It grows by
//!   a bucket for each new value, so its memory follows the spread of the
//!   values: right for one stream, not for a fleet.
//! - **Fixed** ([`Hist::fixed`], a target among several): every bucket of
//!   1 ns .. [`Hist::FIXED_CAP_NS`] (1.07 s, above the default 1 s probe
//!   timeout) at 64 buckets per doubling (at most 1.6 % wide), a `u32`
//!   count each, allocated and committed when the histogram is made:
//!   [`Hist::FIXED_BYTES`] (6.25 KiB) whatever it records, for the whole
//!   run. 1000 targets' 14 histograms take 85 MiB from the first probe on
//!   and never more.
//!
//! Values above a histogram's cap are not binned: they are counted with
//! their exact sum, least and greatest value ([`Unbinned`]), so the count,
//! mean, min and max stay exact and a percentile that falls among them is
//! reported as unknown, above the cap, rather than as a wrong number. A
//! fixed bucket counts up to 2^32 − 1 values (12 h of one target at 100 k
//! probes/s, all in one bucket); values into a full bucket are counted in
//! the total but not binned, and said.
//!
//! The figures follow `hdrhistogram`'s definitions over the same buckets
//! (the tests hold them against it): min, max and mean at the buckets'
//! bounds and middles, quantiles at the upper bound of the bucket that
//! holds them, in one pass over the buckets held.

#[cfg(test)]
use hdrhistogram::Histogram;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An entry of a sparse histogram is the bucket's index in the top 16
/// bits (a value up to 100 s has an index below 28 672 at 3 digits) and
/// its count in the low 48.
const COUNT_BITS: u32 = 48;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// log2 of half the sub-buckets per bucket of a fixed histogram: 64
/// buckets per doubling.
const FIXED_HALF_MAGNITUDE: u32 = 6;

/// Where the counts live.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Store {
    /// Sorted entries of the buckets that hold a count (see [`COUNT_BITS`]).
    Sparse(Vec<u64>),
    /// One count per bucket from index 0 to the cap's, allocated once.
    Fixed(Box<[u32]>),
}

/// The values a histogram did not bin.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Outside {
    /// Above the cap: how many, their sum, least and greatest.
    above: u64,
    above_sum_ns: f64,
    above_min_ns: u64,
    above_max_ns: u64,
    /// Into a fixed bucket already holding `u32::MAX`.
    bucket_full: u64,
}

impl Outside {
    fn add_above(&mut self, n: u64, sum_ns: f64, min_ns: u64, max_ns: u64) {
        if n == 0 {
            return;
        }
        self.above_min_ns = if self.above == 0 {
            min_ns
        } else {
            self.above_min_ns.min(min_ns)
        };
        self.above_max_ns = self.above_max_ns.max(max_ns);
        self.above += n;
        self.above_sum_ns += sum_ns;
    }

    fn add(&mut self, o: &Outside) {
        self.add_above(o.above, o.above_sum_ns, o.above_min_ns, o.above_max_ns);
        self.bucket_full += o.bucket_full;
    }
}

/// What a histogram did not bin, as the summary says it (the JSON's
/// `unbinned` of a latency; absent when every value was binned).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub(crate) struct Unbinned {
    /// The highest value the histogram bins, ns.
    pub(crate) cap_ns: u64,
    /// Values above `cap_ns`. They are in `count`, `mean` and `max`; a
    /// percentile that falls among them is null (above the cap, the text
    /// shows "> cap").
    pub(crate) above_cap: u64,
    /// Values that fell into a bucket already holding 2^32 − 1 values:
    /// in `count`, not in the percentiles.
    pub(crate) bucket_full: u64,
}

/// Counts per bucket; values above the cap counted beside them. The
/// buckets are `hdrhistogram`'s with a 1 ns unit.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Hist {
    store: Store,
    /// log2 of half the sub-buckets: 10 for 3 significant digits
    /// (0.1 %), 7 for 2 (1 %), 6 for a fixed histogram (1.6 %).
    half_magnitude: u32,
    /// The highest value binned.
    cap_ns: u64,
    outside: Outside,
}

impl Default for Hist {
    fn default() -> Self {
        Self::new()
    }
}

impl Hist {
    /// The highest value a sparse histogram bins: what a dense one bounded
    /// at 100 s would hold.
    pub(crate) const MAX_NS: u64 = 100_000_000_000;

    /// The highest value a fixed histogram bins: 2^30 − 1 ns (1.07 s),
    /// above the default probe timeout of 1 s.
    pub(crate) const FIXED_CAP_NS: u64 = (1 << 30) - 1;

    /// Buckets of a fixed histogram (1 ns .. 1.07 s at 64 per doubling).
    pub(crate) const FIXED_BUCKETS: usize = 1600;

    /// Heap bytes of a fixed histogram.
    #[cfg(test)]
    pub(crate) const FIXED_BYTES: usize = Self::FIXED_BUCKETS * std::mem::size_of::<u32>();

    /// Sparse, 3 significant digits (0.1 % resolution), as a single target's.
    pub(crate) fn new() -> Self {
        Self::with_digits(3)
    }

    /// Sparse, `digits` significant digits: 2 or 3.
    pub(crate) fn with_digits(digits: u8) -> Self {
        Self::sparse(if digits <= 2 { 7 } else { 10 }, Self::MAX_NS)
    }

    fn sparse(half_magnitude: u32, cap_ns: u64) -> Self {
        Self {
            store: Store::Sparse(Vec::new()),
            half_magnitude,
            cap_ns,
            outside: Outside::default(),
        }
    }

    /// A fixed histogram: every bucket of 1 ns .. [`Self::FIXED_CAP_NS`],
    /// allocated and its pages touched now, so that recording never
    /// allocates and the process's memory is what it will stay.
    pub(crate) fn fixed() -> Self {
        let mut counts = vec![0u32; Self::FIXED_BUCKETS].into_boxed_slice();
        // Zeroed memory fresh from the kernel is not resident until it is
        // written; write one count per page so it is now, not when the
        // tails first reach it.
        let per_page = 4096 / std::mem::size_of::<u32>();
        for i in (0..counts.len())
            .step_by(per_page)
            .chain([counts.len() - 1])
        {
            // SAFETY: i is within the slice; a volatile write of the value
            // already there is not optimised away.
            unsafe { std::ptr::write_volatile(&mut counts[i], 0) };
        }
        let h = Self {
            store: Store::Fixed(counts),
            half_magnitude: FIXED_HALF_MAGNITUDE,
            cap_ns: Self::FIXED_CAP_NS,
            outside: Outside::default(),
        };
        debug_assert_eq!(
            h.index_of(Self::FIXED_CAP_NS) as usize + 1,
            Self::FIXED_BUCKETS
        );
        h
    }

    /// Significant digits kept, as `hdrhistogram` counts them (a fixed
    /// histogram's 64 buckets per doubling lie between 1 and 2).
    #[cfg(test)]
    pub(crate) fn digits(&self) -> u8 {
        match self.half_magnitude {
            10 => 3,
            _ => 2,
        }
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

    pub(crate) fn record(&mut self, v: u64) {
        if v > self.cap_ns {
            self.outside.add_above(1, v as f64, v, v);
        } else {
            self.record_n(self.index_of(v), 1);
        }
    }

    fn record_n(&mut self, index: u64, n: u64) {
        match &mut self.store {
            Store::Fixed(counts) => {
                let c = &mut counts[index as usize];
                let room = u64::from(u32::MAX - *c);
                *c += n.min(room) as u32;
                self.outside.bucket_full += n.saturating_sub(room);
            }
            Store::Sparse(entries) => sparse_record(entries, index, n),
        }
    }

    /// (bucket's lowest value, its width, count) of the buckets that hold
    /// a count, lowest first.
    fn buckets_iter(&self) -> Box<dyn Iterator<Item = (u64, u64, u64)> + '_> {
        match &self.store {
            Store::Sparse(entries) => Box::new(entries.iter().map(|e| {
                let (low, width) = self.range_of(e >> COUNT_BITS);
                (low, width, e & COUNT_MASK)
            })),
            Store::Fixed(counts) => Box::new(
                counts
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| **c > 0)
                    .map(|(i, &c)| {
                        let (low, width) = self.range_of(i as u64);
                        (low, width, u64::from(c))
                    }),
            ),
        }
    }

    /// Values binned.
    fn binned(&self) -> u64 {
        match &self.store {
            Store::Sparse(entries) => entries.iter().map(|e| e & COUNT_MASK).sum(),
            Store::Fixed(counts) => counts.iter().map(|&c| u64::from(c)).sum(),
        }
    }

    /// Values recorded, binned or not.
    pub(crate) fn len(&self) -> u64 {
        self.binned() + self.outside.above + self.outside.bucket_full
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Buckets that hold a count.
    #[cfg(test)]
    pub(crate) fn buckets(&self) -> usize {
        self.buckets_iter().count()
    }

    /// Bytes held on the heap.
    pub(crate) fn heap_bytes(&self) -> usize {
        match &self.store {
            Store::Sparse(entries) => entries.capacity() * std::mem::size_of::<u64>(),
            Store::Fixed(counts) => std::mem::size_of_val(&**counts),
        }
    }

    /// The highest value binned.
    #[cfg(test)]
    pub(crate) fn cap_ns(&self) -> u64 {
        self.cap_ns
    }

    /// What was not binned; None when every value was.
    pub(crate) fn unbinned(&self) -> Option<Unbinned> {
        let o = &self.outside;
        (o.above + o.bucket_full > 0).then_some(Unbinned {
            cap_ns: self.cap_ns,
            above_cap: o.above,
            bucket_full: o.bucket_full,
        })
    }

    /// The lowest value recorded, as `hdrhistogram::Histogram::min` says
    /// it (exact when only values above the cap were recorded).
    pub(crate) fn min(&self) -> u64 {
        match self.buckets_iter().next() {
            Some((low, _, _)) => low,
            None => self.outside.above_min_ns,
        }
    }

    /// The highest, as `hdrhistogram::Histogram::max` says it (exact when
    /// a value above the cap was recorded).
    pub(crate) fn max(&self) -> u64 {
        if self.outside.above > 0 {
            return self.outside.above_max_ns;
        }
        self.buckets_iter()
            .last()
            .map_or(0, |(low, width, _)| low + width - 1)
    }

    /// The mean, as `hdrhistogram::Histogram::mean` computes it (each
    /// bucket at its middle, summed in the same order), with the values
    /// above the cap at their exact sum.
    pub(crate) fn mean(&self) -> f64 {
        let total = self.binned() + self.outside.above;
        if total == 0 {
            return 0.0;
        }
        let binned = self.buckets_iter().fold(0.0, |sum, (low, width, n)| {
            sum + (low + (width >> 1)) as f64 * n as f64 / total as f64
        });
        binned + self.outside.above_sum_ns / total as f64
    }

    /// The values at `quantiles` (ascending, each in 0 ..= 1), as
    /// `hdrhistogram::Histogram::value_at_quantile` gives them, in one
    /// pass; None for one that falls above the cap (and for all of them
    /// when nothing was recorded).
    pub(crate) fn quantiles<const N: usize>(&self, quantiles: [f64; N]) -> [Option<u64>; N] {
        let total = self.binned() + self.outside.above;
        let mut out = [None; N];
        if total == 0 {
            return out;
        }
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
            *slot = Some(if q == 0.0 { at.0 } else { at.0 + at.1 - 1 });
        }
        out
    }

    /// Adds `o`'s counts to these. The sum keeps the coarser precision
    /// and the lower cap (a fine bucket lies inside one coarse bucket, and
    /// caps are powers of two less one or above every cap of the other
    /// layout, so that is exact); buckets above the new cap move to the
    /// values not binned at their middles. A fixed histogram of the same
    /// layout adds in place; anything else gives a sparse sum.
    pub(crate) fn add(&mut self, o: &Hist) {
        let half_magnitude = self.half_magnitude.min(o.half_magnitude);
        let cap_ns = self.cap_ns.min(o.cap_ns);
        let in_place = matches!(self.store, Store::Fixed(_))
            && (self.half_magnitude, self.cap_ns) == (half_magnitude, cap_ns);
        if in_place {
            self.outside.add(&o.outside);
            for (low, width, n) in o.buckets_iter() {
                self.add_bucket(low, width, n);
            }
            return;
        }
        let mut sum = Hist::sparse(half_magnitude, cap_ns);
        sum.outside = self.outside;
        sum.outside.add(&o.outside);
        for (low, width, n) in self.buckets_iter().chain(o.buckets_iter()) {
            sum.add_bucket(low, width, n);
        }
        if let Store::Sparse(e) = &mut sum.store {
            e.shrink_to_fit();
        }
        *self = sum;
    }

    /// Adds `n` values of the bucket [low, low + width): into the bucket
    /// holding `low`, or above the cap.
    fn add_bucket(&mut self, low: u64, width: u64, n: u64) {
        if low > self.cap_ns {
            let mid = (low + (width >> 1)) as f64;
            self.outside
                .add_above(n, mid * n as f64, low, low + width - 1);
        } else {
            self.record_n(self.index_of(low), n);
        }
    }

    /// A dense `hdrhistogram` copy (1 ns unit, [`Self::digits`] significant
    /// digits, sized to the largest value binned) with the same counts;
    /// the values not binned are left out.
    #[cfg(test)]
    pub(crate) fn to_hdr(&self) -> Histogram<u64> {
        let highest = self
            .buckets_iter()
            .last()
            .map_or(0, |(low, width, _)| low + width - 1);
        let mut h = Histogram::new_with_bounds(1, highest.max(2048), self.digits())
            .expect("bounds within 1 ns .. 100 s are valid");
        for (low, _, n) in self.buckets_iter() {
            // The bucket's lowest value falls in a bucket of the same or
            // finer precision there.
            let _ = h.record_n(low, n);
        }
        h
    }
}

/// Adds `n` to the sparse entry of bucket `index`, inserting it in order.
fn sparse_record(entries: &mut Vec<u64>, index: u64, n: u64) {
    match entries.binary_search_by_key(&index, |e| e >> COUNT_BITS) {
        Ok(i) => {
            let e = &mut entries[i];
            let count = ((*e & COUNT_MASK) + n).min(COUNT_MASK);
            *e = (*e & !COUNT_MASK) | count;
        }
        Err(i) => {
            // New buckets get rare as a run goes on: grow by an eighth,
            // not by doubling, so that capacity stays close to use.
            if entries.len() == entries.capacity() {
                entries.reserve_exact(entries.len() / 8 + 8);
            }
            entries.insert(i, index << COUNT_BITS | n.min(COUNT_MASK));
        }
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
        assert_eq!(s.quantiles(qs), qs.map(|q| Some(d.value_at_quantile(q))));
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
                s.record(v.min(Hist::MAX_NS));
                d.record(v.min(Hist::MAX_NS)).unwrap();
            }
            assert_same_figures(&s, &d);
            assert!(s.buckets() < 28_672);
            assert_eq!(s.unbinned(), None);
        }
        let one = {
            let mut s = Hist::new();
            s.record(7);
            s
        };
        assert_eq!(one.quantiles([0.0, 0.5, 1.0]), [Some(7); 3]);
        assert_eq!(Hist::new().quantiles([0.5]), [None]);
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
        let Store::Sparse(e) = &a.store else {
            panic!("a sum of sparse histograms is sparse")
        };
        assert!(e.windows(2).all(|w| w[0] >> 48 < w[1] >> 48));
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

    /// The fixed layout's buckets are hdrhistogram's index formula at 64
    /// sub-buckets per doubling: contiguous, each at most 1/64 of its
    /// lowest value wide, the last ending at the cap.
    #[test]
    fn fixed_buckets_tile_the_range_at_1_6_percent() {
        let h = Hist::fixed();
        let mut next = 0;
        for i in 0..Hist::FIXED_BUCKETS as u64 {
            let (low, width) = h.range_of(i);
            assert_eq!(low, next, "bucket {i}");
            assert!(
                width == 1 || width * 64 <= low,
                "bucket {i}: {low} + {width}"
            );
            assert_eq!(h.index_of(low), i);
            assert_eq!(h.index_of(low + width - 1), i);
            next = low + width;
        }
        assert_eq!(next - 1, Hist::FIXED_CAP_NS);
    }

    /// The mechanism of a fleet's flat memory: a fixed histogram holds the
    /// same allocation whatever it records, values above the cap are
    /// counted beside the buckets (exact count, mean and max; percentiles
    /// among them unknown), and a full bucket overflows into a count.
    #[test]
    fn a_fixed_histogram_never_allocates_and_counts_what_it_cannot_bin() {
        let mut h = Hist::fixed();
        let Store::Fixed(c) = &h.store else {
            panic!("fixed")
        };
        let (ptr, bytes) = (c.as_ptr(), h.heap_bytes());
        assert_eq!(bytes, Hist::FIXED_BYTES);
        let mut above = 0;
        let extremes = [
            0,
            1,
            63,
            64,
            1_000,
            Hist::FIXED_CAP_NS,
            Hist::FIXED_CAP_NS + 1,
        ];
        for v in values(50_000)
            .chain(extremes)
            .chain([u64::MAX, Hist::MAX_NS])
        {
            h.record(v);
            above += u64::from(v > Hist::FIXED_CAP_NS);
        }
        let Store::Fixed(c) = &h.store else {
            panic!("still fixed")
        };
        assert_eq!((c.as_ptr(), h.heap_bytes()), (ptr, bytes), "no allocation");
        assert!(above > 1000, "{above}");
        assert_eq!(h.len(), 50_009);
        let u = h.unbinned().unwrap();
        assert_eq!(
            (u.cap_ns, u.above_cap, u.bucket_full),
            (Hist::FIXED_CAP_NS, above, 0)
        );
        assert_eq!(h.max(), u64::MAX, "the exact maximum, above the cap");
        assert_eq!(h.min(), 0);
        // Below the cap the figures are a dense histogram's of the same
        // values; the percentiles past the binned share are unknown.
        let binned = (h.len() - above) as f64 / h.len() as f64;
        let [low, high] = h.quantiles([binned * 0.99, (binned + 1.0) / 2.0]);
        assert!(low.is_some_and(|v| v <= Hist::FIXED_CAP_NS));
        assert_eq!(high, None);
        // A bucket counts up to u32::MAX.
        let mut full = Hist::fixed();
        full.record_n(full.index_of(5_000), u64::from(u32::MAX) - 1);
        for _ in 0..3 {
            full.record(5_000);
        }
        assert_eq!(full.len(), u64::from(u32::MAX) + 2);
        assert_eq!(full.unbinned().unwrap().bucket_full, 2);
        assert_eq!(full.quantiles([0.5]), [Some(full.max())]);
    }

    /// A fixed histogram's figures are those of a dense hdrhistogram of
    /// the same buckets, and targets' fixed histograms add up (in place,
    /// or into the run's sparse total, at the fixed precision and cap).
    #[test]
    fn fixed_figures_and_sums() {
        let (mut a, mut b) = (Hist::fixed(), Hist::fixed());
        for (i, v) in values(20_000).enumerate() {
            if i % 2 == 0 { &mut a } else { &mut b }.record(v);
        }
        let mut total = Hist::new();
        total.add(&a);
        total.add(&b);
        let mut in_place = a.clone();
        in_place.add(&b);
        assert!(matches!(in_place.store, Store::Fixed(_)));
        for s in [&total, &in_place] {
            assert_eq!(s.cap_ns(), Hist::FIXED_CAP_NS);
            assert_eq!(s.len(), 20_000);
            assert_eq!(s.max(), a.max().max(b.max()));
            assert_eq!(
                s.unbinned().unwrap().above_cap,
                a.unbinned().unwrap().above_cap + b.unbinned().unwrap().above_cap
            );
            let q = [0.0, 0.1, 0.5];
            assert_eq!(s.quantiles(q), total.quantiles(q));
            assert_eq!(
                s.buckets_iter().collect::<Vec<_>>(),
                total.buckets_iter().collect::<Vec<_>>()
            );
        }
        // A sparse histogram's buckets above the cap move out, at their middle.
        let mut sparse = Hist::new();
        sparse.record(10);
        sparse.record(5_000_000_000);
        let mut f = Hist::fixed();
        f.add(&sparse);
        let mut sum = sparse.clone();
        sum.add(&Hist::fixed());
        for s in [&f, &sum] {
            assert_eq!(s.len(), 2);
            assert_eq!(s.unbinned().unwrap().above_cap, 1);
            assert_eq!(s.quantiles([0.0, 1.0]), [Some(10), None]);
            assert!(s.max().abs_diff(5_000_000_000) < 5_000_000);
        }
    }
}
