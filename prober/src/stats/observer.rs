//! Watching a session while it runs (interval reports, the progress bar,
//! metrics, the HDR log: see `export::live`), without the session knowing
//! who watches.

use anyhow::Result;

use crate::{model::record::ProbeRecord, stats::RunStats};

/// Watches a session while it runs: every finalized record (seq order)
/// and a tick a few times a second.
pub trait SessionObserver {
    /// A finalized record, whether or not the CSV could take it.
    fn on_record(&mut self, _r: &ProbeRecord) {}
    /// A few times a second (the session's tick) and once more at the end
    /// (`last`). An error is an output that failed: the session stops
    /// sending, ends cleanly and reports it.
    fn on_tick(&mut self, _stats: &RunStats, _last: bool) -> Result<(), String> {
        Ok(())
    }
    /// The session's lost probes by direction where a reflector not ours
    /// tells them (each counted once, when given up as lost); given before
    /// each tick. Without it the loss is told apart by arrival (testbed).
    fn on_loss_directions(&mut self, _d: &LossDirections) {}
}

/// Lost probes by direction, each labelled once, when it was given up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossDirections {
    /// It never reached the reflector.
    pub(crate) forward: u64,
    /// The reflector got it; its echo did not come back.
    pub(crate) r#return: u64,
    /// Nothing told which, when it was given up.
    pub(crate) unknown: u64,
}

/// Watches nothing.
pub(crate) struct NoObserver;

impl SessionObserver for NoObserver {}
