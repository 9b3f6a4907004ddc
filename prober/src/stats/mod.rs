//! Statistics over probe records: HDR histograms for one-way latency and
//! RTT, loss, reordering, duplicates and IPDV jitter. Pure.

pub(crate) mod bootstrap;
pub mod chain;
pub(crate) mod hist;
pub(crate) mod interval;
pub(crate) mod observer;
pub(crate) mod outcome;
pub(crate) mod report;
pub(crate) mod run_stats;
pub(crate) mod summary;

pub use report::RunReport;
pub use run_stats::{Counts, RunStats};
pub use summary::CpuWaits;
pub(crate) use summary::XdpCounters;
pub use summary::{Latency, Pacing, ReaderTiming, Stages, Summary};
