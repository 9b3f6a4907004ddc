//! Statistics over probe records: HDR histograms for one-way latency and
//! RTT, loss, reordering, duplicates and IPDV jitter. Pure.

pub(crate) mod bootstrap;
pub mod chain;
pub mod hist;
pub(crate) mod interval;
pub(crate) mod observer;
pub(crate) mod outcome;
pub mod report;
pub mod summary;

pub use report::RunReport;
pub use summary::CpuWaits;
pub(crate) use summary::XdpCounters;
pub use summary::{Counts, Latency, Pacing, ReaderTiming, RunStats, Stages, Summary};
