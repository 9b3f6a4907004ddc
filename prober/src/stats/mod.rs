//! Statistics over probe records: HDR histograms for one-way latency and
//! RTT, loss, reordering, duplicates and IPDV jitter. Pure.

pub mod summary;

pub use summary::{Latency, RunStats, Summary, XdpCounters};
