//! Statistics over probe records: HDR histograms for one-way latency and
//! RTT, loss, reordering, duplicates and IPDV jitter. Pure.

pub(crate) mod bootstrap;
pub mod chain;
pub(crate) mod interval;
pub mod summary;

pub use summary::{
    Counts, CpuWaits, Dominant, Latency, Pacing, RunStats, Stages, Summary, XdpCounters,
};
