//! Accounting of the built-in load over one measuring window, so that
//! sent, received, loss and rates all describe the same packets: pure
//! bookkeeping, no kernel (the sockets are in `load`).
//!
//! The UDP sender opens the window itself: when asked to mark, it publishes
//! the sequence number of the next datagram (`lo`) *before* sending it, and
//! when asked to stop it publishes the first sequence number it will not
//! send (`hi`). Every datagram of the window therefore reaches the receiver
//! after `lo` is visible to it, and the window is exactly `[lo, hi)`: a
//! datagram sent before the mark but still queued in the shaper does not
//! count as received, and one of the window still queued when the sender
//! stops counts once it arrives (the caller drains before reading).

use std::time::Duration;

/// How far below the highest sequence number seen a datagram may arrive and
/// still be checked for being a duplicate: 65536 datagrams (8 KiB of bits),
/// ~0.8 s at 1 Gbit/s of 1470-byte datagrams, far beyond any reordering a
/// shaped testbed path can cause.
pub(super) const REORDER_HORIZON: u64 = 1 << 16;

/// Payload bits per second of `count` equal datagrams (or byte chunks) of
/// `bytes_each` whose first and last were seen `span` apart: `count - 1`
/// gaps fit in the span, so that is what is divided. None below two.
pub(super) fn span_rate_bps(count: u64, bytes_each: u64, span: Duration) -> Option<f64> {
    if count < 2 || span.is_zero() {
        return None;
    }
    Some((count - 1) as f64 * bytes_each as f64 * 8.0 / span.as_secs_f64())
}

/// Bits per second of `bytes` over `seconds` (a byte stream, e.g. TCP).
pub(super) fn rate_bps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 * 8.0 / seconds
    } else {
        0.0
    }
}

/// Completion times of the fetch load's fetches in one window: an HDR
/// histogram (µs, 3 significant digits, up to an hour) for the percentiles
/// and Welford's running mean and variance, so memory stays bounded
/// however many fetches a run makes.
#[derive(Debug, Clone)]
pub(super) struct FetchStats {
    hist: hdrhistogram::Histogram<u64>,
    count: u64,
    mean_s: f64,
    /// Sum of squared deviations from the mean (Welford's M2), s².
    m2_s2: f64,
    failures: u64,
}

pub(crate) use crate::stats::report::FetchTimes;

impl Default for FetchStats {
    fn default() -> Self {
        Self::new()
    }
}

impl FetchStats {
    pub(super) fn new() -> Self {
        Self {
            hist: hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                .expect("valid histogram bounds"),
            count: 0,
            mean_s: 0.0,
            m2_s2: 0.0,
            failures: 0,
        }
    }

    pub(super) fn record(&mut self, d: Duration) {
        let us = (d.as_micros() as u64).clamp(1, self.hist.high());
        self.hist.saturating_record(us);
        let x = d.as_secs_f64();
        self.count += 1;
        let delta = x - self.mean_s;
        self.mean_s += delta / self.count as f64;
        self.m2_s2 += delta * (x - self.mean_s);
    }

    pub(super) fn fail(&mut self) {
        self.failures += 1;
    }

    pub(super) fn times(&self, size_bytes: u64) -> FetchTimes {
        let n = self.count;
        let q = |p: f64| (n > 0).then(|| self.hist.value_at_quantile(p) as f64 / 1e6);
        FetchTimes {
            size_bytes,
            count: n,
            failures: self.failures,
            mean_s: (n > 0).then_some(self.mean_s),
            sd_s: (n > 1).then(|| (self.m2_s2 / (n - 1) as f64).sqrt()),
            min_s: (n > 0).then(|| self.hist.min() as f64 / 1e6),
            p50_s: q(0.5),
            p90_s: q(0.9),
            p99_s: q(0.99),
            max_s: (n > 0).then(|| self.hist.max() as f64 / 1e6),
        }
    }
}

/// The receiver's view of one window of one UDP flow.
#[derive(Debug, Clone)]
pub(super) struct SeqWindow {
    lo: Option<u64>,
    received: u64,
    bytes: u64,
    duplicates: u64,
    reordered: u64,
    max_seq: Option<u64>,
    /// Arrival times on the receiver's clock (any epoch).
    first_at: Option<Duration>,
    last_at: Option<Duration>,
    /// One bit per sequence number in (max_seq - REORDER_HORIZON, max_seq],
    /// indexed by seq % REORDER_HORIZON.
    seen: Vec<u64>,
}

/// What a window amounted to, once the sender's range is known.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct WindowCounts {
    /// Datagrams the sender sent in the window (hi - lo).
    pub(crate) sent: u64,
    /// Distinct datagrams of the window that arrived.
    pub(crate) received: u64,
    pub(crate) lost: u64,
    pub(crate) duplicates: u64,
    /// Arrived after a datagram with a higher sequence number.
    pub(crate) reordered: u64,
    /// Payload bytes of the distinct datagrams received.
    pub(crate) bytes: u64,
    /// First to last arrival of the window's datagrams.
    pub(crate) receive_span: Duration,
}

impl WindowCounts {
    pub(super) fn loss_pct(&self) -> Option<f64> {
        (self.sent > 0).then(|| 100.0 * self.lost as f64 / self.sent as f64)
    }

    /// Payload rate at the receiver over its own span of the window.
    pub(super) fn achieved_bps(&self, size: u32) -> Option<f64> {
        span_rate_bps(self.received, size as u64, self.receive_span)
    }
}

impl Default for SeqWindow {
    fn default() -> Self {
        Self::new()
    }
}

impl SeqWindow {
    /// A tracker with no window open yet: nothing counts until `restart`.
    pub(super) fn new() -> Self {
        Self {
            lo: None,
            received: 0,
            bytes: 0,
            duplicates: 0,
            reordered: 0,
            max_seq: None,
            first_at: None,
            last_at: None,
            seen: vec![0; (REORDER_HORIZON / 64) as usize],
        }
    }

    /// The window's first sequence number, if one is open.
    pub(super) fn lo(&self) -> Option<u64> {
        self.lo
    }

    /// Opens a new window at `lo`, forgetting everything counted so far
    /// (a later mark moves the window; datagrams below `lo` are the
    /// warm-up's).
    pub(super) fn restart(&mut self, lo: u64) {
        *self = Self {
            seen: std::mem::take(&mut self.seen),
            ..Self::new()
        };
        self.seen.fill(0);
        self.lo = Some(lo);
    }

    /// One datagram with sequence number `seq` and `bytes` of payload
    /// arrived at `at` (on one clock for the whole window; the kernel's
    /// receive stamp, so that a receiver thread that reads late does not
    /// stretch the window).
    pub(super) fn on_datagram(&mut self, seq: u64, bytes: u64, at: Duration) {
        let Some(lo) = self.lo else { return };
        if seq < lo {
            return;
        }
        let new_first = match self.max_seq {
            None => {
                self.max_seq = Some(seq);
                self.set(seq);
                true
            }
            Some(max) if seq > max => {
                // Forget the bits that fall out of the horizon.
                let clear = (seq - max).min(REORDER_HORIZON);
                for s in (seq - clear + 1)..=seq {
                    self.clear(s);
                }
                self.max_seq = Some(seq);
                self.set(seq);
                true
            }
            Some(max) if max - seq >= REORDER_HORIZON => {
                // Too old to tell a duplicate from a late one: count it as
                // late (not a duplicate); never seen on a testbed path.
                self.reordered += 1;
                true
            }
            Some(_) => {
                if self.is_set(seq) {
                    self.duplicates += 1;
                    false
                } else {
                    self.set(seq);
                    self.reordered += 1;
                    true
                }
            }
        };
        if new_first {
            self.received += 1;
            self.bytes += bytes;
            self.first_at.get_or_insert(at);
            self.last_at = Some(at);
        }
    }

    /// The window `[lo, hi)` as the sender closed it. Call after the
    /// queue drained: a datagram still in flight counts as lost.
    pub(super) fn counts(&self, hi: u64) -> WindowCounts {
        let sent = self.lo.map_or(0, |lo| hi.saturating_sub(lo));
        // received <= sent unless the sender's hi is wrong; never report
        // a negative loss.
        let received = self.received.min(sent);
        WindowCounts {
            sent,
            received,
            lost: sent - received,
            duplicates: self.duplicates,
            reordered: self.reordered,
            bytes: self.bytes,
            receive_span: match (self.first_at, self.last_at) {
                (Some(a), Some(b)) => b.saturating_sub(a),
                _ => Duration::ZERO,
            },
        }
    }

    fn bit(seq: u64) -> (usize, u64) {
        let i = seq % REORDER_HORIZON;
        ((i / 64) as usize, 1 << (i % 64))
    }

    fn set(&mut self, seq: u64) {
        let (w, b) = Self::bit(seq);
        self.seen[w] |= b;
    }

    fn clear(&mut self, seq: u64) {
        let (w, b) = Self::bit(seq);
        self.seen[w] &= !b;
    }

    fn is_set(&self, seq: u64) -> bool {
        let (w, b) = Self::bit(seq);
        self.seen[w] & b != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn nothing_counts_before_a_window_opens() {
        let t0 = Duration::from_secs(1_700_000_000);
        let mut w = SeqWindow::new();
        w.on_datagram(0, 1470, t0);
        assert_eq!(w.counts(10).sent, 0);
        assert_eq!(w.counts(10).received, 0);
        assert_eq!(w.counts(10).loss_pct(), None);
    }

    #[test]
    fn gaps_are_lost_and_the_warm_up_is_not_counted() {
        let t0 = Duration::from_secs(1_700_000_000);
        let mut w = SeqWindow::new();
        w.restart(100);
        // Warm-up datagrams still queued when the window opened: ignored.
        for s in 90..100 {
            w.on_datagram(s, 1470, t0);
        }
        // 100..200 sent, every fourth lost in the shaper.
        for s in (100..200).filter(|s| s % 4 != 0) {
            w.on_datagram(s, 1470, t0 + ms(s - 100));
        }
        let c = w.counts(200);
        assert_eq!((c.sent, c.received, c.lost), (100, 75, 25));
        assert_eq!(c.loss_pct(), Some(25.0));
        assert_eq!(c.bytes, 75 * 1470);
        assert_eq!((c.duplicates, c.reordered), (0, 0));
        // First arrival 101 at 1 ms, last 199 at 99 ms.
        assert_eq!(c.receive_span, ms(98));
    }

    #[test]
    fn reordering_and_duplicates_are_told_apart() {
        let t0 = Duration::from_secs(1_700_000_000);
        let mut w = SeqWindow::new();
        w.restart(0);
        for (i, s) in [0, 2, 1, 3, 3, 1, 5, 4].into_iter().enumerate() {
            w.on_datagram(s, 100, t0 + ms(i as u64));
        }
        let c = w.counts(6);
        assert_eq!((c.sent, c.received, c.lost), (6, 6, 0));
        assert_eq!((c.duplicates, c.reordered), (2, 2));
        assert_eq!(c.bytes, 600);
        // The duplicate at 5 ms does not extend the span; 4 at 7 ms does.
        assert_eq!(c.receive_span, ms(7));
    }

    #[test]
    fn the_drain_counts_the_window_s_tail_and_nothing_after() {
        let t0 = Duration::from_secs(1_700_000_000);
        let mut w = SeqWindow::new();
        w.restart(0);
        for s in 0..50 {
            w.on_datagram(s, 1000, t0 + ms(s));
        }
        // The sender stopped at hi = 60; 50..60 were still queued and
        // arrive during the drain, except 55, dropped at the full queue.
        let before_drain = w.counts(60);
        assert_eq!(before_drain.lost, 10);
        for s in (50..60).filter(|s| *s != 55) {
            w.on_datagram(s, 1000, t0 + ms(s));
        }
        let c = w.counts(60);
        assert_eq!((c.sent, c.received, c.lost), (60, 59, 1));
        assert_eq!(c.receive_span, ms(59));
    }

    #[test]
    fn a_new_mark_forgets_the_old_window() {
        let t0 = Duration::from_secs(1_700_000_000);
        let mut w = SeqWindow::new();
        w.restart(0);
        for s in 0..10 {
            w.on_datagram(s, 1, t0);
        }
        w.restart(10);
        // 9 arrives late (it was in the queue): before the new window.
        w.on_datagram(9, 1, t0);
        w.on_datagram(10, 1, t0);
        w.on_datagram(11, 1, t0 + ms(1));
        let c = w.counts(12);
        assert_eq!((c.sent, c.received, c.lost, c.reordered), (2, 2, 0, 0));
        assert_eq!(w.lo(), Some(10));
    }

    #[test]
    fn the_horizon_slides_without_false_duplicates() {
        let t0 = Duration::from_secs(1_700_000_000);
        let mut w = SeqWindow::new();
        w.restart(0);
        // Same bit slot, one horizon apart: not a duplicate.
        w.on_datagram(1, 1, t0);
        w.on_datagram(1 + REORDER_HORIZON, 1, t0);
        w.on_datagram(1 + 3 * REORDER_HORIZON, 1, t0);
        // Within the horizon below the max: late, and then a duplicate.
        let late = 3 * REORDER_HORIZON;
        w.on_datagram(late, 1, t0);
        w.on_datagram(late, 1, t0);
        // Older than the horizon: counted once as late.
        w.on_datagram(5, 1, t0);
        let c = w.counts(4 * REORDER_HORIZON);
        assert_eq!(c.received, 5);
        assert_eq!(c.duplicates, 1);
        assert_eq!(c.reordered, 2);
    }

    #[test]
    fn rates_divide_the_gaps_in_the_span() {
        // 8001 datagrams of 1470 B, one every 125 us: 1 s, 94.08 Mbit/s.
        let r = span_rate_bps(8001, 1470, Duration::from_secs(1)).unwrap();
        assert!((r - 94.08e6).abs() < 1.0, "{r}");
        assert_eq!(span_rate_bps(1, 1470, Duration::from_secs(1)), None);
        assert_eq!(span_rate_bps(10, 1470, Duration::ZERO), None);
        assert_eq!(rate_bps(12_500_000, 1.0), 100e6);
        assert_eq!(rate_bps(1, 0.0), 0.0);
        let c = WindowCounts {
            sent: 3,
            received: 3,
            lost: 0,
            duplicates: 0,
            reordered: 0,
            bytes: 3000,
            receive_span: ms(2),
        };
        assert_eq!(c.achieved_bps(1000), Some(8e6));
    }

    #[test]
    fn fetch_stats_mean_sd_and_percentiles() {
        let mut f = FetchStats::new();
        assert_eq!(f.times(100).mean_s, None);
        assert_eq!(f.times(100).p50_s, None);
        for s in [1.0, 2.0, 3.0, 4.0] {
            f.record(Duration::from_secs_f64(s));
        }
        f.fail();
        let t = f.times(102_400);
        assert_eq!((t.count, t.failures, t.size_bytes), (4, 1, 102_400));
        assert!((t.mean_s.unwrap() - 2.5).abs() < 1e-9);
        // Sample sd of 1, 2, 3, 4: sqrt(5/3).
        assert!((t.sd_s.unwrap() - (5.0f64 / 3.0).sqrt()).abs() < 1e-9);
        let close = |a: Option<f64>, b: f64| (a.unwrap() - b).abs() <= b * 1e-3;
        assert!(close(t.min_s, 1.0) && close(t.max_s, 4.0), "{t:?}");
        assert!(
            close(t.p50_s, 2.0) && close(t.p90_s, 4.0) && close(t.p99_s, 4.0),
            "{t:?}"
        );
        let mut one = FetchStats::new();
        one.record(Duration::from_millis(250));
        assert_eq!(one.times(1).sd_s, None);
    }

    #[test]
    fn fetch_stats_welford_is_stable_for_close_values() {
        // Naive sum-of-squares loses these to cancellation; Welford keeps them.
        let mut f = FetchStats::new();
        for i in 0..1000 {
            f.record(Duration::from_secs(1000) + Duration::from_micros(i % 2));
        }
        let t = f.times(1);
        assert!((t.sd_s.unwrap() - 0.5e-6).abs() < 1e-8, "{t:?}");
    }
}
