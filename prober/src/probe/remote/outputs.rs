//! What each target's records go to: its rows of the session's one CSV
//! and its observer (metrics), both without the figures that compare two
//! hosts' clocks when those clocks do not allow them.

use std::sync::Mutex;

use anyhow::Result;

use super::{super::RecordSink, verdict::Ledger};
use crate::{model::record::ProbeRecord, stats::observer::SessionObserver};

/// One target's writer into the session's one CSV: the one-way column
/// and the two stages that cross hosts (path: sender TX -> reflector RX;
/// return path: reflector TX -> sender RX) left empty when the clocks do
/// not allow them (the raw stamps stay), and the row tagged with the
/// target's name where the CSV has a `target` column.
pub(super) struct OneWaySink<'a, 'b> {
    pub(super) inner: &'a Mutex<&'b mut dyn RecordSink>,
    /// The CSV's `target` cell (None: a single `--target` run's CSV).
    pub(super) target: Option<&'a str>,
    pub(super) show: bool,
    /// Only one leg flushes the shared CSV on the collector's ticks.
    pub(super) flushes: bool,
}

/// A record without the figures that compare two hosts' clocks (one-way,
/// path, return path): what the CSV and /metrics get when the clocks do
/// not allow them.
fn without_one_way(r: &ProbeRecord) -> ProbeRecord {
    let mut c = r.clone();
    c.one_way_ns = None;
    c.path_ns = None;
    c.return_ns = None;
    c
}

impl RecordSink for OneWaySink<'_, '_> {
    fn write(&mut self, r: &ProbeRecord) -> Result<()> {
        let cleared;
        let r = if self.show {
            r
        } else {
            cleared = without_one_way(r);
            &cleared
        };
        let mut inner = self
            .inner
            .lock()
            .map_err(|_| anyhow::anyhow!("CSV writer poisoned"))?;
        match self.target {
            Some(t) => inner.write_for(t, r),
            None => inner.write(r),
        }
    }
    fn flush(&mut self) -> Result<()> {
        if !self.flushes {
            return Ok(());
        }
        self.inner
            .lock()
            .map_err(|_| anyhow::anyhow!("CSV writer poisoned"))?
            .flush()
    }
}

/// One target's observer (its metrics) sees the records the CSV gets: no
/// one-way histogram between clocks that do not allow it; and the loss
/// by direction as the target's ledger labels each lost probe (the
/// reflector's counts, as in the summary's split).
pub(super) struct OneWayObserver<'a> {
    pub(super) inner: &'a mut dyn SessionObserver,
    pub(super) show: bool,
    pub(super) ledger: &'a Mutex<Ledger>,
}

impl SessionObserver for OneWayObserver<'_> {
    fn on_record(&mut self, r: &ProbeRecord) {
        if r.lost
            && let Ok(mut l) = self.ledger.lock()
        {
            l.label_lost(r.seq);
        }
        if self.show {
            self.inner.on_record(r);
        } else {
            self.inner.on_record(&without_one_way(r));
        }
    }
    fn on_tick(&mut self, stats: &crate::stats::RunStats, last: bool) -> Result<(), String> {
        if let Ok(l) = self.ledger.lock() {
            self.inner.on_loss_directions(&l.labelled);
        }
        self.inner.on_tick(stats, last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an observer was given.
    #[derive(Default)]
    struct Seen(Vec<ProbeRecord>);

    impl SessionObserver for Seen {
        fn on_record(&mut self, r: &ProbeRecord) {
            self.0.push(r.clone());
        }
    }

    #[test]
    fn metrics_get_no_one_way_figure_where_the_clocks_do_not_allow_it() {
        let r = ProbeRecord {
            seq: 7,
            one_way_ns: Some(5_000),
            path_ns: Some(3_000),
            return_ns: Some(2_000),
            rtt_ns: Some(9_000),
            ..Default::default()
        };
        for show in [false, true] {
            let mut seen = Seen::default();
            let ledger = Mutex::new(Ledger::default());
            OneWayObserver {
                inner: &mut seen,
                show,
                ledger: &ledger,
            }
            .on_record(&r);
            let got = &seen.0[0];
            assert_eq!(got.rtt_ns, Some(9_000), "RTT needs one clock: always there");
            assert_eq!(got.one_way_ns.is_some(), show);
            assert_eq!(got.path_ns.is_some(), show);
            assert_eq!(got.return_ns.is_some(), show);
        }
    }
}
