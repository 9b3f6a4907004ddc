//! What came out of one run: its summary, its metadata, how many rows were
//! written and whether it ended early.

use crate::{model::meta::RunMeta, stats::Summary};

/// The result of a run.
pub(crate) struct RunOutcome {
    pub summary: Summary,
    pub meta: RunMeta,
    pub rows: u64,
    pub interrupted: bool,
    /// An output failed and stopped the run (the rest is complete).
    pub output_error: Option<String>,
}
