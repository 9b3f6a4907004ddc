//! Where one probe run's results go. Command line only in effect: a
//! scenario names each cell's files itself (`rtprobe run --out-dir`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, clap::Args, Serialize, Deserialize)]
#[command(next_help_heading = "Output")]
#[serde(deny_unknown_fields)]
pub(crate) struct OutputSpec {
    /// Per-probe CSV, streamed as the run goes [default: out.csv].
    #[arg(long)]
    pub(crate) out: Option<PathBuf>,

    /// Also write the summary as JSON to this path (whole or not at all: a temporary file renamed
    /// into place).
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,

    /// Label stored in the CSV metadata and used as the legend by `rtprobe plot`.
    #[arg(long)]
    pub(crate) label: Option<String>,

    /// Print no progress, only the summary.
    #[arg(short, long, num_args = 0, default_missing_value = "true")]
    pub(crate) quiet: Option<bool>,
}
