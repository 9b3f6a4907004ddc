//! Statistics over probe records: HDR histograms for one-way latency and
//! RTT, loss, reordering, duplicates and IPDV jitter. Pure.

pub(crate) mod bootstrap;
pub mod chain;
pub(crate) mod hist;
pub(crate) mod interval;
pub(crate) mod observer;
pub(crate) mod outcome;
pub(crate) mod passive;
pub(crate) mod report;
pub(crate) mod run_stats;
pub(crate) mod summary;

pub(crate) use report::RunReport;
pub use run_stats::{Counts, RunStats};
pub(crate) use summary::CpuWaits;
pub use summary::Summary;
pub(crate) use summary::XdpCounters;
pub(crate) use summary::{Latency, Pacing, ReaderTiming};
