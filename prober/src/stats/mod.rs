//! Statistics over probe records: HDR histograms for one-way latency and
//! RTT, loss, reordering, duplicates and IPDV jitter. Pure.

pub mod bootstrap;
pub mod chain;
pub mod interval;
pub mod report;
pub mod summary;

pub use report::RunReport;
pub use summary::{
    Counts, CpuWaits, Dominant, Latency, Pacing, RunStats, Stages, Summary, XdpCounters,
};
