//! The running statistics of one probe run ([`RunStats`]): fed one
//! record at a time, they keep the histograms and counters that
//! [`RunStats::summary`] turns into a [`Summary`].

#[cfg(test)]
use hdrhistogram::Histogram;

use super::{
    chain::Stage,
    hist::Hist,
    report::RunReport,
    summary::{Latency, Pacing, ReaderTiming, Stages, Summary},
};
use crate::model::record::{ProbeRecord, StartSrc};

/// Latencies are recorded in ns from 1 ns to 100 s at 3 significant digits
/// (0.1 % resolution) in sparse histograms: a stage a run never sees costs
/// nothing, one it sees a few KiB. A target among several keeps fixed
/// histograms instead ([`RunStats::one_of_many`]).
fn new_hist() -> Hist {
    Hist::new()
}

/// Records `v`; a value above the histogram's cap is counted beside it.
fn record(h: &mut Hist, v: u64) {
    h.record(v);
}

/// A send `late_ns` after its schedule missed its tick when it went out
/// more than one whole interval late (the next probe was already due).
pub(crate) fn is_missed_tick(late_ns: i64, interval_ns: i64) -> bool {
    interval_ns > 0 && late_ns > interval_ns
}

/// A run's counts so far (see [`Summary`] for each one's meaning).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub sent: u64,
    pub received: u64,
    pub lost: u64,
    pub echo_lost: u64,
    pub reordered: u64,
    pub duplicates: u64,
    pub foreign: u64,
    pub never_sent: u64,
    pub late_echoes: u64,
    pub unaccounted: u64,
}

/// Running statistics, fed one finalized record at a time in seq order,
/// plus arrival-order events from the receiver. Memory is constant.
pub struct RunStats {
    one_way: Hist,
    rtt: Hist,
    ipdv: Hist,
    send_err: Hist,
    send_to_tx: Hist,
    stages: [Hist; 7],
    /// Records whose headline starts at the SCHED stamp / the user-space send.
    starts: [u64; 2],
    rtt_net: Hist,
    turnaround: Hist,
    /// A send later than this after its schedule is a missed tick (0: not counted).
    interval_ns: i64,
    missed_ticks: u64,
    /// Send times of the first and the latest record.
    first_send_ns: Option<i64>,
    last_send_ns: i64,
    sent: u64,
    /// Probes the sender tried to send, when known (for `unaccounted`).
    attempts: Option<u64>,
    received: u64,
    lost: u64,
    echo_lost: u64,
    tx_missing: u64,
    negative_one_way: u64,
    /// Previous record's one-way delay if it was received, for IPDV.
    prev_one_way: Option<(u64, i64)>,
    /// Highest seq seen at the receiver, for reordering (arrival order).
    max_arrived: Option<u64>,
    reordered: u64,
    duplicates: u64,
    tx_ts_duplicates: u64,
    tx_ts_late: u64,
    echo_tx_duplicates: u64,
    /// Matcher slots dropped without a record (see `set_unmatched`).
    unmatched: u64,
    foreign: u64,
    never_sent: u64,
    late_echoes: u64,
    sources: [u64; 3],
    pacing: Option<Pacing>,
    /// The most heap bytes one of the streams merged into these held (the
    /// targets of a run with several).
    part_heap_bytes: Option<usize>,
}

impl Default for RunStats {
    fn default() -> Self {
        Self::new()
    }
}

impl RunStats {
    pub fn new() -> Self {
        Self {
            one_way: new_hist(),
            rtt: new_hist(),
            ipdv: new_hist(),
            send_err: new_hist(),
            send_to_tx: new_hist(),
            stages: std::array::from_fn(|_| new_hist()),
            starts: [0; 2],
            rtt_net: new_hist(),
            turnaround: new_hist(),
            interval_ns: 0,
            missed_ticks: 0,
            first_send_ns: None,
            last_send_ns: 0,
            sent: 0,
            attempts: None,
            received: 0,
            lost: 0,
            echo_lost: 0,
            tx_missing: 0,
            negative_one_way: 0,
            prev_one_way: None,
            max_arrived: None,
            reordered: 0,
            duplicates: 0,
            tx_ts_duplicates: 0,
            tx_ts_late: 0,
            echo_tx_duplicates: 0,
            unmatched: 0,
            foreign: 0,
            never_sent: 0,
            late_echoes: 0,
            sources: [0; 3],
            pacing: None,
            part_heap_bytes: None,
        }
    }

    /// Statistics for a probe stream with this interval: sends later than
    /// one interval after their schedule count as missed ticks.
    pub(crate) fn with_interval(interval_ns: i64) -> Self {
        Self {
            interval_ns,
            ..Self::new()
        }
    }

    /// The statistics of one target among several: every histogram fixed
    /// ([`Hist::fixed`]: 1 ns .. 1.07 s at 1.6 %, allocated now), so that a
    /// target's memory is [`RunStats::FIXED_HEAP_BYTES`] from its first
    /// probe to its last and 1000 targets never grow. Sparse histograms
    /// gain a bucket for each new value: 1000 targets' tails kept adding
    /// memory for the whole of a 10-minute run.
    pub(crate) fn one_of_many(interval_ns: i64) -> Self {
        Self {
            rtt: Hist::fixed(),
            one_way: Hist::fixed(),
            ipdv: Hist::fixed(),
            send_err: Hist::fixed(),
            send_to_tx: Hist::fixed(),
            stages: std::array::from_fn(|_| Hist::fixed()),
            rtt_net: Hist::fixed(),
            turnaround: Hist::fixed(),
            ..Self::with_interval(interval_ns)
        }
    }

    /// Heap bytes of a target among several: its 14 fixed histograms.
    #[cfg(test)]
    pub(crate) const FIXED_HEAP_BYTES: usize = 14 * Hist::FIXED_BYTES;

    /// The interval a send is late after (0: not counted).
    pub(crate) fn interval_ns(&self) -> i64 {
        self.interval_ns
    }

    /// Adds another stream's statistics to these (the total of a run with
    /// several targets): histograms and counters add up, the first and
    /// last sends span both; the per-stream state (IPDV's previous delay,
    /// reordering's highest seq) stays this one's.
    pub(crate) fn merge(&mut self, o: &RunStats) {
        self.part_heap_bytes = self.part_heap_bytes.max(Some(o.heap_bytes()));
        let hists = [
            (&mut self.one_way, &o.one_way),
            (&mut self.rtt, &o.rtt),
            (&mut self.ipdv, &o.ipdv),
            (&mut self.send_err, &o.send_err),
            (&mut self.send_to_tx, &o.send_to_tx),
            (&mut self.rtt_net, &o.rtt_net),
            (&mut self.turnaround, &o.turnaround),
        ];
        for (a, b) in hists
            .into_iter()
            .chain(self.stages.iter_mut().zip(&o.stages))
        {
            a.add(b);
        }
        for i in 0..2 {
            self.starts[i] += o.starts[i];
        }
        for i in 0..3 {
            self.sources[i] += o.sources[i];
        }
        self.first_send_ns = match (self.first_send_ns, o.first_send_ns) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_send_ns = self.last_send_ns.max(o.last_send_ns);
        self.attempts = match (self.attempts, o.attempts) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        };
        for (a, b) in [
            (&mut self.missed_ticks, o.missed_ticks),
            (&mut self.sent, o.sent),
            (&mut self.received, o.received),
            (&mut self.lost, o.lost),
            (&mut self.echo_lost, o.echo_lost),
            (&mut self.tx_missing, o.tx_missing),
            (&mut self.negative_one_way, o.negative_one_way),
            (&mut self.reordered, o.reordered),
            (&mut self.duplicates, o.duplicates),
            (&mut self.tx_ts_duplicates, o.tx_ts_duplicates),
            (&mut self.tx_ts_late, o.tx_ts_late),
            (&mut self.echo_tx_duplicates, o.echo_tx_duplicates),
            (&mut self.unmatched, o.unmatched),
            (&mut self.foreign, o.foreign),
            (&mut self.never_sent, o.never_sent),
            (&mut self.late_echoes, o.late_echoes),
        ] {
            *a += b;
        }
        if self.pacing.is_none() {
            self.pacing = o.pacing.clone();
        }
    }

    /// A probe arrived at the receiver (arrival order). `first` is false for
    /// a second copy of a seq already seen.
    pub(crate) fn on_arrival(&mut self, seq: u64, first: bool) {
        if !first {
            self.duplicates += 1;
            return;
        }
        match self.max_arrived {
            Some(m) if seq < m => self.reordered += 1,
            _ => self.max_arrived = Some(seq),
        }
    }

    /// How many probes the sender tried to send; every one of them must
    /// end up as a record (received or lost), else it is unaccounted.
    pub(crate) fn set_attempts(&mut self, attempts: u64) {
        self.attempts = Some(attempts);
    }

    /// How the sender paced (reported by the sender when it is done).
    pub(crate) fn set_pacing(&mut self, p: Pacing) {
        self.pacing = Some(p);
    }

    /// The I/O thread's timing, beside the sender's.
    pub(crate) fn set_reader(&mut self, r: Option<ReaderTiming>) {
        self.pacing.get_or_insert_with(Pacing::default).reader = r;
    }

    /// Probes seen at the receiver whose send was never recorded (the
    /// matcher had to drop them without a record).
    pub(crate) fn set_unmatched(&mut self, n: u64) {
        self.unmatched = n;
    }

    /// Probes in no count: attempted but never written as a record (every
    /// record is either received or lost), or dropped by the matcher.
    pub(crate) fn unaccounted(&self) -> u64 {
        self.attempts.map_or(0, |a| a.abs_diff(self.sent)) + self.unmatched
    }

    pub(crate) fn on_tx_timestamp_duplicate(&mut self) {
        self.tx_ts_duplicates += 1;
    }

    pub(crate) fn on_tx_timestamp_late(&mut self) {
        self.tx_ts_late += 1;
    }

    pub(crate) fn on_echo_tx_duplicate(&mut self) {
        self.echo_tx_duplicates += 1;
    }

    pub(crate) fn on_foreign_packet(&mut self) {
        self.foreign += 1;
    }

    /// A datagram of this session whose seq was never sent.
    pub(crate) fn on_never_sent(&mut self) {
        self.never_sent += 1;
    }

    /// An echo that came after its probe's record was written.
    pub(crate) fn on_late_echo(&mut self) {
        self.late_echoes += 1;
    }

    /// A finalized probe (seq order).
    pub fn on_record(&mut self, r: &ProbeRecord) {
        self.sent += 1;
        self.first_send_ns.get_or_insert(r.send_ns);
        self.last_send_ns = r.send_ns;
        let late_ns = r.send_ns.saturating_sub(r.sched_ns);
        record(&mut self.send_err, late_ns.max(1) as u64);
        if is_missed_tick(late_ns, self.interval_ns) {
            self.missed_ticks += 1;
        }
        match r.tx_ns {
            Some(tx) => {
                record(
                    &mut self.send_to_tx,
                    tx.saturating_sub(r.send_ns).max(1) as u64,
                );
            }
            None => self.tx_missing += 1,
        }
        for (h, stage) in self.stages.iter_mut().zip(Stage::ALL) {
            // A negative stage (clocks of two NICs not aligned) is recorded
            // as 1 ns, like the one-way figure; `negative_one_way` says so.
            if let Some(v) = stage.of(r) {
                record(h, v.max(1) as u64);
            }
        }
        if r.lost {
            self.lost += 1;
            self.prev_one_way = None;
            return;
        }
        self.received += 1;
        if r.echo_ns.is_none() {
            self.echo_lost += 1;
        }
        if let Some(ow) = r.one_way_ns {
            if ow < 0 {
                self.negative_one_way += 1;
            }
            record(&mut self.one_way, ow.max(1) as u64);
            if let Some((prev_seq, prev_ow)) = self.prev_one_way
                && prev_seq + 1 == r.seq
            {
                record(&mut self.ipdv, (ow - prev_ow).unsigned_abs().max(1));
            }
            self.prev_one_way = Some((r.seq, ow));
        } else {
            self.prev_one_way = None;
        }
        if let Some(rtt) = r.rtt_ns {
            record(&mut self.rtt, rtt.max(1) as u64);
            if let Some(t) = r.turnaround_ns {
                record(&mut self.rtt_net, (rtt - t).max(1) as u64);
            }
        }
        if let Some(t) = r.turnaround_ns {
            record(&mut self.turnaround, t.max(1) as u64);
        }
        if let Some(s) = r.ts_source {
            self.sources[s as usize] += 1;
        }
        match r.start_src {
            Some(StartSrc::Sched) => self.starts[0] += 1,
            Some(StartSrc::User) => self.starts[1] += 1,
            None => {}
        }
    }

    /// The running counts, cheap enough to read several times a second.
    pub(crate) fn counts(&self) -> Counts {
        Counts {
            sent: self.sent,
            received: self.received,
            lost: self.lost,
            echo_lost: self.echo_lost,
            reordered: self.reordered,
            duplicates: self.duplicates,
            foreign: self.foreign,
            never_sent: self.never_sent,
            late_echoes: self.late_echoes,
            unaccounted: self.unaccounted(),
        }
    }

    /// Where the headline figures started, over the received probes.
    pub(crate) fn one_way_start(&self) -> &'static str {
        match self.starts {
            [0, 0] => "none",
            [_, 0] => "sched",
            [0, _] => "user",
            _ => "mixed",
        }
    }

    /// Bytes its histograms hold on the heap (the rest of it is a few
    /// hundred bytes inline).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.hists().map(Hist::heap_bytes).sum()
    }

    fn hists(&self) -> impl Iterator<Item = &Hist> {
        [
            &self.one_way,
            &self.rtt,
            &self.ipdv,
            &self.send_err,
            &self.send_to_tx,
            &self.rtt_net,
            &self.turnaround,
        ]
        .into_iter()
        .chain(&self.stages)
    }

    /// A stage's histogram, e.g. for per-interval reporting.
    #[cfg(test)]
    pub(crate) fn stage_hist(&self, stage: Stage) -> Histogram<u64> {
        self.stages[stage as usize].to_hdr()
    }

    pub(crate) fn lost(&self) -> u64 {
        self.lost
    }

    /// The overall timestamp source: one word if every probe agrees.
    pub(crate) fn timestamp_source(&self) -> &'static str {
        let [hw, sw, mixed] = self.sources;
        match (hw > 0, sw > 0, mixed > 0) {
            (false, false, false) => "none",
            (true, false, false) => "hardware",
            (false, true, false) => "software",
            _ => "mixed",
        }
    }

    pub fn summary(&self) -> Summary {
        Summary {
            sent: self.sent,
            received: self.received,
            lost: self.lost,
            loss_pct: if self.sent == 0 {
                0.0
            } else {
                100.0 * self.lost as f64 / self.sent as f64
            },
            reordered: self.reordered,
            duplicates: self.duplicates,
            echo_lost: self.echo_lost,
            tx_timestamp_missing: self.tx_missing,
            tx_timestamp_duplicates: self.tx_ts_duplicates,
            tx_timestamp_late: self.tx_ts_late,
            echo_tx_duplicates: self.echo_tx_duplicates,
            foreign_packets: self.foreign,
            never_sent: self.never_sent,
            late_echoes: self.late_echoes,
            timestamp_source: self.timestamp_source().into(),
            one_way_start: self.one_way_start().into(),
            one_way_ns: Latency::of(&self.one_way),
            rtt_ns: Latency::of(&self.rtt),
            stages_ns: self.stages_summary(),
            rtt_net_ns: Latency::of(&self.rtt_net),
            reflector_turnaround_ns: Latency::of(&self.turnaround),
            ipdv_ns: Latency::of(&self.ipdv),
            send_error_ns: Latency::of(&self.send_err),
            missed_ticks: self.missed_ticks,
            send_rate_pps: self
                .first_send_ns
                .filter(|&f| self.last_send_ns > f && self.sent > 1)
                .map_or(0.0, |f| {
                    (self.sent - 1) as f64 * 1e9 / (self.last_send_ns - f) as f64
                }),
            unaccounted: self.unaccounted(),
            send_to_tx_ns: Latency::of(&self.send_to_tx),
            pacing: self.pacing.clone(),
            report: RunReport {
                negative_one_way: (self.negative_one_way > 0).then_some(self.negative_one_way),
                stats_bytes_per_target: self.part_heap_bytes.map(|b| b as u64),
                ..Default::default()
            },
            ..Default::default()
        }
        .with_dominant_stages()
    }

    fn stages_summary(&self) -> Stages {
        let mut out = Stages::default();
        for (h, stage) in self.stages.iter().zip(Stage::ALL) {
            *out.get_mut(stage) = Latency::of(h);
        }
        out
    }
}

#[cfg(test)]
#[path = "run_stats_tests.rs"]
mod tests;
