//! What came out of one run: its summary, its metadata, how many rows were
//! written and whether it ended early.

use crate::{model::meta::RunMeta, stats::Summary};

/// The result of a run.
pub(crate) struct RunOutcome {
    pub(crate) summary: Summary,
    pub(crate) meta: RunMeta,
    pub(crate) rows: u64,
    pub(crate) interrupted: bool,
    /// An output failed and stopped the run (the rest is complete).
    pub(crate) output_error: Option<String>,
}
