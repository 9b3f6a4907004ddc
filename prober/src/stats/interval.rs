//! Interval statistics: the probes *sent* in each interval of a run (like
//! iperf's interval reports), with HDR histograms that are reset and reused
//! for every interval, so memory stays flat however long the run. Pure.
//!
//! Records come out of the matcher in seq order, up to the timeout after
//! they were sent; an interval is complete once a record sent after its
//! end comes out, so every line counts each probe of its interval exactly
//! once (received or lost), at most one timeout late.

use std::time::Duration;

use hdrhistogram::Histogram;

use crate::model::record::ProbeRecord;

/// Same range and precision as the run's histograms (1 ns .. 100 s, 3 digits).
fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static histogram bounds are valid")
}

/// Empty intervals reported at most in a row before jumping ahead (a
/// stalled sender or a clock step must not print a million lines).
const MAX_EMPTY_RUN: u64 = 3;

/// One interval's figures.
#[derive(Debug, Clone)]
pub(crate) struct Interval {
    /// 0 for the first interval of the run.
    pub(crate) index: u64,
    /// Start of the interval, CLOCK_REALTIME ns (sched time of the probes).
    pub(crate) start_ns: i64,
    pub(crate) len_ns: i64,
    /// Offset of the interval's start from the run's start.
    pub(crate) offset_ns: i64,
    pub(crate) sent: u64,
    pub(crate) lost: u64,
    pub(crate) one_way: Histogram<u64>,
    pub(crate) rtt: Histogram<u64>,
}

impl Interval {
    fn new(len_ns: i64) -> Self {
        Self {
            index: 0,
            start_ns: 0,
            len_ns,
            offset_ns: 0,
            sent: 0,
            lost: 0,
            one_way: new_hist(),
            rtt: new_hist(),
        }
    }

    fn reset(&mut self, index: u64, run_start_ns: i64) {
        self.index = index;
        self.offset_ns = index as i64 * self.len_ns;
        self.start_ns = run_start_ns + self.offset_ns;
        self.sent = 0;
        self.lost = 0;
        self.one_way.reset();
        self.rtt.reset();
    }

    fn record(&mut self, r: &ProbeRecord) {
        self.sent += 1;
        if r.lost {
            self.lost += 1;
        }
        if let Some(v) = r.one_way_ns {
            let _ = self.one_way.record(v.max(1) as u64);
        }
        if let Some(v) = r.rtt_ns {
            let _ = self.rtt.record(v.max(1) as u64);
        }
    }

    pub(crate) fn loss_pct(&self) -> f64 {
        if self.sent == 0 {
            0.0
        } else {
            100.0 * self.lost as f64 / self.sent as f64
        }
    }

    /// The headline histogram for one-line displays: one-way where there
    /// is one, else RTT.
    pub(crate) fn headline(&self) -> (&'static str, &Histogram<u64>) {
        if self.one_way.is_empty() && !self.rtt.is_empty() {
            ("rtt", &self.rtt)
        } else {
            ("one-way", &self.one_way)
        }
    }

    /// The iperf-style line: `[  10.0-  11.0 s]  sent 1000  lost 0 (0.00 %)
    /// one-way p50 45.2 µs p99 80.1 µs max 120 µs  rtt p50 ...`.
    pub(crate) fn line(&self) -> String {
        let secs = |ns: i64| ns as f64 / 1e9;
        let mut s = format!(
            "[{:>7.1}-{:>7.1} s]  sent {:>7}  lost {:>5} ({:>5.2} %)",
            secs(self.offset_ns),
            secs(self.offset_ns + self.len_ns),
            self.sent,
            self.lost,
            self.loss_pct()
        );
        for (name, h) in [("one-way", &self.one_way), ("rtt", &self.rtt)] {
            s.push_str(&format!("  {name} {}", quantiles_words(h)));
        }
        s
    }
}

/// "p50 45.2 µs  p99 80.1 µs  max 120 µs", or "-" for an empty histogram.
pub(crate) fn quantiles_words(h: &Histogram<u64>) -> String {
    use crate::model::units::format_duration_ns;
    if h.is_empty() {
        return "-".into();
    }
    format!(
        "p50 {} p99 {} max {}",
        format_duration_ns(h.value_at_quantile(0.5) as f64),
        format_duration_ns(h.value_at_quantile(0.99) as f64),
        format_duration_ns(h.max() as f64)
    )
}

/// Splits a run's records into fixed intervals of send time.
pub(crate) struct IntervalStats {
    len_ns: i64,
    /// The first record's scheduled send time: interval 0 starts there.
    run_start_ns: Option<i64>,
    cur: Interval,
    /// The last complete interval (for displays between two completions).
    last: Option<Interval>,
}

impl IntervalStats {
    pub(crate) fn new(len: Duration) -> Self {
        let len_ns = (len.as_nanos() as i64).max(1);
        Self {
            len_ns,
            run_start_ns: None,
            cur: Interval::new(len_ns),
            last: None,
        }
    }

    /// Adds a finalized record (seq order); `done` gets every interval the
    /// record shows complete, in order.
    pub(crate) fn on_record(&mut self, r: &ProbeRecord, mut done: impl FnMut(&Interval)) {
        let start = *self.run_start_ns.get_or_insert_with(|| {
            self.cur.reset(0, r.sched_ns);
            r.sched_ns
        });
        // A send scheduled before the run's start (it cannot be, but a
        // clock step could make it look so) counts in the current interval.
        let index = (r.sched_ns.saturating_sub(start).max(0) / self.len_ns) as u64;
        if index > self.cur.index {
            self.complete(&mut done);
            // Empty intervals between: reported (sent 0), a few at most.
            let done_index = self.cur.index;
            let mut next = done_index + 1;
            while next < index && next - done_index <= MAX_EMPTY_RUN {
                self.cur.reset(next, start);
                done(&self.cur);
                next += 1;
            }
            self.cur.reset(index, start);
        }
        self.cur.record(r);
    }

    /// Ends the run: the current interval, if it has probes, is complete.
    pub(crate) fn finish(&mut self, mut done: impl FnMut(&Interval)) {
        if self.run_start_ns.is_some() && self.cur.sent > 0 {
            self.complete(&mut done);
            self.cur.sent = 0;
        }
    }

    fn complete(&mut self, done: &mut impl FnMut(&Interval)) {
        done(&self.cur);
        match &mut self.last {
            Some(l) => l.clone_from(&self.cur),
            None => self.last = Some(self.cur.clone()),
        }
    }

    /// The interval being filled.
    #[cfg(test)]
    pub(crate) fn current(&self) -> &Interval {
        &self.cur
    }

    /// What a live display should show: the interval being filled once it
    /// holds at least half as many probes as the last complete one (so the
    /// figures do not jump at each interval's start), else the last one.
    pub(crate) fn display(&self) -> &Interval {
        match &self.last {
            Some(l) if self.cur.sent * 2 < l.sent => l,
            _ => &self.cur,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, sched_ns: i64, one_way: Option<i64>) -> ProbeRecord {
        ProbeRecord {
            seq,
            sched_ns,
            send_ns: sched_ns,
            one_way_ns: one_way,
            rtt_ns: one_way.map(|v| 2 * v),
            lost: one_way.is_none(),
            ..Default::default()
        }
    }

    #[test]
    fn each_probe_counts_in_the_interval_it_was_sent_in() {
        let mut s = IntervalStats::new(Duration::from_millis(10));
        let mut out = Vec::new();
        let t0 = 1_000_000_000_000;
        // 4 probes a ms apart per 10 ms; the third interval loses one.
        for seq in 0..30u64 {
            let lost = seq == 25;
            s.on_record(
                &rec(
                    seq,
                    t0 + seq as i64 * 1_000_000,
                    (!lost).then_some(1000 + seq as i64),
                ),
                |i| out.push((i.index, i.sent, i.lost, i.one_way.max(), i.line())),
            );
        }
        assert_eq!(out.len(), 2, "the third interval is not complete yet");
        s.finish(|i| out.push((i.index, i.sent, i.lost, i.one_way.max(), i.line())));
        let counts: Vec<_> = out.iter().map(|o| (o.0, o.1, o.2)).collect();
        assert_eq!(counts, vec![(0, 10, 0), (1, 10, 0), (2, 10, 1)]);
        assert_eq!(out[1].3, 1019);
        assert!(out[2].4.contains("lost     1 (10.00 %)"), "{}", out[2].4);
        assert!(out[0].4.contains("one-way p50 1.00"), "{}", out[0].4);
    }

    #[test]
    fn gaps_print_a_few_empty_intervals_then_jump() {
        let mut s = IntervalStats::new(Duration::from_secs(1));
        let mut idx = Vec::new();
        s.on_record(&rec(0, 0, Some(5)), |i| idx.push((i.index, i.sent)));
        s.on_record(&rec(1, 2_500_000_000, Some(5)), |i| {
            idx.push((i.index, i.sent))
        });
        assert_eq!(idx, vec![(0, 1), (1, 0)]);
        idx.clear();
        s.on_record(&rec(2, 1_000_000_000_000, Some(5)), |i| {
            idx.push((i.index, i.sent))
        });
        assert_eq!(idx.len(), 1 + MAX_EMPTY_RUN as usize);
        assert_eq!(s.current().index, 1000);
        assert_eq!(s.current().offset_ns, 1_000_000_000_000);
    }

    #[test]
    fn display_keeps_the_last_interval_until_the_new_one_fills() {
        let mut s = IntervalStats::new(Duration::from_millis(10));
        for seq in 0..10u64 {
            s.on_record(&rec(seq, seq as i64 * 1_000_000, Some(100)), |_| {});
        }
        s.on_record(&rec(10, 10_000_000, Some(900)), |_| {});
        assert_eq!(s.display().index, 0, "1 probe against 10");
        for seq in 11..16u64 {
            s.on_record(&rec(seq, seq as i64 * 1_000_000, Some(900)), |_| {});
        }
        assert_eq!(s.display().index, 1);
        assert_eq!(s.display().headline().0, "one-way");
    }
}
