//! `rtprobe plot`: boxplots, CDFs and time series from rtprobe CSVs.

pub mod axis;
pub mod read;
pub mod stats;
